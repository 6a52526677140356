//! One course as a shard sees it: current sections, what changed since the last
//! frame, who watches, and the frames rendered from it.

use crate::conn::ConnId;
use crate::deflate::Deflater;
use crate::gate::Gate;
use crate::rate::FramePacer;
use crate::server_msg;
use crate::snapshot::Snapshot;
use crate::sse_event;
use crate::ws_codec::deflated_frame;
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The most sections a course holds (contract §2: a university's largest
/// course has a few hundred); past it a new section is rejected
/// (`too_many_sections`), however large the state hash.
pub const MAX_SECTIONS: usize = 4096;

/// The most presence batches a course keeps its own joins and leaves of
/// while no count covers them (a presence store that stopped answering, a
/// reconnect storm within one presence tick); past it the two oldest merge
/// (see [`Course::note_presence`]).
const PENDING_MAX: usize = 1024;

/// A viewer of a course, with whether it missed a frame and is owed a full
/// one, and the count it was last sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Viewer {
    pub conn: ConnId,
    pub owes_full: bool,
    /// The viewer count this viewer last got ([`Viewer::NO_COUNT`]: none
    /// yet): a count goes to a viewer only when it differs.
    pub shown: u32,
}

impl Viewer {
    /// `shown` before any count was sent.
    pub const NO_COUNT: u32 = u32::MAX;

    /// `shown` of a viewer whose watch answer's count waits for a count
    /// that includes its own join ([`Course::held`]): no other count goes
    /// to it before that one.
    pub const HELD: u32 = u32::MAX - 1;

    /// A count as `shown` keeps it (a count past `u32` is kept as its cap).
    pub fn count(viewers: u64) -> u32 {
        viewers.min(u64::from(Self::HELD - 1)) as u32
    }
}

/// Per-course state on one shard.
#[derive(Debug)]
pub(crate) struct Course {
    pub name: Arc<str>,
    pub sections: BTreeMap<u32, Arc<Snapshot>>,
    /// Sections changed since the last frame, ascending; a Vec keeps its
    /// memory across frames (a set allocated a node for every frame).
    pub dirty: Vec<u32>,
    pub viewers: Vec<Viewer>,
    /// Connections per user watching here: the distinct-user tally.
    pub users: HashMap<Arc<str>, u32>,
    /// Viewers whose `owes_full` is set.
    pub owed: u32,
    /// When the next frame may go out (one token per tick, two held).
    pub pacer: FramePacer,
    /// True once the ingest thread answered our interest with the current board.
    pub seeded: bool,
    /// Watchers waiting for the seed before their full-frame answer.
    pub awaiting_seed: Vec<ConnId>,
    /// Seeded, but the answers wait for a first count (or its patience), so
    /// that they show the viewers on other shards and nodes.
    pub awaiting_count: bool,
    /// The last global count the presence layer sent (`None`: none yet).
    pub global: Option<u64>,
    /// Viewers whose watch answer went without its count, which waits for
    /// a count read after their join's presence batch (the batch) was
    /// applied, or for the moment (Unix ms) it stops waiting.
    pub held: Vec<(ConnId, u64, u64)>,
    /// This shard's joins (+1) and leaves (-1) of the course that `global`
    /// cannot include yet, summed per presence batch (the batch they go to
    /// the presence layer in), oldest batch first.
    pending: VecDeque<(u64, i32)>,
    /// The sum of `pending`.
    pending_net: i64,
    /// The latest presence batch with a join of this shard's that no count
    /// includes yet: a watch answer's count waits for one that does.
    pub unsettled_join: Option<u64>,
    /// Last presence count broadcast to this course's viewers.
    pub presence: Option<u64>,
    /// That count's message, encoded once, resent to a viewer that heals.
    pub presence_msg: Option<Bytes>,
    /// A watch answer showed a count other than `presence` (the shard's own
    /// users, before any count came): the next count is offered to every
    /// viewer even if it equals `presence`, or that viewer would keep the
    /// one it was shown.
    pub presence_mixed: bool,
    /// True while the course sits in the shard's render schedule.
    pub scheduled: bool,
    /// `scheduled` and the pacer's due moment, shared with the ingest thread.
    pub gate: Gate,
    full_cache: Option<Bytes>,
    /// The full frame compressed (permessage-deflate), once per board state.
    full_deflated: Option<Bytes>,
    /// The full frame as a Server-Sent Event, once per board state.
    full_sse: Option<Bytes>,
}

