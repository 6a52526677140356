//! The relay's figures: what the receive threads count (atomics), what the
//! pending map counts (read under its lock), rendered for `/metrics` from
//! one table of families ([`crate::exposition`]) with every series at 0
//! from start, and the
//! `/healthz` JSON (contract §10).

use super::pending::{Counts, Pending};
use crate::exposition::Family;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A Redis call running longer than this shows Redis as down (`redis:false`)
/// while it runs, whatever it waits on: a backstop under the Redis layer's
/// timeouts (a call fails after a read timeout, a reconnect and one retry,
/// about 2 s on a frozen Redis), so the contract's 10 s holds whatever a call
/// does.
pub const STALL: Duration = Duration::from_secs(3);

/// Why a datagram was refused (`seatboard_relay_rejected_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a JSON object.
    Json,
    /// JSON, but a field is missing, of the wrong type or out of range.
    Schema,
    /// Over 64 KiB.
    TooLarge,
}

impl Rejected {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Rejected; 3] = [Rejected::Json, Rejected::Schema, Rejected::TooLarge];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Rejected::Json => "json",
            Rejected::Schema => "schema",
            Rejected::TooLarge => "too_large",
        }
    }
}

/// What the relay's threads share.
pub struct Shared {
    /// The held snapshots and their counters.
    pending: Mutex<Pending>,
    /// Signalled when a snapshot is held or the relay stops.
    pub work: Condvar,
    /// Datagrams received.
    pub received: AtomicU64,
    rejected: [AtomicU64; 3],
    /// Whether Redis answered the last command.
    pub redis_up: AtomicBool,
    /// Set at SIGTERM: the receive threads stop.
    pub stop: AtomicBool,
    /// What [`Shared::call_since`] counts from.
    epoch: Instant,
    /// When the writer's Redis call in progress started (ms since `epoch`,
    /// plus one); 0 while none runs.
    call_since: AtomicU64,
}

impl Shared {
    /// Nothing held, every counter at 0, Redis not yet reached.
    pub fn new(pending: Pending) -> Shared {
        Shared {
            pending: Mutex::new(pending),
            work: Condvar::new(),
            received: AtomicU64::new(0),
            rejected: Default::default(),
            redis_up: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            call_since: AtomicU64::new(0),
        }
    }

    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The writer starts a Redis call.
    pub fn call_started(&self) {
        self.call_since.store(self.ms(), Relaxed);
    }

    /// The writer's Redis call returned.
    pub fn call_ended(&self) {
        self.call_since.store(0, Relaxed);
    }

    /// Whether Redis counts as up: it answered the last command, and no call
    /// has been waiting on it for [`STALL`] or more.
    pub fn redis_up(&self) -> bool {
        let since = self.call_since.load(Relaxed);
        let stalled = since != 0 && self.ms().saturating_sub(since) >= STALL.as_millis() as u64;
        self.redis_up.load(Relaxed) && !stalled
    }

    /// The pending map (a poisoned lock is taken anyway: the map stays consistent).
    pub fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a refused datagram.
    pub fn reject(&self, why: Rejected) {
        self.rejected[why as usize].fetch_add(1, Relaxed);
    }

    /// Refused datagrams so far for `why`.
    pub fn rejected(&self, why: Rejected) -> u64 {
        self.rejected[why as usize].load(Relaxed)
    }
}

/// The relay's figures at one scrape.
struct Reading {
    received: u64,
    rejected: [u64; 3],
    counts: Counts,
    pending: u64,
    redis_up: bool,
}

/// The relay's families, in `/metrics` order.
const FAMILIES: &[Family<Reading>] = &[
    Family::counter(
        "seatboard_relay_received_total",
        "Datagrams received.",
        |r, s| s.one(r.received),
    ),
    Family::counter(
        "seatboard_relay_rejected_total",
        "Datagrams refused by the snapshot rules, by reason.",
        |r, s| {
            for (why, n) in Rejected::ALL.iter().zip(r.rejected) {
                s.labelled("reason", why.label(), n);
            }
        },
    ),
    Family::counter(
        "seatboard_relay_coalesced_total",
        "Snapshots dropped for a newer one of their section (held or already written).",
        |r, s| s.one(r.counts.coalesced),
    ),
    Family::counter(
        "seatboard_relay_published_total",
        "Snapshots written to Redis (state hash, then channel).",
        |r, s| s.one(r.counts.published),
    ),
    Family::counter(
        "seatboard_relay_dropped_total",
        "Snapshots dropped: full (a new section past --max-pending or --max-pending-bytes, or a newer snapshot of a held section past --max-pending-bytes plus 64 KiB), redis_down (Redis never took it).",
        |r, s| {
            s.labelled("reason", "full", r.counts.dropped_full);
            s.labelled("reason", "redis_down", r.counts.dropped_redis_down);
        },
    ),
    Family::gauge(
        "seatboard_relay_pending",
        "Snapshots held for Redis (being written included), at most one held per section beside one being written.",
        |r, s| s.one(r.pending),
    ),
    Family::gauge(
        "seatboard_relay_redis_up",
        "1 when Redis answered the relay's last command, else 0.",
        |r, s| s.one(u64::from(r.redis_up)),
    ),
];

impl crate::worker_http::Figures for Shared {
    fn thread(&self) -> &'static str {
        "relay-http"
    }

    /// The figures read once (the pending map under one lock), then rendered.
    fn metrics(&self) -> String {
        let (counts, pending) = {
            let p = self.pending();
            (p.counts(), p.len() as u64)
        };
        let reading = Reading {
            received: self.received.load(Relaxed),
            rejected: Rejected::ALL.map(|r| self.rejected(r)),
            counts,
            pending,
            redis_up: self.redis_up(),
        };
        crate::exposition::text(&reading, FAMILIES)
    }

    fn healthz(&self) -> String {
        let up = self.redis_up();
        let pending = self.pending().len();
        crate::worker_http::health(up, &[("redis", &up), ("pending", &pending)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_http::Figures;

    #[test]
    fn every_series_at_zero_from_start() {
        let s = Shared::new(Pending::new(10, usize::MAX));
        let m = s.metrics();
        for line in [
            "seatboard_relay_received_total 0",
            "seatboard_relay_rejected_total{reason=\"json\"} 0",
            "seatboard_relay_rejected_total{reason=\"schema\"} 0",
            "seatboard_relay_rejected_total{reason=\"too_large\"} 0",
            "seatboard_relay_coalesced_total 0",
            "seatboard_relay_published_total 0",
            "seatboard_relay_dropped_total{reason=\"full\"} 0",
            "seatboard_relay_dropped_total{reason=\"redis_down\"} 0",
            "seatboard_relay_pending 0",
            "seatboard_relay_redis_up 0",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing in\n{m}");
        }
        assert_eq!(
            s.healthz(),
            r#"{"status":"degraded","redis":false,"pending":0}"#
        );
    }

    #[test]
    fn a_call_waiting_past_the_stall_shows_redis_down() {
        let mut s = Shared::new(Pending::new(10, usize::MAX));
        s.redis_up.store(true, Relaxed);
        s.call_started();
        assert!(s.redis_up(), "a call just started");
        // As if the call had started twice STALL ago.
        let Some(past) = Instant::now().checked_sub(STALL * 2) else {
            return;
        };
        s.epoch = past;
        s.call_since.store(1, Relaxed);
        assert!(!s.redis_up());
        assert!(s.healthz().contains(r#""redis":false"#));
        s.call_ended();
        assert!(s.redis_up());
    }
}
