//! The analytics worker's figures: what it counted, wrote and lost, as
//! atomics rendered for `/metrics` (`--metrics`, served by
//! `crate::worker_http`) from one table of families with every series at 0
//! from start, and the `/healthz` JSON. Every bucket the worker gives up is
//! counted here as well as logged.

use crate::exposition::Family;
use crate::worker_http::{health, Figures};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Why a bucket was given up (`seatboard_analytics_buckets_lost_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The Redis connection dropped during it.
    RedisDown,
    /// Its viewer counts could not be read when it ended.
    Presence,
    /// It ended while the entry before it was still unwritten.
    Unwritten,
}

/// Why a payload was not counted (`seatboard_analytics_rejected_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a snapshot by section 2's rules, or another course's.
    Malformed,
    /// Over the 64 KiB cap, skipped unread.
    Oversize,
}

/// What the worker's loop and its `/metrics` thread share.
#[derive(Default)]
pub struct Shared {
    /// Snapshots counted into a bucket.
    pub snapshots: AtomicU64,
    rejected: [AtomicU64; 2],
    /// Entries appended to the stream.
    pub entries: AtomicU64,
    lost: [AtomicU64; 3],
    /// Whether the pub/sub connection is up now.
    pub redis_up: AtomicBool,
    /// Whether an entry whose `XADD` failed waits to be written.
    pub held: AtomicBool,
}

impl Shared {
    /// Counts a bucket given up.
    pub fn lost(&self, why: Lost) {
        self.lost[why as usize].fetch_add(1, Relaxed);
    }

    /// Buckets given up for `why` so far.
    pub fn lost_count(&self, why: Lost) -> u64 {
        self.lost[why as usize].load(Relaxed)
    }

    /// Counts a payload not counted.
    pub fn rejected(&self, why: Rejected) {
        self.rejected[why as usize].fetch_add(1, Relaxed);
    }
}

/// The worker's families, in `/metrics` order.
const FAMILIES: &[Family<Shared>] = &[
    Family::count(
        "seatboard_analytics_snapshots_total",
        "Snapshots counted into a bucket.",
        |m| &m.snapshots,
    ),
    Family::counts(
        "seatboard_analytics_rejected_total",
        "Payloads not counted, by reason.",
        "reason",
        &["malformed", "oversize"],
        |m| &m.rejected,
    ),
    Family::count(
        "seatboard_analytics_entries_total",
        "Entries appended to the session's stream.",
        |m| &m.entries,
    ),
    Family::counts(
        "seatboard_analytics_buckets_lost_total",
        "Buckets given up (nothing, or only what followed a reconnect, written for them), by reason.",
        "reason",
        &["redis_down", "presence", "unwritten"],
        |m| &m.lost,
    ),
    Family::flag(
        "seatboard_analytics_redis_up",
        "1 while the pub/sub connection is up, else 0.",
        |m| &m.redis_up,
    ),
    Family::flag(
        "seatboard_analytics_held_entry",
        "1 while an entry whose XADD failed waits to be written, else 0.",
        |m| &m.held,
    ),
];

impl Figures for Shared {
    fn thread(&self) -> &'static str {
        "analytics-http"
    }

    fn metrics(&self) -> String {
        crate::exposition::text(self, FAMILIES)
    }

    fn healthz(&self) -> String {
        let (redis, held) = (self.redis_up.load(Relaxed), self.held.load(Relaxed));
        health(redis && !held, &[("redis", &redis), ("held_entry", &held)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_at_zero_from_start_and_each_loss_counted() {
        let s = Shared::default();
        let m = s.metrics();
        for line in [
            "seatboard_analytics_snapshots_total 0",
            "seatboard_analytics_rejected_total{reason=\"malformed\"} 0",
            "seatboard_analytics_rejected_total{reason=\"oversize\"} 0",
            "seatboard_analytics_entries_total 0",
            "seatboard_analytics_buckets_lost_total{reason=\"redis_down\"} 0",
            "seatboard_analytics_buckets_lost_total{reason=\"presence\"} 0",
            "seatboard_analytics_buckets_lost_total{reason=\"unwritten\"} 0",
            "seatboard_analytics_redis_up 0",
            "seatboard_analytics_held_entry 0",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing in:\n{m}");
        }
        s.lost(Lost::RedisDown);
        s.lost(Lost::Unwritten);
        s.lost(Lost::Unwritten);
        s.rejected(Rejected::Oversize);
        let m = s.metrics();
        assert!(m.contains("seatboard_analytics_buckets_lost_total{reason=\"redis_down\"} 1\n"));
        assert!(m.contains("seatboard_analytics_buckets_lost_total{reason=\"unwritten\"} 2\n"));
        assert!(m.contains("seatboard_analytics_rejected_total{reason=\"oversize\"} 1\n"));
        assert_eq!(s.lost_count(Lost::Presence), 0);
        assert!(s.healthz().contains("\"status\":\"degraded\""));
        s.redis_up.store(true, Relaxed);
        assert!(s.healthz().contains("\"status\":\"ok\""));
    }
}
