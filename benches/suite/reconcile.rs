//! `reconcile`: what `seatboard reconcile` costs and what it buys, on a
//! real PostgreSQL (started here, as in the tests) and a real Redis.
//!
//! `--courses` × `--sections` rows (12,500 × 8 = 100,000 for the figures in
//! benches/RESULTS.md), an index on `updated_at`. In one run:
//! - the first sweep, Redis empty: every row written (time, the
//!   reconciler's CPU and RSS after: its memory per section);
//! - a quiet database for `--seconds`: Redis commands sent meanwhile
//!   (`INFO commandstats`; the liveness `PING`s, one per 5 s, apart), rows
//!   read per check;
//! - `--rate` row changes/s for `--seconds`, none published (every change a
//!   lost publish): the reconciler's CPU (% of a core), rows read, `HGET`s
//!   and compare-and-set writes per check, the database's CPU per check (the
//!   reconciler's own backend, from /proc), and the query plan (`EXPLAIN`);
//! - the end of a window: every section of two sets changes once more,
//!   published with 1 % of the publishes dropped; the reconciler's query
//!   covers one set only. 10 s later, the share of sections whose state
//!   hash (what every new viewer and every reread gets) equals the database,
//!   with and without the reconciler, same run.

use super::{Opts, Outcome};
use crate::procs::{self, Usage};
use seatboard::publisher::{Publisher, PublisherConfig};
use seatboard::redis::RedisFlags;
use serde_json::{json, Value};
use shards::Snapshot;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::common::{free_port, metric_value, seatboard_command, wait_for, RedisServer};
use testkit::proc::Postgres;

const QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, updated_at FROM seats WHERE updated_at >= $1";

struct Rec {
    child: Child,
    metrics: u16,
}

impl Rec {
    fn start(db: &str, query: &str, redis: &str) -> Rec {
        let metrics = free_port();
        let child = seatboard_command()
            .args(["reconcile", "--redis", redis, "--query", query])
            .args([
                "--metrics",
                &format!("127.0.0.1:{metrics}"),
                "--log-level",
                "error",
            ])
            .env("SEATBOARD_RECONCILE_DB", db)
            .stdout(Stdio::null())
            .spawn()
            .expect("seatboard reconcile");
        Rec { child, metrics }
    }

    fn m(&self) -> String {
        testkit::scrape::metrics(self.metrics)
    }

    fn checks(&self) -> f64 {
        let m = self.m();
        metric_value(&m, "seatboard_reconcile_checks_total{kind=\"incremental\"}")
            + metric_value(&m, "seatboard_reconcile_checks_total{kind=\"sweep\"}")
    }
}

