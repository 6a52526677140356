//! The load-generator children (this binary re-executed as `__loadgen`):
//! started, commanded over stdin, their progress and reports read from
//! stdout.

use crate::procs::usage;
use loadgen::{message, Command as LoadgenCommand, Config, Counters, Output};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The load-generator children and their messages.
pub struct Fleet {
    children: Vec<(Child, Option<ChildStdin>)>,
    rx: mpsc::Receiver<(usize, Output)>,
    /// Latest progress counters per child.
    pub progress: Vec<Counters>,
}

impl Fleet {
    /// Starts one child per config.
    pub fn start(configs: Vec<Config>) -> Fleet {
        let exe = std::env::current_exe().expect("current exe");
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        for (i, cfg) in configs.iter().enumerate() {
            let mut child = Command::new(&exe)
                .arg("__loadgen")
                .arg(serde_json::to_string(cfg).expect("config json"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn load generator");
            let out = child.stdout.take().expect("stdout");
            let stdin = child.stdin.take();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    // A line that is no output is a broken child: say so.
                    let o = message::parse::<Output>(&line)
                        .unwrap_or_else(|e| panic!("load generator {i}: {e}"));
                    if tx.send((i, o)).is_err() {
                        break;
                    }
                }
            });
            children.push((child, stdin));
        }
        let n = children.len();
        Fleet {
            children,
            rx,
            progress: vec![Counters::default(); n],
        }
    }

    /// Pids of the children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.0.id()).collect()
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
        let line = message::line(&cmd);
        for (_, stdin) in &mut self.children {
            if let Some(s) = stdin {
                let _ = writeln!(s, "{line}");
                let _ = s.flush();
            }
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
        for (c, stdin) in &mut self.children {
            stdin.take();
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
        reports
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
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
