//! What the ingest and presence threads feed a shard: snapshots, seeds
//! answering its interest in a course, viewer counts, and the gates that
//! decide when a snapshot must wake it.

use super::{Counts, Shard};
use crate::conn::ConnId;
use crate::course::Viewer;
use crate::gate::Gate;
use crate::server_msg;
use crate::snapshot::Snapshot;
use crate::sse_event;
use crate::timer::Timer;
use bytes::Bytes;
use std::sync::Arc;

/// Courses whose counts read with a presence write are kept between two
/// presence ticks at most (a storm brings one list per presence write).
const MAX_JOIN_COUNTS: usize = 16_384;

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
        c.seeded = true;
        let name = Arc::clone(&c.name);
        let patience = self.cfg.count_patience_ms;
        if patience > 0 && c.global.is_none() && !c.awaiting_seed.is_empty() {
            // No count of the course yet: its first viewers' answers wait
            // for one (a little), or they would show this shard's own users.
            c.awaiting_count = true;
            let due = now_ms + patience;
            self.count_waits.push_back((due, name));
            if self.timers.get(Timer::Count).is_none() {
                self.timers.set(Timer::Count, due);
            }
            return;
        }
        self.answer_waiting(&name, now_ms);
    }

    /// A course is ready ([`crate::course::Course::ready`]): the watchers
    /// waiting get everything in their answer, and it renders from here.
    fn answer_waiting(&mut self, course: &Arc<str>, now_ms: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        c.awaiting_count = false;
        self.wait_ends += 1;
        let waiting = std::mem::take(&mut c.awaiting_seed);
        for id in waiting {
            self.answer_watch(id, course, now_ms);
        }
        self.schedule(course);
        self.trim_count_waits();
    }

    /// Drops the waits at the front whose course waits no more (its count
    /// came), and runs the timer to the first that still does, so a count
    /// that came in time costs no wake-up at its deadline.
    fn trim_count_waits(&mut self) {
        while let Some((_, course)) = self.count_waits.front() {
            if self.courses.get(course).is_some_and(|c| c.awaiting_count) {
                break;
            }
            self.count_waits.pop_front();
        }
        let next = self.count_waits.front().map(|(due, _)| *due);
        self.timers.set_or_stop(Timer::Count, next);
    }

    /// Courses whose wait for a first count is over by `now_ms` answer with
    /// what they have.
    pub(super) fn count_waits_due(&mut self, now_ms: u64) {
        if !self.timers.is_expired(Timer::Count, now_ms) {
            return;
        }
        while let Some(course) = super::pop_due(&mut self.count_waits, now_ms) {
            if let Some(c) = self.courses.get_mut(&course).filter(|c| c.awaiting_count) {
                // No count came: none will for these answers either.
                c.unsettled_join = None;
                self.answer_waiting(&course, now_ms);
            }
        }
        self.trim_count_waits();
    }

    /// The number of the presence batch that the joins and leaves queued now
    /// ([`Action::PresenceJoin`], [`Action::PresenceLeave`]) go out in. The
    /// shell sends every one it took from [`Shard::poll_action`] in that
    /// batch, tagged with this number, then calls
    /// [`Shard::presence_batch_sent`]; the presence layer answers each count
    /// with the last of this shard's batches it had applied before it read
    /// the count ([`Shard::handle_counts`]).
    ///
    /// [`Action::PresenceJoin`]: super::Action::PresenceJoin
    /// [`Action::PresenceLeave`]: super::Action::PresenceLeave
    pub fn presence_batch(&self) -> u64 {
        self.presence_batch
    }

    /// The shell sent batch [`Shard::presence_batch`] (every join and leave
    /// taken so far): later ones go in the next.
    pub fn presence_batch_sent(&mut self) {
        self.presence_batch += 1;
    }

    /// The presence layer's global counts, sorted by course, read after it
    /// had applied this shard's presence batches up to `applied` (see
    /// [`Shard::presence_batch`]). Each course watched here takes its count
    /// ([`Shard::handle_presence`]); the counts are kept (shared, not copied),
    /// so a course first watched here later starts from its count instead
    /// of none.
    pub fn handle_counts(&mut self, counts: &Counts, applied: u64) {
        for (course, n) in counts.iter() {
            self.handle_presence(course, *n, applied);
        }
        self.counts = Some(Arc::clone(counts));
        self.join_counts.clear();
    }

    /// Counts of the courses that gained members on this node, read by the
    /// presence layer with the write that added them (the node's joins of
    /// the last few tens of milliseconds at most), so that the next watch
    /// answer here shows every viewer written so far on every node and
    /// shard, not only those of the last presence tick: a course with no
    /// count yet takes it as the tick's (its held answers go, its viewers
    /// shown only this shard's users get it); one with a count takes it
    /// without a message, its viewers getting the next tick's count (one
    /// count per presence tick). Only some courses, so not kept as
    /// [`Shard::handle_counts`] keeps the whole list.
    pub fn handle_join_counts(&mut self, counts: &Counts, applied: u64) {
        for (course, n) in counts.iter() {
            match self.courses.get_mut(&**course) {
                Some(c) if c.global.is_some() => {
                    c.settle_presence(*n, applied);
                    self.release_held(course, applied, self.now_ms);
                }
                _ => self.handle_presence(course, *n, applied),
            }
            // Kept until the next whole list, for a course first watched
            // here meanwhile (a newer count replaces an older one); bounded,
            // and cleared by the tick's list.
            if self.join_counts.len() < MAX_JOIN_COUNTS || self.join_counts.contains_key(course) {
                self.join_counts.insert(Arc::clone(course), *n);
            }
        }
    }

    /// The last count of `course` [`Shard::handle_counts`] kept (a list not
    /// sorted may miss it: the course then starts without a count, as
    /// before any came).
    pub(super) fn kept_count(&self, course: &str) -> Option<u64> {
        let find = |counts: &Counts| {
            let at = counts.binary_search_by(|(c, _)| (**c).cmp(course)).ok()?;
            counts.get(at).map(|(_, n)| *n)
        };
        // A first count is newer than the whole list.
        self.join_counts
            .get(course)
            .copied()
            .or_else(|| self.counts.as_ref().and_then(find))
    }

    /// The global viewer count of a course from the presence layer, read
    /// after it had applied this shard's presence batches up to `applied`.
    /// What goes to the viewers is the count with this shard's joins and
    /// leaves it does not include yet (as a watch answer shows it), and only
    /// to those shown another number: one count per presence tick.
    pub fn handle_presence(&mut self, course: &str, viewers: u64, applied: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        c.settle_presence(viewers, applied);
        // The held answers first: their count is this one, not a second.
        self.release_held(course, applied, self.now_ms);
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if c.awaiting_count {
            // The count its first answers waited for.
            let name = Arc::clone(&c.name);
            return self.answer_waiting(&name, self.now_ms);
        }
        if !c.seeded {
            // Every viewer of the course waits for its seed, and its watch
            // answer brings the count: nothing goes before the board.
            return;
        }
        let viewers = c.viewers_now();
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
            .filter(|v| v.shown != count && v.shown != Viewer::HELD)
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
