//! The viewers spread over viewer loops ([`super::viewers::run_with`]), each
//! one epoll loop of at most 5,000 viewers: threads of this process while
//! one process's open files hold them all, else one child process each
//! ([`super::children`]). Commands in and JSON values out over channels
//! (pipes for a child); the open-file limit raised to its hard limit first.

use super::children::ChildLoop;
use super::viewers::{run_with, Config};
use serde_json::Value;
use std::sync::mpsc;

/// Viewers one loop drives at most.
const PER_THREAD: usize = 5000;

/// File descriptors a process keeps for other things than viewers (Redis
/// links, the publisher, stdio, epoll, scrapes).
const RESERVE_FDS: u64 = 128;

/// One running viewer loop.
enum Loop {
    /// A thread of this process.
    Thread(mpsc::Sender<String>, std::thread::JoinHandle<()>),
    /// A child process.
    Child(ChildLoop),
}

impl Loop {
    fn send(&mut self, cmd: &str) {
        match self {
            Loop::Thread(tx, _) => drop(tx.send(cmd.into())),
            Loop::Child(c) => c.send(cmd),
        }
    }

    fn end(self) {
        match self {
            Loop::Thread(_, t) => drop(t.join()),
            Loop::Child(c) => c.wait(std::time::Duration::from_secs(10)),
        }
    }
}

/// The running viewer loops.
pub struct Workers {
    loops: Vec<Loop>,
    rx: mpsc::Receiver<(usize, Value)>,
    /// The latest progress value of each worker.
    pub progress: Vec<Value>,
    /// Latency (µs) reported since [`Workers::take_interval`] was last called.
    interval: super::hist::Hist,
    /// Loops that run in child processes.
    children: usize,
}

/// Viewers one process can hold: its open-file limit less the reserve.
pub fn per_process(nofile: u64) -> usize {
    nofile.saturating_sub(RESERVE_FDS).max(1) as usize
}

/// The loops' configs: `base.clients` split into WebSocket and SSE loops of
/// at most `per_loop` viewers each, the connect rate shared in proportion.
fn split(base: &Config, sse_clients: usize, per_loop: usize) -> Vec<Config> {
    let ws_clients = base.clients - sse_clients;
    let mut configs = Vec::new();
    for (n, sse) in [(ws_clients, false), (sse_clients, true)] {
        let parts = n.div_ceil(per_loop.max(1));
        for i in 0..parts {
            let mut c = base.clone();
            c.sse = sse;
            c.clients = n / parts + usize::from(i < n % parts);
            c.connect_rate = base.connect_rate * c.clients as f64 / base.clients as f64;
            configs.push(c);
        }
    }
    for (i, c) in configs.iter_mut().enumerate() {
        c.child = i as u32;
        c.seed = base.seed + i as u64;
    }
    configs
}

/// Raises the soft open-file limit to the hard one; the soft limit after.
pub fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit out/in pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        let want = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
            return want.rlim_cur;
        }
    }
    r.rlim_cur
}

impl Workers {
    /// Splits `base` (whose `clients` is the total) over loops and starts
    /// them: threads while `per_process` viewers fit in this process, else
    /// a child process for each loop.
    pub fn start(base: &Config, sse_clients: usize, per_process: usize) -> Workers {
        let in_children = base.clients > per_process;
        let per_loop = PER_THREAD.min(per_process);
        let (tx, rx) = mpsc::channel();
        let mut loops = Vec::new();
        for (i, c) in split(base, sse_clients, per_loop).into_iter().enumerate() {
            let tx = tx.clone();
            if in_children {
                match ChildLoop::spawn(i, &c, tx) {
                    Ok(child) => loops.push(Loop::Child(child)),
                    Err(e) => crate::logging::line(&format!(
                        "warning: rehearse: cannot start a viewers process: {e}"
                    )),
                }
                continue;
            }
            let (ctx, crx) = mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("rehearse-viewers-{i}"))
                .spawn(move || run_with(c, crx, |v| drop(tx.send((i, v)))));
            if let Ok(t) = spawned {
                loops.push(Loop::Thread(ctx, t));
            }
        }
        let n = loops.len();
        Workers {
            children: if in_children { n } else { 0 },
            loops,
            rx,
            progress: vec![Value::Null; n],
            interval: Default::default(),
        }
    }

    /// Child processes running viewers (0: all in threads of this one).
    pub fn processes(&self) -> usize {
        self.children
    }

    /// Takes the progress values that arrived.
    pub fn poll(&mut self) {
        while let Ok((i, v)) = self.rx.try_recv() {
            if v.get("p").is_some() {
                self.interval.merge_json(&v["l"]);
                self.progress[i] = v;
            }
        }
    }

    /// The latency histogram since the last call.
    pub fn take_interval(&mut self) -> super::hist::Hist {
        std::mem::take(&mut self.interval)
    }

    /// Refusals by status over the workers' latest progress.
    pub fn refusals(&self) -> std::collections::BTreeMap<u64, u64> {
        let mut m = std::collections::BTreeMap::new();
        for v in &self.progress {
            for pair in v["r"].as_array().into_iter().flatten() {
                *m.entry(pair[0].as_u64().unwrap_or(0)).or_default() +=
                    pair[1].as_u64().unwrap_or(0);
            }
        }
        m
    }

    /// The sum of a counter over the workers' latest progress.
    pub fn sum(&self, key: &str) -> u64 {
        self.progress
            .iter()
            .map(|v| v["p"][key].as_u64().unwrap_or(0))
            .sum()
    }

    /// Every worker's report (they say goodbye to their viewers after it).
    pub fn reports(mut self) -> Vec<Value> {
        for l in &mut self.loops {
            l.send("report");
        }
        let mut out = vec![Value::Null; self.loops.len()];
        let mut left = self.loops.len();
        while left > 0 {
            match self.rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok((i, v)) => {
                    if let Some(r) = v.get("report") {
                        if out[i].is_null() {
                            left -= 1;
                        }
                        out[i] = r.clone();
                    }
                }
                Err(_) => break,
            }
        }
        for l in self.loops.drain(..) {
            l.end();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewers_split_into_loops_of_at_most_the_limit() {
        let base = Config {
            clients: 120,
            connect_rate: 600.0,
            seed: 7,
            ..Config::default()
        };
        let parts = split(&base, 24, 50);
        let sizes: Vec<(usize, bool)> = parts.iter().map(|c| (c.clients, c.sse)).collect();
        assert_eq!(sizes, vec![(48, false), (48, false), (24, true)]);
        let rate: f64 = parts.iter().map(|c| c.connect_rate).sum();
        assert!((rate - 600.0).abs() < 1e-9);
        let ids: Vec<u32> = parts.iter().map(|c| c.child).collect();
        assert_eq!(ids, vec![0, 1, 2], "user ids differ across loops");
        assert_eq!(per_process(20_000), 20_000 - 128);
        assert_eq!(per_process(10), 1);
    }
}
