//! The reconciler's loop on its worker thread, by the rule of
//! [`super::schedule`]: a sweep first, then an incremental check every
//! interval and a sweep every `--sweep-s`, each at its own deadline (each
//! wait shortened by a random 0-10 %), jittered backoff capped at 30 s (never
//! faster than the interval) while the database or Redis fails, and a `PING`
//! when Redis has gone 5 s unasked, so `redis` on `/healthz` follows Redis
//! while the database is quiet. One check: the rows read, checked, planned,
//! looked up in Redis, judged, repaired. Every section newly found ahead of
//! the database is logged once, with its course and section. The first
//! check that reads both the database and Redis logs one info line,
//! `reconciler checking`, once per process (a clean start logs no warning).
//! `--check` is one full check that writes nothing.

use super::decide::{compare, Book, Candidate, Field, State};
use super::flags::Timing;
use super::metrics::{ErrorKind, Shared};
use super::row;
use super::schedule::{Schedule, Step};
use super::source::{DbError, Source};
use super::store::Store;
use crate::clock;
use crate::redis::backoff::Backoff;
use crossbeam_channel::Receiver;
use shards::Snapshot;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest wait between tries while the database or Redis fails.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Log lines of one kind (refused rows, errors) at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// How far past this host's clock a row's `updated_at` may be and still set
/// the next incremental check's bound: the widest time zone offset (a
/// `timestamp` column holding local time) and then some. A row further out
/// (a typo, a test row, `2099-01-01`) is checked like any other, but taken
/// as the bound it would hide every later change from the incremental
/// checks until the next sweep.
const FUTURE_SLACK_US: i64 = 15 * 3_600 * 1_000_000;

/// `d` shortened by a random 0-10 % (never longer).
fn jitter(d: Duration) -> Duration {
    d.mul_f64(1.0 - fastrand::f64() * 0.1)
}

/// A log line allowed at most once per [`LOG_EVERY`].
#[derive(Default)]
struct Every(Option<Instant>);

impl Every {
    /// Whether a line may be logged now (and if so, counts it as logged).
    fn ready(&mut self) -> bool {
        let ok = self.0.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if ok {
            self.0 = Some(Instant::now());
        }
        ok
    }
}

/// The reconciler's worker.
pub struct Worker {
    /// The database.
    pub source: Box<dyn Source>,
    /// Redis.
    pub store: Store,
    /// The state machine.
    pub book: Book,
    /// The figures.
    pub shared: Arc<Shared>,
    /// The clocks.
    pub timing: Timing,
    /// Set at SIGTERM: what a check was about to write is dropped.
    pub stop: Arc<AtomicBool>,
    /// The newest `updated_at` seen, µs.
    newest_us: Option<i64>,
    /// Whether a check has completed since start (its one info line logged).
    checking: bool,
    /// The last check failed (its recovery is logged).
    failing: bool,
    /// The last `PING` failed (its recovery is logged).
    ping_failed: bool,
    logs: Logs,
}

/// The rate limits of the warnings that may repeat at every check.
#[derive(Default)]
struct Logs {
    /// Rows skipped.
    rows: Every,
    /// Checks failed for Redis, and `PING`s failed.
    redis: Every,
    /// Checks failed for the database.
    db: Every,
    /// Rows whose `updated_at` is in the future.
    future: Every,
}

/// Why a check failed.
#[derive(Debug)]
pub enum CheckError {
    /// The database.
    Db(DbError),
    /// Redis.
    Redis(crate::redis::Error),
    /// Stopped (SIGTERM) before it could write.
    Stopped,
}

impl Worker {
    /// A worker that has checked nothing yet.
    pub fn new(
        source: Box<dyn Source>,
        store: Store,
        shared: Arc<Shared>,
        timing: Timing,
        stop: Arc<AtomicBool>,
    ) -> Worker {
        Worker {
            source,
            store,
            book: Book::new(
                timing.grace.as_millis() as u64,
                timing.ahead_repair.as_millis() as u64,
            ),
            shared,
            timing,
            stop,
            newest_us: None,
            checking: false,
            failing: false,
            ping_failed: false,
            logs: Logs::default(),
        }
    }

