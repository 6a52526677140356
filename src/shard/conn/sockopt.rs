//! The few socket system calls the shard makes itself on a connection's
//! socket, beside its runtime's and its sends': the kernel's count of unsent
//! bytes, the reset-on-close option, and shutdown. (`TCP_NODELAY` and the pinned
//! send buffer are the listener's, inherited by every accepted socket.)

use std::os::fd::RawFd;

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

/// Shuts down the writing half of socket `fd` (a FIN after what was sent).
pub fn shutdown_write(fd: RawFd) {
    // SAFETY: `fd` is an open socket owned by the caller; shutdown does not
    // close the descriptor.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
}

/// Shuts down both halves of socket `fd`: the reader sees its end, and
/// nothing more is sent.
pub fn shutdown_both(fd: RawFd) {
    // SAFETY: as for `shutdown_write`.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}
