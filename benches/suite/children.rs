//! The load-generator children (this binary re-executed as `__loadgen`,
//! through the `loadgen` crate's one parent, `loadgen::ChildLoop`: the config
//! on the child's stdin): commanded, their progress and reports read.

use crate::procs::usage;
use loadgen::{Command as LoadgenCommand, Config, Counters, Output};
use serde_json::Value;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The hidden subcommand a child runs.
pub const SUBCOMMAND: &str = "__loadgen";

/// The load-generator children and their messages.
pub struct Fleet {
    children: Vec<loadgen::ChildLoop>,
    rx: mpsc::Receiver<(usize, Output)>,
    /// Latest progress counters per child.
    pub progress: Vec<Counters>,
}

impl Fleet {
    /// Starts one child per config.
    pub fn start(configs: Vec<Config>) -> Fleet {
        let exe = std::env::current_exe().expect("current exe");
        let (tx, rx) = mpsc::channel();
        let children: Vec<loadgen::ChildLoop> = configs
            .iter()
            .enumerate()
            .map(|(i, cfg)| {
                loadgen::ChildLoop::spawn(&exe, SUBCOMMAND, i, cfg, tx.clone())
                    .expect("spawn load generator")
            })
            .collect();
        let n = children.len();
        Fleet {
            children,
            rx,
            progress: vec![Counters::default(); n],
        }
    }

    /// Pids of the children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(loadgen::ChildLoop::pid).collect()
    }

    /// Summed CPU time of the children, µs.
    pub fn cpu_us(&self) -> u64 {
        self.pids().into_iter().map(|p| usage(p).cpu_us).sum()
    }

    /// Drains pending outputs (progress kept); returns, per child, the
    /// answer `want_answer` picks (a mark or a report) as JSON.
    fn pump(
        &mut self,
        want_answer: fn(Output) -> Option<Value>,
        wait: Duration,
        want: usize,
    ) -> Vec<Value> {
        let mut got = vec![Value::Null; self.children.len()];
        let mut n = 0;
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let msg = if n >= want {
                match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            } else {
                match self.rx.recv_timeout(left) {
                    Ok(m) => m,
                    Err(_) => break,
                }
            };
            let (i, o) = msg;
            match o {
                Output::Progress(p) => self.progress[i] = p.counters,
                Output::Rejected(e) => panic!("load generator {i}: {e}"),
                answer => {
                    if let Some(a) = want_answer(answer) {
                        if got[i].is_null() {
                            n += 1;
                        }
                        got[i] = a;
                    }
                }
            }
        }
        got
    }

    /// Refreshes `progress` and returns the summed value of one counter.
    pub fn sum(&mut self, counter: impl Fn(&Counters) -> u64) -> u64 {
        self.pump(|_| None, Duration::ZERO, 0);
        loadgen::counters::sum(&self.progress, counter)
    }

    /// The summed value of the counter called `name` (as the reports name
    /// it: scenarios that print or pick counters by name); a name that is
    /// no counter panics, naming it.
    pub fn sum_named(&mut self, name: &str) -> u64 {
        self.sum(|c| {
            let v = serde_json::to_value(c).unwrap_or_default();
            v[name]
                .as_u64()
                .unwrap_or_else(|| panic!("no load-generator counter named {name:?}"))
        })
    }

    /// Sends one command to every child (see `loadgen::Command`).
    pub fn command(&mut self, cmd: LoadgenCommand) {
        for c in &mut self.children {
            c.send(&cmd);
        }
    }

    /// Counters of every child right now (summed).
    pub fn mark(&mut self) -> Value {
        self.command(LoadgenCommand::Mark);
        let marks = self.pump(
            |o| match o {
                Output::Mark(c) => serde_json::to_value(c).ok(),
                _ => None,
            },
            Duration::from_secs(10),
            self.children.len(),
        );
        sum_objects(&marks)
    }

    /// Final reports; the children exit.
    pub fn report(mut self) -> Vec<Value> {
        self.command(LoadgenCommand::Report);
        let reports = self.pump(
            |o| match o {
                Output::Report(r) => serde_json::to_value(r).ok(),
                _ => None,
            },
            Duration::from_secs(30),
            self.children.len(),
        );
        for c in self.children.drain(..) {
            c.wait(Duration::from_secs(10));
        }
        reports
    }
}

/// Field-wise sum of JSON objects of numbers.
pub fn sum_objects(objs: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for o in objs {
        for (k, v) in o.as_object().into_iter().flatten() {
            let cur = out.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            out.insert(k.clone(), Value::from(cur + v.as_u64().unwrap_or(0)));
        }
    }
    Value::Object(out)
}
