//! The shard's runtime on tokio (`--driver tokio`, feature `tokio-shell`, for
//! the runtime comparison): a current-thread runtime and a `LocalSet`, and
//! [`Runtime`] over its sockets, tasks and timer. The loops themselves are
//! runtime-free.

use super::{Runtime, StartError};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Builds a tokio current-thread runtime and a `LocalSet` and runs `task`
/// on them until it ends; `Err` says why no runtime could be built.
pub fn block_on(task: impl Future<Output = ()>) -> Result<(), StartError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(StartError::NoTokio)?;
    tokio::task::LocalSet::new().block_on(&rt, task);
    Ok(())
}

/// tokio's current-thread runtime, its tasks local to the shard thread.
pub enum Tokio {}

impl Runtime for Tokio {
    type Listener = TcpListener;
    type Stream = TcpStream;

    fn listener(std: std::net::TcpListener) -> io::Result<TcpListener> {
        std.set_nonblocking(true)?;
        TcpListener::from_std(std)
    }

    fn spawn(task: impl Future<Output = ()> + 'static) {
        tokio::task::spawn_local(task);
    }

    fn sleep_until(at: Instant) -> impl Future<Output = ()> {
        tokio::time::sleep_until(at.into())
    }

    async fn accept(listener: &TcpListener) -> io::Result<TcpStream> {
        listener.accept().await.map(|(stream, _peer)| stream)
    }

    fn fd(stream: &TcpStream) -> RawFd {
        stream.as_raw_fd()
    }

    async fn read(stream: &mut TcpStream, mut buf: Vec<u8>) -> (io::Result<usize>, Vec<u8>) {
        buf.resize(buf.capacity().max(1), 0);
        let res = stream.read(&mut buf).await;
        buf.truncate(*res.as_ref().unwrap_or(&0));
        (res, buf)
    }

    async fn write_all(stream: &mut TcpStream, buf: Vec<u8>) -> io::Result<()> {
        stream.write_all(&buf).await
    }

    async fn readable(stream: &TcpStream) -> io::Result<()> {
        stream.readable().await
    }

    async fn writable(stream: &TcpStream) -> io::Result<()> {
        stream.writable().await
    }

    /// tokio's own non-blocking read, so a `WouldBlock` clears its readiness.
    fn try_recv(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        stream.try_read(buf)
    }

    fn try_send(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        stream.try_write(buf)
    }
}
