//! The ingest thread: owns the pub/sub source, parses each snapshot once, keeps
//! the node's current board, and routes snapshots only to shards that watch the
//! course. It also builds the admin aggregate once per node. It never waits on
//! Redis: subscriptions are confirmed as events, and state hashes are read by
//! the state reader thread (`reader.rs`), whose answers arrive as commands.

mod admin;
pub mod bus;
pub mod reader;
pub mod scan;
mod seed;
pub mod states;
#[cfg(test)]
mod tests;
mod watch;

use crate::channels::wake::IngestRx;
use crate::channels::ReadRequest;
use crate::channels::{IngestCmd, Outlet, PresenceCmd, Topology};
use crate::clock;
use crate::logging::LogBudget;
use crate::metrics::Metrics;
use crate::redis::pubsub::{Source, SourceEvent};
use crate::slots::BlindSlots;
use crossbeam_channel::Sender;
use foldhash::{HashMap, HashMapExt};
use shards::{Gate, Snapshot};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use watch::{Tally, Watch};

/// Where a course's state read stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// Not read since its last (re)subscription: read once it is confirmed.
    #[default]
    Unread,
    /// Asked of the state reader in this subscription epoch.
    Reading(u64),
    /// Read since its subscription was confirmed.
    Loaded,
}

/// One course as the node knows it.
#[derive(Default)]
struct Board {
    sections: BTreeMap<u32, Arc<Snapshot>>,
    /// Shards watching (one bit each) and where its state read stands,
    /// changed through [`Ingest::tally`].
    watch: Watch,
    /// Those shards' gates for this course (a shard without one is woken by
    /// every snapshot).
    gates: Vec<(usize, Gate)>,
    /// Shards waiting for its seed (their first viewer's watch answer).
    awaiting: u128,
    /// When it was first watched (monotonic ms), until its state is seeded.
    watched_at: Option<u64>,
    /// Sections a live snapshot changed while its state read was in flight:
    /// the read only fills gaps and newer versions there.
    live: Vec<u32>,
    /// Live snapshots the version rule refused while its state read was in
    /// flight, the newest of each section: where the read overrules a section
    /// the node held ahead, one of these may be newer than the hash as read.
    refused: Vec<Arc<Snapshot>>,
    /// Snapshots accepted during the current admin tick.
    updates: u64,
    /// A snapshot or a state hash named it: kept for admins after its last
    /// viewer leaves (a made-up name is kept only while watched).
    named: bool,
    /// Its state hash has been read (a viewer's read or a discovery): a
    /// discovery cut short by a failed read leaves the rest to the next one.
    state_read: bool,
    /// The discovery count ([`Ingest::scans`]) when a live snapshot last
    /// named it: one named after a scan was asked is not gone from it.
    named_in_scan: u64,
    /// Its admin entry as last sent (while the firehose is on).
    shown: Option<admin::Shown>,
}

impl Board {
    /// Keeps a live snapshot refused while the state read is in flight, the
    /// newest of its section (one per section, so at most `MAX_SECTIONS`).
    fn refused_while_reading(&mut self, snap: Arc<Snapshot>) {
        match self.refused.iter_mut().find(|r| r.section == snap.section) {
            Some(r) if snap.replaces(Some(r)) => *r = snap,
            Some(_) => {}
            None => self.refused.push(snap),
        }
    }
}

/// Where a snapshot given to [`Ingest::accept`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The channel.
    Live,
    /// A state read asked once the course's subscription was confirmed.
    Read,
    /// A state read that may have run before the subscription (asked before a
    /// reconnect, or a discovery): it only fills gaps and newer versions.
    OldRead,
}

/// How often a failed state-hash read is retried (ms).
const RETRY_LOAD_MS: u64 = 1_000;

/// How often snapshots held back for a full shard channel are offered again.
pub const BACKLOG_RETRY: Duration = Duration::from_millis(1);

/// Log at most this many rejects per second.
const REJECT_LOGS_PER_SEC: u32 = 5;

