//! Every channel between threads, in one place: each shard's inbox (a bounded
//! snapshot channel that the ingest side coalesces into when full, an
//! unbounded control channel for rare messages, and a waker so a sleeping
//! shard notices either), the ingest thread's commands and the presence
//! worker's commands (with [`wake`], the ingest thread's eventfd wake-up).
//! Threads only ever talk through these types, so no worker module needs
//! another's.

pub mod wake;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use shards::{ConnId, Snapshot};
use std::collections::HashMap;
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
    /// Global viewer counts of courses.
    Presence(Arc<Vec<(Arc<str>, u64)>>),
    /// A roster reply for one connection.
    Roster {
        /// Who asked.
        conn: ConnId,
        /// The encoded reply.
        frame: Bytes,
    },
    /// The node's admin aggregate, encoded once.
    Admin(Bytes),
    /// First signal: start draining.
    Drain,
    /// Second signal: close everything now.
    CloseAll,
    /// Liveness probe for the systemd watchdog: the shard's loop answers by
    /// moving its heartbeat.
    Probe,
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
    /// Stop the thread.
    Shutdown,
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
    },
    /// A user's last connection on a shard stopped watching a course.
    Leave {
        /// Course.
        course: Arc<str>,
        /// User id.
        user: Arc<str>,
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
        })
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
    overflow: HashMap<(Arc<str>, u32), Arc<Snapshot>>,
}

impl Outlet {
    /// The outlet feeding `inbox`.
    pub fn new(inbox: Arc<Inbox>) -> Self {
        Outlet {
            inbox,
            batch: Vec::new(),
            overflow: HashMap::new(),
        }
    }

    /// The inbox behind this outlet.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Adds a snapshot to the next batch.
    pub fn push(&mut self, snap: Arc<Snapshot>) {
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
        }
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        match self.inbox.snapshots_tx.try_send(batch) {
            Ok(()) => self.inbox.waker.wake(),
            Err(TrySendError::Full(batch)) | Err(TrySendError::Disconnected(batch)) => {
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
            out.push(snap((v % 3) as u32, v as u32, v));
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
}
