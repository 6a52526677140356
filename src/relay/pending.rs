//! What the relay holds for Redis: per section the newest snapshot received
//! and not yet written, bounded by `--max-pending` sections and by
//! `--max-pending-bytes` (what a held snapshot costs, [`cost`]), and per
//! section the last version written in the last [`FORGET`] (whatever
//! `--max-pending`, within [`WRITTEN_CAP`] sections), so nothing older than
//! a snapshot written in that window is written after it; past the window
//! the script in Redis decides (a poisoned or deleted field takes real
//! publishes again). Pure: no I/O, no clock (time is passed in);
//! the receive thread offers, the writer takes, reports and gives back, both
//! under one mutex.
//!
//! Every snapshot offered ends in exactly one counter (or is still held):
//! `coalesced` (a newer one for its section was kept instead, or one at least
//! as new was written in the window), `published`, `dropped_full` (a new
//! section past a bound, or a newer snapshot of a held section past the
//! bytes bound and its [`SLACK`]), `dropped_redis_down`
//! (Redis never took it: refused by Redis itself, or still held when the
//! relay stopped).

use foldhash::{HashMap, HashMapExt};
use shards::Snapshot;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the version last written for a section is remembered (contract
/// §10): within it an older snapshot is coalesced, past it the state
/// script in Redis decides.
pub const FORGET: Duration = Duration::from_secs(10);

/// What one held snapshot is counted as against `--max-pending-bytes`: its
/// JSON, its course code and the map's, the queue's and the struct's share.
pub fn cost(s: &Snapshot) -> usize {
    const OVERHEAD: usize = 256;
    s.json.len() + s.course.len() + OVERHEAD
}

/// How far past `--max-pending-bytes` a newer snapshot of a section already
/// held (or in flight) may take the bytes held: one datagram. The newest of
/// a held section is kept in place of the older one within it (the older is
/// never written instead); a new section is held only within the bound
/// itself. So the bytes held never pass the bound plus this.
pub const SLACK: usize = shards::snapshot::MAX_PAYLOAD;

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
    /// Dropped: a new section past either bound, or a newer snapshot of a
    /// held section past the bytes bound and its [`SLACK`].
    Full,
}

/// The counters [`Pending`] keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Snapshots dropped for a newer one of their section.
    pub coalesced: u64,
    /// Snapshots written to Redis.
    pub published: u64,
    /// Snapshots dropped past a bound ([`Offer::Full`]).
    pub dropped_full: u64,
    /// Snapshots Redis never took (refused, or held at stop).
    pub dropped_redis_down: u64,
}

/// The most sections whose last written version is remembered, both
/// generations of `Written` together: only a flood of more than
/// `WRITTEN_CAP / 2` distinct sections written within 10 s (50,000 a second)
/// reaches it, and then the least recently written are forgotten early.
///
/// What it costs at the cap: an entry is 48 bytes (the course's `Arc<str>`
/// and the section id, the version and the `Instant`) plus one control
/// byte; a generation of 500,000 entries takes a table of 2^20 buckets,
/// about 49 MiB, so both about 98 MiB (25 MiB more for a moment while a
/// table grows). Each entry also keeps its course code alive (one
/// allocation of 16 bytes plus the code: 32 bytes for codes of up to 8
/// characters, at most 96 for 64), up to 92 MiB more. Fewer sections
/// written cost proportionally less: 10,000 written every 10 s, about
/// 2 MiB.
pub const WRITTEN_CAP: usize = 1_000_000;

/// What one remembered written version is counted as against
/// `--max-pending-bytes` (with the snapshots held): its entry with the
/// table's slack (up to about 112 bytes just after a table grows) and the
/// course code it keeps alive (32 bytes for codes of up to 16 characters).
/// Held snapshots come first: the remembered versions are forgotten early
/// (the older generation, then all) when both would pass the bound, so the
/// process's memory stays within the bytes bound plus a few MiB.
pub const WRITTEN_COST: usize = 160;

