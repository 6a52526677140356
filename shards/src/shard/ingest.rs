//! What the ingest and presence threads feed a shard: snapshots, seeds
//! answering its interest in a course, viewer counts, and the gates that
//! decide when a snapshot must wake it.

use super::Shard;
use crate::conn::ConnId;
use crate::course::Viewer;
use crate::gate::Gate;
use crate::server_msg;
use crate::snapshot::Snapshot;
use crate::sse_event;
use bytes::Bytes;
use std::sync::Arc;

impl Shard {
    /// The gate of a course watched here: shared with the ingest thread, so
    /// that a snapshot wakes this shard only when its frame is due before the
    /// shard's own timer.
    pub fn gate(&self, course: &str) -> Option<Gate> {
        self.courses.get(course).map(|c| c.gate.clone())
    }

    /// A snapshot routed here by the ingest thread.
    pub fn handle_snapshot(&mut self, snap: &Arc<Snapshot>) {
        let Some(c) = self.courses.get_mut(&*snap.course) else {
            return;
        };
        if c.apply(snap) {
            self.stats.snapshots_applied += 1;
            let name = Arc::clone(&c.name);
            self.schedule(&name);
        }
    }

    /// The current board of a course, answering this shard's interest in it.
    pub fn handle_seed(&mut self, course: &str, sections: &[Arc<Snapshot>], now_ms: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        for s in sections {
            c.apply_seed(s);
        }
        if !c.seeded {
            // Every viewer of an unseeded course is waiting for this seed and gets
            // the whole board in its answer: nothing is left to send as a delta.
            c.dirty.clear();
        }
        // Watchers waiting for the seed get everything in their answer.
        c.seeded = true;
        self.wait_ends += 1;
        let waiting = std::mem::take(&mut c.awaiting_seed);
        let name = Arc::clone(&c.name);
        for id in waiting {
            self.answer_watch(id, &name, now_ms);
        }
        self.schedule(&name);
    }

    /// The global viewer count of a course from the presence layer.
    pub fn handle_presence(&mut self, course: &str, viewers: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if c.presence == Some(viewers) && !c.presence_mixed {
            return;
        }
        c.presence = Some(viewers);
        c.presence_mixed = false;
        let msg = server_msg::presence(course, viewers);
        c.presence_msg = Some(msg.clone());
        let count = Viewer::count(viewers);
        // Only to the viewers shown another count (a watch answer may have
        // shown this one already).
        let targets: Vec<ConnId> = c
            .viewers
            .iter_mut()
            .filter(|v| v.shown != count)
            .map(|v| {
                v.shown = count;
                v.conn
            })
            .collect();
        // Wrapped once, for the first SSE viewer, and shared by the rest.
        let mut as_sse: Option<Bytes> = None;
        for id in targets {
            if self.conn(id).is_some_and(|c| c.transport.is_sse()) && as_sse.is_none() {
                as_sse = sse_event::event(&msg);
            }
            if !self.send_or_drop_as(id, &msg, &msg, as_sse.as_ref()) {
                // No room: a full frame is owed, and the count goes with it
                // when the viewer heals (a count is sent only when it
                // changes, so a dropped one would never come again).
                self.owe_full(id, course);
            }
        }
    }
}
