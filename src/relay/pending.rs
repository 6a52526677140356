//! What the relay holds for Redis: per section the newest snapshot received
//! and not yet written, bounded by `--max-pending`, and per section the last
//! version written (bounded too), so nothing older than a written snapshot is
//! ever written after it. Pure: no I/O, no clock; the receive thread offers,
//! the writer takes, reports and gives back, both under one mutex.
//!
//! Every snapshot offered ends in exactly one counter (or is still held):
//! `coalesced` (a newer one for its section was kept instead, or one at least
//! as new was already written), `published`, `dropped_full` (a new section
//! past the bound), `dropped_redis_down` (Redis never took it: refused by
//! Redis itself, or still held when the relay stopped).

use foldhash::{HashMap, HashMapExt};
use shards::Snapshot;
use std::collections::VecDeque;
use std::sync::Arc;

/// A section: course code and section id.
type Key = (Arc<str>, u32);

fn key(s: &Snapshot) -> Key {
    (Arc::clone(&s.course), s.section)
}

/// What became of an offered snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Held: its section had nothing held.
    Held,
    /// Held in place of an older one for its section (that one coalesced).
    Replaced,
    /// Dropped: not newer than what is held or was written (coalesced).
    Stale,
    /// Dropped: a new section while `max` sections are held.
    Full,
}

/// The counters [`Pending`] keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Snapshots dropped for a newer one of their section.
    pub coalesced: u64,
    /// Snapshots written to Redis.
    pub published: u64,
    /// New sections dropped while the map was full.
    pub dropped_full: u64,
    /// Snapshots Redis never took (refused, or held at stop).
    pub dropped_redis_down: u64,
}

/// Last versions written, bounded: two generations; when the current one
/// reaches half the bound it becomes the old one, so the sections written
/// least recently are forgotten first. A forgotten section can at worst see
/// an older snapshot written again: the state hash's compare-and-set still
/// keeps it out of the hash, and hubs drop it by its version.
#[derive(Debug)]
struct Written {
    half: usize,
    cur: HashMap<Key, u64>,
    old: HashMap<Key, u64>,
}

impl Written {
    fn new(bound: usize) -> Written {
        Written {
            half: (bound / 2).max(1),
            cur: HashMap::new(),
            old: HashMap::new(),
        }
    }

    fn get(&self, k: &Key) -> Option<u64> {
        self.cur.get(k).or_else(|| self.old.get(k)).copied()
    }

    fn record(&mut self, s: &Snapshot) {
        let k = key(s);
        match s.version {
            // Written without a version: the hash holds what anything may replace.
            None => {
                self.cur.remove(&k);
                self.old.remove(&k);
            }
            Some(v) => {
                if self.cur.len() >= self.half && !self.cur.contains_key(&k) {
                    self.old = std::mem::take(&mut self.cur);
                }
                self.cur.insert(k, v);
            }
        }
    }

    /// Whether `s` is not newer than the version last written for its section.
    fn outdates(&self, s: &Snapshot) -> bool {
        match (s.version, self.get(&key(s))) {
            (Some(v), Some(w)) => v <= w,
            _ => false,
        }
    }

    fn len(&self) -> usize {
        self.cur.len() + self.old.len()
    }
}

/// The held snapshots, oldest section first.
#[derive(Debug)]
pub struct Pending {
    max: usize,
    map: HashMap<Key, Snapshot>,
    /// Each held section once, in the order it was first held.
    order: VecDeque<Key>,
    /// Taken by the writer and not yet reported; they count against `max`
    /// (a section in flight and held again counts twice until reported).
    inflight: usize,
    written: Written,
    counts: Counts,
}

impl Pending {
    /// At most `max` sections held (in flight included); the last written
    /// version remembered for up to `written_bound` sections.
    pub fn new(max: usize, written_bound: usize) -> Pending {
        Pending {
            max: max.max(1),
            map: HashMap::new(),
            order: VecDeque::new(),
            inflight: 0,
            written: Written::new(written_bound),
            counts: Counts::default(),
        }
    }

    /// Sections held, those being written included (the `pending` gauge).
    pub fn len(&self) -> usize {
        self.map.len() + self.inflight
    }

    /// Whether nothing is held or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sections waiting to be taken (not in flight).
    pub fn held(&self) -> usize {
        self.map.len()
    }

