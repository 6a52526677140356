//! The reconciler's figures (contract §11): counters and gauges as atomics,
//! the query-time histogram, rendered for `/metrics` from one table of
//! families ([`crate::exposition`]) with every series at 0 from start, and
//! the `/healthz` JSON.

use super::decide::State;
use crate::clock::unix_ms;
use crate::exposition::{Family, Histogram};
use crate::worker_http::{health, Figures};
use shards::snapshot::Reject;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Upper bounds of the query-time histogram's buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Why a check failed (`seatboard_reconcile_errors_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The database is down, slow to connect or refusing.
    Db,
    /// A statement was cancelled at its timeout.
    Timeout,
    /// Redis did not answer or refused (a check's commands, or a `PING`).
    Redis,
}

/// What the reconciler's threads share.
pub struct Shared {
    checks: [AtomicU64; 2],
    /// Rows read from the database.
    pub rows: AtomicU64,
    repaired: [AtomicU64; 3],
    /// Sections found ahead of the database.
    pub ahead: AtomicU64,
    rejected: [AtomicU64; 3],
    errors: [AtomicU64; 3],
    query: Histogram,
    /// Whether the last statement was answered within the statement timeout.
    pub db_up: AtomicBool,
    /// Whether Redis answered the last command.
    pub redis_up: AtomicBool,
    /// The end of the last complete check, ms since the epoch (0: none yet).
    pub last_check_ms: AtomicU64,
    /// Redis commands sent.
    pub redis_commands: AtomicU64,
    /// When the process started, ms since the epoch.
    started_ms: AtomicU64,
}

fn state_index(s: State) -> usize {
    match s {
        State::Missing => 0,
        State::Behind => 1,
        State::Ahead => 2,
    }
}

fn reject_index(r: Reject) -> usize {
    match r {
        Reject::Json => 0,
        Reject::TooLarge => 2,
        Reject::Schema | Reject::ChannelMismatch | Reject::TooManySections => 1,
    }
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

impl Shared {
    /// Every counter at 0, nothing reached yet, started now.
    pub fn new() -> Shared {
        Shared {
            checks: Default::default(),
            rows: AtomicU64::new(0),
            repaired: Default::default(),
            ahead: AtomicU64::new(0),
            rejected: Default::default(),
            errors: Default::default(),
            query: Histogram::new(BUCKETS),
            db_up: AtomicBool::new(false),
            redis_up: AtomicBool::new(false),
            last_check_ms: AtomicU64::new(0),
            redis_commands: AtomicU64::new(0),
            started_ms: AtomicU64::new(unix_ms()),
        }
    }

    /// Counts a complete check.
    pub fn check(&self, sweep: bool) {
        self.checks[usize::from(sweep)].fetch_add(1, Relaxed);
        self.last_check_ms.store(unix_ms(), Relaxed);
    }

    /// Checks so far (`sweep`: full ones).
    pub fn checks(&self, sweep: bool) -> u64 {
        self.checks[usize::from(sweep)].load(Relaxed)
    }

    /// Counts sections repaired for `why`.
    pub fn repaired(&self, why: State, n: u64) {
        self.repaired[state_index(why)].fetch_add(n, Relaxed);
    }

    /// Counts a refused row.
    pub fn reject(&self, why: Reject) {
        self.rejected[reject_index(why)].fetch_add(1, Relaxed);
    }

    /// Counts a failed check (or a failed `PING`, as `Redis`).
    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Relaxed);
    }

    /// Records one query's time.
    pub fn query_time(&self, secs: f64) {
        self.query.observe_us((secs * 1e6) as u64);
    }
}

