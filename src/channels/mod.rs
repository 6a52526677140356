//! Every channel between threads, in one place: each shard's inbox (a bounded
//! snapshot channel that the ingest side coalesces into when full, an
//! unbounded control channel for rare messages, and a waker so a sleeping
//! shard notices either), the ingest thread's commands and the presence
//! worker's commands (with [`wake`], the eventfd wake-up and the ingest
//! thread's mailbox, and [`poll`], the one `poll(2)` wrapper). Threads only
//! ever talk through these types, so no worker module needs another's.

pub mod poll;
pub mod signals;
pub mod wake;

use crate::clock;
use atomic_waker::AtomicWaker;
use bytes::Bytes;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use shards::{ConnId, Gate, Snapshot};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{fence, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Waker;

/// Batches of snapshots in flight to one shard before coalescing kicks in.
const SNAPSHOT_BATCHES: usize = 64;

/// Rare messages to a shard; never dropped.
#[derive(Debug)]
pub enum Control {
    /// The current board of a course the shard showed interest in.
    Seed {
        /// Course.
        course: Arc<str>,
        /// Every known section.
        sections: Vec<Arc<Snapshot>>,
    },
    /// Global viewer counts of courses (sorted by course), shared by every
    /// shard.
    Presence {
        /// The counts.
        counts: shards::Counts,
        /// The last of this shard's presence batches ([`BatchTag`]) the
        /// presence worker had applied to its store before it read them.
        applied: u64,
    },
    /// Counts of the courses that gained members in a presence write (sorted
    /// by course), read in the same round trip: only those courses.
    JoinCounts {
        /// The counts.
        counts: shards::Counts,
        /// As in [`Control::Presence`].
        applied: u64,
    },
    /// A roster reply for one connection.
    Roster {
        /// Who asked.
        conn: ConnId,
        /// The encoded reply.
        frame: Bytes,
    },
    /// The node's admin aggregate (full and delta), encoded once.
    Admin(shards::AdminMsg),
    /// First signal: start draining.
    Drain,
    /// Second signal: close everything now.
    CloseAll,
    /// Liveness probe for the systemd watchdog: the shard's loop answers by
    /// moving its heartbeat.
    Probe,
    /// Shutdown, once drained or closed: the shard's thread ends.
    Stop,
}

/// What shards (and the presence worker) tell the ingest thread.
#[derive(Debug)]
pub enum IngestCmd {
    /// A shard's first viewer of a course arrived, or its last left.
    Interest {
        /// Which shard.
        shard: usize,
        /// Course.
        course: Arc<str>,
        /// Arrived (`true`) or left.
        watching: bool,
        /// The course's gate on that shard (arrivals only; `None`: every
        /// snapshot of it wakes the shard).
        gate: Option<Gate>,
    },
    /// A shard's first admin feed opened, or its last closed.
    AdminFeed {
        /// Which shard.
        shard: usize,
        /// Opened (`true`) or closed.
        connected: bool,
    },
    /// Global viewer counts, for the admin aggregate.
    Viewers(Arc<Vec<(Arc<str>, u64)>>),
    /// The state reader's answer to a read: the state hashes of `courses`, in
    /// order (`None`: the read failed).
    States {
        /// The courses asked for.
        courses: Vec<Arc<str>>,
        /// One payload per section for each course, or `None`.
        hashes: Option<Vec<Vec<Vec<u8>>>>,
        /// The subscription epoch the read was asked in.
        epoch: u64,
    },
    /// The state reader's answer to a discovery (`None`: it failed).
    Discovered(Option<Discovery>),
    /// What the state reader's probe of a cluster's primaries found changed.
    Topology(Topology),
    /// Stop the thread.
    Shutdown,
}

/// A cluster's primaries as the state reader's probe finds them, sent when
/// it changes: a failover or a migration moves slots (every watched course
/// is read again, wherever its channel is held), a primary that stops
/// answering leaves slots blind (the node is `degraded` while a watched
/// course needs one of them).
#[derive(Debug, Default)]
pub struct Topology {
    /// Some slot has another primary than at the last probe: the map read
    /// now, from a primary that answered.
    pub moved: Option<crate::slots::SlotMap>,
    /// The primaries that did not answer the probe.
    pub down: Vec<crate::slots::Addr>,
    /// The slots those primaries serve.
    pub blind: crate::slots::BlindSlots,
}

/// What a discovery found: every course with a state hash, and the state of
/// those the ingest thread did not hold.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Every valid course code with a state hash.
    pub courses: Vec<String>,
    /// The state hashes read (course, one payload per section).
    pub states: Vec<(Arc<str>, Vec<Vec<u8>>)>,
}