impl Drop for Rec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `calls` of each command in `INFO commandstats`.
fn calls(redis: &RedisServer, cmd: &str) -> f64 {
    let text = redis.cli(&["INFO", "commandstats"]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

fn total_commands(redis: &RedisServer) -> f64 {
    redis
        .cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0)
}

fn backend_pid(pg: &Postgres) -> u32 {
    pg.psql(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'seatboard-reconcile' LIMIT 1",
    )
    .parse()
    .unwrap_or(0)
}

fn client(pg: &Postgres) -> postgres::Client {
    postgres::Client::connect(&pg.url("postgres", "x"), postgres::NoTls).expect("postgres client")
}

/// Changes `per_s` random rows a second for `seconds` (one UPDATE per 100 ms).
fn churn(pg: &Postgres, rows: u64, per_s: f64, seconds: f64) -> u64 {
    let mut c = client(pg);
    let batch = (per_s / 10.0).max(1.0) as i64;
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut tick = 0u32;
    while t0.elapsed().as_secs_f64() < seconds {
        let due = t0 + Duration::from_millis(100) * tick;
        if let Some(w) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        tick += 1;
        let done = c
            .execute(
                "UPDATE seats SET seats_taken = (seats_taken + 1) % 40, version = version + 1,
                   updated_at = clock_timestamp()
                 WHERE id IN (SELECT (random() * ($1::bigint - 1))::bigint FROM generate_series(1, $2::bigint))",
                &[&(rows as i64), &batch],
            )
            .unwrap_or(0);
        n += done;
    }
    n
}

/// The share of `prefix`'s sections whose state hash equals the database.
fn equal_share(pg: &Postgres, redis: &RedisServer, prefix: &str) -> f64 {
    let mut c = client(pg);
    let rows = c
        .query(
            "SELECT course, section, version FROM seats WHERE course LIKE $1",
            &[&format!("{prefix}%")],
        )
        .unwrap_or_default();
    let mut equal = 0usize;
    for r in &rows {
        let course: String = r.get(0);
        let section: i32 = r.get(1);
        let version: i64 = r.get(2);
        let f = redis.cli(&["HGET", &format!("seatstate:{course}"), &section.to_string()]);
        let held = serde_json::from_str::<Value>(&f)
            .ok()
            .and_then(|v| v["version"].as_i64());
        equal += usize::from(held == Some(version));
    }
    equal as f64 / rows.len().max(1) as f64
}

/// PostgreSQL with the seats table and its rows, and Redis: what every phase runs against.
struct Rig {
    redis: RedisServer,
    pg: Postgres,
    /// The reconciler's database URL.
    db: String,
    /// `--courses` × `--sections`.
    rows: u64,
}

impl Rig {
    /// Starts PostgreSQL (the table, its `updated_at` index, its rows) and Redis.
    fn start(o: &Opts) -> Rig {
        let sections = i64::from(o.sections.max(1));
        let rows = (o.courses as i64 * sections).max(1) as u64;
        let pg = Postgres::start();
        pg.psql(
            "CREATE TABLE seats (id bigint NOT NULL UNIQUE, course text NOT NULL, section int NOT NULL,
               total_seats int NOT NULL, seats_taken int NOT NULL, version bigint NOT NULL,
               updated_at timestamptz NOT NULL, PRIMARY KEY (course, section));
             CREATE INDEX seats_updated ON seats (updated_at);",
        );
        // Spread over the last hours, as a window's rows are: the newest a minute old.
        pg.psql(&format!(
            "INSERT INTO seats SELECT i, 'B' || (i / {sections}), (i % {sections})::int, 40, 0, 1,
               now() - interval '1 minute' - i * interval '50 ms' FROM generate_series(0, {rows} - 1) i;
             ANALYZE seats;"
        ));
        let redis = RedisServer::start();
        let db = pg.url("postgres", "x");
        Rig {
            redis,
            pg,
            db,
            rows,
        }
    }

    /// Starts a reconciler on this rig with `query`.
    fn reconciler(&self, query: &str) -> Rec {
        Rec::start(&self.db, query, &self.redis.uri())
    }
}

/// The first sweep's figures: its time, the reconciler's usage after it and
/// the same process's reading no rows.
struct FirstSweep {
    seconds: f64,
    after: Usage,
    idle: Usage,
}

/// A quiet database's figures: checks, Redis commands (the liveness
/// `PING`s apart, counted on their own) and rows read meanwhile.
struct Quiet {
    seconds: f64,
    checks: f64,
    redis_commands: f64,
    pings: f64,
    rows: f64,
}

/// A busy database's figures over its window (counts are the window's
/// differences), and the incremental query's plan.
struct Busy {
    changed: u64,
    secs: f64,
    cpu_pct: f64,
    rss_kib: u64,
    checks: f64,
    rows: f64,
    hgets: f64,
    cas: f64,
    db_ms: f64,
    plan: String,
}

/// The end of a window's figures: sections, publishes dropped, and the share
/// equal to the database with and without the reconciler.
struct Window {
    sections: usize,
    dropped: usize,
    with: f64,
    without: f64,
}

/// Runs the scenario.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("reconcile");
    let rig = Rig::start(o);
    let Some((rec, first)) = first_sweep(&rig) else {
        out.check(
            false,
            "the first sweep did not write every row within 600 s",
        );
        return out;
    };
    let quiet = quiet(&rig, &rec, o.seconds);
    let busy = busy(&rig, &rec, o);
    // Its query covers every row: gone before the window, whose other set it would repair.
    drop(rec);
    let window = end_of_window(&rig);
    report(&mut out, rig.rows, &first, &quiet, &busy, &window);
    out
}

/// The first sweep: Redis empty, every row written; the reconciler is kept
/// for the next phases. `None` if it did not write every row within 600 s.
fn first_sweep(rig: &Rig) -> Option<(Rec, FirstSweep)> {
    let t0 = Instant::now();
    let rec = rig.reconciler(QUERY);
    let first = wait_for(Duration::from_secs(600), || {
        (metric_value(
            &rec.m(),
            "seatboard_reconcile_repaired_total{reason=\"missing\"}",
        ) >= rig.rows as f64)
            .then(|| t0.elapsed())
    })?;
    let after = procs::usage(rec.child.id());
    let idle = idle_usage(rig);
    let figures = FirstSweep {
        seconds: first.as_secs_f64(),
        after,
        idle,
    };
    Some((rec, figures))
}

/// The same process reading no rows: what the sections cost is the difference.
fn idle_usage(rig: &Rig) -> Usage {
    let idle = rig.reconciler(&QUERY.replace("WHERE", "WHERE false AND"));
    let _ = wait_for(Duration::from_secs(30), || {
        (idle.checks() >= 2.0).then_some(())
    });
    procs::usage(idle.child.id())
}

