//! Non-blocking `send(2)`/`recv(2)` on a socket's descriptor, for the reads
//! and writes that bypass a runtime's driver (monoio's `try_recv` and
//! `try_send`, a shard's direct sends, the pub/sub connection's reads).

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
