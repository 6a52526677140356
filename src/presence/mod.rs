//! Presence: who watches which course, kept in a store with expiry scores so a
//! dead node's viewers simply time out. One worker thread per node talks to the
//! store; shards only send it messages and never wait on it.

pub mod error;
pub mod memory;
pub mod redis;

pub use error::StoreError;

use crate::channels::wake::IngestTx;
use crate::channels::{BatchTag, Control, Inbox, IngestCmd, PresenceCmd};
use crate::clock;
use crate::metrics::Metrics;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use foldhash::{HashMap, HashSet};
use shards::server_msg;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most ids in a roster reply.
pub const ROSTER_LIMIT: usize = 1000;
/// Most removals kept for a retry while the store is unreachable; beyond
/// them a left member simply expires after the TTL, like a dead node's.
pub const UNREMOVED_MAX: usize = 10_000;

/// How long the removal of a member who left waits to be written, so that the
/// members who leave together (a node's viewers all sent elsewhere, a
/// reconnect storm) share one write, and one who comes back within it costs
/// none: well inside a presence tick, and every count writes them first, so
/// no count sees a member who left. (A new member is written as soon as the
/// commands that came with it, see [`GATHER_MS`], are handled.)
pub const LEAVE_WINDOW_MS: u64 = 20;

/// The shortest wait before the members are written again after a failure.
const RETRY_MIN_MS: u64 = 10;

/// Errors from a store (Redis down); the worker counts and retries.
pub type StoreResult<T> = Result<T, StoreError>;

/// Members as the worker hands them to its store: (course, user) pairs, each
/// course's users next to one another, so that a store writes each course's
/// members in one command.
pub type Members = [(Arc<str>, Arc<str>)];

/// A presence store: sorted sets of user -> expiry (Unix ms) per course.
pub trait PresenceStore: Send {
    /// Adds new members at `expiry_ms`, in one round trip: one `ZADD` per
    /// course for all its members, and its key's TTL renewed.
    fn add(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()>;
    /// Re-scores every member of this node at `expiry_ms`, as
    /// [`PresenceStore::add`] writes them (its keys' TTLs renewed too).
    fn refresh(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        self.add(members, expiry_ms)
    }
    /// Removes members in one round trip: one `ZREM` per course.
    fn remove(&mut self, members: &Members) -> StoreResult<()>;
    /// Trims expired members and counts the rest, per course, in one round trip.
    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>>;
    /// Opens the store's connection ahead of its first use (errors are left
    /// to the first call): the first viewer of a course after a start is
    /// then counted a round trip before its seed, not behind a connect.
    fn warm(&mut self) {}
    /// [`PresenceStore::add`] then [`PresenceStore::count`] of `courses`,
    /// the count reading what was just written: one round trip where the
    /// store can (Redis: one pipeline).
    fn add_and_count(
        &mut self,
        members: &Members,
        expiry_ms: u64,
        courses: &[Arc<str>],
        now_ms: u64,
    ) -> StoreResult<Vec<u64>> {
        if !members.is_empty() {
            self.add(members, expiry_ms)?;
        }
        self.count(courses, now_ms)
    }
    /// Keys that refused a write since the last call (a key of another
    /// type: `WRONGTYPE`), for `/metrics`; the other keys were written.
    fn take_refused(&mut self) -> u64 {
        0
    }
    /// After a call failed, how long until the store's connection makes its
    /// next attempt (its own jittered backoff, capped at 2 s); `None` for a
    /// store that keeps no backoff (the members are then written again at
    /// the next presence tick).
    fn retry_in(&self) -> Option<Duration> {
        None
    }
    /// Total unexpired members and at most `limit` of their ids.
    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)>;
}

/// Timing of the worker.
#[derive(Debug, Clone, Copy)]
pub struct PresenceTiming {
    /// How often counts are read and pushed.
    pub tick_ms: u64,
    /// Member lifetime; refreshed every half of it.
    pub ttl_ms: u64,
}

impl PresenceTiming {
    /// How often every member is re-scored: half the TTL.
    fn refresh_ms(&self) -> u64 {
        (self.ttl_ms / 2).max(1)
    }
}

