//! The viewers spread over viewer loops ([`loadgen::run_with`]), each one
//! epoll loop of at most 5,000 viewers: threads of this process while one
//! process's open files hold them all, else one child process each
//! ([`loadgen::ChildLoop`], running [`super::children`]). Typed commands in
//! and outputs back over channels (JSON lines on pipes for a child); a
//! message that does not read is logged with its loop's number, never
//! dropped silently.

use super::children::SUBCOMMAND;
use loadgen::{run_with, ChildLoop, Command, Config, Counters, Hist, Output, Report};
use std::collections::BTreeMap;
use std::sync::mpsc;

/// Viewers one loop drives at most.
const PER_THREAD: usize = 5000;

/// File descriptors a process keeps for other things than viewers (Redis
/// links, the publisher, stdio, epoll, scrapes).
const RESERVE_FDS: u64 = 128;

/// One running viewer loop.
enum Loop {
    /// A thread of this process.
    Thread(mpsc::Sender<Command>, std::thread::JoinHandle<()>),
    /// A child process.
    Child(ChildLoop),
}

impl Loop {
    fn send(&mut self, cmd: Command) {
        match self {
            Loop::Thread(tx, _) => drop(tx.send(cmd)),
            Loop::Child(c) => c.send(&cmd),
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
    rx: mpsc::Receiver<(usize, Output)>,
    /// The latest counters of each loop.
    counters: Vec<Counters>,
    /// The latest refusals by status of each loop.
    refusals: Vec<Vec<(u16, u64)>>,
    /// Latency (µs) reported since [`Workers::take_interval`] was last called.
    interval: Hist,
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

impl Workers {
    /// Splits `base` (whose `clients` is the total) over loops and starts
    /// them: threads while `per_process` viewers fit in this process, else
    /// a child process for each loop.
    pub fn start(base: &Config, sse_clients: usize, per_process: usize) -> Workers {
        let in_children = base.clients > per_process;
        let per_loop = PER_THREAD.min(per_process);
        let (tx, rx) = mpsc::channel();
        let exe = std::env::current_exe();
        let mut loops = Vec::new();
        for (i, c) in split(base, sse_clients, per_loop).into_iter().enumerate() {
            let tx = tx.clone();
            if in_children {
                let spawned = exe
                    .as_ref()
                    .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
                    .and_then(|exe| ChildLoop::spawn(exe, SUBCOMMAND, i, &c, tx));
                match spawned {
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
                .spawn(move || run_with(c, crx, |o| drop(tx.send((i, o)))));
            if let Ok(t) = spawned {
                loops.push(Loop::Thread(ctx, t));
            }
        }
        let n = loops.len();
        Workers {
            children: if in_children { n } else { 0 },
            loops,
            rx,
            counters: vec![Counters::default(); n],
            refusals: vec![Vec::new(); n],
            interval: Hist::default(),
        }
    }

    /// Child processes running viewers (0: all in threads of this one).
    pub fn processes(&self) -> usize {
        self.children
    }

    /// Takes the progress values that arrived.
    pub fn poll(&mut self) {
        while let Ok((i, o)) = self.rx.try_recv() {
            self.take(i, o);
        }
    }

    /// One loop's output: progress kept, a rejected command logged; a mark
    /// or report is answered only when asked for (see [`Workers::reports`]).
    fn take(&mut self, i: usize, o: Output) -> Option<Box<Report>> {
        match o {
            Output::Progress(p) => {
                self.interval.merge(&p.latency);
                self.counters[i] = p.counters;
                self.refusals[i] = p.refusals;
            }
            Output::Rejected(e) => {
                crate::logging::line(&format!("warning: rehearse: viewers loop {i}: {e}"))
            }
            Output::Mark(c) => self.counters[i] = c,
            Output::Report(r) => {
                if let Some(why) = &r.error {
                    crate::logging::line(&format!(
                        "warning: rehearse: viewers loop {i} could not run: {why}"
                    ));
                }
                return Some(r);
            }
        }
        None
    }

    /// The latency histogram since the last call.
    pub fn take_interval(&mut self) -> Hist {
        std::mem::take(&mut self.interval)
    }

    /// Refusals by status over the loops' latest progress.
    pub fn refusals(&self) -> BTreeMap<u64, u64> {
        let lists = self.refusals.iter().map(Vec::as_slice);
        loadgen::report::sum_refusals(lists)
            .into_iter()
            .map(|(s, n)| (u64::from(s), n))
            .collect()
    }

    /// The sum of one counter over the loops' latest progress.
    pub fn sum(&self, field: impl Fn(&Counters) -> u64) -> u64 {
        loadgen::counters::sum(&self.counters, field)
    }

    /// The largest value of one counter over the loops' latest progress.
    pub fn max(&self, field: impl Fn(&Counters) -> u64) -> u64 {
        loadgen::counters::max(&self.counters, field)
    }

    /// Every loop's report (they say goodbye to their viewers after it); a
    /// loop that sent none within 10 s has the default (empty) one.
    pub fn reports(mut self) -> Vec<Report> {
        for l in &mut self.loops {
            l.send(Command::Report);
        }
        let mut out: Vec<Option<Report>> = vec![None; self.loops.len()];
        let mut left = self.loops.len();
        while left > 0 {
            match self.rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok((i, o)) => {
                    if let Some(r) = self.take(i, o) {
                        if out[i].is_none() {
                            left -= 1;
                        }
                        out[i] = Some(*r);
                    }
                }
                Err(_) => break,
            }
        }
        for l in self.loops.drain(..) {
            l.end();
        }
        out.into_iter().map(Option::unwrap_or_default).collect()
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