/// The routing core of the ingest thread, separate from its loop for tests.
/// Like a shard it reads no clock: every call that decides something by time
/// takes `now_ms` (monotonic ms, [`clock::now_ms`]), [`Ingest::event`] also
/// the wall clock (`unix_ms`, which a snapshot's `ts` is compared with), and
/// [`Ingest::poll_timeout`] says when [`Ingest::handle_timeout`] is due. (An
/// outlet looks at the shards' monotonic clock when it decides whether a batch
/// wakes its shard: `src/channels/mod.rs`.)
pub struct Ingest<S: Source> {
    source: S,
    outlets: Vec<Outlet>,
    /// Looked up once per snapshot: foldhash (keyed per process) over SipHash.
    boards: HashMap<Arc<str>, Board>,
    /// Watched boards and those of them unread, kept as each board's
    /// [`Watch`] changes (the metrics and the reread timer need no pass over
    /// every board).
    tally: Tally,
    admin_shards: u128,
    viewers: HashMap<Arc<str>, u64>,
    metrics: Arc<Metrics>,
    presence: Option<Sender<PresenceCmd>>,
    /// The state reader's requests.
    reader: Sender<ReadRequest>,
    /// Bumped at every reconnect: a read asked before it no longer counts.
    epoch: u64,
    /// State reads asked in this turn of the loop, sent as one request by
    /// [`Ingest::flush`].
    reads: Vec<Arc<str>>,
    /// When shards waiting for a seed get what is held instead (monotonic ms, course).
    seed_deadlines: VecDeque<(u64, Arc<str>)>,
    /// A discovery is asked of the state reader and not answered yet.
    discovering: bool,
    /// Discoveries asked so far.
    scans: u64,
    /// A course left the admin view: the next admin message is the full
    /// aggregate for every feed (a delta cannot take an entry away).
    admin_shrunk: bool,
    /// Admin shards waiting for the discovery to answer them.
    admin_waiting: u128,
    /// The rejects logged each second (the rest summed up).
    reject_log: LogBudget,
    admin_tick_ms: u64,
    next_admin_ms: u64,
    next_retry_ms: u64,
    /// The next scan for courses with a state hash (while the firehose is on).
    next_scan_ms: u64,
    /// Slots whose primary the state reader's probe found silent.
    blind: BlindSlots,
}

impl<S: Source> Ingest<S> {
    /// A router feeding these outlets from `source`, asking `reader` for state
    /// hashes, building the admin aggregate every `admin_tick_ms` while an
    /// admin is connected.
    pub fn new(
        source: S,
        outlets: Vec<Outlet>,
        metrics: Arc<Metrics>,
        presence: Option<Sender<PresenceCmd>>,
        reader: Sender<ReadRequest>,
        admin_tick_ms: u64,
        now_ms: u64,
    ) -> Self {
        Ingest {
            source,
            outlets,
            boards: HashMap::new(),
            tally: Tally::default(),
            admin_shards: 0,
            viewers: HashMap::new(),
            metrics,
            presence,
            reader,
            epoch: 0,
            reads: Vec::new(),
            seed_deadlines: VecDeque::new(),
            discovering: false,
            scans: 0,
            admin_shrunk: false,
            admin_waiting: 0,
            reject_log: LogBudget::new(REJECT_LOGS_PER_SEC, now_ms),
            admin_tick_ms,
            next_admin_ms: now_ms + admin_tick_ms,
            next_retry_ms: now_ms + RETRY_LOAD_MS,
            next_scan_ms: now_ms + admin::RESCAN_MS,
            blind: BlindSlots::default(),
        }
    }

    /// Whether an admin is connected somewhere (the pattern subscription is held).
    pub fn firehose(&self) -> bool {
        self.admin_shards != 0
    }

