//! Seeding: a newly watched course is subscribed, its subscription confirmed,
//! its state hash read by the state reader, and only then are the shards that
//! asked for it seeded; snapshots of every other course keep flowing
//! meanwhile. A read that comes back after live snapshots never takes a
//! section backwards (the version rule; gaps only where a live snapshot came
//! first). Also the admin firehose's discovery, asked of the same reader.

use super::{Ingest, Load, Via};
use crate::channels::Control;
use crate::channels::Discovery;
use crate::channels::ReadRequest;
use crate::redis::pubsub::Source;
use shards::{Gate, Snapshot};
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// How long shards wait for a course's state read before they are seeded with
/// what the node holds (a Redis that does not answer): the read still lands
/// later, as ordinary snapshots.
pub const SEED_PATIENCE_MS: u64 = 2_000;

impl<S: Source> Ingest<S> {
    pub(super) fn interest_on(
        &mut self,
        shard: usize,
        course: Arc<str>,
        gate: Option<Gate>,
        now_ms: u64,
    ) {
        // Starting, the node waits for Redis like a connected one.
        let connected = self.source.connected() || self.source.connecting();
        let board = self.boards.entry(Arc::clone(&course)).or_default();
        // Under a pattern (classic firehose) the source ignores it; a sharded
        // source has no pattern and needs every watched course.
        let new_sub = board.watch.shards() == 0;
        let shards = board.watch.shards() | 1 << shard;
        self.tally.set_shards(&mut board.watch, shards);
        board.gates.retain(|(s, _)| *s != shard);
        if let Some(g) = gate {
            board.gates.push((shard, g));
        }
        let loaded = board.watch.load() == Load::Loaded;
        if !loaded && connected {
            // Answered once the state is read (or at the deadline).
            board.awaiting |= 1 << shard;
            board.watched_at.get_or_insert(now_ms);
            self.seed_deadlines
                .push_back((now_ms + SEED_PATIENCE_MS, Arc::clone(&course)));
        }
        if new_sub {
            // Subscribe first; the read goes out once it is confirmed.
            self.source.subscribe(&course);
        }
        if loaded || !connected {
            // Redis down: the viewer gets what is held now, the rest when it is back.
            self.seed_shards(&course, 1 << shard);
        }
        if !loaded {
            self.want_read(&course);
        }
    }

    /// Asks for `course`'s state read if it needs one and its subscription is
    /// confirmed (gathered into this turn's one request).
    pub(super) fn want_read(&mut self, course: &str) {
        if !self.source.subscribed(course)
            && !crate::planted::active(crate::planted::Bug::ReadBeforeConfirmed)
        {
            return;
        }
        let epoch = self.epoch;
        let Some(name) = self
            .boards
            .get_key_value(course)
            .map(|(k, _)| Arc::clone(k))
        else {
            return;
        };
        if let Some(b) = self.boards.get_mut(course) {
            if b.watch.load() == Load::Unread && b.watch.shards() != 0 {
                self.tally.set_load(&mut b.watch, Load::Reading(epoch));
                b.live.clear();
                b.refused.clear();
                self.reads.push(name);
            }
        }
    }

    /// Asks for every read that is due (a pattern confirmed, the retry timer).
    pub(super) fn want_all_reads(&mut self) {
        if !self.tally.any_unread() {
            // Every second by the retry timer: no pass over the boards for nothing.
            return;
        }
        let unread: Vec<Arc<str>> = self
            .boards
            .iter()
            .filter(|(_, b)| b.watch.load() == Load::Unread && b.watch.shards() != 0)
            .map(|(c, _)| Arc::clone(c))
            .collect();
        for c in unread {
            self.want_read(&c);
        }
    }

    /// The connection came back: every course is read again, each once its
    /// subscription is confirmed (reads in flight no longer count).
    pub(super) fn reread_all(&mut self) {
        self.epoch += 1;
        let _ = self.reader.send(ReadRequest::Reconnected);
        for b in self.boards.values_mut() {
            self.tally.set_load(&mut b.watch, Load::Unread);
        }
        self.want_all_reads();
    }

