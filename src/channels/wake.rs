//! The ingest thread's mailbox: commands go over a channel, and each send also
//! bumps an eventfd, so the thread can sleep in `poll(2)` on its Redis socket
//! and that eventfd instead of waking every few milliseconds to look.

use crate::channels::IngestCmd;
use crossbeam_channel::{unbounded, Receiver, SendError, Sender};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// An eventfd that makes a sleeping ingest thread's `poll(2)` return.
#[derive(Debug)]
pub struct Wake {
    fd: OwnedFd,
}

impl Wake {
    fn new() -> io::Result<Wake> {
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

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full
        // counter (EAGAIN) already means "awake".
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter after a wake-up.
    fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
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
}

impl IngestRx {
    /// The next queued command, without waiting.
    pub fn try_recv(&self) -> Option<IngestCmd> {
        self.rx.try_recv().ok()
    }

    /// Sleeps until `fd` (if any) is readable, a command is sent, or `timeout`
    /// passes (`None`: no deadline).
    pub fn wait(&self, fd: Option<RawFd>, timeout: Option<Duration>) {
        let mut fds = [
            libc::pollfd {
                fd: self.wake.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as i32);
        // SAFETY: `fds` is a live array of 2 pollfd; a negative fd is ignored.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if fds[0].revents != 0 {
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
        IngestRx { rx, wake },
    ))
}