/// A (course, user) pair: a member of one course's presence set.
type Member = (Arc<str>, Arc<str>);

/// The most entries a set of waiting writes keeps room for once written: a
/// storm's thousands of joins or leaves do not keep their peak table for
/// the idle hours after it.
const WAITING_KEPT: usize = 1024;

/// The presence worker's state. Like a shard it reads no clock: every call
/// takes `now_ms` (Unix ms, the clock of the scores), and
/// [`Worker::poll_timeout`] says when [`Worker::handle_timeout`] is due.
pub struct Worker<P: PresenceStore> {
    store: P,
    timing: PresenceTiming,
    /// Node-wide connection-shard count per (course, user): shards each
    /// report their own first/last, the node removes a member only when all
    /// are gone. One flat table: a table per course would hold hundreds of
    /// small tables of every size, each in the allocator's pages of its size.
    members: HashMap<Member, u32>,
    /// Members per course, so that a count names the courses without going
    /// over every member.
    courses: HashMap<Arc<str>, u32>,
    inboxes: Vec<Arc<Inbox>>,
    ingest: Option<IngestTx>,
    metrics: Arc<Metrics>,
    count_all: bool,
    extra: Vec<Arc<str>>,
    /// Members whose write failed: rewritten on the next refresh.
    dirty: bool,
    /// After a failure, when the store's connection makes its next attempt
    /// (Unix ms): the refresh that rewrites the members is made then, so
    /// the node reconnects on the connection's own jittered schedule, not
    /// on the presence tick (longer than the 2 s cap by default, and the
    /// same period on every node).
    retry_ms: Option<u64>,
    /// Members who left while their removal failed (bounded by
    /// [`UNREMOVED_MAX`]): removed again with the next refresh.
    unremoved: HashSet<Member>,
    /// New members not written yet (within one batch of commands), members
    /// gone whose removal is not written yet (never both for one member), and
    /// when the removals are written (see [`LEAVE_WINDOW_MS`]).
    adds: HashSet<Member>,
    removes: HashSet<Member>,
    writes_due_ms: Option<u64>,
    /// Courses a shard joined with a member the node already had (another
    /// tab on another shard, or one back within the leave window): nothing
    /// to write, but the shard's watch answer waits for a count all the same.
    recount: HashSet<Arc<str>>,
    /// Per shard, the last presence batch whose joins and leaves were
    /// handled (every count writes the waiting ones first, so a count read
    /// now includes them): sent with each count, so the shard knows which of
    /// its joins and leaves the count includes.
    applied: Vec<u64>,
    next_count_ms: u64,
    next_refresh_ms: u64,
}

/// Counts one more connection-shard of `user` on `course`; true when it is
/// the member's first (a new member, counted in its course). The strings are
/// cloned only when new.
fn join(
    members: &mut HashMap<Member, u32>,
    courses: &mut HashMap<Arc<str>, u32>,
    key: &Member,
) -> bool {
    if let Some(n) = members.get_mut(key) {
        *n += 1;
        return false;
    }
    members.insert(key.clone(), 1);
    match courses.get_mut(&*key.0) {
        Some(n) => *n += 1,
        None => {
            courses.insert(Arc::clone(&key.0), 1);
        }
    }
    true
}

/// Counts one connection-shard of `user` on `course` gone; true when it was
/// the member's last (the member is gone, and its course forgotten with its
/// last member). A leave never joined changes nothing.
fn leave(
    members: &mut HashMap<Member, u32>,
    courses: &mut HashMap<Arc<str>, u32>,
    key: &Member,
) -> bool {
    let Some(n) = members.get_mut(key) else {
        return false;
    };
    *n = n.saturating_sub(1);
    if *n > 0 {
        return false;
    }
    members.remove(key);
    if let Some(c) = courses.get_mut(&*key.0) {
        *c = c.saturating_sub(1);
        if *c == 0 {
            courses.remove(&*key.0);
        }
    }
    true
}

/// `members` in course order: each course's users next to one another, as
/// a store writes them (one command per course).
fn by_course(mut members: Vec<Member>) -> Vec<Member> {
    members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    members
}

