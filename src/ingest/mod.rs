//! The ingest thread: owns the pub/sub source, parses each snapshot once, keeps
//! the node's current board, and routes snapshots only to shards that watch the
//! course. It also builds the admin aggregate once per node.

mod admin;
pub mod any;
pub mod bus;
pub mod redis;
pub mod scan;
pub mod sharded;
pub mod source;

use crate::channels::wake::IngestRx;
use crate::channels::{Control, IngestCmd, Outlet, PresenceCmd};
use crate::clock;
use crate::metrics::Metrics;
use crossbeam_channel::Sender;
use foldhash::{HashMap, HashMapExt};
use shards::{Gate, Snapshot};
use source::{Source, SourceEvent};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// One course as the node knows it.
#[derive(Default)]
struct Board {
    sections: BTreeMap<u32, Arc<Snapshot>>,
    /// Shards watching, one bit each.
    shards: u128,
    /// Those shards' gates for this course (a shard without one is woken by
    /// every snapshot).
    gates: Vec<(usize, Gate)>,
    /// The state hash was read since the last (re)subscription.
    loaded: bool,
    /// Snapshots accepted during the current admin tick.
    updates: u64,
    /// A snapshot or a state hash named it: kept for admins after its last
    /// viewer leaves (a made-up name is kept only while watched).
    named: bool,
    /// Its admin entry as last sent (while the firehose is on).
    shown: Option<admin::Shown>,
}

/// How often a failed state-hash read is retried (ms).
const RETRY_LOAD_MS: u64 = 1_000;

/// Log at most this many rejects per second.
const REJECT_LOGS_PER_SEC: u32 = 5;

/// The routing core of the ingest thread, separate from its loop for tests.
/// Like a shard it reads no clock: every call that decides something by time
/// takes `now_ms` (Unix ms, the clock `ts` and presence scores use), and
/// [`Ingest::poll_timeout`] says when [`Ingest::handle_timeout`] is due.
pub struct Ingest<S: Source> {
    source: S,
    outlets: Vec<Outlet>,
    /// Looked up once per snapshot: foldhash (keyed per process) over SipHash.
    boards: HashMap<Arc<str>, Board>,
    admin_shards: u128,
    viewers: HashMap<Arc<str>, u64>,
    metrics: Arc<Metrics>,
    presence: Option<Sender<PresenceCmd>>,
    /// Start (ms) of the current reject-log second, and rejects logged in it.
    reject_log: (u64, u32),
    admin_tick_ms: u64,
    next_admin_ms: u64,
    next_retry_ms: u64,
    /// The next scan for courses with a state hash (while the firehose is on).
    next_scan_ms: u64,
}

