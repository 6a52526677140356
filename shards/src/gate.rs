//! A course's wake gate: the one number a shard shares with the thread that
//! feeds it snapshots, so a snapshot wakes the shard only when the shard's own
//! timer would put that course's next frame out too late.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// When a new snapshot of a course could next make a shard send a frame.
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<AtomicU64>);

impl Gate {
    /// The course is in the render schedule: the shard's timer is set for its
    /// next frame, and a snapshot arriving meanwhile needs no wake-up.
    pub const ARMED: u64 = u64::MAX;

    /// The earliest moment (the shard's ms) a snapshot could go out: at or
    /// before now while the course's pacer holds a token; [`Gate::ARMED`].
    pub fn ready_at(&self) -> u64 {
        self.0.load(SeqCst)
    }

    /// The shard's side: sets [`Gate::ready_at`].
    pub fn set(&self, ms: u64) {
        self.0.store(ms, SeqCst);
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Gate {}