/// Quiet: nothing changes for `seconds`.
fn quiet(rig: &Rig, rec: &Rec, seconds: f64) -> Quiet {
    let p0 = calls(&rig.redis, "ping");
    let (c0, k0, r0) = (
        total_commands(&rig.redis),
        rec.checks(),
        metric_value(&rec.m(), "seatboard_reconcile_rows_total"),
    );
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (c1, k1, r1) = (
        total_commands(&rig.redis),
        rec.checks(),
        metric_value(&rec.m(), "seatboard_reconcile_rows_total"),
    );
    let pings = calls(&rig.redis, "ping") - p0;
    Quiet {
        seconds,
        checks: k1 - k0,
        // The two INFO calls of this measurement are commands too; the
        // reconciler's liveness PINGs are no state reads.
        redis_commands: (c1 - c0 - 1.0 - pings).max(0.0),
        pings,
        rows: r1 - r0,
    }
}

/// Busy: `--rate` changes/s for `--seconds`, none published; then the
/// incremental query's plan.
fn busy(rig: &Rig, rec: &Rec, o: &Opts) -> Busy {
    let (redis, pid) = (&rig.redis, rec.child.id());
    let backend = backend_pid(&rig.pg);
    let (u0, b0) = (procs::usage(pid), procs::usage(backend));
    let (h0, e0, k0) = (
        calls(redis, "hget"),
        calls(redis, "evalsha") + calls(redis, "eval"),
        rec.checks(),
    );
    let r0 = metric_value(&rec.m(), "seatboard_reconcile_rows_total");
    let t = Instant::now();
    let changed = churn(&rig.pg, rig.rows, o.rate, o.seconds);
    let secs = t.elapsed().as_secs_f64();
    let (u1, b1) = (procs::usage(pid), procs::usage(backend));
    let (h1, e1, k1) = (
        calls(redis, "hget"),
        calls(redis, "evalsha") + calls(redis, "eval"),
        rec.checks(),
    );
    let r1 = metric_value(&rec.m(), "seatboard_reconcile_rows_total");
    let checks = (k1 - k0).max(1.0);
    let plan = rig.pg.psql("EXPLAIN SELECT course, section, total_seats, seats_taken, version, updated_at FROM seats WHERE updated_at >= now() - interval '12 seconds'");
    Busy {
        changed,
        secs,
        cpu_pct: (u1.cpu_us - u0.cpu_us) as f64 / 1e4 / secs,
        rss_kib: u1.rss_kib,
        checks,
        rows: r1 - r0,
        hgets: h1 - h0,
        cas: e1 - e0,
        db_ms: (b1.cpu_us.saturating_sub(b0.cpu_us)) as f64 / 1e3 / checks,
        plan,
    }
}

/// A snapshot of one section as the window published it, stamped now.
fn snapshot(course: &str, section: i32, taken: i32, version: i64) -> Snapshot {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Snapshot::build(
        course.into(),
        section as u32,
        40,
        taken as u32,
        None,
        Some(version as u64),
        Some(now_ms),
    )
}

/// The end of a window: one last change of every section, 1 % of the
/// publishes dropped; the reconciler covers the R courses only. 10 s later,
/// the share of each set equal to the database.
fn end_of_window(rig: &Rig) -> Window {
    let (pg, redis) = (&rig.pg, &rig.redis);
    let set = (rig.rows / 2).clamp(1, 2000) as i64;
    let mut c = client(pg);
    let _ = c.batch_execute(&format!(
        "INSERT INTO seats SELECT 1000000000 + i, CASE WHEN i < {set} THEN 'R' ELSE 'N' END || ((i % {set}) / 8), (i % 8)::int, 40, 0, 1,
           now() - interval '1 minute' FROM generate_series(0, 2 * {set} - 1) i"
    ));
    let rec = rig.reconciler(&QUERY.replace("WHERE", "WHERE course LIKE 'R%' AND"));
    let publisher = Publisher::start(PublisherConfig {
        redis: RedisFlags::new(&redis.uri()),
        channel_prefix: "seats:".into(),
        state_prefix: "seatstate:".into(),
        queue: 100_000,
        state_ttl: None,
    })
    .expect("publisher");
    // Every section published once, as the window had it.
    let all_rows = c
        .query(
            "SELECT course, section, seats_taken, version FROM seats WHERE id >= 1000000000",
            &[],
        )
        .unwrap_or_default();
    for r in &all_rows {
        publisher.publish(snapshot(r.get(0), r.get(1), r.get(2), r.get(3)));
    }
    let _ = wait_for(Duration::from_secs(30), || {
        (equal_share(pg, redis, "N") == 1.0 && equal_share(pg, redis, "R") == 1.0).then_some(())
    });
    let last = c
        .query(
            "UPDATE seats SET seats_taken = seats_taken + 1, version = version + 1, updated_at = clock_timestamp()
             WHERE id >= 1000000000 RETURNING course, section, seats_taken, version",
            &[],
        )
        .unwrap_or_default();
    let mut dropped = 0usize;
    for (i, r) in last.iter().enumerate() {
        if fastrand::u32(0..100) == 0 || (i == 0 && dropped == 0 && last.len() < 100) {
            dropped += 1;
            continue;
        }
        publisher.publish(snapshot(r.get(0), r.get(1), r.get(2), r.get(3)));
    }
    std::thread::sleep(Duration::from_secs(10));
    let (with, without) = (equal_share(pg, redis, "R"), equal_share(pg, redis, "N"));
    drop(rec);
    Window {
        sections: last.len(),
        dropped,
        with,
        without,
    }
}