    /// The state reader's answer: merges each hash by the version rule, then
    /// seeds the shards that waited for it.
    pub(super) fn states_read(
        &mut self,
        courses: Vec<Arc<str>>,
        hashes: Option<Vec<Vec<Vec<u8>>>>,
        epoch: u64,
        now_ms: u64,
    ) {
        let mut hashes = hashes.map(|h| h.into_iter());
        for course in courses {
            let payloads = hashes.as_mut().and_then(|h| h.next());
            let current = self
                .boards
                .get(&course)
                .is_some_and(|b| b.watch.load() == Load::Reading(epoch));
            if let Some(p) = payloads {
                let via = if current { Via::Read } else { Via::OldRead };
                self.merge_read(&course, p, via, now_ms);
            }
            let Some(b) = self.boards.get_mut(&course) else {
                continue;
            };
            if !current {
                // Asked before a reconnect: its data is merged, but the course
                // is read again once subscribed again.
                continue;
            }
            b.live.clear();
            b.refused.clear();
            if hashes.is_none() {
                // Failed: retried every second; waiting shards get what is held.
                self.tally.set_load(&mut b.watch, Load::Unread);
            } else {
                self.tally.set_load(&mut b.watch, Load::Loaded);
                if let Some(t) = b.watched_at.take() {
                    self.metrics
                        .seed
                        .observe_us(now_ms.saturating_sub(t).saturating_mul(1000));
                }
            }
            let mask = std::mem::take(&mut b.awaiting);
            self.seed_shards(&course, mask);
        }
        // Seeds already sent need no deadline.
        while let Some((_, c)) = self.seed_deadlines.front() {
            if self.boards.get(c).is_some_and(|b| b.awaiting != 0) {
                break;
            }
            self.seed_deadlines.pop_front();
        }
    }

    /// One course's state hash merged into its board (routed as snapshots to
    /// shards already seeded).
    fn merge_read(&mut self, course: &Arc<str>, payloads: Vec<Vec<u8>>, via: Via, now_ms: u64) {
        if let Some(b) = self.boards.get_mut(course) {
            b.state_read = true;
        }
        for p in payloads {
            match Snapshot::parse(&p, Some(course)) {
                Ok(mut s) => {
                    if self.older_than_held(&s) {
                        // An out-of-order publisher, or a write Redis lost:
                        // the newer stays, unless a repair wrote the field.
                        self.metrics.state_stale.fetch_add(1, Relaxed);
                    }
                    s.replace = s.replace
                        && via == Via::Read
                        && !self.live_in_read(&s)
                        && !crate::planted::active(crate::planted::Bug::ReadIgnoresReplace);
                    self.accept(Arc::new(s), via);
                }
                Err(r) => self.rejected(r, course, now_ms),
            }
        }
        if via == Via::Read {
            // Live snapshots refused while the read was in flight, newer than
            // what the read overruled the node with.
            let refused = self
                .boards
                .get_mut(course)
                .map(|b| std::mem::take(&mut b.refused))
                .unwrap_or_default();
            for s in refused {
                let held = self
                    .boards
                    .get(course)
                    .and_then(|b| b.sections.get(&s.section));
                if s.replaces(held.map(|h| &**h)) && self.accept(s, Via::Read) {
                    // A publish after all: counted for admins as it was not
                    // when it came.
                    if let Some(b) = self.boards.get_mut(course) {
                        b.updates += 1;
                    }
                }
            }
        }
    }

    /// Whether a live snapshot changed `s`'s section while its read was in
    /// flight (the read may be older there). A field the reconciler's repair
    /// wrote carries `replace` (contract §11) and, read once subscribed,
    /// overrules the node everywhere else: a node whose connection was down
    /// when the repair was published takes it at its reread.
    fn live_in_read(&self, s: &Snapshot) -> bool {
        self.boards
            .get(&s.course)
            .is_some_and(|b| b.live.contains(&s.section))
    }

    /// Whether a state hash entry carries a lower version than the one this
    /// node already holds for that section (equal is the normal case: the hash
    /// holds what the channel brought).
    fn older_than_held(&self, s: &Snapshot) -> bool {
        let held = self
            .boards
            .get(&s.course)
            .and_then(|b| b.sections.get(&s.section))
            .and_then(|h| h.version);
        matches!((s.version, held), (Some(v), Some(h)) if v < h)
    }