/// Takes the members waiting in `set`, in course order, and lets the set
/// give back a storm's table (see [`WAITING_KEPT`]).
fn take_waiting(set: &mut HashSet<Member>) -> Vec<Member> {
    let taken = by_course(set.drain().collect());
    if set.capacity() > WAITING_KEPT {
        set.shrink_to(WAITING_KEPT);
    }
    taken
}

impl<P: PresenceStore> Worker<P> {
    /// A worker over `store`.
    pub fn new(
        store: P,
        timing: PresenceTiming,
        inboxes: Vec<Arc<Inbox>>,
        ingest: Option<IngestTx>,
        metrics: Arc<Metrics>,
        now_ms: u64,
    ) -> Self {
        Worker {
            applied: vec![0; inboxes.len()],
            next_count_ms: now_ms + timing.tick_ms,
            next_refresh_ms: now_ms + timing.refresh_ms(),
            store,
            timing,
            members: HashMap::default(),
            courses: HashMap::default(),
            inboxes,
            ingest,
            metrics,
            count_all: false,
            extra: Vec::new(),
            dirty: false,
            retry_ms: None,
            unremoved: HashSet::default(),
            adds: HashSet::default(),
            removes: HashSet::default(),
            recount: HashSet::default(),
            writes_due_ms: None,
        }
    }

    fn failed(&mut self, what: &str, e: StoreError, now_ms: u64) {
        self.metrics.presence_errors.fetch_add(1, Relaxed);
        self.dirty = true;
        // Never at once: a store that fails without backing off is not
        // retried in a busy loop.
        self.retry_ms = self
            .store
            .retry_in()
            .map(|d| now_ms + (d.as_millis() as u64).max(RETRY_MIN_MS));
        tracing::debug!(error = %e, "presence {what} failed");
    }

    fn expiry(&self, now_ms: u64) -> u64 {
        now_ms + self.timing.ttl_ms
    }

    /// Whether `cmd` brings a member of a course this node counts nobody on.
    pub fn brings_a_new_course(&self, cmd: &PresenceCmd) -> bool {
        match cmd {
            PresenceCmd::Join { course, .. } => !self.courses.contains_key(&**course),
            PresenceCmd::Batch(cmds) => cmds.iter().any(|c| self.brings_a_new_course(c)),
            _ => false,
        }
    }

    /// Handles one command; false on shutdown.
    pub fn command(&mut self, cmd: PresenceCmd, now_ms: u64) -> bool {
        let go_on = self.command_inner(cmd, now_ms);
        self.tally_refused();
        go_on
    }

    /// Keys that refused a write, counted with the presence errors.
    fn tally_refused(&mut self) {
        let n = self.store.take_refused();
        if n > 0 {
            self.metrics.presence_errors.fetch_add(n, Relaxed);
        }
    }

    fn command_inner(&mut self, cmd: PresenceCmd, now_ms: u64) -> bool {
        if matches!(
            cmd,
            PresenceCmd::Join { .. } | PresenceCmd::Leave { .. } | PresenceCmd::Batch(_)
        ) {
            return self.commands([cmd], now_ms);
        }
        // Whatever else comes is handled after the members that came before it.
        self.write_all(now_ms);
        match cmd {
            PresenceCmd::Join { .. } | PresenceCmd::Leave { .. } | PresenceCmd::Batch(_) => {}
            PresenceCmd::Roster {
                shard,
                conn,
                course,
            } => {
                let frame = match self.store.roster(&course, now_ms, ROSTER_LIMIT) {
                    Ok((total, ids)) => server_msg::roster(&course, total, &ids),
                    Err(e) => {
                        self.failed("roster", e, now_ms);
                        server_msg::presence_unreachable()
                    }
                };
                if let Some(i) = self.inboxes.get(shard) {
                    i.control(Control::Roster { conn, frame });
                }
            }
            PresenceCmd::CountAll(on) => {
                self.count_all = on;
                if !on {
                    self.extra.clear();
                }
            }
            PresenceCmd::Extra(courses) => {
                if self.count_all {
                    self.extra = courses;
                }
            }
            PresenceCmd::Shutdown => return false,
        }
        true
    }

