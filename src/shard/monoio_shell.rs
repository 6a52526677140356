//! A shard on monoio (`--driver uring|epoll|auto`): the runtime, and only its
//! loops — accepting, reading a head under its deadline, the reader of each
//! connection (and its writer while its socket is full), and the shard's clock. Every runtime-free step is in
//! `steps.rs`, shared with `tokio_shell.rs`, which mirrors this file.

use super::handshake::Accepted;
use super::response::Response;
use super::steps::{self, HeadOutcome, Next, ReadStep, Wait, HEAD_DEADLINE};
use super::{ConnIo, Ready, ShardCtx, Socket};
use crate::cli::Driver;
use crate::clock;
use crate::metrics::Refusal;
use bytes::{Buf, Bytes};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use shards::ConnId;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

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
            Ok(rt) => {
                match super::send_ring::SendRing::new() {
                    Ok(ring) => *ctx.send_ring.borrow_mut() = Some(ring),
                    Err(e) => {
                        tracing::warn!(error = %e, shard = ctx.index, "no io_uring for batched sends: one send(2) per frame")
                    }
                }
                return serve_on(rt, "io_uring", ctx, listener, ready);
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
        Ok(rt) => serve_on(rt, "epoll", ctx, listener, ready),
        Err(e) => {
            let _ = ready.send(Err(format!("epoll runtime failed: {e}")));
        }
    }
}

/// The shard's life on a built runtime (either driver): its clock, and the
/// accept loop on its listener.
fn serve_on<D: monoio::Driver>(
    mut rt: monoio::Runtime<D>,
    name: &'static str,
    ctx: Rc<ShardCtx>,
    listener: std::net::TcpListener,
    ready: Ready,
) {
    rt.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(format!("listener setup failed: {e}")));
                return;
            }
        };
        if ctx.index == 0 {
            tracing::info!("shards run on {name}");
        }
        let _ = ready.send(Ok(name));
        drop(ready);
        monoio::spawn(tick_loop(Rc::clone(&ctx)));
        accept_loop(ctx, listener).await
    });
}

/// The feed-render-sleep loop ([`steps::step`]) with monoio's timer.
async fn tick_loop(ctx: Rc<ShardCtx>) {
    loop {
        let deadline = steps::step(&ctx);
        Wait {
            ctx: &ctx,
            sleep: deadline
                .map(|ms| Box::pin(monoio::time::sleep_until(clock::instant_at(ms).into()))),
        }
        .await;
    }
}

/// Accepts connections until the listener fails.
async fn accept_loop(ctx: Rc<ShardCtx>, listener: TcpListener) {
    super::pages::prepare();
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                monoio::spawn(serve(Rc::clone(&ctx), stream));
            }
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, shard = ctx.index, "accept failed");
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn read_head(stream: &mut TcpStream) -> HeadOutcome {
    let deadline = monoio::time::Instant::now() + HEAD_DEADLINE;
    let mut head: Vec<u8> = Vec::new();
    let mut buf = Vec::with_capacity(2048);
    loop {
        let read = monoio::time::timeout_at(deadline, stream.read(buf)).await;
        let (res, b) = match read {
            Ok(r) => r,
            Err(_) => return HeadOutcome::Refused(Refusal::HeadTimeout, None),
        };
        buf = b;
        match res {
            Ok(0) | Err(_) => return HeadOutcome::Gone,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if let Some(outcome) = steps::parse_head(&mut head) {
            return outcome;
        }
    }
}

async fn respond(mut stream: TcpStream, resp: Response, head_only: bool) {
    let (_, _) = stream.write_all(resp.encode(head_only)).await;
    let _ = stream.shutdown().await;
}

async fn serve(ctx: Rc<ShardCtx>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (head, rest) = match read_head(&mut stream).await {
        HeadOutcome::Head(h, rest) => (h, rest),
        HeadOutcome::Refused(why, resp) => {
            ctx.node.metrics.refuse(why);
            if let Some(r) = resp {
                respond(stream, r, false).await;
            }
            return;
        }
        HeadOutcome::Gone => return,
    };
    match steps::route_head(&ctx, &head) {
        Next::Respond(resp, head_only) => respond(stream, resp, head_only).await,
        Next::Upgrade(accepted) => {
            drop(head);
            start(ctx, stream, accepted, rest).await
        }
    }
}

/// Sends the `101`, registers the connection with the shard, and hands it to
/// a reader task of its own, so nothing of the handshake stays alive for the
/// connection's life but its slot (in its [`ConnIo`]). Frames are written by
/// the shard's flush step, or by a writer task only while the socket is full
/// ([`write_loop`]).
async fn start(ctx: Rc<ShardCtx>, mut stream: TcpStream, accepted: Accepted, rest: Vec<u8>) {
    steps::pin_send_buffer(stream.as_raw_fd());
    let Accepted { upgrade, response } = accepted;
    let (res, _) = stream.write_all(response).await;
    if res.is_err() {
        return;
    }
    let fd = stream.as_raw_fd();
    let stream = Rc::new(stream);
    let (id, io) = steps::register(&ctx, upgrade, fd, Rc::clone(&stream) as Rc<dyn Socket>);
    let reading = steps::feed(&ctx, id, &rest);
    drop(rest);
    monoio::spawn(async move {
        if reading {
            read_loop(&ctx, id, &stream).await;
        }
        drop(stream);
        steps::writer_gone(&io).await;
        steps::finish(&ctx, &io, id);
    });
}

/// Waits for the socket to be readable and reads what it holds, until the
/// peer or the shard ends it. The wait holds no buffer (a poll on io_uring,
/// the readiness state on epoll, checked with `poll(2)` since the reads
/// themselves bypass the runtime).
async fn read_loop(ctx: &Rc<ShardCtx>, id: ConnId, stream: &TcpStream) {
    let fd = stream.as_raw_fd();
    loop {
        if stream.readable(false).await.is_err() {
            return;
        }
        match steps::read_step(ctx, id, |buf| steps::recv_now(fd, buf)) {
            ReadStep::Again => {}
            ReadStep::Stop => return,
        }
    }
}

impl Socket for TcpStream {
    fn spawn_writer(self: Rc<Self>, ctx: Rc<ShardCtx>, io: Rc<ConnIo>, id: ConnId, rest: Bytes) {
        monoio::spawn(write_loop(ctx, io, id, self, rest));
    }
}

/// A connection's writer while its socket is full: waits for room, writes
/// `frame` (the rest of the frame the socket did not take at once), then the
/// queue, and ends when the queue is empty. The flush step does not write this
/// socket meanwhile, so the task is its only writer.
async fn write_loop(
    ctx: Rc<ShardCtx>,
    io: Rc<ConnIo>,
    id: ConnId,
    stream: Rc<TcpStream>,
    mut frame: Bytes,
) {
    loop {
        while !frame.is_empty() {
            if stream.writable(false).await.is_err() {
                return steps::writer_failed(&io);
            }
            match steps::send_now(io.fd, &frame) {
                Ok(n) => {
                    frame.advance(n);
                    ctx.metrics().bytes_out.fetch_add(n as u64, Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return steps::writer_failed(&io),
            }
        }
        match steps::writer_next(&ctx, &io, id) {
            Some(f) => frame = f,
            None => return,
        }
    }
}
