//! Sharded placement in a Redis Cluster (`--pubsub sharded`, contract §2a): each
//! watched course's channel is `SSUBSCRIBE`d on the primary that owns its slot,
//! one pub/sub connection per primary that owns a watched channel and none to
//! the others. A connection loss, a `MOVED` reply, or the server unsubscribing
//! a channel whose slot moved marks the slot map stale: it is reread, every
//! channel that lost its place is subscribed again on its new owner, and the
//! router is told to reread the state hashes. While an admin watches, every
//! course with a state hash (found by the state reader's scan, handed over
//! with [`Source::cover`]) is subscribed. `SSUBSCRIBE`s are written without
//! waiting (one pipeline per primary per turn); each confirmation comes back
//! as [`SourceEvent::Subscribed`]. Connections are opened by the source's
//! [`Dialer`], one thread per dial, and the slot map read on its map thread: a
//! frozen primary holds up only the channels it owns. A failed dial waits out
//! that primary's own backoff and asks for the map again without holding
//! placement on the map held; only a map known wrong (a lost connection, a
//! `MOVED`, a slot moved) holds placement until it is reread.

use super::classic::{message_event, PING_AFTER, PING_DEADLINE};
use super::conn::{classify, packed, Fill, Frame, PubConn};
use super::dialer::{Dialed, Dialer};
use super::source::{Source, SourceEvent};
use crate::redis::backoff::Backoff;
use crate::redis::commands::MAP_REFRESH;
use crate::slots::{Addr, SlotMap};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

fn show(a: &Addr) -> String {
    format!("{}:{}", a.0, a.1)
}

/// How far [`Sharded::place`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    /// Every channel's `SSUBSCRIBE` is written.
    All,
    /// The rest wait for connections on their way.
    Dialing,
    /// A slot has no owner, or a write failed.
    Failed,
}

/// A `Source` on sharded pub/sub in a Redis Cluster.
pub struct Sharded {
    /// Opens the connections and reads the slot map (`CLUSTER SLOTS`).
    dialer: Dialer,
    channel_prefix: String,
    map: Option<SlotMap>,
    map_at: Instant,
    /// When the map reader was last asked for a map: one it answers that was
    /// asked before the probe handed over a newer map is dropped unread (it
    /// may come from a node that had not seen the promotion yet).
    map_asked: Instant,
    /// The map is known wrong: placement waits for its reread.
    map_dirty: bool,
    /// A dial failed (a failover may have moved its slots): the map is
    /// reread, while channels go on being placed on the map held.
    map_check: bool,
    /// Paces slot-map rereads that fail.
    map_backoff: Backoff,
    /// Each primary whose last dial failed: its next dial waits this out on
    /// its own thread, so a hung primary's retries hold up no other.
    dial_backoff: HashMap<Addr, Backoff>,
    /// Whether the last slot-map read succeeded (`None`: none answered yet;
    /// the first failure is logged).
    up: Option<bool>,
    conns: Vec<PubConn>,
    /// Where each subscribed course's channel is confirmed subscribed.
    placed: HashMap<String, Addr>,
    /// Where each course's `SSUBSCRIBE` went, until it is confirmed.
    sent: HashMap<String, Addr>,
    /// `SSUBSCRIBE`s written and not confirmed yet, per course and node: a
    /// course counts as subscribed at the last one's confirmation.
    subs_out: HashMap<(String, Addr), u32>,
    /// Our own `SUNSUBSCRIBE`s not confirmed yet (a confirmation beyond them
    /// is the server's: the slot moved).
    unsubs_out: HashMap<(String, Addr), u32>,
    /// An error reply came since the last confirmation (logged once).
    erroring: bool,
    /// Courses the router asked for.
    wanted: BTreeSet<String>,
    firehose: bool,
    /// Courses with a state hash, subscribed while the firehose is on.
    covered: BTreeSet<String>,
    pending: VecDeque<SourceEvent>,
    backoff: Backoff,
    /// A channel lost its place: the router rereads state once all are placed again.
    moved: bool,
    /// Some wanted channel may have no place (checked at the next reconcile).
    need: bool,
    /// The last reconcile could not place every wanted channel (a slot
    /// without a reachable primary): the source counts as down.
    stuck: bool,
    /// The firehose went off: channels nobody watches go at the next reconcile.
    prune: bool,
    rr: usize,
}

