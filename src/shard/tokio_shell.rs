//! A shard on tokio (`--driver tokio`, feature `tokio-shell`, for the runtime
//! comparison): a current-thread runtime and a `LocalSet`, and only its loops,
//! mirroring `monoio_shell.rs` function for function. Every runtime-free step
//! is in `steps.rs`.

use super::handshake::Accepted;
use super::response::Response;
use super::steps::{self, HeadOutcome, Next, ReadStep, Wait, HEAD_DEADLINE};
use super::{ConnIo, Ready, ShardCtx, Socket};
use crate::clock;
use crate::metrics::Refusal;
use bytes::{Buf, Bytes};
use shards::ConnId;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::spawn_local;

/// Runs one shard on its own tokio current-thread runtime until it ends.
pub fn run(ctx: Rc<ShardCtx>, listener: std::net::TcpListener, ready: Ready) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("tokio runtime failed: {e}")));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(format!("listener setup failed: {e}")));
                return;
            }
        };
        if ctx.index == 0 {
            tracing::info!("shards run on tokio");
        }
        let _ = ready.send(Ok("tokio"));
        drop(ready);
        spawn_local(tick_loop(Rc::clone(&ctx)));
        accept_loop(ctx, listener).await
    });
}

/// The feed-render-sleep loop ([`steps::step`]) with tokio's timer.
async fn tick_loop(ctx: Rc<ShardCtx>) {
    loop {
        let deadline = steps::step(&ctx);
        Wait {
            ctx: &ctx,
            sleep: deadline
                .map(|ms| Box::pin(tokio::time::sleep_until(clock::instant_at(ms).into()))),
        }
        .await;
    }
}

async fn accept_loop(ctx: Rc<ShardCtx>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                spawn_local(serve(Rc::clone(&ctx), stream));
            }
            Err(e) => {
                tracing::warn!(error = %e, shard = ctx.index, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn read_head(stream: &mut TcpStream) -> HeadOutcome {
    let deadline = tokio::time::Instant::now() + HEAD_DEADLINE;
    let mut head: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 2048];
    loop {
        let res = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(r) => r,
            Err(_) => return HeadOutcome::Refused(Refusal::HeadTimeout, None),
        };
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
    let _ = stream.write_all(&resp.encode(head_only)).await;
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
/// a reader task of its own, as the monoio shell does; a writer task runs only
/// while the socket is full ([`write_loop`]).
async fn start(ctx: Rc<ShardCtx>, mut stream: TcpStream, accepted: Accepted, rest: Vec<u8>) {
    steps::pin_send_buffer(stream.as_raw_fd());
    let Accepted { upgrade, response } = accepted;
    if stream.write_all(&response).await.is_err() {
        return;
    }
    drop(response);
    let fd = stream.as_raw_fd();
    let stream = Rc::new(stream);
    let (id, io) = steps::register(&ctx, upgrade, fd, Rc::clone(&stream) as Rc<dyn Socket>);
    let reading = steps::feed(&ctx, id, &rest);
    drop(rest);
    spawn_local(async move {
        if reading {
            read_loop(&ctx, id, &stream).await;
        }
        drop(stream);
        steps::writer_gone(&io).await;
        steps::finish(&ctx, &io, id);
    });
}

/// Waits for the socket to be readable and reads what it holds, as the monoio
/// shell does (no buffer held while waiting).
async fn read_loop(ctx: &Rc<ShardCtx>, id: ConnId, stream: &TcpStream) {
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match steps::read_step(ctx, id, |buf| stream.try_read(buf)) {
            ReadStep::Again => {}
            ReadStep::Stop => return,
        }
    }
}

impl Socket for TcpStream {
    fn spawn_writer(self: Rc<Self>, ctx: Rc<ShardCtx>, io: Rc<ConnIo>, id: ConnId, rest: Bytes) {
        spawn_local(write_loop(ctx, io, id, self, rest));
    }
}

/// A connection's writer while its socket is full, as in the monoio shell:
/// writes `frame`, then the queue, and ends when the queue is empty.
async fn write_loop(
    ctx: Rc<ShardCtx>,
    io: Rc<ConnIo>,
    id: ConnId,
    stream: Rc<TcpStream>,
    mut frame: Bytes,
) {
    loop {
        while !frame.is_empty() {
            if stream.writable().await.is_err() {
                return steps::writer_failed(&io);
            }
            match stream.try_write(&frame) {
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
