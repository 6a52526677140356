//! The front door of a shard: accepting connections, reading a request head
//! under its deadline, routing it (pages, JSON, the WebSocket handshake), and
//! writing the plain HTTP answers. An upgrade goes on to `conn/lifecycle.rs`.

use super::handshake::{self, Accepted};
use super::response::Response;
use super::routes::{self, Route};
use crate::metrics::Refusal;
use crate::shard::conn::{lifecycle, sockopt};
use crate::shard::ctx::ShardCtx;
use crate::shard::runtime::{self, Runtime};
use shards::http_head::{self, HeadError, RequestHead, MAX_HEAD};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A head not complete in this long is dropped (slowloris).
const HEAD_DEADLINE: Duration = Duration::from_secs(5);

/// How long the kernel holds a new connection that has sent nothing before
/// handing it to a shard anyway (the listener's `TCP_DEFER_ACCEPT`, whole
/// seconds: the first SYN-ACK retransmission, 1 s after the handshake); it
/// counts against the request head's deadline.
pub const DEFER_ACCEPT: Duration = Duration::from_secs(1);

/// Accepts connections until the listener fails.
pub async fn accept_loop<R: Runtime>(ctx: Rc<ShardCtx>, listener: R::Listener) {
    super::pages::prepare();
    loop {
        match R::accept(&listener).await {
            Ok(stream) => R::spawn(serve::<R>(Rc::clone(&ctx), stream)),
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, shard = ctx.index, "accept failed");
                R::sleep_until(Instant::now() + Duration::from_millis(50)).await;
            }
        }
    }
}

/// What reading a request head came to.
enum HeadOutcome {
    /// A complete head, where it goes (routed where its bytes are, which it
    /// borrows), and the bytes read past it.
    Routed(Next, Vec<u8>),
    /// Refused (timeout, too large, malformed), with the answer to send, if any.
    Refused(Refusal, Option<Response>),
    /// The peer went away.
    Gone,
}

/// One accepted connection: its head, then an answer or the upgrade.
async fn serve<R: Runtime>(ctx: Rc<ShardCtx>, mut stream: R::Stream) {
    let route = |head: &RequestHead<'_>| route_head(&ctx, head);
    let (next, rest) = match read_head::<R>(&mut stream, &route).await {
        HeadOutcome::Routed(next, rest) => (next, rest),
        HeadOutcome::Refused(why, resp) => {
            ctx.node.metrics.refuse(why);
            if let Some(r) = resp {
                respond::<R>(stream, r, false).await;
            }
            return;
        }
        HeadOutcome::Gone => return,
    };
    match next {
        Next::Respond(resp, head_only) => respond::<R>(stream, resp, head_only).await,
        Next::Upgrade(Accepted { upgrade, response }) => {
            lifecycle::start::<R, _>(ctx, stream, upgrade, response, rest).await
        }
    }
}