impl<S: Source> Ingest<S> {
    /// A router feeding these outlets from `source`, building the admin
    /// aggregate every `admin_tick_ms` while an admin is connected.
    pub fn new(
        source: S,
        outlets: Vec<Outlet>,
        metrics: Arc<Metrics>,
        presence: Option<Sender<PresenceCmd>>,
        admin_tick_ms: u64,
        now_ms: u64,
    ) -> Self {
        Ingest {
            source,
            outlets,
            boards: HashMap::new(),
            admin_shards: 0,
            viewers: HashMap::new(),
            metrics,
            presence,
            reject_log: (now_ms, 0),
            admin_tick_ms,
            next_admin_ms: now_ms + admin_tick_ms,
            next_retry_ms: now_ms + RETRY_LOAD_MS,
            next_scan_ms: now_ms + admin::RESCAN_MS,
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether an admin is connected somewhere (the pattern subscription is held).
    pub fn firehose(&self) -> bool {
        self.admin_shards != 0
    }

    fn publish_subscriptions(&self) {
        let subs = if self.firehose() {
            0
        } else {
            self.boards.values().filter(|b| b.shards != 0).count() as u64
        };
        self.metrics().subscriptions.store(subs, Relaxed);
        self.metrics()
            .firehose
            .store(self.firehose() as u64, Relaxed);
        self.metrics()
            .ingest_courses
            .store(self.boards.len() as u64, Relaxed);
    }

    /// Handles one command; false on shutdown.
    pub fn command(&mut self, cmd: IngestCmd, now_ms: u64) -> bool {
        match cmd {
            IngestCmd::Interest {
                shard,
                course,
                watching,
                gate,
            } => {
                crate::failure::trip(&course);
                if watching {
                    self.interest_on(shard, course, gate, now_ms)
                } else {
                    self.interest_off(shard, &course)
                }
            }
            IngestCmd::AdminFeed { shard, connected } => self.admin_feed(shard, connected, now_ms),
            IngestCmd::Viewers(counts) => {
                // Only courses that have an admin entry (a made-up name watched
                // and left must leave nothing behind).
                for (c, n) in counts.iter() {
                    if self.boards.get(c).is_some_and(|b| b.named) {
                        self.viewers.insert(Arc::clone(c), *n);
                    }
                }
            }
            IngestCmd::Shutdown => return false,
        }
        self.publish_subscriptions();
        true
    }

    fn interest_on(&mut self, shard: usize, course: Arc<str>, gate: Option<Gate>, now_ms: u64) {
        let firehose = self.firehose();
        let board = self.boards.entry(Arc::clone(&course)).or_default();
        let new_sub = board.shards == 0 && !firehose;
        board.shards |= 1 << shard;
        board.gates.retain(|(s, _)| *s != shard);
        if let Some(g) = gate {
            board.gates.push((shard, g));
        }
        if new_sub {
            // Subscribe first, then read the state hash: nothing published in
            // between can be missed.
            self.source.subscribe(&course);
        }
        if !self.boards.get(&course).is_some_and(|b| b.loaded) {
            self.load(&course, now_ms);
        }
        let sections = self
            .boards
            .get(&course)
            .map(|b| b.sections.values().cloned().collect())
            .unwrap_or_default();
        if let Some(o) = self.outlets.get(shard) {
            // Snapshots already batched for this shard go first.
            o.inbox().control(Control::Seed { course, sections });
        }
    }

    fn interest_off(&mut self, shard: usize, course: &str) {
        let firehose = self.firehose();
        let Some(board) = self.boards.get_mut(course) else {
            return;
        };
        board.shards &= !(1 << shard);
        board.gates.retain(|(s, _)| *s != shard);
        if board.shards != 0 {
            return;
        }
        if !firehose {
            self.source.unsubscribe(course);
            self.boards.remove(course);
        } else if !board.named {
            // A name no snapshot or state hash has named: kept only while watched.
            self.boards.remove(course);
            self.viewers.remove(course);
        }
    }

    fn admin_feed(&mut self, shard: usize, connected: bool, now_ms: u64) {
        let was = self.firehose();
        if connected {
            self.admin_shards |= 1 << shard;
        } else {
            self.admin_shards &= !(1 << shard);
        }
        let now = self.firehose();
        if was == now {
            if connected {
                self.admin_answer(shard);
            }
            return;
        }
        self.source.set_firehose(now);
        if now {
            // The first admin: count updates from this tick on.
            self.reset_updates();
            self.next_admin_ms = now_ms + self.admin_tick_ms;
            // The pattern covers every course: per-course subscriptions go.
            let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
            for c in courses {
                self.source.unsubscribe(&c);
            }
            // Admins see the whole board at once: read every state hash.
            self.discover(now_ms);
            self.admin_answer(shard);
        } else {
            // Back to per-course subscriptions for watched courses only.
            self.boards.retain(|_, b| b.shards != 0);
            for b in self.boards.values_mut() {
                b.shown = None;
            }
            let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
            for c in &courses {
                self.source.subscribe(c);
            }
            self.viewers.clear();
        }
        if let Some(p) = &self.presence {
            let _ = p.send(PresenceCmd::CountAll(now));
        }
    }

    fn load(&mut self, course: &Arc<str>, now_ms: u64) {
        let Some(payloads) = self.source.load_state(course) else {
            // Not loaded: `retry_unloaded` reads it again.
            if let Some(b) = self.boards.get_mut(course) {
                b.loaded = false;
            }
            return;
        };
        let connected = self.source.connected();
        for p in payloads {
            match Snapshot::parse(&p, Some(course)) {
                Ok(s) => {
                    if self.older_than_held(&s) {
                        // An out-of-order publisher wrote the hash: the newer stays.
                        self.metrics.state_stale.fetch_add(1, Relaxed);
                    }
                    self.accept(Arc::new(s), false);
                }
                Err(r) => self.rejected(r, course, now_ms),
            }
        }
        if let Some(b) = self.boards.get_mut(course) {
            b.loaded = connected;
        }
    }

    fn rejected(&mut self, r: shards::Reject, course: &str, now_ms: u64) {
        self.metrics().reject(r);
        let now = now_ms;
        if now.abs_diff(self.reject_log.0) >= 1_000 {
            if self.reject_log.1 > REJECT_LOGS_PER_SEC {
                tracing::warn!(
                    suppressed = self.reject_log.1 - REJECT_LOGS_PER_SEC,
                    "ingest rejects not logged"
                );
            }
            self.reject_log = (now, 0);
        }
        self.reject_log.1 += 1;
        if self.reject_log.1 <= REJECT_LOGS_PER_SEC {
            tracing::warn!(reason = r.label(), course, "snapshot rejected");
        }
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

    /// Applies a snapshot to the node board and routes it; false if it was
    /// stale or a duplicate (the same publish seen through two subscriptions).
    fn accept(&mut self, snap: Arc<Snapshot>, count: bool) -> bool {
        let firehose = self.firehose();
        let board = match self.boards.get_mut(&snap.course) {
            Some(b) => b,
            None if firehose => self.boards.entry(Arc::clone(&snap.course)).or_default(),
            // A late message for a course nobody watches any more.
            None => return false,
        };
        // Dedupe by the version rule: stale, or the same publish seen twice.
        if !snap.replaces(board.sections.get(&snap.section).map(|s| &**s)) {
            self.metrics.ingest_duplicates.fetch_add(1, Relaxed);
            return false;
        }
        board.sections.insert(snap.section, Arc::clone(&snap));
        board.named = true;
        if count {
            board.updates += 1;
        }
        let mut mask = board.shards;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(o) = self.outlets.get_mut(i) {
                let gate = board.gates.iter().find(|(s, _)| *s == i).map(|(_, g)| g);
                o.push(Arc::clone(&snap), gate);
            }
        }
        true
    }

    /// Handles one source event.
    pub fn event(&mut self, ev: SourceEvent, now_ms: u64) {
        match ev {
            SourceEvent::Message { course, payload } => {
                match Snapshot::parse(&payload, Some(&course)) {
                    Ok(s) => {
                        self.metrics().ingest_messages.fetch_add(1, Relaxed);
                        if let Some(ts) = s.ts {
                            self.metrics()
                                .update_latency
                                .observe_us(now_ms.saturating_sub(ts).saturating_mul(1000));
                        }
                        self.accept(Arc::new(s), true);
                    }
                    Err(r) => self.rejected(r, &course, now_ms),
                }
            }
            SourceEvent::Oversize { course } => {
                self.rejected(shards::Reject::TooLarge, &course, now_ms)
            }
            SourceEvent::Reconnected => {
                self.metrics.redis_reconnects.fetch_add(1, Relaxed);
                // Reseed every watched course: versions keep this idempotent.
                let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
                for c in courses {
                    self.load(&c, now_ms);
                }
            }
        }
    }

    /// Rereads the state hash of watched courses whose last read failed.
    fn retry_unloaded(&mut self, now_ms: u64) {
        if !self.source.connected() {
            return;
        }
        let courses: Vec<Arc<str>> = self
            .boards
            .iter()
            .filter(|(_, b)| b.shards != 0 && !b.loaded)
            .map(|(c, _)| Arc::clone(c))
            .collect();
        for c in courses {
            self.load(&c, now_ms);
        }
    }

    /// Runs what is due at `now_ms`: rereads of failed state-hash reads (every
    /// second), and the admin aggregate (every admin tick) together with the
    /// courses the presence worker must count for admins.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        // A wall clock stepped back must not stall the ticks.
        let tick = self.admin_tick_ms;
        self.next_retry_ms = self.next_retry_ms.min(now_ms + RETRY_LOAD_MS);
        self.next_admin_ms = self.next_admin_ms.min(now_ms + tick);
        if now_ms >= self.next_retry_ms {
            self.next_retry_ms = now_ms + RETRY_LOAD_MS;
            self.retry_unloaded(now_ms);
        }
        if now_ms >= self.next_admin_ms {
            self.next_admin_ms += tick;
            if self.next_admin_ms <= now_ms {
                self.next_admin_ms = now_ms + tick;
            }
            self.admin_tick();
            self.admin_presence();
        }
        self.admin_timers(now_ms);
        self.publish_subscriptions();
    }

    /// When [`Ingest::handle_timeout`] has work next (Unix ms): the admin tick
    /// only while an admin is connected, the reread only while a read failed;
    /// `None` while there is nothing to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        let admin = self
            .firehose()
            .then_some(self.next_admin_ms.min(self.next_scan_ms));
        let retry = self.has_unloaded().then_some(self.next_retry_ms);
        admin.into_iter().chain(retry).min()
    }

