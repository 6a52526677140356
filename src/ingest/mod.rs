//! The ingest thread: owns the pub/sub source, parses each snapshot once, keeps
//! the node's current board, and routes snapshots only to shards that watch the
//! course. It also builds the admin aggregate once per node.

pub mod bus;
pub mod redis;
pub mod sharded;
pub mod source;
pub mod wake;

use crate::channels::{Control, IngestCmd, Outlet, PresenceCmd};
use crate::clock;
use crate::metrics::Metrics;
use crate::node::Node;
use bytes::Bytes;
use crossbeam_channel::Sender;
use shards::server_msg::{self, AdminRow};
use shards::Snapshot;
use source::{Source, SourceEvent};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wake::IngestRx;

/// One course as the node knows it.
#[derive(Default)]
struct Board {
    sections: BTreeMap<u32, Arc<Snapshot>>,
    /// Shards watching, one bit each.
    shards: u128,
    /// The state hash was read since the last (re)subscription.
    loaded: bool,
    /// Snapshots accepted during the current admin tick.
    updates: u64,
}

/// How often a failed state-hash read is retried.
const RETRY_LOAD: Duration = Duration::from_secs(1);

/// Log at most this many rejects per second.
const REJECT_LOGS_PER_SEC: u32 = 5;

/// The routing core of the ingest thread, separate from its loop for tests.
pub struct Ingest<S: Source> {
    source: S,
    outlets: Vec<Outlet>,
    boards: HashMap<Arc<str>, Board>,
    admin_shards: u128,
    viewers: HashMap<Arc<str>, u64>,
    admin_dirty: bool,
    node: Arc<Node>,
    presence: Option<Sender<PresenceCmd>>,
    reject_log: (Instant, u32),
}

impl<S: Source> Ingest<S> {
    /// A router feeding these outlets from `source`.
    pub fn new(
        source: S,
        outlets: Vec<Outlet>,
        node: Arc<Node>,
        presence: Option<Sender<PresenceCmd>>,
    ) -> Self {
        Ingest {
            source,
            outlets,
            boards: HashMap::new(),
            admin_shards: 0,
            viewers: HashMap::new(),
            admin_dirty: false,
            node,
            presence,
            reject_log: (Instant::now(), 0),
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.node.metrics
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
    }

    /// Handles one command; false on shutdown.
    pub fn command(&mut self, cmd: IngestCmd) -> bool {
        match cmd {
            IngestCmd::Interest {
                shard,
                course,
                watching,
            } => {
                if watching {
                    self.interest_on(shard, course)
                } else {
                    self.interest_off(shard, &course)
                }
            }
            IngestCmd::AdminFeed { shard, connected } => self.admin_feed(shard, connected),
            IngestCmd::Viewers(counts) => {
                for (c, n) in counts.iter() {
                    if self.viewers.insert(Arc::clone(c), *n) != Some(*n) {
                        self.admin_dirty = true;
                    }
                }
            }
            IngestCmd::Shutdown => return false,
        }
        self.publish_subscriptions();
        true
    }

    fn interest_on(&mut self, shard: usize, course: Arc<str>) {
        let firehose = self.firehose();
        let board = self.boards.entry(Arc::clone(&course)).or_default();
        let new_sub = board.shards == 0 && !firehose;
        board.shards |= 1 << shard;
        if new_sub {
            // Subscribe first, then read the state hash: nothing published in
            // between can be missed.
            self.source.subscribe(&course);
        }
        if !self.boards.get(&course).is_some_and(|b| b.loaded) {
            self.load(&course);
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
        let Some(board) = self.boards.get_mut(course) else {
            return;
        };
        board.shards &= !(1 << shard);
        if board.shards == 0 && !self.firehose() {
            self.source.unsubscribe(course);
            self.boards.remove(course);
        }
    }

    fn admin_feed(&mut self, shard: usize, connected: bool) {
        let was = self.firehose();
        if connected {
            self.admin_shards |= 1 << shard;
            self.admin_dirty = true;
        } else {
            self.admin_shards &= !(1 << shard);
        }
        let now = self.firehose();
        if was == now {
            return;
        }
        self.source.set_firehose(now);
        if now {
            // The pattern covers every course: per-course subscriptions go.
            let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
            for c in courses {
                self.source.unsubscribe(&c);
            }
            // Admins see the whole board at once: read every state hash.
            for c in self.source.known_courses() {
                if shards::snapshot::valid_course(&c) && !self.boards.contains_key(c.as_str()) {
                    let c: Arc<str> = c.into();
                    self.boards.insert(Arc::clone(&c), Board::default());
                    self.load(&c);
                }
            }
        } else {
            // Back to per-course subscriptions for watched courses only.
            self.boards.retain(|_, b| b.shards != 0);
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

    fn load(&mut self, course: &Arc<str>) {
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
                    self.accept(Arc::new(s), false);
                }
                Err(r) => self.rejected(r, course),
            }
        }
        if let Some(b) = self.boards.get_mut(course) {
            b.loaded = connected;
        }
    }

    fn rejected(&mut self, r: shards::Reject, course: &str) {
        self.metrics().reject(r);
        let now = Instant::now();
        if now.duration_since(self.reject_log.0) >= Duration::from_secs(1) {
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
            self.node.metrics.ingest_duplicates.fetch_add(1, Relaxed);
            return false;
        }
        board.sections.insert(snap.section, Arc::clone(&snap));
        if count {
            board.updates += 1;
            self.admin_dirty = true;
        }
        let mut mask = board.shards;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(o) = self.outlets.get_mut(i) {
                o.push(Arc::clone(&snap));
            }
        }
        true
    }

