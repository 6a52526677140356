//! The WebSocket front door: every refusal of the contract, cheapest first, all
//! before the upgrade.

use super::response::Response;
use crate::auth::Denied;
use crate::clock;
use crate::metrics::Refusal;
use crate::node::Compression;
use crate::node::Node;
use crate::shard::conn::{Slot, Upgrade};
use crate::shard::ctx::ShardCtx;
use shards::http_head::{RequestHead, UpgradeError};
use shards::Role;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tungstenite::handshake::derive_accept_key;

/// An upgrade that passed every check.
pub struct Accepted {
    /// The connection to be.
    pub upgrade: Upgrade,
    /// The `101` response.
    pub response: Vec<u8>,
}

fn retry_after(min_s: u64) -> String {
    format!("Retry-After: {}", min_s.max(1) + fastrand::u64(0..=2))
}

fn refuse(ctx: &ShardCtx, why: Refusal, resp: Response) -> Response {
    ctx.node.metrics.refuse(why);
    resp
}

/// Runs the checks in the contract's order: a request that is no valid
/// upgrade is answered before the accept bucket is charged.
pub fn check(
    ctx: &ShardCtx,
    head: &RequestHead<'_>,
    admin_feed: bool,
) -> Result<Accepted, Response> {
    let node = &ctx.node;
    let key = match head.check_upgrade() {
        Ok(k) => k,
        Err(UpgradeError::WrongVersion) => {
            return Err(refuse(
                ctx,
                Refusal::BadVersion,
                Response::text(426, "websocket version 13 required")
                    .header("Sec-WebSocket-Version: 13".into()),
            ))
        }
        Err(UpgradeError::Malformed) => {
            return Err(refuse(
                ctx,
                Refusal::BadUpgrade,
                Response::text(400, "not a websocket upgrade"),
            ))
        }
    };
    repeated_origin(ctx, head)?;
    // A request that is no upgrade at all takes no token from the bucket.
    let (slot, role) = admit(ctx, head, admin_feed)?;
    let (response, deflate) = switching_protocols(node, head, key);
    node.metrics.handshakes_accepted.fetch_add(1, Relaxed);
    Ok(Accepted {
        upgrade: Upgrade {
            slot,
            role,
            admin_feed,
            deflate,
            sse: false,
            courses: head.query_courses(),
        },
        response,
    })
}

/// More than one `Origin` header: 400, counted, before the accept bucket
/// (which one would the origin rule judge?). Shared by `/ws` and `/sse`.
pub fn repeated_origin(ctx: &ShardCtx, head: &RequestHead<'_>) -> Result<(), Response> {
    if head.repeated_origin() {
        return Err(refuse(
            ctx,
            Refusal::RepeatedOrigin,
            Response::text(400, "more than one Origin header"),
        ));
    }
    Ok(())
}

/// The checks after the request's own shape, shared by `/ws` and `/sse`:
/// accept bucket, origin, token, admin role, drain, node cap, per-user cap.
pub fn admit(
    ctx: &ShardCtx,
    head: &RequestHead<'_>,
    admin_feed: bool,
) -> Result<(Slot, Role), Response> {
    let node = &ctx.node;
    if let Err(wait_us) = node.accept_bucket.take(clock::now_us()) {
        return Err(refuse(
            ctx,
            Refusal::RateLimited,
            Response::text(503, "too many new connections")
                .header(retry_after(wait_us.div_ceil(1_000_000))),
        ));
    }
    if !node.origin_allowed(head) {
        return Err(refuse(
            ctx,
            Refusal::Origin,
            Response::text(403, "origin not allowed"),
        ));
    }
    let identity = match node.auth.identify(head) {
        Ok(identity) => identity,
        Err(Denied::Invalid) => {
            return Err(refuse(
                ctx,
                Refusal::Unauthorized,
                Response::text(401, "missing or invalid token"),
            ))
        }
        // Counted by the verifier (`seatboard_auth_key_unavailable_total`).
        Err(Denied::KeyUnavailable { retry_after_s }) => {
            return Err(Response::text(503, "signing key not available yet")
                .header(retry_after(retry_after_s)))
        }
    };
    if admin_feed && identity.role != Role::Admin {
        return Err(refuse(
            ctx,
            Refusal::Forbidden,
            Response::text(403, "admin token required"),
        ));
    }
    if node.draining() {
        return Err(refuse(
            ctx,
            Refusal::Draining,
            Response::text(503, "draining").header(retry_after(1)),
        ));
    }
    if node.open.fetch_add(1, Relaxed) >= node.config.max_connections {
        node.open.fetch_sub(1, Relaxed);
        return Err(refuse(
            ctx,
            Refusal::NodeFull,
            Response::text(503, "node full").header(retry_after(1)),
        ));
    }
    if !node
        .users
        .acquire(&identity.user, node.config.max_conns_per_user)
    {
        node.open.fetch_sub(1, Relaxed);
        return Err(refuse(
            ctx,
            Refusal::UserCap,
            Response::text(429, "too many connections for this user"),
        ));
    }
    let slot = Slot::held(Arc::clone(&ctx.node), identity.user);
    Ok((slot, identity.role))
}

/// The `101` for an accepted upgrade with key `key`, and whether it accepts
/// permessage-deflate (an offer that cannot be accepted as a whole is
/// ignored, never refused). Built in one buffer with room for the `hello`
/// that goes out in the same send.
fn switching_protocols(node: &Node, head: &RequestHead<'_>, key: &str) -> (Vec<u8>, bool) {
    let extensions = match (node.config.compression, head.ws_extensions.as_deref()) {
        (Compression::On, Some(offers)) => shards::deflate::negotiate(offers),
        _ => None,
    };
    (response_101(key, extensions), extensions.is_some())
}

/// The `101`'s bytes for key `key` with the accepted `extensions`, in a
/// buffer with room for the frames of the first send.
fn response_101(key: &str, extensions: Option<&str>) -> Vec<u8> {
    let mut response = Vec::with_capacity(FIRST_SEND_ROOM);
    response.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    response.extend_from_slice(derive_accept_key(key.as_bytes()).as_bytes());
    response.extend_from_slice(b"\r\n");
    if let Some(e) = extensions {
        response.extend_from_slice(b"Sec-WebSocket-Extensions: ");
        response.extend_from_slice(e.as_bytes());
        response.extend_from_slice(b"\r\n");
    }
    response.extend_from_slice(b"\r\n");
    response
}

/// Room for the `101` and the frames that follow it in the first send
/// (the `hello`, a small board): one allocation where most fit.
const FIRST_SEND_ROOM: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_101_carries_rfc_6455s_accept_key() {
        // The example of RFC 6455 section 1.3.
        let plain = response_101("dGhlIHNhbXBsZSBub25jZQ==", None);
        assert_eq!(
            std::str::from_utf8(&plain),
            Ok("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
        );
        let deflate = response_101("dGhlIHNhbXBsZSBub25jZQ==", Some("permessage-deflate"));
        assert!(deflate.ends_with(
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
        ));
    }
}
