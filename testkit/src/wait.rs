//! Polling for a condition, with a deadline.

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(Duration::from_millis(20), timeout, f)
}

/// Polls `f` every `every` until it returns `Some` or `timeout` passes
/// (a short `every` where the moment it holds is measured).
pub fn poll_every<T>(
    every: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(every);
    }
}