    /// Handles commands that arrived together, in their order: the members
    /// they add go to the store in one round trip (a reconnect storm's joins
    /// cost one write, not one each), the removals wait up to
    /// [`LEAVE_WINDOW_MS`] for the others; false on shutdown.
    pub fn commands(&mut self, cmds: impl IntoIterator<Item = PresenceCmd>, now_ms: u64) -> bool {
        for cmd in cmds {
            let ok = match cmd {
                PresenceCmd::Batch(inner) => inner.into_iter().all(|c| self.one(c, now_ms)),
                cmd => self.one(cmd, now_ms),
            };
            if !ok {
                return false;
            }
        }
        self.write_adds_counting(now_ms);
        if !self.removes.is_empty() && self.writes_due_ms.is_none() {
            self.writes_due_ms = Some(now_ms + LEAVE_WINDOW_MS);
        }
        self.tally_refused();
        true
    }

    /// One command of a batch: a member's first join waits in `adds`, its
    /// last leave in `removes` (each cancelling the other: a member who left
    /// and came back within the window costs no write); anything else is
    /// handled after the writes before it.
    fn one(&mut self, cmd: PresenceCmd, now_ms: u64) -> bool {
        match cmd {
            PresenceCmd::Join { course, user, from } => {
                crate::failure::trip(&course);
                self.handled(from);
                let key = (course, user);
                let added = join(&mut self.members, &mut self.courses, &key) && {
                    if !self.unremoved.is_empty() {
                        self.unremoved.remove(&key);
                    }
                    self.removes.is_empty() || !self.removes.remove(&key)
                };
                if added {
                    self.adds.insert(key);
                } else {
                    self.recount.insert(key.0);
                }
            }
            PresenceCmd::Leave { course, user, from } => {
                self.handled(from);
                let key = (course, user);
                if leave(&mut self.members, &mut self.courses, &key)
                    && (self.adds.is_empty() || !self.adds.remove(&key))
                {
                    self.removes.insert(key);
                }
            }
            cmd => return self.command(cmd, now_ms),
        }
        true
    }

    /// Notes that a join or leave of batch `from` was handled (a shard's
    /// batches come in order).
    fn handled(&mut self, from: BatchTag) {
        if let Some(a) = self.applied.get_mut(from.shard) {
            *a = (*a).max(from.batch);
        }
    }

    /// Writes the members waiting: the new ones, then the removals, each
    /// grouped by course.
    fn write_all(&mut self, now_ms: u64) {
        self.write_adds(now_ms);
        self.write_removes(now_ms);
    }

    /// Writes the new members waiting in one round trip: one `ZADD` of all
    /// its new members, and one `PEXPIRE`, per course.
    fn write_adds(&mut self, now_ms: u64) {
        if self.adds.is_empty() {
            return;
        }
        let adds = take_waiting(&mut self.adds);
        if let Err(e) = self.store.add(&adds, self.expiry(now_ms)) {
            self.failed("add", e, now_ms);
        }
    }

    /// As [`Worker::write_adds`], with the counts of the courses that gain
    /// members read in the same round trip and sent to the shards (not as
    /// the tick's whole list: see [`Control::JoinCounts`]): a watch answer
    /// after it shows every viewer written so far, on every node, a course
    /// new to the node its first answers too (they wait for it). The
    /// presence tick's count stays the only one pushed to viewers already
    /// shown a count.
    fn write_adds_counting(&mut self, now_ms: u64) {
        if self.adds.is_empty() && self.recount.is_empty() {
            return;
        }
        // Every count writes the removals waiting first: no count sees a
        // member who left (its shard's leave is in the batches it covers).
        if !self.removes.is_empty() {
            self.write_removes(now_ms);
        }
        let adds = take_waiting(&mut self.adds);
        let mut courses: Vec<Arc<str>> = adds.iter().map(|(c, _)| Arc::clone(c)).collect();
        if !self.recount.is_empty() {
            courses.extend(self.recount.drain());
            courses.sort_unstable();
        }
        courses.dedup();
        let expiry = self.expiry(now_ms);
        let started = Instant::now();
        let counts = match self.store.add_and_count(&adds, expiry, &courses, now_ms) {
            Ok(c) => c,
            Err(e) => return self.failed("add", e, now_ms),
        };
        self.send_counts(courses, counts, |counts, applied| Control::JoinCounts {
            counts,
            applied,
        });
        // Observed once the shards have the counts.
        self.metrics
            .presence_pipeline
            .observe_us(started.elapsed().as_micros() as u64);
    }

