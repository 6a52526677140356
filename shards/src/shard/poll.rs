//! The poll API the shell drains after every event: actions, ready
//! connections, the bytes to write, and when to call back.

use super::{Action, Shard, JOIN_MAX};
use crate::conn::ConnId;
use bytes::Bytes;
use std::cmp::Reverse;

impl Shard {
    /// When the shell must next call [`Shard::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<u64> {
        let render = self.scheduled.peek().map(|Reverse((due, _))| *due);
        [render, self.timers.next_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next thing the shell must do outside the shard.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// A connection that has frames to write.
    pub fn poll_ready(&mut self) -> Option<ConnId> {
        let id = self.ready.pop_front()?;
        if let Some(c) = self.conn_mut(id) {
            c.in_ready = false;
        }
        Some(id)
    }

    /// The next bytes the shell writes to `id` in one send (as quinn-proto's
    /// `poll_transmit`): its queued frames joined up to [`JOIN_MAX`] bytes (a
    /// larger frame goes alone), so frames queued in one round share a system
    /// call and a segment.
    pub fn poll_transmit(&mut self, id: ConnId) -> Option<Bytes> {
        self.conn_mut(id)?.queue.pop_joined(JOIN_MAX)
    }

    /// What [`Shard::poll_transmit`] gives, appended to `out` (the `101`'s
    /// buffer, so a new connection's first frames are copied once); false
    /// when nothing is queued.
    pub fn transmit_into(&mut self, id: ConnId, out: &mut Vec<u8>) -> bool {
        self.conn_mut(id)
            .is_some_and(|c| c.queue.pop_joined_into(out, JOIN_MAX))
    }

    /// The next frame to write to `id`, alone (what [`Shard::poll_transmit`]
    /// joins): tests and benches read frames one by one with it (feature
    /// `test-util`).
    #[cfg(any(test, feature = "test-util"))]
    pub fn poll_frame(&mut self, id: ConnId) -> Option<Bytes> {
        self.conn_mut(id)?.queue.pop()
    }
}
