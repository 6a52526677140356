//! The shard's runtime on monoio (`--driver uring|epoll|auto`): building it
//! (io_uring, with the batched send ring, or epoll) and [`Runtime`] over its
//! sockets, tasks and timer. The loops themselves are runtime-free.

use super::runtime::Runtime;
use super::{sockopt, Ready, ShardCtx};
use crate::cli::Driver;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Instant;

/// Runs one shard on a monoio runtime until it ends: io_uring for `uring`
/// (and for `auto` where the kernel allows it), else epoll.
pub fn run(ctx: Rc<ShardCtx>, listener: std::net::TcpListener, driver: Driver, ready: Ready) {
    #[cfg(target_os = "linux")]
    if driver != Driver::Epoll {
        match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(4096)
            .enable_timer()
            .build()
        {
            Ok(mut rt) => {
                match super::send_ring::SendRing::new() {
                    Ok(ring) => *ctx.send_ring.borrow_mut() = Some(ring),
                    Err(e) => {
                        tracing::warn!(error = %e, shard = ctx.index, "no io_uring for batched sends: one send(2) per frame")
                    }
                }
                return rt.block_on(super::serve::<Monoio>(ctx, listener, "io_uring", ready));
            }
            Err(e) if driver == Driver::Uring => {
                let _ = ready.send(Err(format!("io_uring unavailable: {e}")));
                return;
            }
            Err(e) => {
                if ctx.index == 0 {
                    tracing::warn!(error = %e, "io_uring unavailable, falling back to epoll");
                }
            }
        }
    }
    match monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(mut rt) => rt.block_on(super::serve::<Monoio>(ctx, listener, "epoll", ready)),
        Err(e) => {
            let _ = ready.send(Err(format!("epoll runtime failed: {e}")));
        }
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
        stream.readable(false).await
    }

    async fn writable(stream: &TcpStream) -> io::Result<()> {
        stream.writable(false).await
    }

    fn try_recv(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        sockopt::recv_now(stream.as_raw_fd(), buf)
    }

    fn try_send(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        sockopt::send_now(stream.as_raw_fd(), buf)
    }
}