    /// Sends the course's board to the shards in `mask` (their watch answers).
    pub(super) fn seed_shards(&self, course: &Arc<str>, mut mask: u128) {
        let Some(b) = self.boards.get(course) else {
            return;
        };
        mask &= b.watch.shards();
        if mask == 0 {
            return;
        }
        let mut sections: Vec<Arc<Snapshot>> = b.sections.values().cloned().collect();
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(o) = self.outlets.get(i) {
                // The last shard takes the list itself, the others a copy.
                let sections = if mask == 0 {
                    std::mem::take(&mut sections)
                } else {
                    sections.clone()
                };
                o.inbox().control(Control::Seed {
                    course: Arc::clone(course),
                    sections,
                });
            }
        }
    }

    /// Shards that waited past [`SEED_PATIENCE_MS`] get what is held; all
    /// waiting shards get it at once when Redis turns out to be down (the
    /// first connection failed, or the connection was lost).
    pub(super) fn seeds_overdue(&mut self, now_ms: u64) {
        let down = !self.source.connected() && !self.source.connecting();
        while let Some((due, _)) = self.seed_deadlines.front() {
            if !down && *due > now_ms {
                break;
            }
            let Some((_, course)) = self.seed_deadlines.pop_front() else {
                break;
            };
            let Some(b) = self.boards.get_mut(&course) else {
                continue;
            };
            let mask = std::mem::take(&mut b.awaiting);
            if mask != 0 {
                tracing::debug!(%course, "state read overdue: seeding with what is held");
                self.seed_shards(&course, mask);
            }
        }
    }

    /// Asks the state reader for every course with a state hash the node does
    /// not hold (when the firehose turns on, then every [`super::admin::RESCAN_MS`]).
    pub(super) fn discover(&mut self, now_ms: u64) {
        self.next_scan_ms = now_ms + super::admin::RESCAN_MS;
        if self.discovering {
            return;
        }
        // Courses read already follow the channel: only the others are read
        // (new ones, and those a discovery cut short by a failed read left).
        let have: HashSet<Arc<str>> = self
            .boards
            .iter()
            .filter(|(_, b)| b.state_read)
            .map(|(c, _)| Arc::clone(c))
            .collect();
        self.discovering = self.reader.send(ReadRequest::Discover { have }).is_ok();
        self.scans += u64::from(self.discovering);
    }

    /// The discovery's answer: boards for every course found, their state
    /// merged, the source told what to cover, waiting admins answered.
    pub(super) fn discovered(&mut self, found: Option<Discovery>, now_ms: u64) {
        self.discovering = false;
        if let Some(d) = found.filter(|_| self.firehose()) {
            for c in &d.courses {
                self.boards.entry(Arc::from(c.as_str())).or_default().named = true;
            }
            self.forget_gone(&d.courses);
            // Not taken as a course's read: a viewer who comes for one of
            // them has it read once its subscription is confirmed.
            for (course, payloads) in d.states {
                self.merge_read(&course, payloads, Via::OldRead, now_ms);
            }
            self.source.cover(&d.courses);
        }
        let mut waiting = std::mem::take(&mut self.admin_waiting) & self.admin_shards;
        while waiting != 0 {
            let i = waiting.trailing_zeros() as usize;
            waiting &= waiting - 1;
            self.admin_answer(i);
        }
    }

    /// Courses whose state hash the scan no longer found (deleted, as a
    /// rehearsal's are, or expired) and that no live snapshot named since
    /// the scan was asked: gone from the admin view. One still watched keeps
    /// its board for its viewers, as a name nothing has named is kept (until
    /// its last viewer leaves, or a snapshot names it again).
    fn forget_gone(&mut self, found: &[String]) {
        let found: HashSet<&str> = found.iter().map(String::as_str).collect();
        let scans = self.scans;
        let gone: Vec<Arc<str>> = self
            .boards
            .iter()
            .filter(|(c, b)| b.named && b.named_in_scan < scans && !found.contains(&***c))
            .map(|(c, _)| Arc::clone(c))
            .collect();
        for c in gone {
            let watched = self.boards.get(&c).is_some_and(|b| b.watch.shards() != 0);
            let shown = if watched {
                self.viewers.remove(&c);
                self.boards.get_mut(&c).and_then(|b| {
                    b.named = false;
                    // No admin tick counts it now: a later name starts afresh.
                    b.updates = 0;
                    b.shown.take()
                })
            } else {
                self.forget(&c).and_then(|b| b.shown)
            };
            self.admin_shrunk |= shown.is_some();
        }
    }

    /// Answers a new admin shard now, or once the discovery in flight is in.
    pub(super) fn admin_answer_when_known(&mut self, shard: usize) {
        if self.discovering {
            self.admin_waiting |= 1 << shard;
        } else {
            self.admin_answer(shard);
        }
    }
}
