//! The shard's runtime on monoio (`--driver uring|epoll|auto`): building it
//! (io_uring or epoll) and [`Runtime`] over its sockets, tasks and timer. The
//! loops themselves are runtime-free.

use super::{Runtime, StartError};
use crate::node::Driver;
use crate::sys;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// Which monoio driver a shard's runtime was built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Built {
    /// io_uring: the shard can batch its sends through a ring of its own.
    IoUring,
    /// epoll.
    Epoll,
}

impl Built {
    /// The driver's name, as `/metrics` and the log give it.
    pub fn name(self) -> &'static str {
        match self {
            Built::IoUring => "io_uring",
            Built::Epoll => "epoll",
        }
    }
}

/// Builds shard `shard`'s monoio runtime (io_uring for `uring`, and for
/// `auto` where the kernel allows it, else epoll) and runs the future `make`
/// gives for it until it ends; `Err` says why no runtime could be built.
pub fn block_on<F: Future<Output = ()>>(
    driver: Driver,
    shard: usize,
    make: impl FnOnce(Built) -> F,
) -> Result<(), StartError> {
    #[cfg(target_os = "linux")]
    if driver != Driver::Epoll {
        match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(4096)
            .enable_timer()
            .build()
        {
            Ok(mut rt) => {
                rt.block_on(make(Built::IoUring));
                return Ok(());
            }
            Err(e) if driver == Driver::Uring => return Err(StartError::NoIoUring(e)),
            Err(e) => {
                if shard == 0 {
                    tracing::warn!(error = %e, "io_uring unavailable, falling back to epoll");
                }
            }
        }
    }
    match monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(mut rt) => {
            rt.block_on(make(Built::Epoll));
            Ok(())
        }
        Err(e) => Err(StartError::NoEpoll(e)),
    }
}

/// monoio, on whichever driver the thread's runtime was built with.
pub enum Monoio {}

impl Runtime for Monoio {
    type Listener = TcpListener;
    type Stream = TcpStream;

    fn listener(std: std::net::TcpListener) -> io::Result<TcpListener> {
        TcpListener::from_std(std)
    }

    fn spawn(task: impl Future<Output = ()> + 'static) {
        monoio::spawn(task);
    }

    fn sleep_until(at: Instant) -> impl Future<Output = ()> {
        monoio::time::sleep_until(at.into())
    }

    async fn accept(listener: &TcpListener) -> io::Result<TcpStream> {
        listener.accept().await.map(|(stream, _peer)| stream)
    }

    fn fd(stream: &TcpStream) -> RawFd {
        stream.as_raw_fd()
    }

    async fn read(stream: &mut TcpStream, buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
        stream.read(buf).await
    }

    async fn write_all(stream: &mut TcpStream, buf: Vec<u8>) -> io::Result<()> {
        stream.write_all(buf).await.0.map(drop)
    }

    /// A poll on io_uring, the readiness state on epoll (checked with
    /// `poll(2)`, since the reads themselves bypass the runtime).
    async fn readable(stream: &TcpStream) -> io::Result<()> {
        loop {
            match stream.readable(false).await {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                done => return done,
            }
        }
    }

    async fn writable(stream: &TcpStream) -> io::Result<()> {
        loop {
            match stream.writable(false).await {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                done => return done,
            }
        }
    }

    fn try_recv(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        sys::recv_now(stream.as_raw_fd(), buf)
    }

    fn try_send(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        sys::send_now(stream.as_raw_fd(), buf)
    }
}
