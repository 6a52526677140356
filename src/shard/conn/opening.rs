//! Upgrades whose `101` waits for the board of a course they named
//! (`/ws?course=C`, `/sse?course=C`) that this shard holds no board of yet.
//! When the course's seed comes, the `101` (or the SSE response head), the
//! `hello` and the board go out in one write, as they do at once for a course
//! the shard already holds (contract section 5): one send instead of two, and
//! the viewer's first flight carries its board. The ingest thread answers
//! every interest within its seed patience (2 s, with what the node holds if
//! Redis has not answered; at once while Redis is down), so no head waits longer.

use super::io::ConnIo;
use shards::{ConnId, Shard};
use std::rc::Rc;

/// One upgrade waiting for its boards.
pub struct Opening {
    /// The connection, registered with the core.
    pub id: ConnId,
    /// Its shell half (the socket stays open with it).
    pub io: Rc<ConnIo>,
    /// The response head that goes first once its boards are in.
    pub head: Vec<u8>,
}

/// The shard's upgrades waiting for boards (a few at a time: only the first
/// viewers of a course new to the shard, for one seed's round trip; more
/// while a silent Redis keeps seeds waiting for their patience, so they are
/// looked at only when the core says a wait may have ended).
#[derive(Default)]
pub struct Openings {
    held: Vec<Opening>,
    /// The core's [`Shard::wait_ends`] when `held` was last looked at.
    looked: u64,
}

impl Openings {
    /// Holds connection `id`'s response head until its boards are in.
    pub fn hold(&mut self, id: ConnId, io: Rc<ConnIo>, head: Vec<u8>) {
        self.held.push(Opening { id, io, head });
    }

    /// Drops `id`'s held head: it ended before its boards came.
    pub fn forget(&mut self, id: ConnId) {
        self.held.retain(|o| o.id != id);
    }

    /// The held upgrades whose boards are now all queued (or that the core
    /// no longer holds), taken out; empty (and no allocation) while none
    /// waits or no wait can have ended since the last look. (A head is held
    /// only while [`Shard::awaits_seed`] is true, so a new one needs no look.)
    pub fn take_ready(&mut self, shard: &Shard) -> Vec<Opening> {
        let ends = shard.wait_ends();
        if self.held.is_empty() || ends == self.looked {
            return Vec::new();
        }
        self.looked = ends;
        let (ready, waiting) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|o| !shard.awaits_seed(o.id));
        self.held = waiting;
        ready
    }
}