/// Reads a request head under [`HEAD_DEADLINE`] and routes it with `route`
/// where it was read (the parsed head borrows those bytes). The listener hands a
/// connection over once its first bytes have arrived
/// ([`DEFER_ACCEPT`]), so they are taken at once with one
/// `recv(2)`, not a read through the runtime, and a head that came whole (the
/// usual case) is parsed where it was read; one that takes several reads is
/// gathered in a buffer of its own. A connection handed over with nothing to
/// read has been silent for that second since its handshake, which counts
/// against its 5 s.
async fn read_head<R: Runtime>(
    stream: &mut R::Stream,
    route: &impl Fn(&RequestHead<'_>) -> Next,
) -> HeadOutcome {
    let accepted = Instant::now();
    let mut head = vec![0u8; 2048];
    let deadline = match crate::sys::recv_now(R::fd(stream), &mut head) {
        Ok(0) => return HeadOutcome::Gone,
        Ok(n) => {
            head.truncate(n);
            if let Some(outcome) = parse_head(&mut head, route) {
                return outcome;
            }
            accepted + HEAD_DEADLINE
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            head.clear();
            accepted + HEAD_DEADLINE - DEFER_ACCEPT
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
            head.clear();
            accepted + HEAD_DEADLINE
        }
        Err(_) => return HeadOutcome::Gone,
    };
    let mut buf = Vec::with_capacity(2048);
    loop {
        let (res, b) = match runtime::until::<R, _>(deadline, R::read(stream, buf)).await {
            Ok(r) => r,
            Err(()) => return HeadOutcome::Refused(Refusal::HeadTimeout, None),
        };
        buf = b;
        match res {
            Ok(0) | Err(_) => return HeadOutcome::Gone,
            Ok(_) if head.is_empty() => {
                if let Some(outcome) = parse_head(&mut buf, route) {
                    return outcome;
                }
                // Not whole yet: what came stays in `head`, reads go on in a new buffer.
                head = std::mem::replace(&mut buf, Vec::with_capacity(2048));
            }
            Ok(n) => {
                head.extend_from_slice(&buf[..n]);
                if let Some(outcome) = parse_head(&mut head, route) {
                    return outcome;
                }
            }
        }
    }
}

/// Parses what has been read so far and routes a complete head; `None`
/// means read more.
fn parse_head(
    head: &mut Vec<u8>,
    route: &impl Fn(&RequestHead<'_>) -> Next,
) -> Option<HeadOutcome> {
    match http_head::parse(head) {
        Ok(Some((h, used))) => {
            let next = route(&h);
            Some(HeadOutcome::Routed(next, head.split_off(used)))
        }
        Ok(None) if head.len() <= MAX_HEAD => None,
        Ok(None) | Err(HeadError::TooLarge) => Some(HeadOutcome::Refused(
            Refusal::HeadTooLarge,
            Some(Response::text(431, "request head too large")),
        )),
        Err(HeadError::Malformed) => Some(HeadOutcome::Refused(
            Refusal::BadRequest,
            Some(Response::text(400, "bad request")),
        )),
    }
}

/// Where a parsed request goes.
enum Next {
    /// Answer with this response (`true`: head only) and close.
    Respond(Response, bool),
    /// Upgrade: every check passed.
    Upgrade(Accepted),
}

/// Routes a parsed head: pages, method checks, and the handshake's refusals.
fn route_head(ctx: &ShardCtx, head: &RequestHead) -> Next {
    let head_only = head.method == "HEAD";
    match routes::route(head.path) {
        Route::NotFound => Next::Respond(Response::text(404, "not found"), head_only),
        Route::Page(p) if head.method == "GET" || head_only => {
            Next::Respond(routes::answer(&ctx.node, p, head), head_only)
        }
        // A request of another method that asks for an upgrade is a
        // malformed upgrade (section 4: 400), not a wrong method (405).
        Route::Ws { admin } if head.method == "GET" || head.asks_for_upgrade() => {
            match handshake::check(ctx, head, admin) {
                Err(resp) => Next::Respond(resp, head_only),
                Ok(accepted) => Next::Upgrade(accepted),
            }
        }
        Route::Sse if head.method == "GET" => route_sse(ctx, head),
        route => {
            let allow = if matches!(route, Route::Ws { .. } | Route::Sse) {
                "GET"
            } else {
                "GET, HEAD"
            };
            let resp = Response::text(405, "method not allowed").header(format!("Allow: {allow}"));
            Next::Respond(resp, false)
        }
    }
}

/// `/sse`: its checks, then the stream (it lives on as a connection, like an upgrade).
fn route_sse(ctx: &ShardCtx, head: &RequestHead) -> Next {
    match super::sse::check(ctx, head) {
        Err(resp) => Next::Respond(resp, false),
        Ok(accepted) => Next::Upgrade(accepted),
    }
}

/// A plain HTTP answer the client has not taken in this long is abandoned,
/// its socket reset (contract section 3).
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

/// Writes a plain HTTP answer and closes (FIN after it) once the client has
/// taken it; one it has not taken within [`ANSWER_DEADLINE`] is dropped with
/// a reset, so the node keeps no socket or kernel buffer for a client that
/// never reads.
async fn respond<R: Runtime>(mut stream: R::Stream, resp: Response, head_only: bool) {
    let deadline = Instant::now() + ANSWER_DEADLINE;
    let fd = R::fd(&stream);
    let write = R::write_all(&mut stream, resp.encode(head_only));
    let taken = match runtime::until::<R, _>(deadline, write).await {
        Ok(Ok(())) => {
            // The socket behind the fd is owned by `stream`, alive for the call.
            sockopt::shutdown_write(fd);
            taken_by::<R>(fd, deadline).await
        }
        Ok(Err(_)) => true,
        Err(()) => false,
    };
    if !taken {
        sockopt::reset_on_close(fd);
    }
}

/// Waits until the peer has acknowledged every byte the kernel holds for it on
/// socket `fd` (true), or `deadline` passes first (false).
async fn taken_by<R: Runtime>(fd: RawFd, deadline: Instant) -> bool {
    let mut pause = Duration::from_millis(5);
    loop {
        if sockopt::unsent_bytes(fd).is_none_or(|n| n == 0) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        R::sleep_until((now + pause).min(deadline)).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