    /// Sends each shard `courses`' counts, sorted by course (a shard looks
    /// up the count of a course it starts to hold), as `message` with the
    /// last of that shard's batches handled (all written by now); returns them.
    fn send_counts(
        &self,
        courses: Vec<Arc<str>>,
        counts: Vec<u64>,
        message: impl Fn(shards::Counts, u64) -> Control,
    ) -> shards::Counts {
        let mut counts: Vec<(Arc<str>, u64)> = courses.into_iter().zip(counts).collect();
        counts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let counts = Arc::new(counts);
        for (i, inbox) in self.inboxes.iter().enumerate() {
            let applied = self.applied.get(i).copied().unwrap_or(0);
            inbox.control(message(Arc::clone(&counts), applied));
        }
        counts
    }

    /// Writes the removals waiting in one round trip: one `ZREM` of all its
    /// members gone per course. Those that failed wait for the next refresh.
    fn write_removes(&mut self, now_ms: u64) {
        self.writes_due_ms = None;
        if self.removes.is_empty() {
            return;
        }
        let gone = take_waiting(&mut self.removes);
        if let Err(e) = self.store.remove(&gone) {
            self.failed("remove", e, now_ms);
            let room = UNREMOVED_MAX.saturating_sub(self.unremoved.len());
            self.unremoved.extend(gone.into_iter().take(room));
        }
    }

    /// Re-scores every member of this node, and removes again the members
    /// whose removal failed.
    fn refresh(&mut self, now_ms: u64) {
        // Every member is re-scored below, the waiting ones too.
        self.adds.clear();
        self.write_all(now_ms);
        let expiry = self.expiry(now_ms);
        if !self.members.is_empty() {
            let members = by_course(self.members.keys().cloned().collect());
            if let Err(e) = self.store.refresh(&members, expiry) {
                return self.failed("refresh", e, now_ms);
            }
        }
        if !self.unremoved.is_empty() {
            let gone = by_course(self.unremoved.iter().cloned().collect());
            if let Err(e) = self.store.remove(&gone) {
                return self.failed("remove", e, now_ms);
            }
            self.unremoved = HashSet::default();
        }
        self.dirty = false;
    }

    /// Reads counts and pushes them to shards (sorted by course, each with
    /// the last of that shard's batches handled, all written by now) and to
    /// the ingest thread.
    fn count(&mut self, now_ms: u64) {
        let mut courses: Vec<Arc<str>> = self.courses.keys().cloned().collect();
        courses.extend(
            self.extra
                .iter()
                .filter(|c| !self.courses.contains_key(&***c))
                .cloned(),
        );
        if courses.is_empty() {
            return;
        }
        let started = Instant::now();
        let counts = match self.store.count(&courses, now_ms) {
            Ok(c) => c,
            Err(e) => return self.failed("count", e, now_ms),
        };
        self.metrics
            .presence_pipeline
            .observe_us(started.elapsed().as_micros() as u64);
        let counts = self.send_counts(courses, counts, |counts, applied| Control::Presence {
            counts,
            applied,
        });
        if let Some(tx) = &self.ingest {
            let _ = tx.send(IngestCmd::Viewers(counts));
        }
    }