/// Last versions written, with when: two generations, a new one started
/// once the current one is [`FORGET`] old (the old one then dropped), so a
/// version written in the last [`FORGET`] is always remembered, in the
/// current generation or the one before. Together they never hold more
/// than their cap of sections ([`WRITTEN_CAP`]): past half of it in the
/// current one, a new generation starts early (the last resort). A forgotten section can at
/// worst see an older snapshot written again: the state hash's
/// compare-and-set still keeps it out of the hash, and hubs drop it by its
/// version.
#[derive(Debug)]
struct Written {
    /// The most entries of one generation.
    half: usize,
    /// The bytes they may take beside the snapshots held ([`Written::fit`]):
    /// one generation at most half.
    room: usize,
    /// When `cur` was started.
    since: Option<Instant>,
    cur: HashMap<Key, (u64, Instant)>,
    old: HashMap<Key, (u64, Instant)>,
}

impl Written {
    /// At most `cap` sections remembered.
    fn new(cap: usize) -> Written {
        Written {
            half: (cap / 2).max(1),
            room: usize::MAX,
            since: None,
            cur: HashMap::new(),
            old: HashMap::new(),
        }
    }

    /// Starts a new current generation at `now`; the current one becomes the
    /// old one, unless all it holds is already past [`FORGET`].
    fn rotate(&mut self, now: Instant) {
        let stale = self
            .since
            .is_some_and(|t| now.saturating_duration_since(t) >= 2 * FORGET);
        self.old = std::mem::take(&mut self.cur);
        if stale {
            self.old = HashMap::new();
        }
        self.since = Some(now);
    }

    /// The version written for `k` within [`FORGET`] of `now`.
    fn get(&self, k: &Key, now: Instant) -> Option<u64> {
        self.cur
            .get(k)
            .or_else(|| self.old.get(k))
            .filter(|(_, at)| now.saturating_duration_since(*at) < FORGET)
            .map(|(v, _)| *v)
    }

    fn record(&mut self, s: &Snapshot, now: Instant) {
        if self
            .since
            .is_none_or(|t| now.saturating_duration_since(t) >= FORGET)
        {
            self.rotate(now);
        }
        // Written without a version: the version written before is still
        // one nothing older than may be written within the window.
        let Some(v) = s.version else {
            return;
        };
        let k = key(s);
        // Moved out of the old generation, if there: each section once.
        let k = self.old.remove_entry(&k).map_or(k, |(k, _)| k);
        let full =
            self.cur.len() >= self.half || (self.cur.len() + 1) * WRITTEN_COST > self.room / 2;
        if full && !self.cur.contains_key(&k) {
            // A cap, under a flood: the least recently written go early.
            self.rotate(now);
        }
        self.cur.insert(k, (v, now));
    }

    /// What the remembered versions are counted as ([`WRITTEN_COST`] each).
    fn bytes(&self) -> usize {
        (self.cur.len() + self.old.len()) * WRITTEN_COST
    }

    /// Forgets early (the older generation first, then all) until what is
    /// remembered takes at most `room` bytes.
    fn fit(&mut self, room: usize, now: Instant) {
        self.room = room;
        if self.bytes() > room {
            self.old = HashMap::new();
        }
        if self.bytes() > room {
            self.rotate(now);
        }
        if self.bytes() > room {
            self.old = HashMap::new();
        }
    }

    /// Sections remembered, both generations.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.cur.len() + self.old.len()
    }

    /// Whether `s` is not newer than the version written for its section
    /// within [`FORGET`] of `now`.
    fn outdates(&self, s: &Snapshot, now: Instant) -> bool {
        match (s.version, self.get(&key(s), now)) {
            (Some(v), Some(w)) => v <= w,
            _ => false,
        }
    }
}