impl Course {
    pub fn new(name: Arc<str>) -> Self {
        Course {
            name,
            sections: BTreeMap::new(),
            dirty: Vec::new(),
            viewers: Vec::new(),
            users: HashMap::new(),
            owed: 0,
            pacer: FramePacer::default(),
            seeded: false,
            awaiting_seed: Vec::new(),
            awaiting_count: false,
            global: None,
            held: Vec::new(),
            pending: VecDeque::new(),
            pending_net: 0,
            unsettled_join: None,
            presence: None,
            presence_msg: None,
            presence_mixed: false,
            scheduled: false,
            gate: Gate::default(),
            full_cache: None,
            full_deflated: None,
            full_sse: None,
        }
    }

    /// Applies a snapshot under the version rule ([`crate::snapshot`]); true
    /// if it changed the board. A new section past [`MAX_SECTIONS`] is left
    /// out (the ingest thread counts it before it gets here).
    pub fn apply(&mut self, snap: &Arc<Snapshot>) -> bool {
        let held = self.sections.get(&snap.section).map(|s| &**s);
        if held.is_none() && self.sections.len() >= MAX_SECTIONS {
            return false;
        }
        if !snap.replaces(held) {
            return false;
        }
        self.sections.insert(snap.section, Arc::clone(snap));
        if let Err(at) = self.dirty.binary_search(&snap.section) {
            self.dirty.insert(at, snap.section);
        }
        self.full_cache = None;
        self.full_deflated = None;
        self.full_sse = None;
        true
    }

    /// Applies a section from a seed under the seed half of the version rule.
    pub fn apply_seed(&mut self, snap: &Arc<Snapshot>) -> bool {
        snap.seed_replaces(self.sections.get(&snap.section).map(|s| &**s)) && self.apply(snap)
    }

    /// Whether the course has something to render (changes or owed resyncs).
    pub fn wants_render(&self) -> bool {
        !self.dirty.is_empty() || self.owed > 0
    }

    /// When the next frame may go out: at once while the pacer holds a token.
    pub fn due_ms(&self, tick_ms: u64) -> u64 {
        self.pacer.due_ms(tick_ms)
    }

    /// The full frame (every known section), encoded once per board state.
    pub fn full_frame(&mut self) -> Bytes {
        if let Some(f) = &self.full_cache {
            return f.clone();
        }
        let f = server_msg::frame(&self.name, true, self.sections.values());
        self.full_cache = Some(f.clone());
        f
    }

    /// The full frame for viewers that negotiated permessage-deflate,
    /// compressed once per board state.
    pub fn full_frame_deflated(&mut self, deflater: &mut Deflater) -> Bytes {
        if let Some(f) = &self.full_deflated {
            return f.clone();
        }
        let f = deflated_frame(deflater, &self.full_frame());
        self.full_deflated = Some(f.clone());
        f
    }

    /// The full frame for Server-Sent Events viewers, wrapped once per board state.
    pub fn full_frame_sse(&mut self) -> Bytes {
        if let Some(f) = &self.full_sse {
            return f.clone();
        }
        let f = sse_event::event(&self.full_frame()).unwrap_or_default();
        self.full_sse = Some(f.clone());
        f
    }