    /// Handles one source event.
    pub fn event(&mut self, ev: SourceEvent) {
        match ev {
            SourceEvent::Message { course, payload } => {
                match Snapshot::parse(&payload, Some(&course)) {
                    Ok(s) => {
                        self.metrics().ingest_messages.fetch_add(1, Relaxed);
                        if let Some(ts) = s.ts {
                            let now = clock::unix_ms();
                            self.metrics()
                                .update_latency
                                .observe_us(now.saturating_sub(ts).saturating_mul(1000));
                        }
                        self.accept(Arc::new(s), true);
                    }
                    Err(r) => self.rejected(r, &course),
                }
            }
            SourceEvent::Oversize { course } => self.rejected(shards::Reject::TooLarge, &course),
            SourceEvent::Reconnected => {
                self.node.metrics.redis_reconnects.fetch_add(1, Relaxed);
                // Reseed every watched course: versions keep this idempotent.
                let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
                for c in courses {
                    self.load(&c);
                }
            }
        }
    }

    /// Rereads the state hash of watched courses whose last read failed.
    pub fn retry_unloaded(&mut self) {
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
            self.load(&c);
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
    pub fn reset_updates(&mut self) {
        for b in self.boards.values_mut() {
            b.updates = 0;
        }
    }

    /// Whether some shard's channel is full and snapshots wait coalesced.
    pub fn backlog(&self) -> bool {
        self.outlets.iter().any(|o| o.backlog() > 0)
    }

    /// Builds and sends the admin aggregate if an admin is connected and anything changed.
    pub fn admin_tick(&mut self, tick_ms: u64) {
        if !self.firehose() || !self.admin_dirty {
            for b in self.boards.values_mut() {
                b.updates = 0;
            }
            return;
        }
        // Rates shown this tick must come down to 0 on the next one, so a tick
        // with updates leaves the aggregate dirty for one more round.
        self.admin_dirty = self.boards.values().any(|b| b.updates > 0);
        let frame = self.admin_frame(tick_ms);
        let mut mask = self.admin_shards;
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(o) = self.outlets.get(i) {
                o.inbox().control(Control::Admin(frame.clone()));
            }
        }
    }

    fn admin_frame(&mut self, tick_ms: u64) -> Bytes {
        let mut courses: Vec<(&Arc<str>, &mut Board)> = self.boards.iter_mut().collect();
        courses.sort_by(|a, b| a.0.cmp(b.0));
        let secs = tick_ms as f64 / 1000.0;
        let viewers = &self.viewers;
        let rows = courses.into_iter().map(|(name, b)| {
            let rate = (b.updates as f64 / secs * 10.0).round() / 10.0;
            b.updates = 0;
            AdminRow {
                course: name,
                sections: b.sections.len(),
                total_seats: b.sections.values().map(|s| s.total_seats as u64).sum(),
                seats_taken: b.sections.values().map(|s| s.seats_taken as u64).sum(),
                full_sections: b
                    .sections
                    .values()
                    .filter(|s| s.seats_taken >= s.total_seats)
                    .count(),
                updates_per_s: rate,
                viewers: viewers.get(name.as_ref()).copied().unwrap_or(0),
            }
        });
        server_msg::admin(rows)
    }

    /// Courses the node knows (for presence counting while admins watch).
    pub fn known_courses(&self) -> Vec<Arc<str>> {
        self.boards.keys().cloned().collect()
    }

    /// The source, for health reporting.
    pub fn source(&self) -> &S {
        &self.source
    }
}

/// Longest sleep of an idle ingest thread: the Redis keepalive (a PING after
/// 5 s of silence) is checked when the source is polled.
const IDLE_WAIT: Duration = Duration::from_secs(4);