    /// How long the ingest thread may sleep on the source's sockets and its
    /// command wake-up before it must poll the source or run its timers: until
    /// the first of the router's timers ([`Ingest::poll_timeout`]) and the
    /// source's timed work (`None`: until woken); `Some(ZERO)`: not at all
    /// (something buffered or due, or a backlog to retry).
    pub fn sleep_for(&mut self, now_ms: u64) -> Option<Duration> {
        if self.backlog() {
            return Some(Duration::ZERO);
        }
        let timers = self
            .poll_timeout()
            .map(|t| Duration::from_millis(t.saturating_sub(now_ms)));
        match (timers, self.source.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends batched snapshots to shards.
    pub fn flush(&mut self) {
        for o in &mut self.outlets {
            o.flush();
        }
    }

    /// Whether a watched course's state read failed and waits for a reread.
    pub fn has_unloaded(&self) -> bool {
        self.boards.values().any(|b| b.shards != 0 && !b.loaded)
    }

    /// Starts counting updates afresh (the first admin connected).
    fn reset_updates(&mut self) {
        for b in self.boards.values_mut() {
            b.updates = 0;
        }
    }

    /// Whether some shard's channel is full and snapshots wait coalesced.
    pub fn backlog(&self) -> bool {
        self.outlets.iter().any(|o| o.backlog() > 0)
    }

    /// The source, for health reporting.
    pub fn source(&self) -> &S {
        &self.source
    }
}

/// Runs the ingest thread until `Shutdown`. It sleeps in `poll(2)` on every
/// socket its source reads and its command wake-up, until the next thing it
/// has to do: no timer runs while there is nothing to do (the admin tick only
/// while an admin is connected, the state reread only while a read failed, the
/// source's own timed work only when due; see [`Ingest::sleep_for`]).
pub fn run<S: Source>(mut ingest: Ingest<S>, mut commands: IngestRx) {
    let mut fds = Vec::new();
    loop {
        while let Some(cmd) = commands.try_recv() {
            if !ingest.command(cmd, clock::unix_ms()) {
                return;
            }
        }
        let up = ingest.source().connected();
        ingest.metrics.redis_connected.store(up as u64, Relaxed);
        let sleep = ingest.sleep_for(clock::unix_ms());
        if sleep != Some(Duration::ZERO) {
            fds.clear();
            ingest.source.wait_fds(&mut fds);
            commands.wait(&fds, sleep);
        }
        // Readable, woken or due: read what is there without waiting long (a
        // backlog retries at this pace).
        let wait = Duration::from_millis(1);
        let mut n = 0;
        if let Some(ev) = ingest.source.poll(wait) {
            ingest.event(ev, clock::unix_ms());
            n += 1;
            // Take whatever else is ready, then route it as one batch per shard.
            while n < 1024 {
                match ingest.source.poll(Duration::ZERO) {
                    Some(ev) => {
                        ingest.event(ev, clock::unix_ms());
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        ingest.handle_timeout(clock::unix_ms());
        ingest.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::Inbox;
    use crossbeam_channel::{unbounded, Receiver};
    use std::sync::Mutex;

    /// What the fake source was asked to do, and what it holds.
    #[derive(Default)]
    struct World {
        log: Vec<String>,
        /// State hashes: course -> payloads.
        hashes: HashMap<String, Vec<Vec<u8>>>,
        /// The next this many state reads fail.
        fail: usize,
        /// What the source answers to `poll_timeout`.
        due: Option<Duration>,
    }

    /// A source over a shared [`World`], so a test can look and change it.
    struct Fake(Arc<Mutex<World>>);

    impl Source for Fake {
        fn poll(&mut self, _timeout: Duration) -> Option<SourceEvent> {
            None
        }
        fn subscribe(&mut self, course: &str) {
            self.0.lock().unwrap().log.push(format!("sub {course}"));
        }
        fn unsubscribe(&mut self, course: &str) {
            self.0.lock().unwrap().log.push(format!("unsub {course}"));
        }
        fn set_firehose(&mut self, on: bool) {
            self.0.lock().unwrap().log.push(format!("firehose {on}"));
        }
        fn load_state(&mut self, course: &str) -> Option<Vec<Vec<u8>>> {
            let mut w = self.0.lock().unwrap();
            w.log.push(format!("load {course}"));
            if w.fail > 0 {
                w.fail -= 1;
                return None;
            }
            Some(w.hashes.get(course).cloned().unwrap_or_default())
        }
        fn known_courses(&mut self) -> Vec<String> {
            let mut known: Vec<String> = self.0.lock().unwrap().hashes.keys().cloned().collect();
            known.sort();
            known
        }
        fn connected(&self) -> bool {
            true
        }
        fn poll_timeout(&mut self) -> Option<Duration> {
            self.0.lock().unwrap().due
        }
        fn wait_fds(&self, _fds: &mut Vec<std::os::fd::RawFd>) {}
    }

    struct Rig {
        ingest: Ingest<Fake>,
        world: Arc<Mutex<World>>,
        inboxes: Vec<Arc<Inbox>>,
        presence: Receiver<PresenceCmd>,
        metrics: Arc<Metrics>,
    }

    const T0: u64 = 1_764_420_000_000;
    const ADMIN_TICK: u64 = 750;

    fn rig(shards: usize) -> Rig {
        let metrics = Arc::new(Metrics::new(shards));
        let inboxes: Vec<Arc<Inbox>> = (0..shards).map(|_| Inbox::new()).collect();
        let outlets = inboxes.iter().map(|i| Outlet::new(Arc::clone(i))).collect();
        let world = Arc::new(Mutex::new(World::default()));
        let (tx, presence) = unbounded();
        let ingest = Ingest::new(
            Fake(Arc::clone(&world)),
            outlets,
            Arc::clone(&metrics),
            Some(tx),
            ADMIN_TICK,
            T0,
        );
        Rig {
            ingest,
            world,
            inboxes,
            presence,
            metrics,
        }
    }

    fn payload(course: &str, section: u32, taken: u32, version: u64) -> Vec<u8> {
        format!(
            r#"{{"course":"{course}","section":{section},"total_seats":10,"seats_taken":{taken},"version":{version}}}"#
        )
        .into_bytes()
    }

    fn message(course: &str, section: u32, taken: u32, version: u64) -> SourceEvent {
        SourceEvent::Message {
            course: course.into(),
            payload: payload(course, section, taken, version),
        }
    }

    impl Rig {
        fn interest(&mut self, shard: usize, course: &str, watching: bool) {
            let cmd = IngestCmd::Interest {
                shard,
                course: course.into(),
                watching,
                gate: None,
            };
            assert!(self.ingest.command(cmd, T0));
        }

        fn admin(&mut self, shard: usize, connected: bool) {
            let cmd = IngestCmd::AdminFeed { shard, connected };
            assert!(self.ingest.command(cmd, T0));
        }

        fn log(&self) -> Vec<String> {
            std::mem::take(&mut self.world.lock().unwrap().log)
        }

        /// Snapshots routed to `shard` since the last look, as (course, section, taken).
        fn routed(&mut self, shard: usize) -> Vec<(String, u32, u32)> {
            self.ingest.flush();
            let mut out = Vec::new();
            while let Some(batch) = self.inboxes[shard].try_snapshots() {
                out.extend(
                    batch
                        .iter()
                        .map(|s| (s.course.to_string(), s.section, s.seats_taken)),
                );
            }
            out
        }

        /// Control messages to `shard` since the last look.
        fn control(&self, shard: usize) -> Vec<Control> {
            std::iter::from_fn(|| self.inboxes[shard].try_control()).collect()
        }

        fn presence_cmds(&self) -> Vec<PresenceCmd> {
            self.presence.try_iter().collect()
        }
    }

    /// The JSON of an admin aggregate frame (one unmasked text frame).
    fn admin_json(frame: &bytes::Bytes) -> serde_json::Value {
        let start = match frame[1] {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        serde_json::from_slice(&frame[start..]).expect("admin JSON")
    }

    fn seed_sections(c: &Control) -> Option<usize> {
        match c {
            Control::Seed { sections, .. } => Some(sections.len()),
            _ => None,
        }
    }

    #[test]
    fn one_subscription_per_course_however_many_shards_watch() {
        let mut r = rig(2);
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("C".into(), vec![payload("C", 1, 3, 1)]);
        r.interest(0, "C", true);
        // Subscribe first, then read the state hash.
        assert_eq!(r.log(), ["sub C", "load C"]);
        assert_eq!(
            r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
            [Some(1)]
        );
        assert_eq!(r.metrics.subscriptions.load(Relaxed), 1);
        // A second shard: no second subscription, no reread; its seed holds the board.
        r.interest(1, "C", true);
        assert!(r.log().is_empty());
        assert_eq!(
            r.control(1).iter().map(seed_sections).collect::<Vec<_>>(),
            [Some(1)]
        );
        // The first shard leaving keeps the subscription; the last one ends it.
        r.interest(0, "C", false);
        assert!(r.log().is_empty());
        r.interest(1, "C", false);
        assert_eq!(r.log(), ["unsub C"]);
        assert_eq!(r.metrics.subscriptions.load(Relaxed), 0);
        // Watched again: subscribed and read again (the board was forgotten).
        r.interest(1, "C", true);
        assert_eq!(r.log(), ["sub C", "load C"]);
    }

    #[test]
    fn snapshots_go_only_to_watching_shards_once_and_never_backwards() {
        let mut r = rig(3);
        r.interest(0, "A", true);
        r.interest(2, "A", true);
        r.interest(1, "B", true);
        r.control(0);
        r.ingest.event(message("A", 1, 5, 2), T0);
        r.ingest.event(message("B", 1, 6, 1), T0);
        r.ingest.event(message("Z", 1, 7, 1), T0); // nobody watches Z
        assert_eq!(r.routed(0), [("A".into(), 1, 5)]);
        assert_eq!(r.routed(2), [("A".into(), 1, 5)]);
        assert_eq!(r.routed(1), [("B".into(), 1, 6)]);
        // The same publish seen twice, and an older version: neither is routed.
        let dups = r.metrics.ingest_duplicates.load(Relaxed);
        r.ingest.event(message("A", 1, 5, 2), T0);
        r.ingest.event(message("A", 1, 4, 1), T0);
        assert!(r.routed(0).is_empty());
        assert_eq!(r.metrics.ingest_duplicates.load(Relaxed), dups + 2);
        // A message whose course does not match its channel is rejected.
        r.ingest.event(
            SourceEvent::Message {
                course: "A".into(),
                payload: payload("B", 1, 9, 9),
            },
            T0,
        );
        assert!(r.routed(0).is_empty() && r.routed(1).is_empty());
    }

    #[test]
    fn an_admin_swaps_per_course_subscriptions_for_the_firehose_and_back() {
        let mut r = rig(2);
        {
            let mut w = r.world.lock().unwrap();
            w.hashes.insert("A".into(), vec![payload("A", 1, 2, 1)]);
            w.hashes.insert("B".into(), vec![payload("B", 1, 10, 1)]);
        }
        r.interest(0, "A", true);
        r.log();
        assert_eq!(r.routed(0), [("A".into(), 1, 2)]);
        r.admin(1, true);
        // The pattern replaces the per-course subscription; every course with
        // a state hash is read so the admin sees the whole board.
        assert_eq!(r.log(), ["firehose true", "unsub A", "load B"]);
        assert!(matches!(
            r.presence_cmds()[..],
            [PresenceCmd::CountAll(true)]
        ));
        assert_eq!(r.metrics.firehose.load(Relaxed), 1);
        assert_eq!(r.metrics.subscriptions.load(Relaxed), 0);
        // A second admin shard changes nothing.
        r.admin(0, true);
        assert!(r.log().is_empty());
        // Unwatched courses are followed but routed to no shard.
        r.ingest.event(message("B", 2, 1, 1), T0);
        assert!(r.routed(0).is_empty() && r.routed(1).is_empty());
        // Back to per-course subscriptions when the last admin leaves, for the
        // watched course only.
        r.admin(0, false);
        assert!(r.log().is_empty());
        r.admin(1, false);
        assert_eq!(r.log(), ["firehose false", "sub A"]);
        assert!(matches!(
            r.presence_cmds()[..],
            [PresenceCmd::CountAll(false)]
        ));
        assert_eq!(r.ingest.known_courses(), [Arc::<str>::from("A")]);
        assert_eq!(r.metrics.subscriptions.load(Relaxed), 1);
    }

    /// The one admin message sent to `shard` since the last look.
    fn one_admin(r: &Rig, shard: usize) -> shards::AdminMsg {
        let sent = r.control(shard);
        match &sent[..] {
            [Control::Admin(m)] => m.clone(),
            _ => panic!("one admin message, got {sent:?}"),
        }
    }

    fn courses_of(frame: &bytes::Bytes) -> Vec<String> {
        let v = admin_json(frame);
        v["courses"]
            .as_array()
            .expect("courses")
            .iter()
            .map(|c| c["course"].as_str().expect("code").to_owned())
            .collect()
    }

    #[test]
    fn a_new_admin_gets_every_state_hash_at_once_then_deltas_each_tick_while_something_changed() {
        let mut r = rig(2);
        r.world.lock().unwrap().hashes.insert(
            "A".into(),
            vec![payload("A", 1, 10, 1), payload("A", 2, 3, 1)],
        );
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("B".into(), vec![payload("B", 1, 1, 1)]);
        r.admin(1, true);
        r.presence_cmds();
        // At once, not at the next tick: a full message with every course.
        let first = one_admin(&r, 1);
        assert!(first.delta.is_none());
        assert_eq!(admin_json(&first.full)["full"], true);
        assert_eq!(courses_of(&first.full), ["A", "B"]);
        assert_eq!(r.ingest.poll_timeout(), Some(T0 + ADMIN_TICK));
        // One publish seen through two subscriptions counts once.
        r.ingest.event(message("A", 2, 4, 2), T0 + 10);
        r.ingest.event(message("A", 2, 4, 2), T0 + 11);
        r.ingest.handle_timeout(T0 + ADMIN_TICK - 1);
        assert!(r.control(1).is_empty(), "not before the tick");
        r.ingest.handle_timeout(T0 + ADMIN_TICK);
        let msg = one_admin(&r, 1);
        let delta = msg.delta.expect("a delta");
        let v = admin_json(&delta);
        assert_eq!(v["full"], false);
        assert_eq!(courses_of(&delta), ["A"], "only the changed entry");
        let row = &v["courses"][0];
        assert_eq!(
            (row["sections"].as_u64(), row["full_sections"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(
            (row["total_seats"].as_u64(), row["seats_taken"].as_u64()),
            (Some(20), Some(14))
        );
        assert_eq!(row["updates_per_s"], 1.3, "1 update in 0.75 s");
        // The full message shards keep for newcomers is current too.
        assert_eq!(courses_of(&msg.full), ["A", "B"]);
        assert_eq!(admin_json(&msg.full)["courses"][0]["seats_taken"], 14);
        assert!(r.control(0).is_empty(), "no admin on shard 0");
        // The presence worker is told which courses to count for admins.
        assert!(matches!(&r.presence_cmds()[..], [PresenceCmd::Extra(c)] if c.len() == 2));
        // A rate that fell to 0 is a change; then silence.
        r.ingest.handle_timeout(T0 + 2 * ADMIN_TICK);
        let delta = one_admin(&r, 1).delta.expect("the rate's way down");
        assert_eq!(courses_of(&delta), ["A"]);
        assert_eq!(admin_json(&delta)["courses"][0]["updates_per_s"], 0.0);
        r.ingest.handle_timeout(T0 + 3 * ADMIN_TICK);
        assert!(r.control(1).is_empty(), "nothing changed");
        // Viewer counts from the presence worker change an entry too.
        let counts = Arc::new(vec![(Arc::<str>::from("B"), 7)]);
        r.ingest.command(IngestCmd::Viewers(counts), T0);
        r.ingest.handle_timeout(T0 + 4 * ADMIN_TICK);
        let delta = one_admin(&r, 1).delta.expect("viewers changed");
        assert_eq!(courses_of(&delta), ["B"]);
        assert_eq!(admin_json(&delta)["courses"][0]["viewers"], 7);
        // A second admin shard gets the full message at once; the first one
        // nothing (no entry changed).
        r.admin(0, true);
        let full = one_admin(&r, 0);
        assert!(full.delta.is_none());
        assert_eq!(admin_json(&full.full)["courses"][1]["viewers"], 7);
        assert!(r.control(1).is_empty());
    }

    #[test]
    fn courses_with_a_state_hash_are_rescanned_every_5s_while_an_admin_is_connected() {
        let mut r = rig(1);
        r.admin(0, true);
        assert!(courses_of(&one_admin(&r, 0).full).is_empty());
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("NEW1".into(), vec![payload("NEW1", 1, 2, 1)]);
        r.ingest.handle_timeout(T0 + 4_999);
        r.control(0);
        r.log();
        r.ingest.handle_timeout(T0 + 5_000);
        assert_eq!(r.log(), ["load NEW1"]);
        r.ingest.handle_timeout(T0 + 4_999 + ADMIN_TICK);
        let delta = one_admin(&r, 0).delta.expect("the new course");
        assert_eq!(courses_of(&delta), ["NEW1"]);
    }

    #[test]
    fn a_made_up_course_watched_while_an_admin_is_connected_leaves_nothing_behind() {
        let mut r = rig(1);
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("REAL".into(), vec![payload("REAL", 1, 2, 1)]);
        r.admin(0, true);
        r.control(0);
        for i in 0..300 {
            r.interest(0, &format!("FAKE{i}"), true);
        }
        let counts = Arc::new(vec![(Arc::<str>::from("FAKE1"), 1)]);
        r.ingest.command(IngestCmd::Viewers(counts), T0);
        r.ingest.handle_timeout(T0 + ADMIN_TICK);
        r.presence_cmds();
        for i in 0..300 {
            r.interest(0, &format!("FAKE{i}"), false);
        }
        assert_eq!(r.ingest.boards.len(), 1, "only the real course is kept");
        assert!(r.ingest.viewers.is_empty());
        assert_eq!(r.ingest.known_courses(), [Arc::<str>::from("REAL")]);
        r.control(0);
        r.admin(0, false);
        r.admin(0, true);
        assert_eq!(courses_of(&one_admin(&r, 0).full), ["REAL"]);
        // A watched course that a snapshot names stays after its viewer left.
        r.interest(0, "LATE", true);
        r.ingest.event(message("LATE", 1, 1, 1), T0);
        r.interest(0, "LATE", false);
        assert!(r.ingest.boards.contains_key("LATE"));
    }

    #[test]
    fn a_reconnect_rereads_every_watched_course() {
        let mut r = rig(1);
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("A".into(), vec![payload("A", 1, 2, 1)]);
        r.interest(0, "A", true);
        r.interest(0, "B", true);
        r.log();
        r.routed(0);
        // While the link was down, A moved on.
        r.world
            .lock()
            .unwrap()
            .hashes
            .insert("A".into(), vec![payload("A", 1, 9, 5)]);
        r.ingest.event(SourceEvent::Reconnected, T0 + 5);
        let mut log = r.log();
        log.sort();
        assert_eq!(log, ["load A", "load B"]);
        assert_eq!(r.routed(0), [("A".into(), 1, 9)]);
        // Reading the same state again routes nothing (versions keep it idempotent).
        r.ingest.event(SourceEvent::Reconnected, T0 + 6);
        assert!(r.routed(0).is_empty());
    }

    #[test]
    fn a_failed_state_read_is_retried_every_second_not_taken_as_loaded() {
        let mut r = rig(1);
        {
            let mut w = r.world.lock().unwrap();
            w.fail = 1;
            w.hashes.insert("C1".into(), vec![payload("C1", 2, 4, 3)]);
        }
        r.interest(0, "C1", true);
        // The seed went out empty: the read failed.
        assert_eq!(
            r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
            [Some(0)]
        );
        r.log();
        assert_eq!(r.ingest.poll_timeout(), Some(T0 + 1_000));
        r.ingest.handle_timeout(T0 + 999);
        assert!(r.log().is_empty(), "not before a second");
        r.ingest.handle_timeout(T0 + 1_000);
        assert_eq!(r.log(), ["load C1"]);
        assert_eq!(r.routed(0), [("C1".into(), 2, 4)]);
        // Loaded now: no further reads, and no timer while there is no work.
        assert_eq!(r.ingest.poll_timeout(), None);
        r.ingest.handle_timeout(T0 + 2_000);
        assert!(r.log().is_empty());
    }

    #[test]
    fn the_thread_sleeps_until_the_first_timed_work_of_router_or_source() {
        let mut r = rig(1);
        let secs = Duration::from_secs;
        // Nothing timed anywhere: sleep until a socket or a command wakes it.
        assert_eq!(r.ingest.sleep_for(T0), None);
        // The source's own timed work (a keepalive PING, a slot-map refresh).
        r.world.lock().unwrap().due = Some(secs(5));
        assert_eq!(r.ingest.sleep_for(T0), Some(secs(5)));
        // An admin's tick comes first; then whichever is sooner.
        r.admin(0, true);
        assert_eq!(
            r.ingest.sleep_for(T0 + 50),
            Some(Duration::from_millis(ADMIN_TICK - 50))
        );
        r.world.lock().unwrap().due = Some(Duration::from_millis(20));
        assert_eq!(r.ingest.sleep_for(T0 + 50), Some(Duration::from_millis(20)));
        r.admin(0, false);
        // Something buffered in the source (a queued event, TLS bytes): no sleep.
        r.world.lock().unwrap().due = Some(Duration::ZERO);
        assert_eq!(r.ingest.sleep_for(T0), Some(Duration::ZERO));
        // A failed state read is retried in a second, even with no source timer.
        {
            let mut w = r.world.lock().unwrap();
            w.due = None;
            w.fail = 1;
        }
        r.interest(0, "A", true);
        assert_eq!(
            r.ingest.sleep_for(T0 + 400),
            Some(Duration::from_millis(600))
        );
        r.ingest.handle_timeout(T0 + 1_000);
        assert_eq!(r.ingest.sleep_for(T0 + 1_000), None);
        // A shard whose channel is full: retried without sleeping.
        for v in 1..=200 {
            r.ingest.event(message("A", 1, 1, v), T0);
            r.ingest.flush();
        }
        assert!(r.ingest.backlog());
        assert_eq!(r.ingest.sleep_for(T0), Some(Duration::ZERO));
    }
}