    /// Whether something waits to be taken.
    pub fn has_work(&self) -> bool {
        !self.map.is_empty()
    }

    /// The counters so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Sections whose last written version is remembered.
    pub fn remembered(&self) -> usize {
        self.written.len()
    }

    /// A received snapshot: held if it is the newest of its section.
    pub fn offer(&mut self, s: Snapshot) -> Offer {
        if self.written.outdates(&s) {
            self.counts.coalesced += 1;
            return Offer::Stale;
        }
        let k = key(&s);
        if let Some(held) = self.map.get_mut(&k) {
            self.counts.coalesced += 1;
            // A lower or equal version is stale; no version replaces.
            return if s.supersedes(held) {
                *held = s;
                Offer::Replaced
            } else {
                Offer::Stale
            };
        }
        if self.len() >= self.max {
            self.counts.dropped_full += 1;
            return Offer::Full;
        }
        self.order.push_back(k.clone());
        self.map.insert(k, s);
        Offer::Held
    }

    /// Up to `n` held snapshots to write, oldest section first; they stay
    /// counted against the bound until [`Pending::done`], [`Pending::give_back`]
    /// or [`Pending::refused`].
    pub fn take(&mut self, n: usize) -> Vec<Snapshot> {
        let mut out = Vec::with_capacity(n.min(self.map.len()));
        while out.len() < n {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            let Some(s) = self.map.remove(&k) else {
                continue;
            };
            // A version written after this one was held (it was in flight).
            if self.written.outdates(&s) {
                self.counts.coalesced += 1;
                continue;
            }
            out.push(s);
        }
        self.inflight += out.len();
        out
    }

    /// `batch` (taken before) is written.
    pub fn done(&mut self, batch: &[Snapshot]) {
        self.inflight = self.inflight.saturating_sub(batch.len());
        self.counts.published += batch.len() as u64;
        for s in batch {
            self.written.record(s);
        }
    }

    /// `batch` (taken before) was not written (Redis down or slow): held
    /// again, first in line, unless a newer one of its section arrived since.
    pub fn give_back(&mut self, batch: Vec<Snapshot>) {
        self.inflight = self.inflight.saturating_sub(batch.len());
        for s in batch.into_iter().rev() {
            let k = key(&s);
            if let Some(held) = self.map.get_mut(&k) {
                // `held` arrived later: it wins unless both have versions and
                // the returned one is greater.
                self.counts.coalesced += 1;
                if let (Some(old), Some(new)) = (s.version, held.version) {
                    if old > new {
                        *held = s;
                    }
                }
                continue;
            }
            // The slot was reserved while in flight: this never passes `max`.
            self.order.push_front(k.clone());
            self.map.insert(k, s);
        }
    }

    /// One snapshot (taken before) that Redis refused while answering: dropped.
    pub fn refused(&mut self, _s: &Snapshot) {
        self.inflight = self.inflight.saturating_sub(1);
        self.counts.dropped_redis_down += 1;
    }

