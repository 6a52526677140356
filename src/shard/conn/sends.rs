//! How a shard puts frames on the wire: one non-blocking `send(2)` per frame,
//! or (a shard on io_uring) its send ring, which batches a flush's sends into
//! a few submissions.

use super::io::ConnIo;
use super::send_ring::SendRing;
use shards::ConnId;
use std::os::fd::RawFd;
use std::rc::Rc;

/// A shard's batched sends, each tagged with its connection.
pub type ShardSends = SendRing<(ConnId, Rc<ConnIo>)>;

/// How this shard sends. (One per shard, so the ring is held in place: a box
/// would only add a step to every send.)
#[allow(clippy::large_enum_variant)]
pub enum Sends {
    /// One non-blocking `send(2)` per frame (epoll, tokio, or no io_uring
    /// for the ring).
    Direct,
    /// The flush step's sends batched through the shard's own io_uring.
    Ring(ShardSends),
}

impl Sends {
    /// The send ring for shard `shard` on io_uring, or direct sends if the
    /// kernel gives no ring.
    pub fn batched(shard: usize) -> Self {
        match SendRing::new() {
            Ok(ring) => Sends::Ring(ring),
            Err(e) => {
                tracing::warn!(error = %e, shard, "no io_uring for batched sends: one send(2) per frame");
                Sends::Direct
            }
        }
    }

    /// Makes socket `fd` of connection `id` known to the sends (the ring's
    /// table of registered sockets); it must stay open until [`release`](Self::release).
    pub fn register(&mut self, id: ConnId, fd: RawFd) {
        if let Sends::Ring(ring) = self {
            ring.register(id.index(), fd);
        }
    }

    /// Forgets connection `id`'s socket (it closes after the round's changes go in).
    pub fn release(&mut self, id: ConnId) {
        if let Sends::Ring(ring) = self {
            ring.unregister(id.index());
        }
    }

    /// Submits the round's changes (a release forces one: the ring's hold
    /// keeps a closed connection's socket open until then).
    pub fn submit_changes(&mut self) {
        if let Sends::Ring(ring) = self {
            ring.submit_changes();
        }
    }
}