    /// The gauges, after every command and every turn's timers: each count
    /// is kept, none is counted here (debug builds, which the simulator's and
    /// the router's tests run, check the kept tally against a recount).
    fn publish_subscriptions(&self) {
        debug_assert_eq!(
            self.tally,
            Tally::recount(self.boards.values().map(|b| &b.watch)),
            "the kept tally against a recount"
        );
        let subs = if self.firehose() {
            0
        } else {
            self.tally.watched() as u64
        };
        self.metrics.subscriptions.store(subs, Relaxed);
        self.metrics.firehose.store(self.firehose() as u64, Relaxed);
        self.metrics
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
            IngestCmd::States {
                courses,
                hashes,
                epoch,
            } => self.states_read(courses, hashes, epoch, now_ms),
            IngestCmd::Discovered(found) => self.discovered(found, now_ms),
            IngestCmd::Topology(t) => self.topology(t),
            IngestCmd::Shutdown => {
                let _ = self.reader.send(ReadRequest::Shutdown);
                return false;
            }
        }
        self.publish_subscriptions();
        true
    }

    /// The probe found the cluster's slots moved or primaries silent: the
    /// source follows, every watched course is read again after a move or
    /// once a silent primary answers again (a publish may have been lost
    /// meanwhile), and the node is `degraded` while a watched course's state
    /// hash has no primary.
    fn topology(&mut self, t: Topology) {
        self.source.topology(t.moved.as_ref(), &t.down);
        // Slots served again after their primary was silent: what it held
        // may have changed meanwhile (publishes refused while it was down).
        let back = self
            .blind
            .ranges
            .iter()
            .any(|r| !t.blind.ranges.contains(r));
        if t.moved.is_some() {
            tracing::info!("Redis Cluster slots changed owner; rereading every watched course");
            self.reread_all();
        } else if back {
            tracing::info!("Redis Cluster primary answers again; rereading every watched course");
            self.reread_all();
        }
        self.blind = t.blind;
    }

    /// Whether Redis serves the node now: its source is connected, and no
    /// watched course's state hash is on a slot without a reachable primary.
    pub fn redis_up(&self) -> bool {
        self.source.connected()
            && (self.blind.ranges.is_empty()
                || !self
                    .boards
                    .iter()
                    .any(|(c, b)| b.watch.shards() != 0 && self.blind.covers(c)))
    }

    fn interest_off(&mut self, shard: usize, course: &str) {
        let firehose = self.firehose();
        let Some(board) = self.boards.get_mut(course) else {
            return;
        };
        let shards = board.watch.shards() & !(1 << shard);
        self.tally.set_shards(&mut board.watch, shards);
        board.awaiting &= !(1 << shard);
        board.gates.retain(|(s, _)| *s != shard);
        if shards != 0 {
            return;
        }
        // Unwatched, it counts in no tally: dropped as it is.
        if !firehose {
            self.source.unsubscribe(course);
            self.boards.remove(course);
        } else if !board.named {
            // A name no snapshot or state hash has named: kept only while watched.
            self.forget(course);
        }
    }

    /// Drops a course the node holds for admins only: its board and viewer count.
    fn forget(&mut self, course: &str) -> Option<Board> {
        self.viewers.remove(course);
        self.boards.remove(course)
    }

    fn admin_feed(&mut self, shard: usize, connected: bool, now_ms: u64) {
        let was = self.firehose();
        if connected {
            self.admin_shards |= 1 << shard;
        } else {
            self.admin_shards &= !(1 << shard);
            self.admin_waiting &= !(1 << shard);
        }
        let now = self.firehose();
        if was == now {
            if connected {
                self.admin_answer_when_known(shard);
            }
            return;
        }
        self.source.set_firehose(now);
        if now {
            // The first admin: count updates from this tick on.
            self.reset_updates();
            self.next_admin_ms = now_ms + self.admin_tick_ms;
            // (A pattern covers every course: the classic source drops its
            // per-course subscriptions itself; a sharded one keeps them.)
            // Admins see the whole board at once: every state hash is read,
            // and this admin is answered when that read is.
            self.discover(now_ms);
            self.admin_answer_when_known(shard);
        } else {
            // Back to per-course subscriptions for watched courses only
            // (the boards dropped count in no tally).
            self.boards.retain(|_, b| b.watch.shards() != 0);
            for b in self.boards.values_mut() {
                b.shown = None;
            }
            let courses: Vec<Arc<str>> = self.boards.keys().cloned().collect();
            for c in &courses {
                self.source.subscribe(c);
            }
            self.viewers.clear();
            self.admin_waiting = 0;
        }
        if let Some(p) = &self.presence {
            let _ = p.send(PresenceCmd::CountAll(now));
        }
    }

    fn rejected(&mut self, r: shards::Reject, course: &str, now_ms: u64) {
        self.metrics.reject(r);
        let allowed = self.reject_log.take(now_ms);
        if let Some(suppressed) = allowed.suppressed {
            tracing::warn!(suppressed, "ingest rejects not logged");
        }
        if allowed.log {
            tracing::warn!(reason = r.label(), course, "snapshot rejected");
        }
    }

    /// Applies a snapshot to the node board and routes it; false if it was
    /// stale or a duplicate (the same publish seen through two subscriptions).
    /// `Via::Live`: it came from the channel (counted for admins, remembered
    /// while a state read is in flight); `Via::Read`: from a state read asked
    /// once subscribed (a field a repair wrote replaces), which fills only
    /// gaps and newer versions where a live snapshot came first;
    /// `Via::OldRead`: from a read whose place in time is not known (asked
    /// before a reconnect, or by a discovery), gaps and newer versions only.
    fn accept(&mut self, snap: Arc<Snapshot>, via: Via) -> bool {
        let firehose = self.firehose();
        let board = match self.boards.get_mut(&snap.course) {
            Some(b) => b,
            None if firehose => self.boards.entry(Arc::clone(&snap.course)).or_default(),
            // A late message for a course nobody watches any more.
            None => return false,
        };
        let held = board.sections.get(&snap.section).map(|s| &**s);
        if held.is_none() && board.sections.len() >= shards::MAX_SECTIONS {
            self.metrics.reject(shards::Reject::TooManySections);
            return false;
        }
        let gaps_only = match via {
            Via::Live => false,
            Via::Read => board.live.contains(&snap.section),
            Via::OldRead => true,
        };
        let fresh = if gaps_only {
            snap.seed_replaces(held)
        } else {
            snap.replaces(held)
        };
        let fresh = fresh
            || (via != Via::Live
                && held.is_some_and(|h| !h.same_state(&snap))
                && crate::planted::active(crate::planted::Bug::ReadBackwards));
        let live = via == Via::Live;
        // Dedupe by the version rule: stale, or the same publish seen twice.
        if !fresh {
            if live && snap.replace && held.is_some_and(|h| !h.replace && h.same_state(&snap)) {
                // The replacement of a state already held (the row's own
                // publish came first): held as the replacement from now on,
                // so a state read answered before it reached the field (the
                // forged version) cannot take the section back.
                board.sections.insert(snap.section, Arc::clone(&snap));
            }
            self.metrics.ingest_duplicates.fetch_add(1, Relaxed);
            if live && crate::planted::active(crate::planted::Bug::AdminCountsDuplicates) {
                board.updates += 1;
            }
            if live && matches!(board.watch.load(), Load::Reading(_)) {
                board.refused_while_reading(snap);
            }
            return false;
        }
        if live {
            board.updates += 1;
            board.named_in_scan = self.scans;
            if matches!(board.watch.load(), Load::Reading(_)) && !board.live.contains(&snap.section)
            {
                board.live.push(snap.section);
            }
        }
        board.sections.insert(snap.section, Arc::clone(&snap));
        board.named = true;
        let mut mask = board.watch.shards();
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

    /// Handles one source event at `now_ms` (monotonic); `unix_ms` is what a
    /// snapshot's `ts` is measured against.
    pub fn event(&mut self, ev: SourceEvent, now_ms: u64, unix_ms: u64) {
        match ev {
            SourceEvent::Message { course, payload } => {
                match Snapshot::parse(&payload, Some(&course)) {
                    Ok(s) => {
                        self.metrics.ingest_messages.fetch_add(1, Relaxed);
                        if let Some(ts) = s.ts {
                            self.metrics
                                .update_latency
                                .observe_us(unix_ms.saturating_sub(ts).saturating_mul(1000));
                        }
                        self.accept(Arc::new(s), Via::Live);
                    }
                    Err(r) => self.rejected(r, &course, now_ms),
                }
            }
            SourceEvent::Oversize { course } => {
                self.rejected(shards::Reject::TooLarge, &course, now_ms)
            }
            SourceEvent::Subscribed(Some(course)) => self.want_read(&course),
            SourceEvent::Subscribed(None) => self.want_all_reads(),
            SourceEvent::Reconnected => {
                self.metrics.redis_reconnects.fetch_add(1, Relaxed);
                if crate::planted::active(crate::planted::Bug::NoRereadAfterReconnect) {
                    return;
                }
                self.reread_all();
            }
        }
    }

    /// Runs what is due at `now_ms`: rereads of failed state-hash reads (every
    /// second), seeds that waited too long, and the admin aggregate (every
    /// admin tick) together with the courses the presence worker must count
    /// for admins.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        let tick = self.admin_tick_ms;
        if now_ms >= self.next_retry_ms {
            self.next_retry_ms = now_ms + RETRY_LOAD_MS;
            self.want_all_reads();
        }
        self.seeds_overdue(now_ms);
        if now_ms >= self.next_admin_ms {
            self.next_admin_ms += tick;
            if self.next_admin_ms <= now_ms {
                self.next_admin_ms = now_ms + tick;
            }
            self.admin_tick();
            self.admin_presence();
        }
        if self.firehose() && now_ms >= self.next_scan_ms {
            // The rescan for courses with a state hash.
            self.discover(now_ms);
        }
        self.publish_subscriptions();
    }

    /// When [`Ingest::handle_timeout`] has work next (monotonic ms): the admin tick
    /// only while an admin is connected, the reread only while a read failed,
    /// a seed's deadline only while one waits; `None` while there is nothing to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        let admin = self
            .firehose()
            .then_some(self.next_admin_ms.min(self.next_scan_ms));
        let retry = self.has_unloaded().then_some(self.next_retry_ms);
        let seed = self.seed_deadlines.front().map(|(t, _)| *t);
        admin.into_iter().chain(retry).chain(seed).min()
    }

    /// How long the ingest thread may sleep on the source's sockets and its
    /// command wake-up before it must poll the source or run its timers: until
    /// the first of the router's timers ([`Ingest::poll_timeout`]) and the
    /// source's timed work (`None`: until woken); `Some(ZERO)`: not at all
    /// (something buffered or due). A backlog is retried every
    /// [`BACKLOG_RETRY`].
    pub fn sleep_for(&mut self, now_ms: u64) -> Option<Duration> {
        let timers = self
            .poll_timeout()
            .map(|t| Duration::from_millis(t.saturating_sub(now_ms)));
        let backlog = self.backlog().then_some(BACKLOG_RETRY);
        [timers, self.source.poll_timeout(), backlog]
            .into_iter()
            .flatten()
            .min()
    }

    /// Sends batched snapshots to shards, and this turn's state reads to the
    /// state reader as one request.
    pub fn flush(&mut self) {
        self.source.flush();
        for o in &mut self.outlets {
            o.flush();
        }
        if !self.reads.is_empty() {
            let courses = std::mem::take(&mut self.reads);
            let epoch = self.epoch;
            let _ = self.reader.send(ReadRequest::States { courses, epoch });
        }
    }

    /// Whether a watched course waits for a state read that failed or has not
    /// been asked yet (its subscription unconfirmed).
    pub fn has_unloaded(&self) -> bool {
        self.tally.any_unread()
    }

    /// Starts counting updates afresh (the first admin connected; no admin at a tick).
    fn reset_updates(&mut self) {
        for b in self.boards.values_mut() {
            b.updates = 0;
        }
    }

    /// Whether some shard's channel is full and snapshots wait coalesced.
    pub fn backlog(&self) -> bool {
        self.outlets.iter().any(|o| o.backlog() > 0)
    }

    /// Every section this node's board holds, with its version: what the
    /// simulator checks never goes backwards.
    pub fn held(&self) -> impl Iterator<Item = (&Arc<str>, u32, Option<u64>)> {
        self.boards
            .iter()
            .flat_map(|(c, b)| b.sections.values().map(move |s| (c, s.section, s.version)))
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
            if !ingest.command(cmd, clock::now_ms()) {
                return;
            }
        }
        // What the commands asked for (subscriptions, reads, seeds and the
        // snapshots a read merged) goes out before the thread sleeps.
        ingest.flush();
        let up = ingest.redis_up();
        ingest.metrics.redis_connected.store(up as u64, Relaxed);
        let sleep = ingest.sleep_for(clock::now_ms());
        if sleep != Some(Duration::ZERO) {
            fds.clear();
            ingest.source.wait_fds(&mut fds);
            commands.wait(&fds, sleep);
        }
        // Readable, woken or due: take what is ready without waiting, then
        // route it as one batch per shard.
        for _ in 0..1024 {
            let Some(ev) = ingest.source.poll() else {
                break;
            };
            ingest.event(ev, clock::now_ms(), clock::unix_ms());
        }
        ingest.handle_timeout(clock::now_ms());
        ingest.flush();
    }
}
