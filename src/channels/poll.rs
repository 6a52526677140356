//! The one `poll(2)` wrapper: every thread that sleeps on descriptors (the
//! ingest mailbox and its sockets, the hub's wake-up, the workers' HTTP
//! endpoint) waits through [`poll`].

use std::time::Duration;

/// A `pollfd` asking for `events` on `fd`.
pub fn interest(fd: std::os::fd::RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Sleeps until one of `fds` is ready or `timeout` passes (`None`: no
/// deadline; rounded up to whole milliseconds, so a deadline is never woken
/// for early). Returns how many are ready (0 on the deadline, an interrupted
/// call or an error: the caller looks at its state and waits again).
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> usize {
    let ms = timeout.map_or(-1, |t| {
        t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
    });
    // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()`
    // pollfds that poll(2) only writes `revents` of.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    usize::try_from(n).unwrap_or(0)
}

/// Waits up to `timeout` until one of `fds` is readable; which ones are.
pub fn wait_readable(fds: &[std::os::fd::RawFd], timeout: Duration) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| interest(fd, libc::POLLIN)).collect();
    if poll(&mut p, Some(timeout)) == 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|x| x.revents != 0).collect()
}
