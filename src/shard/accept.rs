//! The front door of one shard: accepts sockets from its own SO_REUSEPORT
//! listener, reads the request head under a deadline and a size cap, and routes.

use super::handshake::{self, Accepted};
use super::http::{self, Response, Route};
use super::ws_conn;
use super::ShardCtx;
use crate::metrics::Refusal;
use monoio::io::AsyncReadRent;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use shards::http_head::{self, HeadError, RequestHead, MAX_HEAD};
use std::rc::Rc;
use std::time::Duration;

/// A head not complete in this long is dropped (slowloris).
pub(super) const HEAD_DEADLINE: Duration = Duration::from_secs(5);

/// Accepts connections until the listener fails.
pub async fn accept_loop(ctx: Rc<ShardCtx>, listener: TcpListener) {
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

/// What reading a request head came to.
pub(super) enum HeadOutcome {
    /// A complete head, and the bytes read past it.
    Head(Box<RequestHead>, Vec<u8>),
    /// Refused (timeout, too large, malformed), with the answer to send, if any.
    Refused(Refusal, Option<Response>),
    /// The peer went away.
    Gone,
}

/// Parses what has been read so far; `None` means read more.
pub(super) fn parse_head(head: &mut Vec<u8>) -> Option<HeadOutcome> {
    match http_head::parse(head) {
        Ok(Some((h, used))) => Some(HeadOutcome::Head(Box::new(h), head.split_off(used))),
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
pub(super) enum Next {
    /// Answer with this response (`true`: head only) and close.
    Respond(Response, bool),
    /// Upgrade: every check passed.
    Upgrade(Accepted),
}

/// Routes a parsed head: pages, method checks, and the handshake's refusals.
pub(super) fn route_head(ctx: &ShardCtx, head: &RequestHead) -> Next {
    let head_only = head.method == "HEAD";
    match http::route(&head.path) {
        Route::NotFound => Next::Respond(Response::text(404, "not found"), head_only),
        Route::Page(p) if head.method == "GET" || head_only => {
            Next::Respond(http::answer(&ctx.node, p, head), head_only)
        }
        Route::Ws { admin } if head.method == "GET" => match handshake::check(ctx, head, admin) {
            Err(resp) => Next::Respond(resp, false),
            Ok(accepted) => Next::Upgrade(accepted),
        },
        route => {
            let allow = if matches!(route, Route::Ws { .. }) {
                "GET"
            } else {
                "GET, HEAD"
            };
            let resp = Response::text(405, "method not allowed").header(format!("Allow: {allow}"));
            Next::Respond(resp, false)
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
        if let Some(outcome) = parse_head(&mut head) {
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
    match route_head(&ctx, &head) {
        Next::Respond(resp, head_only) => respond(stream, resp, head_only).await,
        Next::Upgrade(accepted) => {
            drop(head);
            ws_conn::start(ctx, stream, accepted, rest).await
        }
    }
}
