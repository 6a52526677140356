//! Ending connections: a close with its grace and cut, the drain that spreads
//! reconnect hints and closes 1012 over a window, and the second signal.

use super::{Action, Shard, CLOSE_GRACE_MS};
use crate::conn::ConnId;
use crate::server_msg;
use crate::sse_event;
use crate::timer::Timer;
use crate::ws_codec::{close, close_frame};
use std::sync::Arc;

impl Shard {
    /// Closes a connection with `code` (a protocol violation found by the shell,
    /// a drain, a shutdown): unwatches everything and queues the close frame.
    pub fn close(&mut self, id: ConnId, code: u16, reason: &str) {
        let Some(conn) = self.conn(id) else { return };
        if !conn.phase.is_open() {
            return;
        }
        let courses: Vec<Arc<str>> = conn.watched.iter().map(|(c, _)| Arc::clone(c)).collect();
        for c in courses {
            self.unwatch(id, &c);
        }
        self.send_always(id, close_frame(code, reason));
        let cut_at = self.now_ms + CLOSE_GRACE_MS;
        if let Some(c) = self.conn_mut(id) {
            c.phase.start_close(code, cut_at);
        }
        // A stream with nothing queued (an SSE stream has no close frame)
        // still needs the write side to see it closing and end it.
        self.mark_ready(id);
        self.actions.push_back(Action::Close { conn: id, code });
        self.cuts.push_back((cut_at, id));
        self.arm_cut();
    }

    /// Starts a drain: every connection gets its reconnect hint and close 1012 at
    /// its own moment, uniformly spread over `window_ms`.
    pub fn start_drain(&mut self, now_ms: u64, window_ms: u64) {
        if self.draining {
            return;
        }
        self.draining = true;
        let ids: Vec<ConnId> = self.live_ids().collect();
        for id in ids {
            let at = now_ms
                + if window_ms == 0 {
                    0
                } else {
                    self.rand() % window_ms
                };
            self.drain_schedule.push((at, id));
        }
        self.drain_schedule.sort_unstable_by(|a, b| b.cmp(a));
        self.arm_drain();
    }

    /// Runs the drain timer until the next drain moment (or stops it).
    pub(super) fn arm_drain(&mut self) {
        let next = self.drain_schedule.last().map(|d| d.0);
        self.timers.set_or_stop(Timer::Drain, next);
    }

    /// Runs the cut timer until the next close grace ends (or stops it).
    fn arm_cut(&mut self) {
        let next = self.cuts.front().map(|c| c.0);
        self.timers.set_or_stop(Timer::Cut, next);
    }

    /// Hints and closes every connection whose drain moment came.
    pub(super) fn drain_due(&mut self, now_ms: u64) {
        while let Some(&(at, id)) = self.drain_schedule.last() {
            if at > now_ms {
                break;
            }
            self.drain_schedule.pop();
            if self.conn(id).is_some_and(|c| c.phase.is_open()) {
                let after = self.rand() % 5001;
                let hint = server_msg::reconnect(after);
                let as_sse = sse_event::reconnect(after, &hint);
                self.send_always_as(id, &hint, &hint, as_sse.as_ref());
                self.close(id, close::RESTART, "draining");
            }
        }
        self.arm_drain();
    }

    /// Second signal: closes every connection at once.
    pub fn close_all(&mut self, code: u16) {
        let ids: Vec<ConnId> = self.live_ids().collect();
        for id in ids {
            self.close(id, code, "");
        }
    }

    /// Cuts the closing connections whose close grace is over and whose
    /// socket is still open.
    pub(super) fn cut_due(&mut self, now_ms: u64) {
        while let Some(&(at, id)) = self.cuts.front() {
            if at > now_ms {
                break;
            }
            self.cuts.pop_front();
            if self
                .conn_mut(id)
                .is_some_and(|c| c.phase.cut_if_due(now_ms))
            {
                self.actions.push_back(Action::Cut { conn: id });
            }
        }
        self.arm_cut();
    }
}