/// The table rows, JSON and checks of every phase, in the order they ran.
fn report(out: &mut Outcome, rows: u64, f: &FirstSweep, q: &Quiet, b: &Busy, w: &Window) {
    let (after, base) = (f.after, f.idle);
    out.row(
        "first_sweep",
        format!(
            "{rows} rows written in {:.1} s (grace 2 s included), reconciler CPU {:.2} s",
            f.seconds,
            after.cpu_us as f64 / 1e6
        ),
        json!({"rows": rows, "seconds": f.seconds, "cpu_s": after.cpu_us as f64 / 1e6}),
    );
    let per_section =
        after.rss_anon_kib.saturating_sub(base.rss_anon_kib) as f64 * 1024.0 / rows as f64;
    out.row(
        "memory",
        format!(
            "RSS {:.1} MiB at {rows} sections, {:.1} MiB with none: {per_section:.0} bytes per section (anonymous memory)",
            after.rss_kib as f64 / 1024.0,
            base.rss_kib as f64 / 1024.0
        ),
        json!({"rss_kib": after.rss_kib, "rss_anon_kib": after.rss_anon_kib, "idle_rss_kib": base.rss_kib,
               "idle_rss_anon_kib": base.rss_anon_kib, "sections": rows, "bytes_per_section": per_section}),
    );
    let (quiet_checks, quiet_cmds, pings) = (q.checks, q.redis_commands, q.pings);
    out.row(
        "quiet",
        format!("{quiet_checks} checks in {:.0} s: {quiet_cmds} Redis commands besides {pings} PING, {:.0} rows read per check",
            q.seconds, q.rows / quiet_checks.max(1.0)),
        json!({"checks": quiet_checks, "redis_commands": quiet_cmds, "pings": pings, "rows_per_check": q.rows / quiet_checks.max(1.0)}),
    );
    out.check(quiet_cmds == 0.0, "a quiet database cost Redis commands");
    let (secs, cpu_pct, db_ms, checks) = (b.secs, b.cpu_pct, b.db_ms, b.checks);
    out.row(
        "busy",
        format!("{:.0} changes/s for {secs:.0} s: reconciler {cpu_pct:.1} % of a core, RSS {:.1} MiB; per check {:.0} rows, {:.0} HGET, {:.0} compare-and-set; database {db_ms:.1} ms CPU per check",
            b.changed as f64 / secs, b.rss_kib as f64 / 1024.0, b.rows / checks, b.hgets / checks, b.cas / checks),
        json!({"changes_per_s": b.changed as f64 / secs, "cpu_pct": cpu_pct, "rss_kib": b.rss_kib,
               "checks": checks, "rows_per_check": b.rows / checks, "hget_per_check": b.hgets / checks,
               "cas_per_check": b.cas / checks, "db_cpu_ms_per_check": db_ms}),
    );
    let indexed = b.plan.contains("seats_updated");
    out.row(
        "plan",
        b.plan.lines().next().unwrap_or("").trim().to_string(),
        json!({"uses_updated_at_index": indexed, "plan": b.plan}),
    );
    out.check(
        indexed,
        "the incremental query does not use the updated_at index",
    );
    out.row(
        "end_of_window",
        format!("{} sections, {dropped} last publishes dropped (1 %): 10 s later {:.2} % equal the database with the reconciler, {:.2} % without",
            w.sections, w.with * 100.0, w.without * 100.0, dropped = w.dropped),
        json!({"sections": w.sections, "dropped": w.dropped, "equal_with": w.with, "equal_without": w.without}),
    );
    out.check(
        w.with == 1.0,
        "with the reconciler, a section still differs from the database 10 s after",
    );
}
