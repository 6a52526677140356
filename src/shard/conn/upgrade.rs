//! What an accepted upgrade (a WebSocket's `101` or an SSE stream's `200`)
//! brings to the connection's life: its place under the node's caps, its role
//! and its options.

use crate::node::Node;
use shards::Role;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// A connection's place under the node's `max-connections` and the user's
/// `max-conns-per-user`: taken by the handshake, given back when dropped,
/// however the connection ends.
pub struct Slot {
    node: Arc<Node>,
    user: Arc<str>,
}

impl Slot {
    /// Takes over a place the handshake has already counted in `node.open`
    /// and in the user's cap.
    pub fn held(node: Arc<Node>, user: Arc<str>) -> Self {
        Slot { node, user }
    }

    /// The user holding the slot.
    pub fn user(&self) -> &Arc<str> {
        &self.user
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.node.open.fetch_sub(1, Relaxed);
        self.node.users.release(&self.user);
    }
}

/// What an accepted upgrade brings to the connection's life.
pub struct Upgrade {
    /// The connection's slot, held until the connection is gone.
    pub slot: Slot,
    /// The token's role.
    pub role: Role,
    /// Connected on `/ws/admin`.
    pub admin_feed: bool,
    /// Negotiated permessage-deflate (section 4a).
    pub deflate: bool,
    /// A Server-Sent Events stream (section 4c), not a WebSocket.
    pub sse: bool,
    /// The courses named in the request (`?course=`): an SSE stream's (checked),
    /// or those a WebSocket watches from its start (section 5; the core refuses
    /// a bad one as it would a `watch`).
    pub courses: Vec<String>,
}