impl Sharded {
    /// A source on a cluster through `dialer`; asks for the slot map at once,
    /// but an unreachable cluster is not an error (it keeps retrying).
    pub fn new(channel_prefix: &str, dialer: Dialer) -> Self {
        let mut s = Sharded {
            dialer,
            channel_prefix: channel_prefix.to_owned(),
            map: None,
            map_at: Instant::now(),
            map_asked: Instant::now(),
            map_dirty: true,
            map_check: false,
            map_backoff: Backoff::capped(super::classic::RECONNECT_CAP),
            dial_backoff: HashMap::new(),
            up: None,
            conns: Vec::new(),
            placed: HashMap::new(),
            sent: HashMap::new(),
            subs_out: HashMap::new(),
            unsubs_out: HashMap::new(),
            erroring: false,
            wanted: BTreeSet::new(),
            firehose: false,
            covered: BTreeSet::new(),
            pending: VecDeque::new(),
            backoff: Backoff::capped(super::classic::RECONNECT_CAP),
            moved: false,
            need: true,
            stuck: false,
            prune: false,
            rr: 0,
        };
        s.reconcile();
        s
    }

    fn channel(&self, course: &str) -> String {
        format!("{}{course}", self.channel_prefix)
    }

    fn course_of<'a>(&self, channel: &'a [u8]) -> Option<&'a str> {
        std::str::from_utf8(channel.strip_prefix(self.channel_prefix.as_bytes())?).ok()
    }

    /// Courses that should be subscribed now. While an admin watches nothing is
    /// unsubscribed (the firehose covers every course the node ever saw).
    fn desired(&self) -> BTreeSet<String> {
        let mut d = self.wanted.clone();
        if self.firehose {
            d.extend(self.covered.iter().cloned());
            d.extend(self.placed.keys().cloned());
        }
        d
    }

    /// Whether `course` should be subscribed now ([`Sharded::desired`] for one).
    fn is_desired(&self, course: &str) -> bool {
        self.wanted.contains(course)
            || (self.firehose
                && (self.covered.contains(course) || self.placed.contains_key(course)))
    }

    /// Counts one down; true if none is left.
    fn settle(counts: &mut HashMap<(String, Addr), u32>, key: (String, Addr)) -> bool {
        match counts.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                counts.remove(&key);
                true
            }
            None => true,
        }
    }

    /// Courses wanted now with no subscription placed or on its way.
    fn unplaced(&self) -> Vec<String> {
        self.desired()
            .into_iter()
            .filter(|c| !self.placed.contains_key(c) && !self.sent.contains_key(c))
            .collect()
    }

    fn conn_index(&self, addr: &Addr) -> Option<usize> {
        self.conns.iter().position(|c| &c.addr == addr)
    }

    /// Drops connection `i`: its channels lose their place.
    fn lose(&mut self, i: usize, why: &str) {
        let c = self.conns.swap_remove(i);
        let before = self.placed.len();
        self.placed.retain(|_, a| *a != c.addr);
        self.sent.retain(|_, a| *a != c.addr);
        self.subs_out.retain(|(_, a), _| *a != c.addr);
        self.unsubs_out.retain(|(_, a), _| *a != c.addr);
        let lost = before - self.placed.len();
        if lost > 0 {
            self.moved = true;
            self.need = true;
        }
        self.map_dirty = true;
        tracing::warn!(node = %show(&c.addr), reason = why, channels = lost, "Redis shard pub/sub connection lost; resubscribing on the slot owners");
    }

    /// Handles one frame from connection `i`; an event for the router, if any.
    fn frame(&mut self, i: usize, f: Frame) -> Option<SourceEvent> {
        match f {
            Frame::Message { channel, payload } => {
                message_event(&self.channel_prefix, channel, payload)
            }
            Frame::Confirm(kind, channel) => {
                let course = self.course_of(&channel)?.to_owned();
                let addr = self.conns.get(i)?.addr.clone();
                match kind.as_slice() {
                    b"ssubscribe" => {
                        if !Self::settle(&mut self.subs_out, (course.clone(), addr.clone())) {
                            // An earlier one of several: the last one counts.
                            return None;
                        }
                        self.erroring = false;
                        self.backoff.reset();
                        if self.sent.get(&course) == Some(&addr) {
                            self.sent.remove(&course);
                        }
                        self.placed.insert(course.clone(), addr);
                        if self.is_desired(&course) {
                            return Some(SourceEvent::Subscribed(Some(course)));
                        }
                        // Dropped while on its way: it goes again.
                        self.unplace(&course);
                    }
                    b"sunsubscribe" => {
                        let ours = self
                            .unsubs_out
                            .contains_key(&(course.clone(), addr.clone()));
                        if ours {
                            Self::settle(&mut self.unsubs_out, (course, addr));
                        } else if self.placed.get(&course) == Some(&addr) {
                            // Not asked for: the slot moved away from this primary.
                            self.placed.remove(&course);
                            self.moved = true;
                            self.need = true;
                            self.map_dirty = true;
                            tracing::info!(course, node = %show(&addr), "shard channel unsubscribed by the server (slot moved)");
                        }
                    }
                    _ => {}
                }
                None
            }
            Frame::Error(e) => {
                if e.starts_with("MOVED") || e.starts_with("ASK") || e.starts_with("CLUSTERDOWN") {
                    self.map_dirty = true;
                }
                // An error names no channel: every unconfirmed SSUBSCRIBE on
                // this connection goes again (a second one only confirms),
                // after the backoff.
                if let Some(addr) = self.conns.get(i).map(|c| c.addr.clone()) {
                    self.sent.retain(|_, a| *a != addr);
                    self.subs_out.retain(|(_, a), _| *a != addr);
                    self.need = true;
                }
                self.backoff.failed();
                if !std::mem::replace(&mut self.erroring, true) {
                    tracing::warn!(error = %e, "Redis error on a shard pub/sub connection");
                }
                None
            }
            Frame::Other => None,
        }
    }

    /// Writes `SSUBSCRIBE`s for `courses` to their slots' owners, one write
    /// per primary, without waiting: each confirmation is an event. An owner
    /// without a connection is dialed; its channels go once it is there.
    fn place(&mut self, courses: Vec<String>) -> Placed {
        let Some(map) = self.map.clone() else {
            return if courses.is_empty() {
                Placed::All
            } else {
                Placed::Failed
            };
        };
        let mut by_owner: HashMap<Addr, Vec<String>> = HashMap::new();
        let mut all = true;
        let mut dialing = false;
        for c in courses {
            match map.owner_of(self.channel(&c).as_bytes()) {
                Some(o) => by_owner.entry(o.clone()).or_default().push(c),
                None => all = false,
            }
        }
        for (owner, courses) in by_owner {
            let Some(i) = self.conn_index(&owner) else {
                let after = self
                    .dial_backoff
                    .get(&owner)
                    .map_or(Duration::ZERO, Backoff::wait);
                self.dialer.dial(&owner, after);
                dialing = true;
                continue;
            };
            let mut out = Vec::new();
            for c in &courses {
                out.extend(packed("SSUBSCRIBE", [self.channel(c)]));
            }
            if let Err(e) = self.conns[i].send(&out) {
                self.lose(i, &format!("write: {e}"));
                all = false;
                continue;
            }
            for c in courses {
                *self.subs_out.entry((c.clone(), owner.clone())).or_default() += 1;
                self.sent.insert(c, owner.clone());
            }
        }
        match (all, dialing) {
            (false, _) => Placed::Failed,
            (true, true) => Placed::Dialing,
            (true, false) => Placed::All,
        }
    }

    /// Takes the dialer's answers: slot maps and connections.
    fn answers(&mut self) {
        while let Some(a) = self.dialer.answer() {
            match a {
                // Asked before the map held was read: older than it.
                Dialed::SlotMap(_) if self.map.is_some() && self.map_asked < self.map_at => {}
                Dialed::SlotMap(r) => self.map_read(r),
                Dialed::Conn(addr, Ok(c)) => {
                    self.dial_backoff.remove(&addr);
                    if self.conn_index(&addr).is_none() {
                        self.conns.push(c);
                    }
                    self.need = true;
                }
                Dialed::Conn(addr, Err(e)) => {
                    tracing::debug!(node = %show(&addr), error = %e, "shard pub/sub connect failed");
                    self.dial_backoff
                        .entry(addr)
                        .or_insert_with(|| Backoff::capped(super::classic::RECONNECT_CAP))
                        .failed();
                    self.map_check = true;
                    self.need = true;
                    self.stuck = true;
                }
                Dialed::Resolved(_) => {}
            }
        }
    }

    /// Unsubscribes `course` from wherever it is placed.
    fn unplace(&mut self, course: &str) {
        let Some(addr) = self
            .placed
            .remove(course)
            .or_else(|| self.sent.remove(course))
        else {
            return;
        };
        if let Some(i) = self.conn_index(&addr) {
            let cmd = packed("SUNSUBSCRIBE", [self.channel(course)]);
            match self.conns[i].send(&cmd) {
                Ok(()) => {
                    *self
                        .unsubs_out
                        .entry((course.to_owned(), addr))
                        .or_default() += 1;
                }
                Err(e) => self.lose(i, &format!("write: {e}")),
            }
        }
    }

    /// A slot-map read came back.
    fn map_read(&mut self, read: Result<Option<SlotMap>, crate::redis::error::Error>) {
        let first = self.up.is_none();
        match read {
            Ok(Some(m)) => {
                // Channels whose slot changed owner move there (those
                // still waiting for a confirmation from the old one too).
                let stale: Vec<String> = self
                    .placed
                    .iter()
                    .chain(self.sent.iter())
                    .filter(|(c, a)| m.owner_of(self.channel(c).as_bytes()) != Some(*a))
                    .map(|(c, _)| c.clone())
                    .collect();
                for c in stale {
                    self.unplace(&c);
                    self.moved = true;
                    self.need = true;
                }
                // (Primaries reachable are counted by the state reader's probe.)
                self.map = Some(m);
                self.map_at = Instant::now();
                self.map_dirty = false;
                self.map_check = false;
                self.map_backoff.reset();
                self.up = Some(true);
                self.need = true;
            }
            Ok(None) => {
                tracing::error!("--pubsub sharded needs a Redis Cluster; this one is standalone");
                self.up = Some(false);
                self.map_backoff.failed();
            }
            Err(e) => {
                if first {
                    tracing::warn!(
                        "Redis Cluster unreachable at start; serving degraded and retrying"
                    );
                } else if self.up == Some(true) {
                    tracing::warn!(error = %e, "Redis Cluster slot map unavailable");
                }
                self.up = Some(false);
                self.map_backoff.failed();
            }
        }
    }

    /// Brings subscriptions in line with what is wanted and where slots live.
    /// Cheap when nothing is flagged (it runs before every poll and at the
    /// end of every turn).
    fn reconcile(&mut self) {
        self.answers();
        let stale = self.map_dirty
            || self.map_check
            || self.map.is_none()
            || self.map_at.elapsed() >= MAP_REFRESH;
        if !(self.need || self.prune || stale) {
            return;
        }
        if self.prune {
            self.prune = false;
            let desired = self.desired();
            let extra: Vec<String> = self
                .placed
                .keys()
                .chain(self.sent.keys())
                .filter(|c| !desired.contains(*c))
                .cloned()
                .collect();
            for c in extra {
                self.unplace(&c);
            }
        }
        if stale && self.map_backoff.ready() && self.dialer.read_map() {
            self.map_asked = Instant::now();
        }
        // Placed on a fresh map only: a dirty one waits for its reread.
        let mapped = self.map.is_some() && !self.map_dirty;
        if self.need && mapped && self.backoff.ready() {
            let placed = self.place(self.unplaced());
            if placed != Placed::Dialing {
                self.stuck = placed == Placed::Failed;
            }
            if placed == Placed::All {
                // (The backoff is reset by a confirmation, not by a write.)
                self.need = false;
                if self.moved {
                    self.moved = false;
                    tracing::info!(
                        channels = self.placed.len() + self.sent.len(),
                        "shard channels subscribed again on their owners"
                    );
                    self.pending.push_back(SourceEvent::Reconnected);
                }
            } else if placed == Placed::Failed {
                self.backoff.failed();
            }
        }
        self.drop_unused();
    }

    /// Drops the connections to primaries that own no subscribed channel.
    fn drop_unused(&mut self) {
        let used: BTreeSet<&Addr> = self.placed.values().chain(self.sent.values()).collect();
        self.conns.retain(|c| used.contains(&c.addr));
    }

    /// The next event from what is buffered on any connection.
    fn buffered_event(&mut self) -> Option<SourceEvent> {
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.rr + k) % n;
            while let Some(c) = self.conns.get_mut(i) {
                match c.next_frame() {
                    Ok(Some(items)) => {
                        if let Some(ev) = self.frame(i, classify(items)) {
                            self.rr = i;
                            return Some(ev);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.lose(i, &format!("protocol: {e}"));
                        return self.pending.pop_front();
                    }
                }
            }
        }
        self.rr = self.rr.wrapping_add(1);
        self.pending.pop_front()
    }
}