    /// The rows of one query, checked by section 2's rules (refusals counted).
    fn rows(&mut self, bound_us: Option<i64>) -> Result<Vec<Snapshot>, CheckError> {
        let t = Instant::now();
        let fetched = self.source.fetch(bound_us);
        match &fetched {
            Ok(_) => self.shared.db_up.store(true, Relaxed),
            // A database too slow to answer within the statement timeout is
            // not up for the reconciler (contract §11: "down, slow, or refuses").
            Err(DbError::Timeout(_)) => {
                self.shared.db_up.store(false, Relaxed);
                self.shared.error(ErrorKind::Timeout);
            }
            // A result lacking required columns compares nothing: a
            // database error like a refusal, retried with the same backoff.
            Err(DbError::Down(_) | DbError::Columns { .. }) => {
                self.shared.db_up.store(false, Relaxed);
                self.shared.error(ErrorKind::Db);
            }
        }
        let rows = fetched.map_err(CheckError::Db)?;
        self.shared.query_time(t.elapsed().as_secs_f64());
        self.shared.rows.fetch_add(rows.len() as u64, Relaxed);
        let mut out = Vec::with_capacity(rows.len());
        let latest = clock::unix_ms() as i64 * 1000 + FUTURE_SLACK_US;
        for r in &rows {
            match r.updated_us {
                Some(u) if u <= latest => {
                    self.newest_us = Some(self.newest_us.map_or(u, |n| n.max(u)));
                }
                Some(_) if self.logs.future.ready() => tracing::warn!(
                    course = r.course.as_deref().unwrap_or("?"),
                    section = ?r.section,
                    "row's updated_at is in the future: checked, but not taken as the next check's bound"
                ),
                _ => {}
            }
            match row::snapshot(r) {
                Ok(s) => out.push(s),
                Err(why) => {
                    self.shared.reject(why);
                    if self.logs.rows.ready() {
                        tracing::warn!(
                            reason = why.label(),
                            course = r.course.as_deref().unwrap_or("?"),
                            section = ?r.section,
                            "row skipped: not a valid snapshot"
                        );
                    }
                }
            }
        }
        Ok(out)
    }

    /// `r`, a Redis call begun when `before` commands had been sent, on the
    /// figures: `redis_up` set when Redis answered a command (a read of no
    /// section sends none and says nothing), cleared and counted when it
    /// failed.
    fn redis<T>(
        &mut self,
        before: u64,
        r: Result<T, crate::redis::Error>,
    ) -> Result<T, CheckError> {
        match r {
            Ok(v) => {
                if self.store.commands != before {
                    self.shared.redis_up.store(true, Relaxed);
                }
                Ok(v)
            }
            Err(e) => {
                self.shared.redis_up.store(false, Relaxed);
                self.shared.error(ErrorKind::Redis);
                Err(CheckError::Redis(e))
            }
        }
    }

