//! The few socket system calls the shard makes itself, beside its runtime's:
//! non-blocking `send`/`recv` on a raw descriptor, the kernel's count of
//! unsent bytes, and the reset-on-close option. (`TCP_NODELAY` and the pinned
//! send buffer are the listener's, inherited by every accepted socket.)

use std::io::{self, ErrorKind};
use std::os::fd::RawFd;

/// One non-blocking `recv(2)` on socket `fd`.
pub fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `fd` is the open socket of a connection whose reader is running
    // (the socket is released only after the reader ends), and `buf` is valid
    // for writes of `buf.len()` bytes.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One non-blocking `send(2)` of `buf` on socket `fd`: the bytes taken, or
/// `WouldBlock` when the send buffer is full.
pub fn send_now(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `fd` is an open socket of a live connection (the caller
        // found it in the shard's map, which `finish` leaves before the
        // socket is released), and `buf` is valid for `buf.len()` bytes.
        let n = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Bytes the kernel still holds for the peer on socket `fd` (sent or not, but
/// not acknowledged); `None` if the kernel does not say.
pub fn unsent_bytes(fd: RawFd) -> Option<usize> {
    let mut unsent: libc::c_int = 0;
    // SAFETY: `fd` is an open socket owned by the caller; TIOCOUTQ writes one
    // c_int to a live local.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut unsent) } == 0;
    ok.then_some(unsent.max(0) as usize)
}

/// Makes the close of socket `fd` a reset (SO_LINGER 0): the kernel drops
/// what it still holds instead of keeping an orphaned socket to deliver it.
pub fn reset_on_close(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `fd` is an open socket owned by the caller; the option value
    // points to a live `linger` of the length passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}
