//! The viewers spread over threads of this process, each one epoll loop
//! ([`super::viewers::run_with`]), commands in and JSON values out over
//! channels; the open-file limit raised to its hard limit first.

use super::viewers::{run_with, Config};
use serde_json::Value;
use std::sync::mpsc;

/// Viewers one thread drives at most.
const PER_THREAD: usize = 5000;

/// The running viewer threads.
pub struct Workers {
    cmds: Vec<mpsc::Sender<String>>,
    rx: mpsc::Receiver<(usize, Value)>,
    /// The latest progress value of each worker.
    pub progress: Vec<Value>,
    /// Latency (µs) reported since [`Workers::take_interval`] was last called.
    interval: super::hist::Hist,
    threads: Vec<std::thread::JoinHandle<()>>,
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
    /// Splits `base` (whose `clients` is the total) over threads and starts them.
    pub fn start(base: &Config, sse_clients: usize) -> Workers {
        let ws_clients = base.clients - sse_clients;
        let mut configs = Vec::new();
        for (n, sse) in [(ws_clients, false), (sse_clients, true)] {
            let parts = n.div_ceil(PER_THREAD);
            for i in 0..parts {
                let mut c = base.clone();
                c.sse = sse;
                c.clients = n / parts + usize::from(i < n % parts);
                c.connect_rate = base.connect_rate * c.clients as f64 / base.clients as f64;
                configs.push(c);
            }
        }
        let (tx, rx) = mpsc::channel();
        let mut cmds = Vec::new();
        let mut threads = Vec::new();
        for (i, mut c) in configs.into_iter().enumerate() {
            c.child = i as u32;
            c.seed = base.seed + i as u64;
            let (ctx, crx) = mpsc::channel();
            cmds.push(ctx);
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rehearse-viewers-{i}"))
                .spawn(move || run_with(c, crx, |v| drop(tx.send((i, v)))));
            if let Ok(t) = spawned {
                threads.push(t);
            }
        }
        let n = cmds.len();
        Workers {
            cmds,
            rx,
            progress: vec![Value::Null; n],
            threads,
            interval: Default::default(),
        }
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
        for c in &self.cmds {
            let _ = c.send("report".into());
        }
        let mut out = vec![Value::Null; self.cmds.len()];
        let mut left = self.cmds.len();
        while left > 0 {
            match self.rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok((i, v)) => {
                    if let Some(r) = v.get("report") {
                        out[i] = r.clone();
                        left -= 1;
                    }
                }
                Err(_) => break,
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        out
    }
}