/// The held snapshots, oldest section first.
#[derive(Debug)]
pub struct Pending {
    max: usize,
    max_bytes: usize,
    /// What the held and in-flight snapshots cost ([`cost`]): at most
    /// `max_bytes` plus [`SLACK`].
    bytes: usize,
    map: HashMap<Key, Snapshot>,
    /// Each held section once, in the order it was first held.
    order: VecDeque<Key>,
    /// Snapshots taken by the writer and not yet reported, by section: a
    /// newer snapshot of a section in flight is held beside it, and is no
    /// new section.
    inflight: HashMap<Key, u32>,
    /// The sum of `inflight`.
    inflight_total: usize,
    /// Sections held or in flight, each once: what `max` bounds.
    sections: usize,
    written: Written,
    counts: Counts,
}

impl Pending {
    /// At most `max` sections and `max_bytes` held (in flight included);
    /// the last version written remembered for [`FORGET`] (for up to
    /// [`WRITTEN_CAP`] sections).
    pub fn new(max: usize, max_bytes: usize) -> Pending {
        Pending::remembering(max, max_bytes, WRITTEN_CAP)
    }

    /// As [`Pending::new`], with the last version written remembered for
    /// up to `written_cap` sections.
    fn remembering(max: usize, max_bytes: usize, written_cap: usize) -> Pending {
        Pending {
            max: max.max(1),
            max_bytes,
            bytes: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
            inflight: HashMap::new(),
            inflight_total: 0,
            sections: 0,
            written: Written::new(written_cap),
            counts: Counts::default(),
        }
    }

    /// Snapshots held, those being written included (the `pending`
    /// gauge): a section being written with a newer one held counts twice,
    /// so that every snapshot received is in exactly one counter or here.
    pub fn len(&self) -> usize {
        self.map.len() + self.inflight_total
    }

    /// Whether nothing is held or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sections waiting to be taken (not in flight).
    pub fn held(&self) -> usize {
        self.map.len()
    }

    /// The counters so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// A received snapshot at `now`: held if it is the newest of its section
    /// and fits: a new section both bounds, a newer snapshot of a section
    /// held or in flight the bytes bound plus [`SLACK`].
    pub fn offer(&mut self, s: Snapshot, now: Instant) -> Offer {
        if self.written.outdates(&s, now) {
            self.counts.coalesced += 1;
            return Offer::Stale;
        }
        let k = key(&s);
        let c = cost(&s);
        if let Some(held) = self.map.get_mut(&k) {
            // A lower or equal version is stale; no version replaces.
            if !s.supersedes(held) {
                self.counts.coalesced += 1;
                return Offer::Stale;
            }
            let old = cost(held);
            if c > old && self.bytes - old + c > self.max_bytes.saturating_add(SLACK) {
                // A larger replacement past the bound and its slack: the
                // one held stays.
                self.counts.dropped_full += 1;
                return Offer::Full;
            }
            self.counts.coalesced += 1;
            self.bytes = self.bytes - old + c;
            *held = s;
            self.fit_written(now);
            return Offer::Replaced;
        }
        let in_flight = self.inflight.contains_key(&k);
        // A section in flight is no new section: its newer snapshot has the slack.
        let bound = if in_flight {
            self.max_bytes.saturating_add(SLACK)
        } else {
            self.max_bytes
        };
        if (!in_flight && self.sections >= self.max) || self.bytes + c > bound {
            self.counts.dropped_full += 1;
            return Offer::Full;
        }
        if !in_flight {
            self.sections += 1;
        }
        self.bytes += c;
        self.order.push_back(k.clone());
        self.map.insert(k, s);
        self.fit_written(now);
        Offer::Held
    }

    /// The remembered written versions forgotten early where they and the
    /// snapshots held would pass `--max-pending-bytes` together.
    fn fit_written(&mut self, now: Instant) {
        self.written
            .fit(self.max_bytes.saturating_sub(self.bytes), now);
    }