impl Source for Sharded {
    fn poll(&mut self) -> Option<SourceEvent> {
        if let Some(ev) = self.pending.pop_front() {
            return Some(ev);
        }
        self.reconcile();
        for i in (0..self.conns.len()).rev() {
            if let Err(e) = self.conns[i].keepalive(PING_AFTER, PING_DEADLINE) {
                self.lose(i, &e.to_string());
            }
        }
        if let Some(ev) = self.buffered_event() {
            return Some(ev);
        }
        for i in (0..self.conns.len()).rev() {
            match self.conns[i].fill_ready() {
                Ok(Fill::Closed) => self.lose(i, "closed by Redis"),
                Ok(_) => {}
                Err(e) => self.lose(i, &format!("read: {e}")),
            }
        }
        self.buffered_event()
    }

    fn subscribe(&mut self, course: &str) {
        self.wanted.insert(course.to_owned());
        if !self.placed.contains_key(course) && !self.sent.contains_key(course) {
            // Written at the end of this turn, with the others.
            self.need = true;
        }
    }

    fn unsubscribe(&mut self, course: &str) {
        self.wanted.remove(course);
        if !self.firehose {
            self.unplace(course);
            self.drop_unused();
        }
    }

    fn topology(&mut self, moved: Option<&SlotMap>, down: &[Addr]) {
        if let Some(map) = moved {
            // Every channel whose slot changed owner moves (the map was read
            // from a primary that answered, not from the silent one).
            self.map_read(Ok(Some(map.clone())));
        } else if self.conns.iter().any(|c| down.contains(&c.addr)) {
            // A held primary went silent: its replica may be promoted soon.
            self.map_check = true;
        }
    }

