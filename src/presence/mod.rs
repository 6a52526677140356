//! Presence: who watches which course, kept in a store with expiry scores so a
//! dead node's viewers simply time out. One worker thread per node talks to the
//! store; shards only send it messages and never wait on it.

pub mod memory;
pub mod redis;

use crate::channels::{Control, Inbox, IngestCmd, PresenceCmd};
use crate::clock;
use crate::ingest::wake::IngestTx;
use crate::node::Node;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use shards::server_msg;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most ids in a roster reply.
pub const ROSTER_LIMIT: usize = 1000;

/// Errors from a store (Redis down); the worker counts and retries.
pub type StoreResult<T> = Result<T, String>;

/// A presence store: sorted sets of user -> expiry (Unix ms) per course.
pub trait PresenceStore: Send {
    /// ZADD one member.
    fn add(&mut self, course: &str, user: &str, expiry_ms: u64) -> StoreResult<()>;
    /// ZREM one member.
    fn remove(&mut self, course: &str, user: &str) -> StoreResult<()>;
    /// Re-scores every listed member in one round trip.
    fn refresh(&mut self, members: &[(Arc<str>, Arc<str>)], expiry_ms: u64) -> StoreResult<()>;
    /// Trims expired members and counts the rest, per course, in one round trip.
    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>>;
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

/// The presence worker's state.
pub struct Worker<P: PresenceStore> {
    store: P,
    timing: PresenceTiming,
    /// Node-wide connection-shard count per (course, user): shards each report
    /// their own first/last, the node removes a member only when all are gone.
    members: HashMap<(Arc<str>, Arc<str>), u32>,
    inboxes: Vec<Arc<Inbox>>,
    ingest: Option<IngestTx>,
    node: Arc<Node>,
    count_all: bool,
    extra: Vec<Arc<str>>,
    /// Members whose write failed: rewritten on the next refresh.
    dirty: bool,
}

impl<P: PresenceStore> Worker<P> {
    /// A worker over `store`.
    pub fn new(
        store: P,
        timing: PresenceTiming,
        inboxes: Vec<Arc<Inbox>>,
        ingest: Option<IngestTx>,
        node: Arc<Node>,
    ) -> Self {
        Worker {
            store,
            timing,
            members: HashMap::new(),
            inboxes,
            ingest,
            node,
            count_all: false,
            extra: Vec::new(),
            dirty: false,
        }
    }

    fn failed(&mut self, what: &str, e: String) {
        self.node.metrics.presence_errors.fetch_add(1, Relaxed);
        self.dirty = true;
        tracing::debug!(error = %e, "presence {what} failed");
    }

    fn expiry(&self) -> u64 {
        clock::unix_ms() + self.timing.ttl_ms
    }

    /// Handles one command; false on shutdown.
    pub fn command(&mut self, cmd: PresenceCmd) -> bool {
        match cmd {
            PresenceCmd::Join { course, user } => {
                let n = self
                    .members
                    .entry((Arc::clone(&course), Arc::clone(&user)))
                    .or_insert(0);
                *n += 1;
                if *n == 1 {
                    let expiry = self.expiry();
                    if let Err(e) = self.store.add(&course, &user, expiry) {
                        self.failed("add", e);
                    }
                }
            }
            PresenceCmd::Leave { course, user } => {
                let key = (course, user);
                if let Some(n) = self.members.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.members.remove(&key);
                        if let Err(e) = self.store.remove(&key.0, &key.1) {
                            self.failed("remove", e);
                        }
                    }
                }
            }
            PresenceCmd::Roster {
                shard,
                conn,
                course,
            } => {
                let frame = match self.store.roster(&course, clock::unix_ms(), ROSTER_LIMIT) {
                    Ok((total, ids)) => server_msg::roster(&course, total, &ids),
                    Err(e) => {
                        self.failed("roster", e);
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

    /// Re-scores every member of this node.
    pub fn refresh(&mut self) {
        let members: Vec<(Arc<str>, Arc<str>)> = self.members.keys().cloned().collect();
        if members.is_empty() {
            return;
        }
        let expiry = self.expiry();
        match self.store.refresh(&members, expiry) {
            Ok(()) => self.dirty = false,
            Err(e) => self.failed("refresh", e),
        }
    }

    /// Reads counts and pushes them to shards and the ingest thread.
    pub fn count(&mut self) {
        let mut courses: HashSet<Arc<str>> =
            self.members.keys().map(|(c, _)| Arc::clone(c)).collect();
        courses.extend(self.extra.iter().cloned());
        if courses.is_empty() {
            return;
        }
        let courses: Vec<Arc<str>> = courses.into_iter().collect();
        let started = Instant::now();
        let counts = match self.store.count(&courses, clock::unix_ms()) {
            Ok(c) => c,
            Err(e) => return self.failed("count", e),
        };
        self.node
            .metrics
            .presence_pipeline
            .observe_us(started.elapsed().as_micros() as u64);
        let counts: Arc<Vec<(Arc<str>, u64)>> = Arc::new(courses.into_iter().zip(counts).collect());
        for i in &self.inboxes {
            i.control(Control::Presence(Arc::clone(&counts)));
        }
        if let Some(tx) = &self.ingest {
            let _ = tx.send(IngestCmd::Viewers(counts));
        }
    }

    /// Whether a write failed since the last successful refresh.
    pub fn needs_refresh(&self) -> bool {
        self.dirty
    }
}

/// Runs the presence worker until `Shutdown`.
pub fn run<P: PresenceStore>(mut w: Worker<P>, commands: Receiver<PresenceCmd>) {
    let tick = Duration::from_millis(w.timing.tick_ms);
    let refresh_every = Duration::from_millis((w.timing.ttl_ms / 2).max(1));
    let mut next_count = Instant::now() + tick;
    let mut next_refresh = Instant::now() + refresh_every;
    loop {
        let next = next_count.min(next_refresh);
        match commands.recv_deadline(next) {
            Ok(cmd) => {
                if !w.command(cmd) {
                    return;
                }
                // A burst of joins is counted promptly, not a whole tick later.
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if now >= next_refresh || (w.needs_refresh() && now >= next_count) {
            next_refresh = now + refresh_every;
            w.refresh();
        }
        if now >= next_count {
            next_count = now + tick;
            w.count();
        }
    }
}