    /// Up to `n` held snapshots and about `max_bytes` of them (at least one)
    /// to write, oldest section first; they stay counted against the bounds
    /// until [`Pending::done`], [`Pending::give_back`] or [`Pending::refused`].
    pub fn take(&mut self, n: usize, max_bytes: usize, now: Instant) -> Vec<Snapshot> {
        let mut out = Vec::with_capacity(n.min(self.map.len()));
        let mut size = 0;
        while out.len() < n && (out.is_empty() || size < max_bytes) {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            let Some(s) = self.map.remove(&k) else {
                continue;
            };
            // A version written after this one was held (it was in flight).
            if self.written.outdates(&s, now) {
                self.counts.coalesced += 1;
                self.bytes = self.bytes.saturating_sub(cost(&s));
                if !self.inflight.contains_key(&k) {
                    self.sections -= 1;
                }
                continue;
            }
            size += cost(&s);
            *self.inflight.entry(k).or_insert(0) += 1;
            self.inflight_total += 1;
            out.push(s);
        }
        out
    }

    /// One snapshot of section `k` taken before is reported: no longer in
    /// flight. True when no other snapshot of it is in flight.
    fn landed(&mut self, k: &Key) -> bool {
        let Some(n) = self.inflight.get_mut(k) else {
            return false;
        };
        self.inflight_total -= 1;
        *n -= 1;
        if *n > 0 {
            return false;
        }
        self.inflight.remove(k);
        true
    }

    /// A snapshot taken before is gone (written or refused): its section
    /// leaves the count unless a newer one of it is held.
    fn settled(&mut self, s: &Snapshot) {
        let k = key(s);
        if self.landed(&k) && !self.map.contains_key(&k) {
            self.sections -= 1;
        }
        self.bytes = self.bytes.saturating_sub(cost(s));
    }

    /// `batch` (taken before) is written, at `now`.
    pub fn done(&mut self, batch: &[Snapshot], now: Instant) {
        self.counts.published += batch.len() as u64;
        for s in batch {
            self.settled(s);
            self.written.record(s, now);
        }
        self.fit_written(now);
    }

    /// `batch` (taken before) was not written (Redis down or slow): held
    /// again, first in line, unless a newer one of its section arrived since.
    pub fn give_back(&mut self, batch: Vec<Snapshot>) {
        for s in batch.into_iter().rev() {
            let k = key(&s);
            // Its section stays counted: held again, or held newer.
            self.landed(&k);
            if let Some(held) = self.map.get_mut(&k) {
                // `held` arrived later: it wins unless both have versions and
                // the returned one is greater. The loser's bytes are freed.
                self.counts.coalesced += 1;
                let returned_wins =
                    matches!((s.version, held.version), (Some(old), Some(new)) if old > new);
                let loser = if returned_wins {
                    std::mem::replace(held, s)
                } else {
                    s
                };
                self.bytes = self.bytes.saturating_sub(cost(&loser));
                continue;
            }
            // The section was counted while in flight: this never passes `max`.
            self.order.push_front(k.clone());
            self.map.insert(k, s);
        }
    }

    /// One snapshot (taken before) that Redis refused while answering: dropped.
    pub fn refused(&mut self, s: &Snapshot) {
        self.settled(s);
        self.counts.dropped_redis_down += 1;
    }