/// The shard and presence batch a join or leave came in: each shard numbers
/// the batches it sends ([`shards::Shard::presence_batch`]), and every count
/// the worker sends a shard names the last of them it had applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchTag {
    /// Which shard.
    pub shard: usize,
    /// The shard's batch number.
    pub batch: u64,
}

/// What shards and the ingest thread tell the presence worker.
#[derive(Debug)]
pub enum PresenceCmd {
    /// A user's first connection on a shard started watching a course.
    Join {
        /// Course.
        course: Arc<str>,
        /// User id.
        user: Arc<str>,
        /// The batch it came in.
        from: BatchTag,
    },
    /// A user's last connection on a shard stopped watching a course.
    Leave {
        /// Course.
        course: Arc<str>,
        /// User id.
        user: Arc<str>,
        /// The batch it came in.
        from: BatchTag,
    },
    /// An admin asked for a roster.
    Roster {
        /// The asking connection's shard.
        shard: usize,
        /// The asking connection.
        conn: ConnId,
        /// Course.
        course: Arc<str>,
    },
    /// Count every known course too (while an admin is connected).
    CountAll(bool),
    /// The courses the node knows, to count for admins.
    Extra(Vec<Arc<str>>),
    /// The joins and leaves of one round of a shard's loop, in their order:
    /// one message (one wake-up of the worker) however many connections came.
    Batch(Vec<PresenceCmd>),
    /// Stop the thread.
    Shutdown,
}

/// The shared half: channels plus the shard's waker.
pub struct Inbox {
    snapshots_rx: Receiver<Vec<Arc<Snapshot>>>,
    snapshots_tx: Sender<Vec<Arc<Snapshot>>>,
    control_rx: Receiver<Control>,
    control_tx: Sender<Control>,
    waker: AtomicWaker,
    /// The moment (process ms) the shard's own timer wakes it next and it
    /// reads this inbox anyway; `u64::MAX` while it has no deadline.
    wakes_at_ms: AtomicU64,
}

impl Inbox {
    /// A fresh inbox.
    pub fn new() -> Arc<Inbox> {
        let (snapshots_tx, snapshots_rx) = bounded(SNAPSHOT_BATCHES);
        let (control_tx, control_rx) = unbounded();
        Arc::new(Inbox {
            snapshots_rx,
            snapshots_tx,
            control_rx,
            control_tx,
            waker: AtomicWaker::new(),
            wakes_at_ms: AtomicU64::new(u64::MAX),
        })
    }

    /// Shard side: the moment its timer wakes it next (`None`: no deadline).
    /// Call after the step's gate updates and before the final look at the
    /// inbox that precedes a sleep: with the fence on each side, either the
    /// shard sees a batch sent meanwhile, or the ingest thread sees these.
    pub fn set_wakes_at(&self, ms: Option<u64>) {
        self.wakes_at_ms.store(ms.unwrap_or(u64::MAX), SeqCst);
        fence(SeqCst);
    }

    /// Ingest side, after a batch went in: wakes the shard unless its own
    /// timer reads the inbox within one round ([`clock::ROUND_MS`]) of the
    /// moment the batch's earliest frame may go out (`need_ms`, a gate's
    /// [`Gate::ready_at`]: never, while every course in it is armed).
    fn wake_for_batch(&self, need_ms: u64, now_ms: u64) {
        if need_ms == Gate::ARMED {
            return;
        }
        if self.wakes_at_ms.load(SeqCst) > need_ms.max(now_ms) + clock::ROUND_MS {
            self.waker.wake();
        }
    }