    /// One check; true when a sweep is wanted next (a section due for
    /// replacement whose row was not read again).
    pub fn check(&mut self, sweep: bool) -> Result<bool, CheckError> {
        let overlap = self.timing.overlap.as_micros() as i64;
        let bound = if sweep {
            None
        } else {
            self.newest_us.map(|n| n.saturating_sub(overlap))
        };
        let rows = match self.rows(bound) {
            Ok(rows) => rows,
            Err(e) => {
                // Redis is not read when the database fails: asked on its
                // own, so `redis_up` says what Redis does, not what the
                // database did (not when stopping: the cancel ended it).
                if !self.stop.load(Relaxed) {
                    self.ping();
                }
                return Err(e);
            }
        };
        let cands = self.book.plan(rows, sweep);
        let before = self.store.commands;
        let fields = self.store.read(&cands);
        let fields = self.redis(before, fields)?;
        if self.stop.load(Relaxed) {
            return Err(CheckError::Stopped);
        }
        let looked = self.readable(cands, fields);
        let out = self.book.judge(looked, crate::clock::now_ms());
        // Each section once, when first found so: bounded by the sections,
        // and never again while it stays ahead.
        for (s, redis) in &out.newly_ahead {
            self.shared.ahead.fetch_add(1, Relaxed);
            tracing::warn!(
                course = %s.course,
                section = s.section,
                db_version = ?s.version,
                redis_version = %redis,
                "Redis holds a version the database does not (replaced if it stays so)"
            );
        }
        if !out.write.is_empty() {
            let snaps: Vec<Snapshot> = out.write.iter().map(|(s, _)| s.clone()).collect();
            let at = self.store.commands;
            let r = self.store.write(&snaps);
            self.redis(at, r)?;
            self.book.written(&snaps);
            for (s, why) in &out.write {
                self.shared.repaired(*why, 1);
                tracing::info!(course = %s.course, section = s.section, version = ?s.version, reason = why.label(), "section repaired: its publish was lost");
            }
        }
        if !out.replace.is_empty() {
            let at = self.store.commands;
            let r = self.store.replace(&out.replace);
            self.redis(at, r)?;
            self.book.written(&out.replace);
            self.shared.repaired(State::Ahead, out.replace.len() as u64);
            for s in &out.replace {
                tracing::warn!(course = %s.course, section = s.section, version = ?s.version, "section replaced: Redis held a version the database never had");
            }
        }
        self.shared
            .redis_commands
            .fetch_add(self.store.commands - before, Relaxed);
        self.shared.check(sweep);
        Ok(out.want_sweep)
    }

    /// The candidates with their fields, less those whose state key refused
    /// the read (no hash): each such key counted as a Redis error and logged
    /// (rate-limited); the others are checked.
    fn readable(
        &mut self,
        cands: Vec<Candidate>,
        fields: Vec<Option<Field>>,
    ) -> Vec<(Candidate, Field)> {
        let mut looked = Vec::with_capacity(cands.len());
        for (c, f) in cands.into_iter().zip(fields) {
            match f {
                Some(f) => looked.push((c, f)),
                None => {
                    self.shared.error(ErrorKind::Redis);
                    if self.logs.redis.ready() {
                        tracing::warn!(course = %c.snap.course, section = c.snap.section, "the course's state key is not a hash: its sections are not checked");
                    }
                }
            }
        }
        looked
    }

    /// Asks Redis whether it answers (`PING`): `redis_up` and `/healthz`
    /// follow Redis while no check has needed it (a quiet database reads
    /// no state, and this is no state read); a failure is counted
    /// (`errors_total{kind="redis"}`) and logged (rate-limited), the answer
    /// after one logged once. The command client's own backoff still holds.
    fn ping(&mut self) {
        let before = self.store.commands;
        let r = self.store.ping();
        self.shared
            .redis_commands
            .fetch_add(self.store.commands - before, Relaxed);
        match self.redis(before, r) {
            Ok(()) => {
                if std::mem::take(&mut self.ping_failed) {
                    tracing::info!("Redis answers again");
                }
            }
            Err(e) => {
                self.ping_failed = true;
                if self.logs.redis.ready() {
                    if let CheckError::Redis(r) = &e {
                        tracing::warn!(error = %r, "Redis does not answer");
                    }
                }
            }
        }
    }

    /// A check succeeded: its info lines (the first check, or the first
    /// after failures).
    fn answered(&mut self) {
        if !self.checking {
            // Once per process: the database and Redis both read.
            self.checking = true;
            tracing::info!(
                rows = self.shared.rows.load(Relaxed),
                interval_ms = self.timing.interval.as_millis() as u64,
                sweep_s = self.timing.sweep.as_secs(),
                "reconciler checking"
            );
        } else if self.failing {
            tracing::info!("database and Redis answer again");
        }
        self.failing = false;
    }

    /// A check failed (`e`), retried in `wait`: logged, rate-limited by kind.
    fn failed(&mut self, e: &CheckError, wait: Duration) {
        self.failing = true;
        let retry_in_ms = wait.as_millis() as u64;
        match e {
            CheckError::Db(d) if self.logs.db.ready() => {
                tracing::warn!(error = %d, retry_in_ms, "check failed")
            }
            CheckError::Redis(r) if self.logs.redis.ready() => {
                tracing::warn!(error = %r, retry_in_ms, "check failed: Redis")
            }
            _ => {}
        }
    }