/// The reconciler's families, in `/metrics` order.
const FAMILIES: &[Family<Shared>] = &[
    Family::counts(
        "seatboard_reconcile_checks_total",
        "Checks of the database against Redis, by kind.",
        "kind",
        &["incremental", "sweep"],
        |m| &m.checks,
    ),
    Family::count(
        "seatboard_reconcile_rows_total",
        "Rows read from the database.",
        |m| &m.rows,
    ),
    Family::counts(
        "seatboard_reconcile_repaired_total",
        "Sections written to Redis because a publish was lost, by what Redis held.",
        "reason",
        &["missing", "behind", "ahead"],
        |m| &m.repaired,
    ),
    Family::count(
        "seatboard_reconcile_ahead_total",
        "Sections found with a version greater than the database's.",
        |m| &m.ahead,
    ),
    Family::counts(
        "seatboard_reconcile_rejected_total",
        "Rows skipped by the snapshot rules, by reason.",
        "reason",
        &["json", "schema", "too_large"],
        |m| &m.rejected,
    ),
    Family::counts(
        "seatboard_reconcile_errors_total",
        "Checks that failed, by kind; redis also counts each PING that failed.",
        "kind",
        &["db", "timeout", "redis"],
        |m| &m.errors,
    ),
    Family::histogram(
        "seatboard_reconcile_query_seconds",
        "Time of one query of the database.",
        |m, s| s.histogram(&m.query, ""),
    ),
    Family::flag(
        "seatboard_reconcile_db_up",
        "1 when the database answered the last statement, else 0.",
        |m| &m.db_up,
    ),
    Family::flag(
        "seatboard_reconcile_redis_up",
        "1 when Redis answered the last command, else 0.",
        |m| &m.redis_up,
    ),
    Family::gauge(
        "seatboard_reconcile_last_check_timestamp_seconds",
        "When the last complete check ended, seconds since the epoch (0: none yet).",
        |m, s| s.one(m.last_check_ms.load(Relaxed) as f64 / 1000.0),
    ),
];

impl Figures for Shared {
    fn thread(&self) -> &'static str {
        "reconcile-http"
    }

    fn metrics(&self) -> String {
        crate::exposition::text(self, FAMILIES)
    }

    fn healthz(&self) -> String {
        let (db, redis) = (self.db_up.load(Relaxed), self.redis_up.load(Relaxed));
        let last = self.last_check_ms.load(Relaxed);
        // Before the first check: how long since the start.
        let since = if last == 0 {
            self.started_ms.load(Relaxed)
        } else {
            last
        };
        let ago = unix_ms().saturating_sub(since);
        health(
            db && redis,
            &[("db", &db), ("redis", &redis), ("last_check_ms_ago", &ago)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_at_zero_from_start() {
        let s = Shared::new();
        let m = s.metrics();
        for line in [
            "seatboard_reconcile_checks_total{kind=\"incremental\"} 0",
            "seatboard_reconcile_checks_total{kind=\"sweep\"} 0",
            "seatboard_reconcile_rows_total 0",
            "seatboard_reconcile_repaired_total{reason=\"missing\"} 0",
            "seatboard_reconcile_repaired_total{reason=\"behind\"} 0",
            "seatboard_reconcile_repaired_total{reason=\"ahead\"} 0",
            "seatboard_reconcile_ahead_total 0",
            "seatboard_reconcile_rejected_total{reason=\"json\"} 0",
            "seatboard_reconcile_rejected_total{reason=\"schema\"} 0",
            "seatboard_reconcile_rejected_total{reason=\"too_large\"} 0",
            "seatboard_reconcile_errors_total{kind=\"db\"} 0",
            "seatboard_reconcile_errors_total{kind=\"timeout\"} 0",
            "seatboard_reconcile_errors_total{kind=\"redis\"} 0",
            "seatboard_reconcile_query_seconds_count 0",
            "seatboard_reconcile_db_up 0",
            "seatboard_reconcile_redis_up 0",
            "seatboard_reconcile_last_check_timestamp_seconds 0",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing in\n{m}");
        }
        assert!(s
            .healthz()
            .starts_with(r#"{"status":"degraded","db":false,"redis":false"#));
        s.query_time(0.003);
        assert!(s
            .metrics()
            .contains("seatboard_reconcile_query_seconds_bucket{le=\"0.005\"} 1"));
    }
}