    /// Runs what is due at `now_ms`: the write of the removals waiting (see
    /// [`LEAVE_WINDOW_MS`]), the re-score of every member each TTL/2 (sooner
    /// after a failed write: at the store connection's next attempt, or at
    /// the next count tick for a store without a backoff), and the count
    /// each presence tick (after the waiting removals are written).
    pub fn handle_timeout(&mut self, now_ms: u64) {
        // A wall clock stepped back must not stall the ticks.
        let (tick, every) = (self.timing.tick_ms, self.timing.refresh_ms());
        self.next_count_ms = self.next_count_ms.min(now_ms + tick);
        self.next_refresh_ms = self.next_refresh_ms.min(now_ms + every);
        let cap = crate::redis::backoff::BACKOFF_CAP.as_millis() as u64;
        self.retry_ms = self.retry_ms.map(|at| at.min(now_ms + cap));
        if !self.dirty {
            // Nothing left to write again.
            self.retry_ms = None;
        }
        let count_due = now_ms >= self.next_count_ms;
        let retry_due = self.retry_ms.is_some_and(|at| now_ms >= at);
        if now_ms >= self.next_refresh_ms || (self.dirty && (count_due || retry_due)) {
            self.next_refresh_ms = now_ms + every;
            // Set again by a failure of this refresh.
            self.retry_ms = None;
            self.refresh(now_ms);
        }
        if count_due || self.writes_due_ms.is_some_and(|at| now_ms >= at) {
            self.write_all(now_ms);
        }
        if count_due {
            self.next_count_ms = now_ms + tick;
            self.count(now_ms);
        }
        self.tally_refused();
    }

    /// When [`Worker::handle_timeout`] is next due (Unix ms).
    pub fn poll_timeout(&self) -> u64 {
        let due = self.next_count_ms.min(self.next_refresh_ms);
        let due = self.retry_ms.map_or(due, |at| at.min(due));
        self.writes_due_ms.map_or(due, |at| at.min(due))
    }
}

/// The most commands handled as one batch (the counts are not held back long).
const BATCH_MAX: usize = 4096;

/// How long the worker lets commands gather after the first one of a quiet
/// spell: the joins and leaves of the shards' rounds in that time queue up
/// without waking the thread (or making a shard wake it) for each, and go to
/// the store in one write (a reconnect storm of 2,000 viewers a second: one
/// write per hundred). Far inside a presence tick, and no count waits for it:
/// every count writes the members waiting first.
pub const GATHER_MS: u64 = 50;

/// How long after its last batch of commands the worker hands the pages its
/// writes freed back to the OS (see [`run`]).
pub const COLLECT_AFTER_MS: u64 = 100;

/// Runs the presence worker until `Shutdown`: commands as they come, and
/// what is due whenever its time has come (a stream of commands cannot hold
/// back the counts). The pages freed by its writes go back to the OS
/// [`COLLECT_AFTER_MS`] after the last batch of commands, and after each
/// count or re-score outside a spell of commands: a write's commands come in
/// as many sizes as the courses have new members, each size in pages of its
/// own, which the allocator would otherwise keep for the thread's next
/// allocation of that size, however long the node then stays idle.
pub fn run<P: PresenceStore>(mut w: Worker<P>, commands: Receiver<PresenceCmd>) {
    w.store.warm();
    let mut collect_at: Option<u64> = None;
    loop {
        let due = w.poll_timeout();
        let due = collect_at.map_or(due, |at| at.min(due));
        let wait = due.saturating_sub(clock::unix_ms());
        match commands.recv_timeout(Duration::from_millis(wait)) {
            Ok(cmd) => {
                // A course new to the node is written and counted at once, so
                // that its count reaches the shards before its seed (a round
                // trip more) and its first watch answer shows it.
                if !matches!(cmd, PresenceCmd::Shutdown) && !w.brings_a_new_course(&cmd) {
                    std::thread::sleep(Duration::from_millis(GATHER_MS));
                }
                // What else is queued goes with it: one store write for all.
                let queued = std::iter::from_fn(|| commands.try_recv().ok()).take(BATCH_MAX);
                if !w.commands(std::iter::once(cmd).chain(queued), clock::unix_ms()) {
                    return;
                }
                collect_at = Some(clock::unix_ms() + COLLECT_AFTER_MS);
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = clock::unix_ms();
        if now >= w.poll_timeout() {
            w.handle_timeout(now);
            // Outside a spell of commands: at once, in this wake-up.
            collect_at.get_or_insert(now);
        }
        if collect_at.is_some_and(|at| now >= at) {
            collect_at = None;
            crate::allocator::collect(true);
        }
    }
}

#[cfg(test)]
mod tests;
