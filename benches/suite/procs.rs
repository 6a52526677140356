//! /proc sampling of the processes a scenario runs: CPU time and RSS,
//! per-thread CPU and wake-ups, the machine's idle time and load.

/// CPU time (utime + stime, µs) and RSS (KiB) of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// CPU time in µs.
    pub cpu_us: u64,
    /// Resident set in KiB.
    pub rss_kib: u64,
    /// Its anonymous part (heap, stacks) in KiB: what connections cost,
    /// without the binary's pages first touched meanwhile.
    pub rss_anon_kib: u64,
}

/// Reads /proc/<pid>/stat and /proc/<pid>/status.
pub fn usage(pid: u32) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let cpu_us = (ticks(11) + ticks(12)) * 1_000_000 / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Usage {
        cpu_us,
        rss_kib: kib("VmRSS:"),
        rss_anon_kib: kib("RssAnon:"),
    }
}

/// Sums `count(task dir)` over the threads of `pid`, by thread name
/// (threads of one name summed: both shards are `seatboard-shard`).
fn by_thread(
    pid: u32,
    count: impl Fn(&std::path::Path) -> u64,
) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in dir.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        *out.entry(name.trim().to_string()).or_default() += count(&path);
    }
    out
}

/// Context switches (voluntary + involuntary) of every thread of `pid`, by
/// thread name: each is a wake-up.
pub fn wakeups(pid: u32) -> std::collections::BTreeMap<String, u64> {
    by_thread(pid, |task| {
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    })
}

/// CPU time (utime + stime, µs) of every thread of `pid`, by thread name.
pub fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    by_thread(pid, |task| {
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        (ticks(11) + ticks(12)) * 1_000_000 / hz
    })
}

/// Machine-wide CPU ticks from /proc/stat: (idle incl. iowait, total).
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (idle, v.iter().take(8).sum())
}

/// Percent of the machine's CPU that was idle between two `machine_ticks`.
pub fn idle_pct(a: (u64, u64), b: (u64, u64)) -> f64 {
    let total = b.1.saturating_sub(a.1).max(1) as f64;
    b.0.saturating_sub(a.0) as f64 / total * 100.0
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}
