//! What a shard's loops need of an async runtime, so that one set of loops
//! (`http/front_door.rs`, `conn/lifecycle.rs`, `conn/writing.rs`, `tick.rs`)
//! runs on every runtime: monoio on io_uring or epoll (`monoio_runtime.rs`)
//! and tokio (`tokio_runtime.rs`, feature `tokio-shell`). Everything here is
//! local to the shard thread, so nothing needs to be `Send`.

pub mod monoio_runtime;
#[cfg(feature = "tokio-shell")]
pub mod tokio_runtime;

use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// Why a shard thread does not serve: no runtime could be built, or its
/// listener could not be moved onto the runtime.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--driver uring` on a kernel without io_uring.
    #[error("io_uring unavailable: {0}")]
    NoIoUring(#[source] io::Error),
    /// The epoll runtime could not be built.
    #[error("epoll runtime failed: {0}")]
    NoEpoll(#[source] io::Error),
    /// The tokio runtime could not be built.
    #[error("tokio runtime failed: {0}")]
    NoTokio(#[source] io::Error),
    /// The listener could not be set up on the runtime.
    #[error("listener setup failed: {0}")]
    Listener(#[source] io::Error),
}

/// One runtime's sockets, tasks and timer, as the shard loops use them.
#[allow(async_fn_in_trait)]
pub trait Runtime: 'static {
    /// The listening socket of the shard.
    type Listener;
    /// An accepted connection.
    type Stream: 'static;

    /// The shard's listener on this runtime (called on the runtime's thread).
    fn listener(std: std::net::TcpListener) -> io::Result<Self::Listener>;
    /// Runs `task` on this shard thread.
    fn spawn(task: impl Future<Output = ()> + 'static);
    /// A future ready at `at`.
    fn sleep_until(at: Instant) -> impl Future<Output = ()>;
    /// The next accepted connection.
    async fn accept(listener: &Self::Listener) -> io::Result<Self::Stream>;
    /// The socket of a connection, for the shard's sends and socket options
    /// (`conn/sends.rs`, `conn/sockopt.rs`); no loop writes to it itself.
    fn fd(stream: &Self::Stream) -> RawFd;
    /// Reads into `buf` from its start, up to its capacity: `buf[..n]` holds
    /// what came (the request head, before the upgrade).
    async fn read(stream: &mut Self::Stream, buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>);
    /// Writes all of `buf` (a plain HTTP answer, or the `101`).
    async fn write_all(stream: &mut Self::Stream, buf: Vec<u8>) -> io::Result<()>;
    /// Waits until the socket has something to read, holding no buffer. A
    /// signal during the wait is not an error: an error ends the connection
    /// (monoio's epoll driver checks readiness with `poll(2)`, which fails
    /// with `EINTR` when a caught signal, SIGTERM's drain, lands in it).
    async fn readable(stream: &Self::Stream) -> io::Result<()>;
    /// Waits until the socket takes more bytes (a signal, as for `readable`,
    /// is not an error).
    async fn writable(stream: &Self::Stream) -> io::Result<()>;
    /// One non-blocking read (`WouldBlock` when nothing is there).
    fn try_recv(stream: &Self::Stream, buf: &mut [u8]) -> io::Result<usize>;
    /// One non-blocking write (`WouldBlock` when the send buffer is full).
    fn try_send(stream: &Self::Stream, buf: &[u8]) -> io::Result<usize>;
}

/// `fut`, unless `at` passes first (`Err(())`).
pub async fn until<R: Runtime, T>(at: Instant, fut: impl Future<Output = T>) -> Result<T, ()> {
    let sleep = R::sleep_until(at);
    let mut fut = std::pin::pin!(fut);
    let mut sleep = std::pin::pin!(sleep);
    std::future::poll_fn(|cx: &mut Context<'_>| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut sleep).as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(())),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}