    /// At stop, what is still held or in flight is dropped (Redis did not take
    /// it in time); returns how many.
    pub fn drop_all(&mut self) -> usize {
        let n = self.len();
        self.map.clear();
        self.order.clear();
        self.inflight = 0;
        self.counts.dropped_redis_down += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(course: &str, section: u32, taken: u32, version: Option<u64>) -> Snapshot {
        Snapshot::build(course.into(), section, 100, taken, None, version, None)
    }

    #[test]
    fn newest_version_per_section_is_kept() {
        let mut p = Pending::new(10, 10);
        assert_eq!(p.offer(snap("A", 1, 5, Some(5))), Offer::Held);
        assert_eq!(p.offer(snap("A", 1, 3, Some(3))), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 5, Some(5))), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 7, Some(7))), Offer::Replaced);
        assert_eq!(p.offer(snap("A", 2, 1, Some(1))), Offer::Held);
        assert_eq!(p.len(), 2);
        let b = p.take(10);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].section, b[0].version), (1, Some(7)));
        assert_eq!(p.counts().coalesced, 3);
    }

    #[test]
    fn no_version_replaces_and_is_replaced() {
        let mut p = Pending::new(10, 10);
        p.offer(snap("A", 1, 5, Some(5)));
        assert_eq!(p.offer(snap("A", 1, 9, None)), Offer::Replaced);
        assert_eq!(p.offer(snap("A", 1, 2, Some(2))), Offer::Replaced);
        assert_eq!(p.take(1)[0].version, Some(2));
    }

    #[test]
    fn shuffled_versions_leave_the_newest() {
        let mut p = Pending::new(100, 100);
        let mut versions: Vec<u64> = (1..=500).collect();
        fastrand::seed(7);
        fastrand::shuffle(&mut versions);
        for v in versions {
            p.offer(snap("HOT", 0, v as u32, Some(v)));
        }
        let b = p.take(10);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].version, Some(500));
        assert_eq!(p.counts().coalesced, 499);
    }

    #[test]
    fn a_new_section_past_the_bound_is_dropped() {
        let mut p = Pending::new(2, 10);
        p.offer(snap("A", 1, 1, Some(1)));
        p.offer(snap("A", 2, 1, Some(1)));
        assert_eq!(p.offer(snap("A", 3, 1, Some(1))), Offer::Full);
        // A held section still takes newer versions.
        assert_eq!(p.offer(snap("A", 2, 2, Some(2))), Offer::Replaced);
        assert_eq!(p.counts().dropped_full, 1);
        // In flight counts against the bound until reported.
        let b = p.take(1);
        assert_eq!(p.offer(snap("A", 3, 1, Some(1))), Offer::Full);
        p.done(&b);
        assert_eq!(p.offer(snap("A", 3, 1, Some(1))), Offer::Held);
    }

    #[test]
    fn nothing_older_than_written_is_written() {
        let mut p = Pending::new(10, 10);
        p.offer(snap("A", 1, 9, Some(9)));
        let b = p.take(10);
        // While 9 is in flight, 4 arrives and is held (nothing held for the section).
        assert_eq!(p.offer(snap("A", 1, 4, Some(4))), Offer::Held);
        p.done(&b);
        assert!(p.take(10).is_empty(), "4 is older than the 9 written");
        assert_eq!(p.offer(snap("A", 1, 9, Some(9))), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 10, Some(10))), Offer::Held);
        assert_eq!(p.counts().published, 1);
        assert_eq!(p.counts().coalesced, 2);
        // Written without a version: anything may follow.
        let b = p.take(10);
        p.done(&b);
        p.offer(snap("A", 1, 0, None));
        let b = p.take(10);
        p.done(&b);
        assert_eq!(p.offer(snap("A", 1, 1, Some(1))), Offer::Held);
    }

    #[test]
    fn given_back_first_in_line_unless_outdated() {
        let mut p = Pending::new(4, 10);
        p.offer(snap("A", 1, 1, Some(1)));
        p.offer(snap("A", 2, 1, Some(1)));
        let b = p.take(2);
        p.offer(snap("A", 3, 1, Some(1)));
        // A section in flight and held again counts twice until reported.
        assert_eq!(p.offer(snap("A", 2, 2, Some(2))), Offer::Held);
        assert_eq!(p.offer(snap("A", 4, 1, Some(1))), Offer::Full);
        p.give_back(b);
        assert_eq!(p.len(), 3);
        let again = p.take(10);
        let got: Vec<(u32, Option<u64>)> = again.iter().map(|s| (s.section, s.version)).collect();
        assert_eq!(got, vec![(1, Some(1)), (3, Some(1)), (2, Some(2))]);
    }

    #[test]
    fn refused_and_stopped_count_as_redis_down() {
        let mut p = Pending::new(10, 10);
        p.offer(snap("A", 1, 1, Some(1)));
        p.offer(snap("A", 2, 1, Some(1)));
        p.offer(snap("A", 3, 1, Some(1)));
        let b = p.take(1);
        p.refused(&b[0]);
        let _in_flight = p.take(1);
        assert_eq!(p.drop_all(), 2);
        assert_eq!(p.counts().dropped_redis_down, 3);
        assert!(p.is_empty());
    }

    #[test]
    fn written_versions_are_bounded() {
        let mut p = Pending::new(1000, 100);
        for i in 0..1000 {
            p.offer(snap("A", i, 1, Some(1)));
        }
        let b = p.take(1000);
        p.done(&b);
        assert!(p.remembered() <= 100, "{}", p.remembered());
        // The most recent ones are still remembered.
        assert_eq!(p.offer(snap("A", 999, 1, Some(1))), Offer::Stale);
    }
}