    /// Notes a join (`+1`) or leave (`-1`) of this shard's users, sent to
    /// the presence layer in batch `batch`: the counts that come before that
    /// batch is applied cannot include it. Past [`PENDING_MAX`] batches the
    /// two oldest merge under the later number: a count that covers the
    /// older one only then keeps both (an error of a few viewers, until the
    /// next count, and only after that many batches without any count).
    pub fn note_presence(&mut self, batch: u64, delta: i32) {
        self.pending_net += i64::from(delta);
        if delta > 0 {
            self.unsettled_join = Some(batch);
        }
        if let Some((b, n)) = self.pending.back_mut() {
            if *b == batch {
                *n += delta;
                return;
            }
        }
        if self.pending.len() >= PENDING_MAX {
            if let Some((_, n)) = self.pending.pop_front() {
                if let Some((_, next)) = self.pending.front_mut() {
                    *next += n;
                }
            }
        }
        self.pending.push_back((batch, delta));
    }

    /// Takes a global count from the presence layer, read after it had
    /// applied this shard's batches up to `applied`: the joins and leaves of
    /// those batches are in it now.
    pub fn settle_presence(&mut self, viewers: u64, applied: u64) {
        self.global = Some(viewers);
        if self.unsettled_join.is_some_and(|b| b <= applied) {
            self.unsettled_join = None;
        }
        while let Some(&(b, n)) = self.pending.front() {
            if b > applied {
                break;
            }
            self.pending_net -= i64::from(n);
            self.pending.pop_front();
        }
        // A storm's table is not kept for the quiet hours after it.
        if self.pending.is_empty() && self.pending.capacity() > 64 {
            self.pending = VecDeque::new();
        }
    }

    /// Whether a watch is answered now: the board is seeded and no first
    /// count is awaited.
    pub fn ready(&self) -> bool {
        self.seeded && !self.awaiting_count
    }

    /// The distinct users watching now, as far as this shard can tell: the
    /// last global count with this shard's joins and leaves it cannot
    /// include yet, and never fewer than this shard's own distinct users.
    /// A join of a user who already watches elsewhere (another tab on
    /// another shard or node) is counted once more than it should be, and
    /// a leave of one who still watches elsewhere once less, until the next
    /// count, which has each user once.
    pub fn viewers_now(&self) -> u64 {
        let global = i64::try_from(self.global.unwrap_or(0)).unwrap_or(i64::MAX);
        let estimate = u64::try_from(global.saturating_add(self.pending_net)).unwrap_or(0);
        estimate.max(self.users.len() as u64)
    }

    /// The count that goes with a whole board (a watch answer, a heal):
    /// [`Course::viewers_now`], with its message. Showing another number
    /// than `presence` marks the course mixed, so the next count from the
    /// presence layer is offered to every viewer (each gets it only if it
    /// differs from what that viewer was shown).
    pub fn count_with_board(&mut self) -> (u64, Bytes) {
        let viewers = self.viewers_now();
        if self.presence == Some(viewers) {
            if let Some(m) = &self.presence_msg {
                return (viewers, m.clone());
            }
        } else {
            self.presence_mixed = true;
        }
        (viewers, server_msg::presence(&self.name, viewers))
    }

    /// The frame of sections changed since the last one.
    pub fn delta_frame(&self) -> Bytes {
        server_msg::frame(
            &self.name,
            false,
            self.dirty.iter().filter_map(|s| self.sections.get(s)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(section: u32, version: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(
            "C".into(),
            section,
            10,
            1,
            None,
            Some(version),
            None,
        ))
    }

    #[test]
    fn a_new_section_past_the_cap_is_left_out_and_held_ones_still_move() {
        let mut c = Course::new("C".into());
        for s in 0..MAX_SECTIONS as u32 {
            assert!(c.apply(&snap(s, 1)));
        }
        assert!(!c.apply(&snap(MAX_SECTIONS as u32, 1)), "past the cap");
        assert!(!c.apply_seed(&snap(u32::MAX, 1)), "past the cap, seeded");
        assert_eq!(c.sections.len(), MAX_SECTIONS);
        assert!(c.apply(&snap(7, 2)), "a held section takes a newer version");
    }
}
