//! The process's own CPU time (the kernel's process CPU clock, in
//! nanoseconds) and resident memory (`/proc/self`, Linux), for the standard
//! `process_cpu_seconds_total` and `process_resident_memory_bytes` of
//! `/metrics`.

/// User plus system CPU time of the whole process, in seconds: the process
/// CPU clock, which moves with any work (`/proc/self/stat` counts in 10 ms
/// ticks and can read 0 for a process that has worked); `/proc/self/stat`
/// only if that clock cannot be read; 0 if neither can.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a live local.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
        return ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    }
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| cpu_ticks(&s))
        .map_or(0.0, |t| t as f64 / clock_ticks())
}

/// Resident set size in bytes (0 if unreadable).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page_size())
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line; the
/// command name in parentheses may hold spaces, so fields count from its `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no pointer involved.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no pointer involved.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_counted_after_a_command_name_with_spaces() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 1 0 5 1000 200";
        assert_eq!(cpu_ticks(line), Some(280));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let mut x = 0u64;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(cpu_seconds() > 0.0);
        assert!(resident_bytes() > 1 << 20);
    }
}