    /// At stop, what is still held or in flight is dropped (Redis did not take
    /// it in time); returns how many.
    pub fn drop_all(&mut self) -> usize {
        let n = self.len();
        self.map.clear();
        self.order.clear();
        self.inflight.clear();
        self.inflight_total = 0;
        self.sections = 0;
        self.bytes = 0;
        self.counts.dropped_redis_down += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    /// One instant for the tests that do not move time.
    fn t0() -> Instant {
        static T: OnceLock<Instant> = OnceLock::new();
        *T.get_or_init(Instant::now)
    }

    fn snap(course: &str, section: u32, taken: u32, version: Option<u64>) -> Snapshot {
        Snapshot::build(course.into(), section, 100, taken, None, version, None)
    }

    #[test]
    fn newest_version_per_section_is_kept() {
        let mut p = Pending::new(10, usize::MAX);
        assert_eq!(p.offer(snap("A", 1, 5, Some(5)), t0()), Offer::Held);
        assert_eq!(p.offer(snap("A", 1, 3, Some(3)), t0()), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 5, Some(5)), t0()), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 7, Some(7)), t0()), Offer::Replaced);
        assert_eq!(p.offer(snap("A", 2, 1, Some(1)), t0()), Offer::Held);
        assert_eq!(p.len(), 2);
        let b = p.take(10, usize::MAX, t0());
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].section, b[0].version), (1, Some(7)));
        assert_eq!(p.counts().coalesced, 3);
    }

    #[test]
    fn no_version_replaces_and_is_replaced() {
        let mut p = Pending::new(10, usize::MAX);
        p.offer(snap("A", 1, 5, Some(5)), t0());
        assert_eq!(p.offer(snap("A", 1, 9, None), t0()), Offer::Replaced);
        assert_eq!(p.offer(snap("A", 1, 2, Some(2)), t0()), Offer::Replaced);
        assert_eq!(p.take(1, usize::MAX, t0())[0].version, Some(2));
    }

    #[test]
    fn shuffled_versions_leave_the_newest() {
        let mut p = Pending::new(100, usize::MAX);
        let mut versions: Vec<u64> = (1..=500).collect();
        fastrand::seed(7);
        fastrand::shuffle(&mut versions);
        for v in versions {
            p.offer(snap("HOT", 0, v as u32, Some(v)), t0());
        }
        let b = p.take(10, usize::MAX, t0());
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].version, Some(500));
        assert_eq!(p.counts().coalesced, 499);
    }

    #[test]
    fn a_new_section_past_the_bound_is_dropped() {
        let mut p = Pending::new(2, usize::MAX);
        p.offer(snap("A", 1, 1, Some(1)), t0());
        p.offer(snap("A", 2, 1, Some(1)), t0());
        assert_eq!(p.offer(snap("A", 3, 1, Some(1)), t0()), Offer::Full);
        // A held section still takes newer versions.
        assert_eq!(p.offer(snap("A", 2, 2, Some(2)), t0()), Offer::Replaced);
        assert_eq!(p.counts().dropped_full, 1);
        // In flight counts against the bound until reported.
        let b = p.take(1, usize::MAX, t0());
        assert_eq!(p.offer(snap("A", 3, 1, Some(1)), t0()), Offer::Full);
        p.done(&b, t0());
        assert_eq!(p.offer(snap("A", 3, 1, Some(1)), t0()), Offer::Held);
    }

    #[test]
    fn nothing_older_than_written_is_written() {
        let mut p = Pending::new(10, usize::MAX);
        p.offer(snap("A", 1, 9, Some(9)), t0());
        let b = p.take(10, usize::MAX, t0());
        // While 9 is in flight, 4 arrives and is held (nothing held for the section).
        assert_eq!(p.offer(snap("A", 1, 4, Some(4)), t0()), Offer::Held);
        p.done(&b, t0());
        assert!(
            p.take(10, usize::MAX, t0()).is_empty(),
            "4 is older than the 9 written"
        );
        assert_eq!(p.offer(snap("A", 1, 9, Some(9)), t0()), Offer::Stale);
        assert_eq!(p.offer(snap("A", 1, 10, Some(10)), t0()), Offer::Held);
        assert_eq!(p.counts().published, 1);
        assert_eq!(p.counts().coalesced, 2);
        // Written without a version: 10 stays the version nothing older than
        // is written within the window; past it the script decides.
        let b = p.take(10, usize::MAX, t0());
        p.done(&b, t0());
        p.offer(snap("A", 1, 0, None), t0());
        let b = p.take(10, usize::MAX, t0());
        p.done(&b, t0());
        assert_eq!(p.offer(snap("A", 1, 1, Some(1)), t0()), Offer::Stale);
        assert_eq!(
            p.offer(snap("A", 1, 1, Some(1)), t0() + FORGET),
            Offer::Held
        );
    }

    #[test]
    fn given_back_first_in_line_unless_outdated() {
        let mut p = Pending::new(4, usize::MAX);
        p.offer(snap("A", 1, 1, Some(1)), t0());
        p.offer(snap("A", 2, 1, Some(1)), t0());
        let b = p.take(2, usize::MAX, t0());
        p.offer(snap("A", 3, 1, Some(1)), t0());
        // A section in flight and held again is one section against the
        // bound (two snapshots pending).
        assert_eq!(p.offer(snap("A", 2, 2, Some(2)), t0()), Offer::Held);
        assert_eq!(p.len(), 4);
        assert_eq!(p.offer(snap("A", 4, 1, Some(1)), t0()), Offer::Held);
        assert_eq!(p.offer(snap("A", 5, 1, Some(1)), t0()), Offer::Full);
        p.give_back(b);
        assert_eq!(p.len(), 4);
        let again = p.take(10, usize::MAX, t0());
        let got: Vec<(u32, Option<u64>)> = again.iter().map(|s| (s.section, s.version)).collect();
        assert_eq!(
            got,
            vec![(1, Some(1)), (3, Some(1)), (2, Some(2)), (4, Some(1))]
        );
    }

    #[test]
    fn a_newer_snapshot_of_a_section_in_flight_is_kept_at_the_bound() {
        // Every section is in flight (Redis frozen) when newer ones come.
        let mut p = Pending::new(10, usize::MAX);
        for section in 0..10 {
            p.offer(snap("MP", section, 1, Some(1)), t0());
        }
        let b = p.take(10, usize::MAX, t0());
        for section in 0..10 {
            let newer = p.offer(snap("MP", section, 2, Some(2)), t0());
            assert_eq!(newer, Offer::Held, "section {section}");
        }
        // Ten sections, twenty snapshots pending.
        assert_eq!(p.len(), 20);
        assert_eq!(p.offer(snap("MP", 10, 1, Some(1)), t0()), Offer::Full);
        // Every snapshot offered is counted once, or pending.
        let c = p.counts();
        let counted = c.coalesced + c.published + c.dropped_full + c.dropped_redis_down;
        assert_eq!(counted + p.len() as u64, 21);
        // Written late, then the newer ones: the newest of each lands last.
        p.done(&b, t0());
        assert_eq!(p.len(), 10);
        let next = p.take(10, usize::MAX, t0());
        assert!(next.iter().all(|s| s.version == Some(2)), "{next:?}");
        p.done(&next, t0());
        assert!(p.is_empty());
        assert_eq!(p.counts().published, 20);
        assert_eq!(p.counts().dropped_full, 1);
        // Given back instead, each older one yields to the newer held.
        for section in 0..3 {
            p.offer(snap("MP", section, 3, Some(3)), t0());
        }
        let b = p.take(3, usize::MAX, t0());
        for section in 0..3 {
            p.offer(snap("MP", section, 4, Some(4)), t0());
        }
        p.give_back(b);
        assert_eq!(p.len(), 3);
        let last = p.take(10, usize::MAX, t0());
        assert!(last.iter().all(|s| s.version == Some(4)), "{last:?}");
        p.refused(&last[0]);
        p.done(&last[1..], t0());
        assert!(p.is_empty());
    }

    #[test]
    fn refused_and_stopped_count_as_redis_down() {
        let mut p = Pending::new(10, usize::MAX);
        p.offer(snap("A", 1, 1, Some(1)), t0());
        p.offer(snap("A", 2, 1, Some(1)), t0());
        p.offer(snap("A", 3, 1, Some(1)), t0());
        let b = p.take(1, usize::MAX, t0());
        p.refused(&b[0]);
        let _in_flight = p.take(1, usize::MAX, t0());
        assert_eq!(p.drop_all(), 2);
        assert_eq!(p.counts().dropped_redis_down, 3);
        assert!(p.is_empty());
    }

    /// Writes `n` sections of course `course` at `at`, `per` at a time.
    fn write_sections(p: &mut Pending, course: &str, n: u32, per: usize, at: Instant) {
        for i in 0..n {
            p.offer(snap(course, i, 1, Some(1)), at);
            if p.held() >= per {
                let b = p.take(per, usize::MAX, at);
                p.done(&b, at);
            }
        }
        let b = p.take(usize::MAX, usize::MAX, at);
        p.done(&b, at);
    }

    #[test]
    fn a_written_version_is_remembered_for_10_s_whatever_max_pending() {
        // Ten sections held at most, thousands written in the window.
        let mut p = Pending::new(10, usize::MAX);
        p.offer(snap("FX", 1, 100, Some(100)), t0());
        let b = p.take(10, usize::MAX, t0());
        p.done(&b, t0());
        for second in 1..10 {
            let at = t0() + Duration::from_secs(second);
            write_sections(&mut p, &format!("OTHER{second}"), 1000, 10, at);
        }
        let inside = t0() + FORGET - Duration::from_millis(1);
        assert_eq!(p.offer(snap("FX", 1, 50, Some(50)), inside), Offer::Stale);
        // Written late in one generation, remembered well into the next.
        let late = t0() + Duration::from_millis(9_990);
        write_sections(&mut p, "LATE", 1, 10, late);
        for second in 10..20 {
            let at = t0() + Duration::from_secs(second);
            write_sections(&mut p, &format!("MORE{second}"), 100, 10, at);
        }
        let before = late + FORGET - Duration::from_millis(1);
        assert_eq!(p.offer(snap("LATE", 0, 1, Some(1)), before), Offer::Stale);
        assert_eq!(p.offer(snap("LATE", 0, 2, Some(2)), before), Offer::Held);
        // Past the window, the script in Redis decides.
        assert_eq!(
            p.offer(snap("FX", 1, 51, Some(51)), t0() + FORGET),
            Offer::Held
        );
        assert_eq!(p.counts().dropped_full, 0);
    }

    #[test]
    fn written_versions_are_forgotten_by_the_generation_after_next() {
        let mut p = Pending::new(100, usize::MAX);
        write_sections(&mut p, "A", 1000, 100, t0());
        assert_eq!(p.written.len(), 1000);
        // A generation later the thousand are the old one; another later, gone.
        write_sections(&mut p, "B", 10, 100, t0() + FORGET);
        assert_eq!(p.written.len(), 1010);
        write_sections(&mut p, "C", 10, 100, t0() + 2 * FORGET);
        assert_eq!(p.written.len(), 20);
        // Idle for longer than two windows: nothing old is kept.
        write_sections(&mut p, "D", 10, 100, t0() + 5 * FORGET);
        assert_eq!(p.written.len(), 10);
        // A section written again is remembered once.
        write_sections(&mut p, "D", 10, 100, t0() + 6 * FORGET);
        assert_eq!(p.written.len(), 10);
    }

    #[test]
    fn an_unversioned_write_leaves_the_version_written_before_remembered() {
        let mut p = Pending::new(10, usize::MAX);
        for v in [Some(10), None] {
            p.offer(snap("CO2", 1, 10, v), t0());
            let b = p.take(10, usize::MAX, t0());
            p.done(&b, t0());
        }
        let later = t0() + Duration::from_millis(300);
        assert_eq!(p.offer(snap("CO2", 1, 6, Some(6)), later), Offer::Stale);
        assert_eq!(p.offer(snap("CO2", 1, 11, Some(11)), later), Offer::Held);
    }

    #[test]
    fn remembered_versions_give_way_to_held_snapshots_within_the_bytes_bound() {
        let bound = 1000 * WRITTEN_COST;
        let mut p = Pending::new(100_000, bound);
        write_sections(&mut p, "W", 2000, 100, t0());
        let within = |p: &Pending| p.bytes + p.written.bytes() <= bound;
        assert!(within(&p), "{} remembered", p.written.len());
        assert!(
            p.written.len() >= 500,
            "the newest stay: {}",
            p.written.len()
        );
        // Redis is down: what arrives is held, and the versions remembered
        // are forgotten to make room, never the bound passed.
        let mut i = 0;
        while p.offer(snap("H", i, 1, Some(1)), t0()) == Offer::Held {
            assert!(
                within(&p),
                "{} held, {} remembered",
                p.held(),
                p.written.len()
            );
            i += 1;
        }
        assert!(p.bytes + cost(&snap("H", i, 1, Some(1))) > bound);
        assert_eq!(p.written.len(), 0);
    }

    #[test]
    fn written_versions_are_bounded_by_the_cap() {
        let mut p = Pending::remembering(1000, usize::MAX, 100);
        write_sections(&mut p, "A", 1000, 1000, t0());
        assert!(p.written.len() <= 100, "{}", p.written.len());
        // The most recent ones are still remembered.
        assert_eq!(p.offer(snap("A", 999, 1, Some(1)), t0()), Offer::Stale);
        assert_eq!(
            Pending::new(1, 1 << 16).written.half * 2,
            WRITTEN_CAP,
            "the cap does not follow --max-pending"
        );
    }

    #[test]
    fn bytes_bound_new_sections_strictly_newer_ones_within_one_datagram_of_slack() {
        let big = |section: u32, version: u64, pad: usize| {
            let info = format!(r#"{{"p":"{}"}}"#, "x".repeat(pad));
            Snapshot::build("B".into(), section, 10, 1, Some(&info), Some(version), None)
        };
        let one = cost(&big(0, 1, 1000));
        let bound = one * 3;
        let mut p = Pending::new(1000, bound);
        for s in 0..3 {
            assert_eq!(p.offer(big(s, 1, 1000), t0()), Offer::Held);
        }
        assert_eq!(p.offer(big(3, 1, 10), t0()), Offer::Full);
        // A newer, larger snapshot of a held section replaces it past the
        // bound, within one datagram of slack.
        assert_eq!(p.offer(big(0, 2, 40_000), t0()), Offer::Replaced);
        assert!(p.bytes > bound && p.bytes <= bound + SLACK, "{}", p.bytes);
        // A second one would pass the slack: dropped, the older one stays.
        assert_eq!(p.offer(big(1, 2, 40_000), t0()), Offer::Full);
        assert_eq!(p.offer(big(1, 3, 10_000), t0()), Offer::Replaced);
        // New sections stay within the bound itself, however small.
        assert_eq!(p.offer(big(3, 1, 10), t0()), Offer::Full);
        assert_eq!(p.counts().dropped_full, 3);
        // A section in flight takes a newer snapshot within the slack too.
        let b = p.take(10, usize::MAX, t0());
        assert_eq!(b.len(), 3);
        assert_eq!(p.offer(big(2, 2, 2000), t0()), Offer::Held);
        assert!(p.bytes <= bound + SLACK, "{}", p.bytes);
        assert_eq!(p.offer(big(1, 4, 30_000), t0()), Offer::Full);
        // Given back, the newer held wins; then all written frees it all.
        p.give_back(b);
        let b = p.take(10, one, t0());
        assert_eq!(b.len(), 1, "a batch stops once past its bytes");
        p.give_back(b);
        let b = p.take(10, usize::MAX, t0());
        let got: Vec<(u32, Option<u64>)> = b.iter().map(|s| (s.section, s.version)).collect();
        assert_eq!(got, vec![(0, Some(2)), (1, Some(3)), (2, Some(2))]);
        p.done(&b, t0());
        assert_eq!((p.bytes, p.len()), (0, 0));
        assert_eq!(p.counts().dropped_full, 4);
    }

    #[test]
    fn a_written_version_is_forgotten_after_the_window() {
        let mut p = Pending::new(10, usize::MAX);
        p.offer(snap("A", 1, 1, Some(MAX)), t0());
        let b = p.take(10, usize::MAX, t0());
        p.done(&b, t0());
        let inside = t0() + FORGET - Duration::from_millis(1);
        assert_eq!(p.offer(snap("A", 1, 1, Some(103)), inside), Offer::Stale);
        let past = t0() + FORGET;
        assert_eq!(p.offer(snap("A", 1, 1, Some(200)), past), Offer::Held);
    }

    const MAX: u64 = shards::snapshot::MAX_VERSION;
}
