//! The reconciler's figures (contract §11): counters and gauges as atomics,
//! the query-time histogram, rendered for `/metrics` with every series at 0
//! from start, and the `/healthz` JSON.

use super::decide::State;
use shards::snapshot::Reject;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

/// Upper bounds of the query-time histogram's buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Why a check failed (`seatboard_reconcile_errors_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The database is down, slow to connect or refusing.
    Db,
    /// A statement was cancelled at its timeout.
    Timeout,
    /// Redis did not answer or refused.
    Redis,
}

/// What the reconciler's threads share.
#[derive(Default)]
pub struct Shared {
    checks: [AtomicU64; 2],
    /// Rows read from the database.
    pub rows: AtomicU64,
    repaired: [AtomicU64; 3],
    /// Sections found ahead of the database.
    pub ahead: AtomicU64,
    rejected: [AtomicU64; 3],
    errors: [AtomicU64; 3],
    query_buckets: [AtomicU64; BUCKETS.len()],
    query_count: AtomicU64,
    query_sum_us: AtomicU64,
    /// Whether the last statement was answered.
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

/// The wall clock in ms since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    /// Every counter at 0, nothing reached yet, started now.
    pub fn new() -> Shared {
        let s = Shared::default();
        s.started_ms.store(now_ms(), Relaxed);
        s
    }

    /// Counts a complete check.
    pub fn check(&self, sweep: bool) {
        self.checks[usize::from(sweep)].fetch_add(1, Relaxed);
        self.last_check_ms.store(now_ms(), Relaxed);
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

    /// Counts a failed check.
    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Relaxed);
    }

    /// Records one query's time.
    pub fn query_time(&self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.query_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.query_count.fetch_add(1, Relaxed);
        self.query_sum_us.fetch_add((secs * 1e6) as u64, Relaxed);
    }

    /// `/metrics`.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut family = |name: &str, kind: &str, help: &str, rows: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v.to_string())];
        let by = |label: &str, names: &[&str], vals: &[AtomicU64]| -> Vec<(String, String)> {
            names
                .iter()
                .zip(vals)
                .map(|(n, v)| (format!("{{{label}=\"{n}\"}}"), v.load(Relaxed).to_string()))
                .collect()
        };
        family(
            "seatboard_reconcile_checks_total",
            "counter",
            "Checks of the database against Redis, by kind.",
            &by("kind", &["incremental", "sweep"], &self.checks),
        );
        family(
            "seatboard_reconcile_rows_total",
            "counter",
            "Rows read from the database.",
            &one(self.rows.load(Relaxed)),
        );
        family(
            "seatboard_reconcile_repaired_total",
            "counter",
            "Sections written to Redis because a publish was lost, by what Redis held.",
            &by("reason", &["missing", "behind", "ahead"], &self.repaired),
        );
        family(
            "seatboard_reconcile_ahead_total",
            "counter",
            "Sections found with a version greater than the database's.",
            &one(self.ahead.load(Relaxed)),
        );
        family(
            "seatboard_reconcile_rejected_total",
            "counter",
            "Rows skipped by the snapshot rules, by reason.",
            &by("reason", &["json", "schema", "too_large"], &self.rejected),
        );
        family(
            "seatboard_reconcile_errors_total",
            "counter",
            "Checks that failed, by kind.",
            &by("kind", &["db", "timeout", "redis"], &self.errors),
        );
        let mut rows: Vec<(String, String)> = BUCKETS
            .iter()
            .zip(&self.query_buckets)
            .map(|(b, n)| {
                (
                    format!("_bucket{{le=\"{b}\"}}"),
                    n.load(Relaxed).to_string(),
                )
            })
            .collect();
        let count = self.query_count.load(Relaxed);
        rows.push(("_bucket{le=\"+Inf\"}".into(), count.to_string()));
        rows.push((
            "_sum".into(),
            format!("{}", self.query_sum_us.load(Relaxed) as f64 / 1e6),
        ));
        rows.push(("_count".into(), count.to_string()));
        family(
            "seatboard_reconcile_query_seconds",
            "histogram",
            "Time of one query of the database.",
            &rows,
        );
        family(
            "seatboard_reconcile_db_up",
            "gauge",
            "1 when the database answered the last statement, else 0.",
            &one(u64::from(self.db_up.load(Relaxed))),
        );
        family(
            "seatboard_reconcile_redis_up",
            "gauge",
            "1 when Redis answered the last command, else 0.",
            &one(u64::from(self.redis_up.load(Relaxed))),
        );
        family(
            "seatboard_reconcile_last_check_timestamp_seconds",
            "gauge",
            "When the last complete check ended, seconds since the epoch (0: none yet).",
            &[(
                String::new(),
                format!("{}", self.last_check_ms.load(Relaxed) as f64 / 1000.0),
            )],
        );
        out
    }

    /// `/healthz`.
    pub fn healthz(&self) -> String {
        let (db, redis) = (self.db_up.load(Relaxed), self.redis_up.load(Relaxed));
        let last = self.last_check_ms.load(Relaxed);
        // Before the first check: how long since the start.
        let since = if last == 0 {
            self.started_ms.load(Relaxed)
        } else {
            last
        };
        let ago = now_ms().saturating_sub(since);
        format!(
            "{{\"status\":\"{}\",\"db\":{db},\"redis\":{redis},\"last_check_ms_ago\":{ago}}}",
            if db && redis { "ok" } else { "degraded" }
        )
    }
}

impl crate::worker_http::Figures for Shared {
    fn thread(&self) -> &'static str {
        "reconcile-http"
    }

    fn metrics(&self) -> String {
        self.render()
    }

    fn healthz(&self) -> String {
        Shared::healthz(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_at_zero_from_start() {
        let s = Shared::new();
        let m = s.render();
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
            .render()
            .contains("seatboard_reconcile_query_seconds_bucket{le=\"0.005\"} 1"));
    }
}