    /// Sends a control message and wakes the shard.
    pub fn control(&self, msg: Control) {
        let _ = self.control_tx.send(msg);
        self.waker.wake();
    }

    /// Shard side: the next snapshot batch, if any.
    pub fn try_snapshots(&self) -> Option<Vec<Arc<Snapshot>>> {
        self.snapshots_rx.try_recv().ok()
    }

    /// Shard side: the next control message, if any.
    pub fn try_control(&self) -> Option<Control> {
        self.control_rx.try_recv().ok()
    }

    /// Shard side: registers to be woken, then reports whether anything is waiting.
    pub fn register(&self, waker: &Waker) -> bool {
        self.waker.register(waker);
        !self.snapshots_rx.is_empty() || !self.control_rx.is_empty()
    }
}

/// The ingest side of one shard's inbox: batches snapshots, and when the channel
/// is full keeps only the newest state per section until it drains.
pub struct Outlet {
    inbox: Arc<Inbox>,
    batch: Vec<Arc<Snapshot>>,
    /// The gates of the batch's courses, read once the batch is sent.
    gates: Vec<Gate>,
    /// A snapshot in the batch has no gate: the batch wakes the shard.
    ungated: bool,
    overflow: HashMap<(Arc<str>, u32), Arc<Snapshot>>,
}

impl Outlet {
    /// The outlet feeding `inbox`.
    pub fn new(inbox: Arc<Inbox>) -> Self {
        Outlet {
            inbox,
            batch: Vec::new(),
            gates: Vec::new(),
            ungated: false,
            overflow: HashMap::new(),
        }
    }

    /// The inbox behind this outlet.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Adds a snapshot to the next batch (`gate`: its course's on the shard).
    pub fn push(&mut self, snap: Arc<Snapshot>, gate: Option<&Gate>) {
        match gate {
            Some(g) => self.gates.push(g.clone()),
            None => self.ungated = true,
        }
        if self.overflow.is_empty() {
            self.batch.push(snap);
        } else {
            coalesce(&mut self.overflow, snap);
        }
    }

    /// Snapshots waiting because the shard's channel was full.
    pub fn backlog(&self) -> usize {
        self.overflow.len()
    }

    /// Sends what is pending without blocking; what does not fit is coalesced.
    pub fn flush(&mut self) {
        if !self.overflow.is_empty() {
            let mut batch: Vec<Arc<Snapshot>> = self.overflow.drain().map(|(_, s)| s).collect();
            batch.append(&mut self.batch);
            self.batch = batch;
            // Their gates went with the batch that did not fit.
            self.ungated = true;
        }
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let ungated = std::mem::take(&mut self.ungated);
        match self.inbox.snapshots_tx.try_send(batch) {
            Ok(()) => {
                // The gates are read after the send (see `Inbox::set_wakes_at`).
                fence(SeqCst);
                let need = if ungated {
                    0
                } else {
                    self.gates.iter().map(Gate::ready_at).min().unwrap_or(0)
                };
                self.gates.clear();
                self.inbox.wake_for_batch(need, clock::now_ms());
            }
            Err(TrySendError::Full(batch)) | Err(TrySendError::Disconnected(batch)) => {
                self.gates.clear();
                for s in batch {
                    coalesce(&mut self.overflow, s);
                }
                self.inbox.waker.wake();
            }
        }
    }
}

