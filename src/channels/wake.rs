//! The one way to wake a sleeping thread, an eventfd ([`Wake`]: the hub's
//! signals and failures, the ingest mailbox), and the ingest thread's
//! mailbox: commands go over a channel, and each send also bumps the eventfd,
//! so the thread can sleep in `poll(2)` on its source's sockets and that
//! eventfd instead of waking every few milliseconds to look.

use crate::channels::{poll, IngestCmd};
use crossbeam_channel::{unbounded, Receiver, SendError, Sender};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// An eventfd that makes a sleeping thread's `poll(2)` return; [`Wake::wake`]
/// is one `write(2)`, so a signal handler may call it.
#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
}

impl Wake {
    /// A fresh eventfd, not signalled.
    pub fn new() -> io::Result<Wake> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(Wake {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes a `poll(2)` on [`Wake::fd`] return.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full
        // counter (EAGAIN) already means "awake".
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter after a wake-up.
    pub fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sleeps until woken or `timeout` passes, and resets the counter.
    pub fn wait(&self, timeout: Duration) {
        let mut fd = [poll::interest(self.fd(), libc::POLLIN)];
        if poll::poll(&mut fd, Some(timeout)) > 0 {
            self.drain();
        }
    }
}

/// The sending side: shards and the presence worker hold clones.
#[derive(Debug, Clone)]
pub struct IngestTx {
    tx: Sender<IngestCmd>,
    wake: Arc<Wake>,
}

impl IngestTx {
    /// Queues a command and wakes the ingest thread.
    pub fn send(&self, cmd: IngestCmd) -> Result<(), SendError<IngestCmd>> {
        let r = self.tx.send(cmd);
        self.wake.wake();
        r
    }
}

/// The ingest thread's side.
pub struct IngestRx {
    rx: Receiver<IngestCmd>,
    wake: Arc<Wake>,
    /// Reused by every wait: the eventfd, then the source's sockets.
    pollfds: Vec<libc::pollfd>,
}

impl IngestRx {
    /// The next queued command, without waiting.
    pub fn try_recv(&self) -> Option<IngestCmd> {
        self.rx.try_recv().ok()
    }

    /// Sleeps until one of `fds` is readable, a command is sent, or `timeout`
    /// passes (`None`: no deadline; rounded up to whole milliseconds, so a
    /// deadline is never woken for early).
    pub fn wait(&mut self, fds: &[RawFd], timeout: Option<Duration>) {
        self.pollfds.clear();
        self.pollfds.extend(
            std::iter::once(self.wake.fd())
                .chain(fds.iter().copied())
                .map(|fd| poll::interest(fd, libc::POLLIN)),
        );
        poll::poll(&mut self.pollfds, timeout);
        if self.pollfds[0].revents != 0 {
            self.wake.drain();
        }
    }
}

/// A command channel to the ingest thread and its wake-up.
pub fn channel() -> io::Result<(IngestTx, IngestRx)> {
    let wake = Arc::new(Wake::new()?);
    let (tx, rx) = unbounded();
    Ok((
        IngestTx {
            tx,
            wake: Arc::clone(&wake),
        },
        IngestRx {
            rx,
            wake,
            pollfds: Vec::new(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A pipe: (read end, write end).
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a live array of two ints; the result is checked.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are fresh and owned by nobody else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn write_byte(fd: &OwnedFd) {
        // SAFETY: writes one byte from a live buffer to a pipe we own.
        assert_eq!(
            unsafe { libc::write(fd.as_raw_fd(), b"x".as_ptr().cast(), 1) },
            1
        );
    }

    #[test]
    fn a_wait_ends_on_any_socket_a_command_or_the_deadline() {
        let (tx, mut rx) = channel().expect("eventfd");
        let (a, _a_w) = pipe();
        let (b, b_w) = pipe();
        let fds = [a.as_raw_fd(), b.as_raw_fd()];
        // Nothing readable: the deadline, not before (rounded up, never early).
        let t = Instant::now();
        rx.wait(&fds, Some(Duration::from_micros(30_500)));
        assert!(
            t.elapsed() >= Duration::from_micros(30_500),
            "{:?}",
            t.elapsed()
        );
        // The second of several sockets readable: at once, however long the deadline.
        write_byte(&b_w);
        let t = Instant::now();
        rx.wait(&fds, None);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop((b, b_w));
        // A command: at once, and the wake-up is drained (the next wait sleeps).
        tx.send(IngestCmd::Shutdown).expect("send");
        let t = Instant::now();
        rx.wait(&fds[..1], Some(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(matches!(rx.try_recv(), Some(IngestCmd::Shutdown)));
        let t = Instant::now();
        rx.wait(&fds[..1], Some(Duration::from_millis(20)));
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
    }
}