    /// Checks (and pings Redis) by [`Schedule`] until `stop_rx` hears (or is dropped).
    pub fn run(&mut self, stop_rx: Receiver<()>) {
        let t = self.timing;
        let mut plan = Schedule::new(Instant::now());
        // From the interval, doubling to 30 s while the database or Redis fails.
        let mut backoff = Backoff::new(t.interval, BACKOFF_CAP);
        loop {
            let step = plan.step(Instant::now());
            if let Step::Sleep(until) = step {
                match stop_rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    _ => return,
                }
            }
            if self.stop.load(Relaxed) {
                return;
            }
            let asked = self.store.commands;
            let started = Instant::now();
            match step {
                Step::Check { sweep } => match self.check(sweep) {
                    Ok(want_sweep) => {
                        self.answered();
                        backoff.reset();
                        let (interval, sweep_every) = (jitter(t.interval), jitter(t.sweep));
                        let ended = Instant::now();
                        plan.checked(started, ended, sweep, want_sweep, interval, sweep_every);
                    }
                    Err(CheckError::Stopped) => return,
                    Err(e) => {
                        if self.stop.load(Relaxed) {
                            return;
                        }
                        backoff.failed();
                        let wait = backoff.wait().max(t.interval);
                        self.failed(&e, wait);
                        plan.failed(Instant::now(), wait);
                    }
                },
                Step::Ping => self.ping(),
                Step::Sleep(_) => {}
            }
            if self.store.commands != asked {
                plan.asked_redis(Instant::now());
            }
        }
    }
}

/// One line of `--check`'s output.
pub fn difference(s: &Snapshot, field: Field, state: State) -> String {
    let redis = field
        .version()
        .map_or_else(|| "null".to_owned(), |v| v.to_string());
    let course = serde_json::to_string(&*s.course).unwrap_or_default();
    format!(
        "{{\"course\":{course},\"section\":{},\"db_version\":{},\"redis_version\":{redis},\"state\":\"{}\"}}",
        s.section,
        s.version.unwrap_or_default(),
        state.label()
    )
}

/// `--check`: one full check, each difference a line on stdout, nothing
/// written. Ok(true) when Redis agrees with the database (a database with no
/// rows agrees only with a Redis that answers a `PING`).
pub fn check_once(w: &mut Worker) -> Result<bool, CheckError> {
    let rows = w.rows(None)?;
    let cands = w.book.plan(rows, true);
    let before = w.store.commands;
    let fields = w.store.read(&cands);
    let fields = w.redis(before, fields)?;
    if cands.is_empty() {
        // Nothing to read, but "they agree" still needs a Redis that answers.
        let before = w.store.commands;
        let pinged = w.store.ping();
        w.redis(before, pinged)?;
    }
    // A state key that is no hash cannot be compared: the check cannot say
    // they agree (exit 3, naming the course).
    if let Some((c, _)) = cands.iter().zip(&fields).find(|(_, f)| f.is_none()) {
        let what = format!("the state key of {} is not a hash", c.snap.course);
        let source = ::redis::RedisError::from((::redis::ErrorKind::Client, "WRONGTYPE", what));
        return Err(CheckError::Redis(crate::redis::Error::Command {
            what: "reconcile",
            source,
        }));
    }
    let mut lines: Vec<(Arc<str>, u32, String)> = cands
        .iter()
        .zip(fields.into_iter().flatten())
        .filter_map(|(c, f)| {
            let v = c.snap.version?;
            let state = compare(v, f)?;
            Some((
                Arc::clone(&c.snap.course),
                c.snap.section,
                difference(&c.snap, f, state),
            ))
        })
        .collect();
    lines.sort();
    let mut out = String::new();
    for (_, _, l) in &lines {
        out.push_str(l);
        out.push('\n');
    }
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    Ok(lines.is_empty())
}