/// Runs the ingest thread until `Shutdown`. It sleeps in `poll(2)` on the
/// Redis socket and its command wake-up, until the next thing it has to do:
/// no timer runs while there is nothing to do (the admin tick only while an
/// admin is connected, the state reread only while a read failed).
pub fn run<S: Source>(mut ingest: Ingest<S>, commands: IngestRx, admin_tick_ms: u64) {
    let admin_tick = Duration::from_millis(admin_tick_ms);
    let mut next_admin = Instant::now() + admin_tick;
    let mut next_retry = Instant::now() + RETRY_LOAD;
    loop {
        while let Some(cmd) = commands.try_recv() {
            let admin_before = ingest.firehose();
            if !ingest.command(cmd) {
                return;
            }
            if ingest.firehose() && !admin_before {
                // The first admin: count updates from this tick on.
                ingest.reset_updates();
                next_admin = Instant::now() + admin_tick;
            }
        }
        let up = ingest.source().connected();
        ingest.node.source_up.store(up, Relaxed);
        ingest
            .node
            .metrics
            .redis_connected
            .store(up as u64, Relaxed);
        // A backlog retries every millisecond; a source that cannot be
        // slept on is polled every 5 ms; otherwise sleep until the socket is
        // readable, a command comes, or the next timer that has work.
        let backlog = ingest.backlog();
        let fd = ingest.source.wait_fd();
        let wait = match (backlog, fd) {
            (true, _) => Duration::from_millis(1),
            (false, None) => Duration::from_millis(5),
            (false, Some(_)) => {
                let now = Instant::now();
                let mut until = now + IDLE_WAIT;
                if ingest.firehose() {
                    until = until.min(next_admin);
                }
                if ingest.has_unloaded() {
                    until = until.min(next_retry);
                }
                commands.wait(fd, Some(until.saturating_duration_since(now)));
                // Readable or woken: read what is there without waiting long.
                Duration::from_millis(1)
            }
        };
        let mut n = 0;
        if let Some(ev) = ingest.source.poll(wait) {
            ingest.event(ev);
            n += 1;
            // Take whatever else is ready, then route it as one batch per shard.
            while n < 1024 {
                match ingest.source.poll(Duration::ZERO) {
                    Some(ev) => {
                        ingest.event(ev);
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        let now = Instant::now();
        if now >= next_retry {
            next_retry = now + RETRY_LOAD;
            ingest.retry_unloaded();
        }
        ingest.flush();
        let now = Instant::now();
        if now >= next_admin {
            next_admin += admin_tick;
            if next_admin < now {
                next_admin = now + admin_tick;
            }
            ingest.admin_tick(admin_tick_ms);
            if ingest.firehose() {
                if let Some(p) = &ingest.presence {
                    let _ = p.send(PresenceCmd::Extra(ingest.known_courses()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Auth;
    use crate::channels::Inbox;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// A source whose first `fail` state reads fail.
    struct FlakyState {
        fail: usize,
        payload: Vec<u8>,
    }

    impl Source for FlakyState {
        fn poll(&mut self, _timeout: Duration) -> Option<SourceEvent> {
            None
        }
        fn subscribe(&mut self, _course: &str) {}
        fn unsubscribe(&mut self, _course: &str) {}
        fn set_firehose(&mut self, _on: bool) {}
        fn load_state(&mut self, _course: &str) -> Option<Vec<Vec<u8>>> {
            if self.fail > 0 {
                self.fail -= 1;
                return None;
            }
            Some(vec![self.payload.clone()])
        }
        fn connected(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_failed_state_read_is_retried_not_taken_as_loaded() {
        let Command::Demo(args) = Cli::parse_from(["seatboard", "demo"]).command else {
            panic!("demo args");
        };
        let node = Arc::new(Node::new(args, 1, Auth::None));
        let inbox = Inbox::new();
        let payload =
            br#"{"course":"C1","section":2,"total_seats":9,"seats_taken":4,"version":3}"#.to_vec();
        let source = FlakyState { fail: 1, payload };
        let mut ingest = Ingest::new(source, vec![Outlet::new(Arc::clone(&inbox))], node, None);
        ingest.command(IngestCmd::Interest {
            shard: 0,
            course: "C1".into(),
            watching: true,
        });
        // The seed went out empty: the read failed.
        match inbox.try_control() {
            Some(Control::Seed { sections, .. }) => assert!(sections.is_empty()),
            other => panic!("expected a seed, got {other:?}"),
        }
        ingest.retry_unloaded();
        ingest.flush();
        let batch = inbox.try_snapshots().expect("the retried read is routed");
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].seats_taken, 4);
        // Loaded now: no further reads.
        ingest.retry_unloaded();
        ingest.flush();
        assert!(inbox.try_snapshots().is_none());
    }
}