fn coalesce(map: &mut HashMap<(Arc<str>, u32), Arc<Snapshot>>, snap: Arc<Snapshot>) {
    let key = (Arc::clone(&snap.course), snap.section);
    match map.get(&key) {
        Some(cur) if !snap.supersedes(cur) => {}
        // What follows a replace in the same backlog replaces too: the shard
        // never saw the one it follows.
        Some(cur) if cur.replace && !snap.replace => {
            let mut s = (*snap).clone();
            s.replace = true;
            map.insert(key, Arc::new(s));
        }
        _ => {
            map.insert(key, snap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(section: u32, taken: u32, version: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(
            "C".into(),
            section,
            100,
            taken,
            None,
            Some(version),
            None,
        ))
    }

    #[test]
    fn full_channel_coalesces_and_never_loses_the_latest() {
        let inbox = Inbox::new();
        let mut out = Outlet::new(Arc::clone(&inbox));
        // Fill the channel, then keep publishing while the shard reads nothing.
        for v in 0..(SNAPSHOT_BATCHES as u64 + 500) {
            out.push(snap((v % 3) as u32, v as u32, v), None);
            out.flush();
        }
        assert!(out.backlog() <= 3, "overflow keeps one per section");
        // The shard catches up: everything it applies ends at the latest state.
        let mut latest: HashMap<u32, Arc<Snapshot>> = HashMap::new();
        loop {
            while let Some(batch) = inbox.try_snapshots() {
                for s in batch {
                    let keep = latest.get(&s.section).is_none_or(|c| s.supersedes(c));
                    if keep {
                        latest.insert(s.section, s);
                    }
                }
            }
            if out.backlog() == 0 {
                break;
            }
            out.flush();
        }
        let last = SNAPSHOT_BATCHES as u64 + 499;
        for section in 0..3u32 {
            let want = (0..=last).rev().find(|v| v % 3 == section as u64).unwrap();
            assert_eq!(latest[&section].version, Some(want));
        }
    }

    #[test]
    fn a_newer_snapshot_coalesced_over_a_replace_in_the_backlog_replaces_too() {
        let inbox = Inbox::new();
        let mut out = Outlet::new(Arc::clone(&inbox));
        for v in 0..SNAPSHOT_BATCHES as u64 {
            out.push(snap(0, v as u32, v), None);
            out.flush();
        }
        // The channel is full: a repair and the next real version meet in
        // the backlog, and only the newer goes on.
        let mut repair = (*snap(1, 9, 100)).clone();
        repair.replace = true;
        out.push(Arc::new(repair), None);
        out.push(snap(1, 7, 101), None);
        out.flush();
        while inbox.try_snapshots().is_some() {}
        out.flush();
        let mut last = None;
        while let Some(batch) = inbox.try_snapshots() {
            last = batch
                .iter()
                .rev()
                .find(|s| s.section == 1)
                .cloned()
                .or(last);
        }
        let last = last.expect("section 1 delivered");
        assert_eq!((last.seats_taken, last.replace), (7, true));
    }

    /// Counts the wake-ups of a registered shard.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// An inbox whose shard sleeps registered, and its wake-up counter.
    fn sleeping_shard() -> (Arc<Inbox>, Arc<Wakes>) {
        let inbox = Inbox::new();
        let wakes = Arc::new(Wakes(Default::default()));
        let waker = Waker::from(Arc::clone(&wakes));
        assert!(!inbox.register(&waker), "nothing waiting yet");
        (inbox, wakes)
    }

    /// Sends one snapshot under `gate` and says whether the shard was woken
    /// (registering it again for the next call).
    fn woke(inbox: &Arc<Inbox>, wakes: &Arc<Wakes>, gate: Option<&Gate>) -> bool {
        let before = wakes.0.load(SeqCst);
        let mut out = Outlet::new(Arc::clone(inbox));
        out.push(snap(1, 1, 1), gate);
        out.flush();
        let woken = wakes.0.load(SeqCst) > before;
        assert!(inbox.try_snapshots().is_some(), "the batch is in the inbox");
        inbox.register(&Waker::from(Arc::clone(wakes)));
        woken
    }

    #[test]
    fn a_batch_wakes_its_shard_only_when_the_shards_timer_is_too_late() {
        let (inbox, wakes) = sleeping_shard();
        let now = clock::now_ms();
        let gate = Gate::default();
        // No deadline: every batch wakes, gated or not.
        inbox.set_wakes_at(None);
        assert!(woke(&inbox, &wakes, None));
        gate.set(now);
        assert!(woke(&inbox, &wakes, Some(&gate)));
        // The timer reads the inbox within a round anyway: no wake-up.
        inbox.set_wakes_at(Some(now + 1));
        assert!(!woke(&inbox, &wakes, Some(&gate)));
        // A far timer and a course whose token is held: woken at once.
        inbox.set_wakes_at(Some(now + 60_000));
        assert!(woke(&inbox, &wakes, Some(&gate)));
        // ... but not for a course whose next token is later than the timer,
        // or that is already armed on the shard's timer.
        gate.set(now + 120_000);
        assert!(!woke(&inbox, &wakes, Some(&gate)));
        gate.set(Gate::ARMED);
        assert!(!woke(&inbox, &wakes, Some(&gate)));
        // One course that needs it is enough.
        let held = Gate::default();
        held.set(now);
        let mut out = Outlet::new(Arc::clone(&inbox));
        out.push(snap(1, 1, 1), Some(&gate));
        out.push(snap(2, 1, 1), Some(&held));
        let before = wakes.0.load(SeqCst);
        out.flush();
        assert_eq!(wakes.0.load(SeqCst), before + 1);
        // A snapshot without a gate always wakes a far timer.
        inbox.register(&Waker::from(Arc::clone(&wakes)));
        assert!(woke(&inbox, &wakes, None));
    }

    #[test]
    fn a_batch_left_unannounced_is_found_by_the_shards_last_look() {
        let (inbox, wakes) = sleeping_shard();
        let gate = Gate::default();
        gate.set(Gate::ARMED);
        // The ingest thread sees a near timer and an armed course: no wake-up.
        inbox.set_wakes_at(Some(clock::now_ms()));
        let mut out = Outlet::new(Arc::clone(&inbox));
        out.push(snap(1, 1, 1), Some(&gate));
        out.flush();
        assert_eq!(wakes.0.load(SeqCst), 0);
        // The shard, about to sleep, publishes its next deadline and looks:
        // the batch is there, so it does not sleep past it.
        inbox.set_wakes_at(None);
        assert!(inbox.register(&Waker::from(Arc::clone(&wakes))));
    }

    #[test]
    fn a_batch_carrying_the_overflow_wakes_its_shard() {
        let (inbox, wakes) = sleeping_shard();
        inbox.set_wakes_at(Some(clock::now_ms() + 60_000));
        let armed = Gate::default();
        armed.set(Gate::ARMED);
        let mut out = Outlet::new(Arc::clone(&inbox));
        // Armed courses alone never wake; a full channel does.
        for v in 0..=SNAPSHOT_BATCHES as u64 {
            out.push(snap(1, 1, v), Some(&armed));
            out.flush();
        }
        assert!(out.backlog() > 0, "the channel is full");
        assert_eq!(wakes.0.load(SeqCst), 1, "the full channel woke the shard");
        // One more armed snapshot joins the overflow, its gate remembered.
        out.push(snap(2, 1, 1), Some(&armed));
        // The shard drains the channel and sleeps; the overflow then goes in
        // without the gates it came with, so it wakes the shard too.
        while inbox.try_snapshots().is_some() {}
        assert!(!inbox.register(&Waker::from(Arc::clone(&wakes))));
        out.flush();
        assert_eq!(out.backlog(), 0);
        assert_eq!(wakes.0.load(SeqCst), 2);
    }
}

/// What the ingest thread asks the state reader.
#[derive(Debug)]
pub enum ReadRequest {
    /// Read these courses' state hashes (each confirmed subscribed), answered
    /// with [`IngestCmd::States`] carrying the same `epoch`.
    States {
        /// Courses to read.
        courses: Vec<Arc<str>>,
        /// The ingest thread's subscription epoch when it asked.
        epoch: u64,
    },
    /// Find every course with a state hash and read those not in `have`,
    /// answered with [`IngestCmd::Discovered`].
    Discover {
        /// Courses whose state the ingest thread holds already.
        have: HashSet<Arc<str>>,
    },
    /// The pub/sub connection came back: the reads that follow go at once,
    /// not after the command connection's own backoff from the outage.
    Reconnected,
    /// Stop the thread.
    Shutdown,
}