    fn set_firehose(&mut self, on: bool) {
        if on == self.firehose {
            return;
        }
        self.firehose = on;
        if on {
            self.need = true;
        } else {
            // Channels nobody watches go at the next poll, after the router
            // has asked again for the ones still watched.
            self.covered.clear();
            self.prune = true;
        }
    }

    fn cover(&mut self, courses: &[String]) {
        if self.firehose {
            self.covered = courses.iter().cloned().collect();
            self.need = true;
        }
    }

    fn flush(&mut self) {
        if self.need {
            self.reconcile();
        }
    }

    fn subscribed(&self, course: &str) -> bool {
        self.placed.contains_key(course)
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        // Queued events, channels to drop, bytes read (or held by TLS): now.
        if !self.pending.is_empty() || self.prune || self.conns.iter_mut().any(|c| c.buffered()) {
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let far = now + MAP_REFRESH;
        // A map read or a dial on its way wakes the thread through the dialer's
        // eventfd; otherwise the next map read waits for its backoff, and
        // placement (on a map not known wrong) for the backoff after errors.
        let mut due = far;
        if !self.dialer.busy() {
            let stale = self.map_dirty || self.map_check || self.map.is_none();
            let map_due = if stale {
                now + self.map_backoff.wait()
            } else {
                self.map_at + MAP_REFRESH
            };
            let mapped = self.map.is_some() && !self.map_dirty;
            let place_due = if self.need && mapped {
                now + self.backoff.wait()
            } else {
                far
            };
            due = map_due.min(place_due);
        }
        for c in &self.conns {
            due = due.min(now + c.keepalive_due(PING_AFTER, PING_DEADLINE));
        }
        Some(due.saturating_duration_since(now))
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.extend(self.conns.iter().map(PubConn::fd));
        fds.extend(self.dialer.wait_fd());
    }

    fn connected(&self) -> bool {
        self.up == Some(true) && !self.stuck
    }

    fn connecting(&self) -> bool {
        self.up.is_none()
    }
}
