//! `seatboard reconcile` (PROTOCOL section 11) against a real PostgreSQL and
//! a real MariaDB (each started by the test on a free port), a real
//! `redis-server` and running nodes with viewers: a lost publish heals
//! every board and a new viewer within its bound, sections never published
//! appear, a flushed state hash comes back with the sweep, a late publish
//! is not written twice, a section ahead is counted, left, then replaced
//! (a forged 2^53 leaves every board, a node cut off from Redis while the
//! replacement went out included, at its reread), a row dated a year ahead does not
//! hide later changes from the incremental checks, `--check` prints and writes nothing,
//! hostile rows are skipped and counted, a slow statement is cut off at its
//! timeout while an `UPDATE` never waits, a database down at start is
//! waited for, a database frozen with its connections open is `db:false`
//! (and `--check` exits 3) and healed after, one connection at most under a SELECT-only role, one
//! `reconciler checking` line once the database and Redis have been read
//! (none before, never a second, no warning at a clean start), Redis lost
//! while the database is quiet shows on `/healthz` within 10 s, a query
//! with a second bind parameter or statement exits 2, a query whose result
//! lacks a required column is a database error (`--check` exits 3 naming
//! it, `db:false`), every section found ahead is logged once by name, and
//! SIGTERM cancels the statement on the server and exits 0 within 2 s.

use crate::common::*;
use crate::redis_util::cut::CutProxy;
use crate::redis_util::{client, read_until, serve, serve_on, watch};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use testkit::proc::{Mariadb, Postgres};

const TICK_MS: u64 = 50;
const INTERVAL_MS: u64 = 200;
const GRACE_MS: u64 = 600;

/// The table, an index on `updated_at`, and a role that may only SELECT it.
const PG_SCHEMA: &str = "
CREATE TABLE seats (course text NOT NULL, section int NOT NULL, total_seats int NOT NULL,
  seats_taken int NOT NULL, version bigint, seat_info jsonb,
  updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (course, section));
CREATE INDEX seats_updated ON seats (updated_at);
CREATE ROLE reader LOGIN PASSWORD 'S3cretPw';
GRANT SELECT ON seats TO reader;";

const PG_QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats WHERE updated_at >= $1";

/// A `seatboard reconcile` process with its `/metrics` port, killed on drop.
struct Reconciler {
    child: Child,
    metrics: u16,
}

impl Reconciler {
    fn start(db: &str, query: &str, redis: &str, extra: &[&str]) -> Reconciler {
        let level = std::env::var("RECONCILE_TEST_LOG").unwrap_or_else(|_| "warn".into());
        Reconciler::spawn(db, query, redis, extra, &level, Stdio::inherit())
    }

    /// Started at `--log-level info`, its stderr lines sent to the receiver
    /// as they come.
    fn start_logged(
        db: &str,
        query: &str,
        redis: &str,
    ) -> (Reconciler, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead, BufReader};
        let mut r = Reconciler::spawn(db, query, redis, &[], "info", Stdio::piped());
        let err = r.child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        (r, rx)
    }

    fn spawn(
        db: &str,
        query: &str,
        redis: &str,
        extra: &[&str],
        level: &str,
        stderr: Stdio,
    ) -> Reconciler {
        let metrics = free_port();
        let mut args: Vec<String> = vec![
            "reconcile".into(),
            "--redis".into(),
            redis.into(),
            "--query".into(),
            query.into(),
            "--metrics".into(),
            format!("127.0.0.1:{metrics}"),
            "--log-level".into(),
            level.into(),
        ];
        for (flag, v) in [
            ("--interval-ms", INTERVAL_MS.to_string()),
            ("--grace-ms", GRACE_MS.to_string()),
            ("--sweep-s", "60".into()),
            ("--ahead-repair-s", "60".into()),
            ("--overlap-ms", "2000".into()),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag.to_owned(), v]);
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = seatboard_command()
            .args(&args)
            .env("SEATBOARD_RECONCILE_DB", db)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn seatboard reconcile");
        let r = Reconciler { child, metrics };
        wait_for(Duration::from_secs(15), || {
            testkit::scrape::get_ok(metrics, "/healthz", Duration::from_secs(2))
        })
        .expect("reconcile /healthz");
        r
    }

    fn metric(&self, name: &str) -> f64 {
        metric_value(&testkit::scrape::metrics(self.metrics), name)
    }

    /// Waits until `name` reads `want` (a repair is counted just after it is written).
    fn wait_metric(&self, name: &str, want: f64) {
        let got = wait_for(Duration::from_secs(5), || {
            let v = self.metric(name);
            (v == want).then_some(v)
        });
        assert_eq!(got, Some(want), "{name}: {}", self.metric(name));
    }

    fn healthz(&self) -> Value {
        testkit::scrape::get_ok(self.metrics, "/healthz", Duration::from_secs(2))
            .and_then(|b| serde_json::from_str(&b).ok())
            .unwrap_or(Value::Null)
    }

    /// Waits for one more complete check after now.
    fn next_checks(&self, n: f64) {
        let c = |r: &Reconciler| {
            r.metric("seatboard_reconcile_checks_total{kind=\"incremental\"}")
                + r.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}")
        };
        let start = c(self);
        wait_for(Duration::from_secs(20), || {
            (c(self) >= start + n).then_some(())
        })
        .expect("the reconciler checks");
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `seatboard reconcile --check` of `db` against `redis` with `query`.
pub(crate) fn check_command(redis: &RedisServer, query: &str, db: &str) -> std::process::Command {
    let mut cmd = seatboard_command();
    cmd.args([
        "reconcile",
        "--check",
        "--redis",
        &redis.uri(),
        "--query",
        query,
    ])
    .env("SEATBOARD_RECONCILE_DB", db);
    cmd
}

/// [`check_command`] run to its end.
fn check_once(redis: &RedisServer, query: &str, db: &str) -> std::process::Output {
    check_command(redis, query, db)
        .output()
        .expect("reconcile --check")
}

/// `rejected_total` for schema, json and too_large, from one scrape.
fn rejected(rec: &Reconciler) -> (f64, f64, f64) {
    let m = testkit::scrape::metrics(rec.metrics);
    let v = |r: &str| {
        metric_value(
            &m,
            &format!("seatboard_reconcile_rejected_total{{reason=\"{r}\"}}"),
        )
    };
    (v("schema"), v("json"), v("too_large"))
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn pg() -> Postgres {
    let pg = Postgres::start();
    pg.psql(PG_SCHEMA);
    pg
}

fn pg_row(pg: &Postgres, course: &str, section: u32, taken: u32, version: u64) {
    pg.psql(&format!(
        "INSERT INTO seats VALUES ('{course}', {section}, 40, {taken}, {version}, '{{\"room\":\"B12\"}}', clock_timestamp())
         ON CONFLICT (course, section) DO UPDATE SET seats_taken = EXCLUDED.seats_taken,
         version = EXCLUDED.version, updated_at = clock_timestamp()"
    ));
}

fn publish_v(redis: &RedisServer, course: &str, section: u32, taken: u32, version: u64) {
    let st = seatboard_command()
        .args(["publish", "--redis", &redis.uri(), "--course", course])
        .args(["--section", &section.to_string(), "--total", "40"])
        .args([
            "--taken",
            &taken.to_string(),
            "--version",
            &version.to_string(),
        ])
        .args(["--seat-info", r#"{"room":"B12"}"#])
        .stdout(Stdio::null())
        .status()
        .expect("seatboard publish");
    assert!(st.success());
}

/// The field's version in the state hash (None: no field).
fn hash_version(redis: &RedisServer, course: &str, section: u32) -> Option<u64> {
    let f = redis.cli(&["HGET", &format!("seatstate:{course}"), &section.to_string()]);
    serde_json::from_str::<Value>(&f).ok()?["version"].as_u64()
}

/// Reads frames into `board` until `pred` holds for it; the time it took.
fn board_until(
    ws: &mut Ws,
    board: &mut Board,
    within: Duration,
    pred: impl Fn(&Board) -> bool,
) -> Option<Duration> {
    let t = Instant::now();
    if pred(board) {
        return Some(Duration::ZERO);
    }
    read_until(ws, within, |m| {
        if m["type"] == "frame" {
            board.apply(m);
        }
        pred(board)
    })
    .map(|_| t.elapsed())
}

fn taken(board: &Board, section: u64) -> u64 {
    board
        .0
        .get(&section)
        .and_then(|s| s["seats_taken"].as_u64())
        .unwrap_or(u64::MAX)
}

/// Sessions the reconciler holds on the server now.
fn pg_sessions(pg: &Postgres) -> usize {
    pg.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'seatboard-reconcile'")
        .parse()
        .unwrap_or(usize::MAX)
}

#[test]
fn a_lost_publish_heals_every_board_and_a_new_viewer_within_its_bound() {
    let pg = pg();
    let redis = RedisServer::start();
    // Section 0 is published; section 1 never was; section 2 is published late.
    pg_row(&pg, "RC1", 0, 10, 1);
    pg_row(&pg, "RC1", 1, 20, 1);
    pg_row(&pg, "RC1", 2, 30, 1);
    publish_v(&redis, "RC1", 0, 10, 1);
    publish_v(&redis, "RC1", 2, 30, 1);
    let node = serve(&redis, &["--tick-ms", &TICK_MS.to_string()]);
    let mut ws = client(&node, "user=a");
    let mut board = Board::default();
    board.apply(&watch(&mut ws, "RC1"));
    assert!(
        !board.0.contains_key(&1),
        "never published: not on the board yet"
    );
    let rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        PG_QUERY,
        &redis.uri(),
        &["--sweep-s", "3"],
    );
    // The section never published appears (the first check is a sweep).
    board_until(&mut ws, &mut board, Duration::from_secs(10), |b| {
        taken(b, 1) == 20
    })
    .expect("the section never published appears");
    rec.wait_metric(
        "seatboard_reconcile_repaired_total{reason=\"missing\"}",
        1.0,
    );

    // A change committed and its publish lost.
    pg_row(&pg, "RC1", 0, 40, 2);
    let bound = Duration::from_millis(GRACE_MS + 2 * INTERVAL_MS + TICK_MS);
    let took = board_until(&mut ws, &mut board, Duration::from_secs(10), |b| {
        taken(b, 0) == 40
    })
    .expect("the lost publish is repaired on the board");
    // Margin for a loaded machine: the bound plus a second.
    assert!(
        took <= bound + Duration::from_secs(1),
        "{took:?} over {bound:?}"
    );
    rec.wait_metric("seatboard_reconcile_repaired_total{reason=\"behind\"}", 1.0);
    let mut fresh = client(&node, "user=b");
    let f = watch(&mut fresh, "RC1");
    let mut b2 = Board::default();
    b2.apply(&f);
    assert_eq!(
        (taken(&b2, 0), taken(&b2, 1), taken(&b2, 2)),
        (40, 20, 30),
        "a new viewer"
    );

    // A publish that is only late (inside the grace) is not written twice.
    pg_row(&pg, "RC1", 2, 31, 2);
    publish_v(&redis, "RC1", 2, 31, 2);
    rec.next_checks(4.0);
    assert_eq!(
        rec.metric("seatboard_reconcile_repaired_total{reason=\"behind\"}"),
        1.0
    );
    assert_eq!(
        rec.metric("seatboard_reconcile_repaired_total{reason=\"missing\"}"),
        1.0
    );

    // A flushed state hash comes back with the sweep (every 3 s here).
    redis.cli(&["DEL", "seatstate:RC1"]);
    wait_for(Duration::from_secs(3 + 1 + 5), || {
        (hash_version(&redis, "RC1", 0) == Some(2) && hash_version(&redis, "RC1", 2) == Some(2))
            .then_some(())
    })
    .expect("the sweep restores the flushed hash");
    assert!(rec.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}") >= 2.0);
    // One session at most, all along, under the SELECT-only role.
    assert_eq!(pg_sessions(&pg), 1);
    let role = pg.psql(
        "SELECT usename FROM pg_stat_activity WHERE application_name = 'seatboard-reconcile'",
    );
    assert_eq!(role, "reader");
    assert_eq!(rec.healthz()["status"], "ok");
}

/// A row whose `updated_at` is far in the future (a typo, a test row) is
/// checked, but does not become the incremental checks' lower bound: a lost
/// publish elsewhere is still repaired within its bound, not at the next
/// sweep (300 s here).
#[test]
fn a_row_dated_in_the_future_does_not_hide_later_changes() {
    let pg = pg();
    let redis = RedisServer::start();
    pg.psql(
        "INSERT INTO seats VALUES ('RCF', 0, 40, 1, 1, NULL, clock_timestamp() + interval '1 year')",
    );
    pg_row(&pg, "RCN", 0, 10, 1);
    publish_v(&redis, "RCN", 0, 10, 1);
    let rec = Reconciler::start(&pg.url("reader", "S3cretPw"), PG_QUERY, &redis.uri(), &[]);
    // The first check (a sweep) writes the future row, never published.
    wait_for(Duration::from_secs(10), || {
        (hash_version(&redis, "RCF", 0) == Some(1)).then_some(())
    })
    .expect("the future row is checked and written");
    rec.next_checks(2.0);
    // A change committed and its publish lost.
    let t = Instant::now();
    pg_row(&pg, "RCN", 0, 11, 2);
    let bound = Duration::from_millis(GRACE_MS + 2 * INTERVAL_MS + TICK_MS);
    wait_for(bound + Duration::from_secs(5), || {
        (hash_version(&redis, "RCN", 0) == Some(2)).then_some(())
    })
    .expect("the lost publish is repaired by an incremental check");
    assert!(
        t.elapsed() <= bound + Duration::from_secs(1),
        "{:?} over {bound:?}",
        t.elapsed()
    );
    assert_eq!(
        rec.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}"),
        1.0,
        "repaired by an incremental check, not a sweep"
    );
}

/// Section 0 of `course` forged at 2^53 (39 taken) in Redis while the
/// database holds 12 taken at version 5; a viewer on `node` (started by
/// `node`) shows the forged board.
fn forged_board(
    pg: &Postgres,
    redis: &RedisServer,
    course: &str,
    node: impl FnOnce() -> Seatboard,
) -> (Seatboard, Ws, Board) {
    pg_row(pg, course, 0, 12, 5);
    publish_v(redis, course, 0, 39, 1 << 53);
    let node = node();
    let mut ws = client(&node, "user=a");
    let mut board = Board::default();
    board.apply(&watch(&mut ws, course));
    assert_eq!(taken(&board, 0), 39, "the forged snapshot is on the board");
    (node, ws, board)
}

/// A new viewer of `course` on `node` sees `taken` at `version`.
fn fresh_viewer_sees(node: &Seatboard, course: &str, taken_version: (u64, u64)) {
    let mut fresh = client(node, "user=b");
    let mut b = Board::default();
    b.apply(&watch(&mut fresh, course));
    assert_eq!((taken(&b, 0), b.version(0)), taken_version);
}

/// The next real version of `course` (13 taken, version 6) passes the
/// script and reaches `board`.
fn next_real_version_passes(
    pg: &Postgres,
    redis: &RedisServer,
    course: &str,
    ws: &mut Ws,
    board: &mut Board,
) {
    pg_row(pg, course, 0, 13, 6);
    publish_v(redis, course, 0, 13, 6);
    board_until(ws, board, Duration::from_secs(5), |b| taken(b, 0) == 13)
        .expect("the next real version is taken");
    assert_eq!(hash_version(redis, course, 0), Some(6));
}

#[test]
fn ahead_is_counted_left_then_replaced_and_a_forged_2_pow_53_leaves_every_board() {
    let pg = pg();
    let redis = RedisServer::start();
    let (node, mut ws, mut board) = forged_board(&pg, &redis, "RC2", || {
        serve(&redis, &["--tick-ms", &TICK_MS.to_string()])
    });
    let started = Instant::now();
    let rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        PG_QUERY,
        &redis.uri(),
        &["--ahead-repair-s", "3"],
    );
    wait_for(Duration::from_secs(10), || {
        (rec.metric("seatboard_reconcile_ahead_total") == 1.0).then_some(())
    })
    .expect("ahead counted");
    // Left while it may be a replica's lag.
    if started.elapsed() < Duration::from_secs(2) {
        assert_eq!(hash_version(&redis, "RC2", 0), Some(1 << 53));
    }
    let took = board_until(&mut ws, &mut board, Duration::from_secs(15), |b| {
        taken(b, 0) == 12
    })
    .expect("the database's state replaces the forged one");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "not before --ahead-repair-s"
    );
    let _ = took;
    assert_eq!(board.version(0), 5);
    assert_eq!(hash_version(&redis, "RC2", 0), Some(5));
    rec.wait_metric("seatboard_reconcile_repaired_total{reason=\"ahead\"}", 1.0);
    assert_eq!(rec.metric("seatboard_reconcile_ahead_total"), 1.0);
    // The next real version passes, on the board and for a new viewer.
    next_real_version_passes(&pg, &redis, "RC2", &mut ws, &mut board);
    fresh_viewer_sees(&node, "RC2", (13, 6));
    // The relay refuses a replace: only the reconciler sends one.
}

#[test]
fn a_node_cut_off_from_redis_during_an_ahead_repair_takes_it_when_it_reads_again() {
    let pg = pg();
    let redis = RedisServer::start();
    let link = CutProxy::start(redis.port);
    let (node, mut ws, mut board) = forged_board(&pg, &redis, "RC9", || {
        serve_on(&link.uri(), &["--tick-ms", &TICK_MS.to_string()])
    });
    // The node's link to Redis goes down, and stays down while the repair
    // is written and published: the node never sees the `replace`.
    link.hold(true);
    assert!(link.cut() > 0, "the node held connections through the link");
    wait_for(Duration::from_secs(10), || {
        (node.metric("seatboard_redis_connected") == 0.0).then_some(())
    })
    .expect("the node sees its link down");
    let rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        PG_QUERY,
        &redis.uri(),
        &["--ahead-repair-s", "1"],
    );
    wait_for(Duration::from_secs(15), || {
        (rec.metric("seatboard_reconcile_repaired_total{reason=\"ahead\"}") == 1.0).then_some(())
    })
    .expect("the section replaced");
    // The field holds what was published, flag and all.
    let field: Value =
        serde_json::from_str(&redis.cli(&["HGET", "seatstate:RC9", "0"])).expect("field JSON");
    assert_eq!(
        (&field["version"], &field["seats_taken"], &field["replace"]),
        (&Value::from(5), &Value::from(12), &Value::Bool(true)),
        "{field}"
    );
    // The link comes back: the node reads the hash again and takes the repair.
    link.hold(false);
    board_until(&mut ws, &mut board, Duration::from_secs(15), |b| {
        taken(b, 0) == 12
    })
    .expect("the repair reaches the board after the reread");
    assert_eq!(board.version(0), 5);
    fresh_viewer_sees(&node, "RC9", (12, 5));
    next_real_version_passes(&pg, &redis, "RC9", &mut ws, &mut board);
}

#[test]
fn a_full_check_reads_rows_dated_before_the_year_1000_and_minus_infinity() {
    let pg = pg();
    let redis = RedisServer::start();
    pg.psql(
        "INSERT INTO seats (course, section, total_seats, seats_taken, version, updated_at) VALUES
         ('RC11', 0, 40, 1, 1, '-infinity'), ('RC11', 1, 40, 1, 1, '0500-01-01'),
         ('RC11', 2, 40, 1, 1, '0100-01-01 BC'), ('RC11', 3, 40, 1, 1, now())",
    );
    let out = check_once(&redis, PG_QUERY, &pg.url("reader", "S3cretPw"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let sections: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["section"].as_u64())
        .collect();
    assert_eq!(sections, [0, 1, 2, 3]);
}

#[test]
fn check_prints_each_difference_and_writes_nothing() {
    let pg = pg();
    let mut redis = RedisServer::start();
    pg_row(&pg, "RC3", 0, 1, 3); // agrees
    pg_row(&pg, "RC3", 1, 1, 3); // missing
    pg_row(&pg, "RC3", 2, 1, 3); // behind
    pg_row(&pg, "RC3", 3, 1, 3); // ahead
    pg_row(&pg, "RC3", 4, 1, 3); // ahead past a double's range
    publish_v(&redis, "RC3", 0, 1, 3);
    publish_v(&redis, "RC3", 2, 1, 2);
    publish_v(&redis, "RC3", 3, 1, 9);
    redis.cli(&[
        "HSET",
        "seatstate:RC3",
        "4",
        r#"{"course":"RC3","section":4,"total_seats":40,"seats_taken":1,"version":1e309}"#,
    ]);
    let run = |db: &str| check_once(&redis, PG_QUERY, db);
    let before = redis.cli(&["HGETALL", "seatstate:RC3"]);
    let out = run(&pg.url("reader", "S3cretPw"));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"course":"RC3","section":1,"db_version":3,"redis_version":null,"state":"missing"}),
            serde_json::json!({"course":"RC3","section":2,"db_version":3,"redis_version":2,"state":"behind"}),
            serde_json::json!({"course":"RC3","section":3,"db_version":3,"redis_version":9,"state":"ahead"}),
            serde_json::json!({"course":"RC3","section":4,"db_version":3,"redis_version":1e38,"state":"ahead"}),
        ]
    );
    assert_eq!(
        redis.cli(&["HGETALL", "seatstate:RC3"]),
        before,
        "nothing written"
    );
    // Agreeing: exit 0, nothing printed.
    pg.psql("DELETE FROM seats WHERE section <> 0");
    let out = run(&pg.url("reader", "S3cretPw"));
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    // A database that cannot be read: exit 3, the password never shown.
    let out = run(&format!(
        "postgres://reader:S3cretPw@127.0.0.1:{}/postgres?sslmode=disable",
        free_port()
    ));
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("S3cretPw"), "{err}");
    // A bad flag names it.
    let out = seatboard_command()
        .args(["reconcile", "--check", "--query", "SELECT * FROM seats"])
        .env("SEATBOARD_RECONCILE_DB", pg.url("reader", "S3cretPw"))
        .output()
        .expect("reconcile");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'--query'"));
    let out = seatboard_command()
        .args([
            "reconcile",
            "--check",
            "--query",
            PG_QUERY,
            "--db",
            "sqlite://u:S3cretPw@h/x",
        ])
        .output()
        .expect("reconcile");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().next().unwrap_or("").contains("'--db'") && !err.contains("S3cretPw"),
        "{err}"
    );
    // No rows agree with a Redis that answers, and with none that does not.
    pg.psql("DELETE FROM seats");
    let db = pg.url("reader", "S3cretPw");
    assert_eq!(check_once(&redis, PG_QUERY, &db).status.code(), Some(0));
    redis.kill();
    let out = check_once(&redis, PG_QUERY, &db);
    assert_eq!(
        out.status.code(),
        Some(3),
        "an empty table against a Redis that is down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_state_key_that_is_no_hash_is_skipped_and_the_other_sections_are_repaired() {
    let pg = pg();
    let redis = RedisServer::start();
    pg_row(&pg, "RCW1", 1, 20, 3); // missing in Redis: repaired
    pg_row(&pg, "RCWS", 1, 5, 3); // its state key is a string
    redis.cli(&["SET", "seatstate:RCWS", "x"]);
    let rec = Reconciler::start(&pg.url("reader", "S3cretPw"), PG_QUERY, &redis.uri(), &[]);
    let healed = wait_for(Duration::from_secs(10), || hash_version(&redis, "RCW1", 1));
    assert_eq!(healed, Some(3), "the section beside it is repaired");
    assert!(rec.metric("seatboard_reconcile_errors_total{kind=\"redis\"}") >= 1.0);
    assert_eq!(redis.cli(&["GET", "seatstate:RCWS"]), "x", "left alone");
    // One full check cannot say they agree: exit 3, naming the course.
    let out = check_once(&redis, PG_QUERY, &pg.url("reader", "S3cretPw"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("RCWS"), "{err}");
}

#[test]
fn check_reads_integers_held_as_numeric_or_text() {
    let pg = pg();
    let redis = RedisServer::start();
    pg_row(&pg, "RCN", 0, 1, 3); // agrees
    pg_row(&pg, "RCN", 1, 2, 3); // missing
    pg_row(&pg, "RCN", 2, 3, 3); // behind
    publish_v(&redis, "RCN", 0, 1, 3);
    publish_v(&redis, "RCN", 2, 3, 2);
    let expected = [
        r#"{"course":"RCN","section":1,"db_version":3,"redis_version":null,"state":"missing"}"#,
        r#"{"course":"RCN","section":2,"db_version":3,"redis_version":2,"state":"behind"}"#,
    ]
    .map(|l| serde_json::from_str::<Value>(l).expect("json"));
    let url = pg.url("reader", "S3cretPw");
    for cols in [
        "section, total_seats, seats_taken, version::numeric AS version",
        "section::numeric(20,0) AS section, total_seats::numeric AS total_seats, seats_taken::numeric(10,2) AS seats_taken, version::numeric(20,0) AS version",
        "section::text AS section, total_seats::varchar AS total_seats, seats_taken::char(6) AS seats_taken, version::text AS version",
    ] {
        let query = format!(
            "SELECT course, {cols}, seat_info, updated_at FROM seats WHERE updated_at >= $1"
        );
        let out = check_once(&redis, &query, &url);
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(
            (out.status.code(), lines.as_slice()),
            (Some(1), &expected[..]),
            "{cols}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A version with a fraction is no integer: every row skipped, nothing to
    // compare (exit 0, nothing printed), as for any row that breaks the rules.
    let frac = "SELECT course, section, total_seats, seats_taken, version + 0.5 AS version, seat_info, updated_at FROM seats WHERE updated_at >= $1";
    let out = check_once(&redis, frac, &url);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// `/healthz` and the gauges once the reconciler sees Redis up and the
/// database not: `db:false`, `degraded`, `db_up` 0 and `redis_up` 1.
fn db_down_redis_up(rec: &Reconciler) {
    let h = wait_for(Duration::from_secs(5), || {
        let h = rec.healthz();
        (h["redis"] == true).then_some(h)
    })
    .unwrap_or_else(|| panic!("Redis is up: {}", rec.healthz()));
    assert_eq!(
        (&h["db"], &h["status"]),
        (&Value::Bool(false), &Value::from("degraded")),
        "{h}"
    );
    let up = |gauge: &str| rec.metric(&format!("seatboard_reconcile_{gauge}_up"));
    assert_eq!((up("db"), up("redis")), (0.0, 1.0));
}

#[test]
fn a_slow_or_down_database_is_db_false_while_redis_up_says_what_redis_does() {
    let mut pg = pg();
    let mut redis = RedisServer::start();
    pg_row(&pg, "RC6", 0, 1, 1);
    let url = pg.url("reader", "S3cretPw");
    let up = |rec: &Reconciler, gauge: &str| rec.metric(&format!("seatboard_reconcile_{gauge}_up"));

    // Slow: every statement cut off at the timeout.
    let slow = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats, pg_sleep(1) WHERE updated_at >= $1";
    let rec = Reconciler::start(&url, slow, &redis.uri(), &["--statement-timeout-ms", "300"]);
    wait_for(Duration::from_secs(15), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"timeout\"}") >= 1.0).then_some(())
    })
    .expect("the statement is cut off at its timeout");
    db_down_redis_up(&rec);
    assert_eq!(
        rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}"),
        0.0
    );
    assert_eq!(
        rec.metric("seatboard_reconcile_errors_total{kind=\"redis\"}"),
        0.0
    );
    drop(rec);

    // Down at start: Redis, never read by a check, is still seen up; and
    // seen down once it is.
    pg.stop();
    let rec = Reconciler::start(&url, PG_QUERY, &redis.uri(), &[]);
    wait_for(Duration::from_secs(10), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0).then_some(())
    })
    .expect("the database down is counted");
    db_down_redis_up(&rec);
    redis.kill();
    wait_for(Duration::from_secs(40), || {
        (rec.healthz()["redis"] == false).then_some(())
    })
    .expect("Redis down is seen while the database is down too");
    assert_eq!(up(&rec, "redis"), 0.0);
}

#[test]
fn a_database_that_stops_answering_is_db_false_check_exits_3_and_it_heals_after() {
    let pg = pg();
    let redis = RedisServer::start();
    pg_row(&pg, "RC10", 0, 1, 1);
    let url = pg.url("reader", "S3cretPw");
    let rec = Reconciler::start(
        &url,
        PG_QUERY,
        &redis.uri(),
        &["--statement-timeout-ms", "500"],
    );
    wait_for(Duration::from_secs(15), || {
        (hash_version(&redis, "RC10", 0) == Some(1)).then_some(())
    })
    .expect("the row written");
    // The whole server stops answering, its connections left open.
    let frozen = pg.freeze();
    wait_for(Duration::from_secs(30), || {
        (rec.healthz()["db"] == false).then_some(())
    })
    .unwrap_or_else(|| panic!("a frozen database is seen: {}", rec.healthz()));
    db_down_redis_up(&rec);
    assert!(rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0);
    // `--check` cannot read it: exit 3, not a wait for ever.
    let mut check = check_command(&redis, PG_QUERY, &url)
        .args(["--statement-timeout-ms", "500"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn reconcile --check");
    let status = wait_for(Duration::from_secs(30), || check.try_wait().ok().flatten());
    if status.is_none() {
        let _ = check.kill();
    }
    let out = check.wait_with_output().expect("check output");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Thawed: up again, and a change made meanwhile is repaired.
    drop(frozen);
    pg_row(&pg, "RC10", 0, 2, 2);
    wait_for(Duration::from_secs(40), || {
        (hash_version(&redis, "RC10", 0) == Some(2)).then_some(())
    })
    .unwrap_or_else(|| panic!("healed after the thaw: {}", rec.healthz()));
    assert_eq!(rec.healthz()["db"], true);
}

#[test]
fn hostile_rows_are_skipped_and_counted_and_a_slow_statement_is_cut_off() {
    let pg = pg();
    let redis = RedisServer::start();
    pg.psql(
        "CREATE TABLE raw (course text, section bigint, total_seats bigint, seats_taken bigint,
           version numeric, seat_info text, updated_at timestamptz DEFAULT clock_timestamp());
         GRANT SELECT ON raw TO reader;",
    );
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(70 * 1024));
    pg.psql(&format!(
        "INSERT INTO raw (course, section, total_seats, seats_taken, version, seat_info) VALUES
         ('GOOD', 1, 40, 3, 1, '{{\"room\":\"B\"}}'),
         ('GOOD', 2, 40, 4, 9007199254740992, NULL),
         ('BAD CODE', 1, 40, 3, 1, NULL),
         ('NEG', 1, 40, -3, 1, NULL),
         ('ARR', 1, 40, 3, 1, '[1,2]'),
         ('NULLV', 1, 40, 3, NULL, NULL),
         ('BIGV', 1, 40, 3, 9007199254740993, NULL),
         ('HUGE', 1, 40, 3, 1, '{big}'),
         ('NOTJSON', 1, 40, 3, 1, '{{nope')"
    ));
    let query = "SELECT course, section, total_seats, seats_taken, version::bigint AS version, seat_info, updated_at FROM raw WHERE updated_at >= $1";
    let rec = Reconciler::start(&pg.url("reader", "S3cretPw"), query, &redis.uri(), &[]);
    wait_for(Duration::from_secs(10), || {
        (hash_version(&redis, "GOOD", 1) == Some(1)
            && hash_version(&redis, "GOOD", 2) == Some(1 << 53))
        .then_some(())
    })
    .expect("the good rows are written");
    // Every read of the rows counts them again: 5 schema, 1 json, 1 too_large a read.
    let (schema, json, large) = rejected(&rec);
    assert!(
        json >= 1.0 && schema == 5.0 * json && large == json,
        "{schema} {json} {large}"
    );
    assert_eq!(
        redis.cli(&["EXISTS", "seatstate:NEG", "seatstate:ARR", "seatstate:HUGE"]),
        "0"
    );
    drop(rec);

    // A slow statement is cut off by the server at the timeout, counted,
    // and an UPDATE of the table meanwhile never waits.
    let slow = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats, pg_sleep(1) WHERE updated_at >= $1";
    pg_row(&pg, "RC4", 0, 1, 1);
    let rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        slow,
        &redis.uri(),
        &["--statement-timeout-ms", "300"],
    );
    wait_for(Duration::from_secs(15), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"timeout\"}") >= 2.0).then_some(())
    })
    .expect("the statement is cancelled at its timeout, counted");
    let t = Instant::now();
    pg_row(&pg, "RC4", 0, 2, 2);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the UPDATE waited {:?}",
        t.elapsed()
    );
    assert_eq!(
        rec.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}"),
        0.0
    );
    assert!(pg_sessions(&pg) <= 1);
}

#[test]
fn a_database_down_at_start_is_waited_for_and_sigterm_cancels_the_statement() {
    let mut pg = pg();
    let redis = RedisServer::start();
    pg_row(&pg, "RC5", 0, 7, 1);
    pg.stop();
    let slowq = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats, pg_sleep(CASE WHEN (SELECT count(*) FROM seats) > 1 THEN 30 ELSE 0 END) WHERE updated_at >= $1";
    let mut rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        slowq,
        &redis.uri(),
        &["--statement-timeout-ms", "60000"],
    );
    wait_for(Duration::from_secs(5), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0).then_some(())
    })
    .expect("the database down is counted");
    assert_eq!(rec.healthz()["db"], false);
    assert_eq!(rec.healthz()["status"], "degraded");
    pg.restart();
    wait_for(Duration::from_secs(20), || {
        (hash_version(&redis, "RC5", 0) == Some(1)).then_some(())
    })
    .expect("once the database is back, the section is written");
    assert_eq!(rec.healthz()["db"], true);
    // A statement that runs long: SIGTERM cancels it on the server.
    pg_row(&pg, "RC5", 1, 7, 1);
    wait_for(Duration::from_secs(10), || {
        let n: usize = pg
            .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'seatboard-reconcile' AND state = 'active'")
            .parse()
            .unwrap_or(0);
        (n == 1).then_some(())
    })
    .expect("the slow statement runs");
    let t = Instant::now();
    signal(&rec.child, libc::SIGTERM);
    let st = wait_for(Duration::from_secs(5), || {
        rec.child.try_wait().ok().flatten()
    })
    .expect("exits after SIGTERM");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "exit took {:?}",
        t.elapsed()
    );
    assert_eq!(st.code(), Some(0));
    wait_for(Duration::from_secs(2), || {
        let q = pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(CASE%' AND state = 'active' AND pid <> pg_backend_pid()");
        (q == "0").then_some(())
    })
    .expect("the statement is gone on the server");
}

/// How many of `log`'s lines contain `text`.
fn count(log: &[String], text: &str) -> usize {
    log.iter().filter(|l| l.contains(text)).count()
}

/// Lines at WARN or ERROR.
fn warnings(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect()
}

#[test]
fn one_checking_line_once_the_database_and_redis_are_read_and_no_warning_at_a_clean_start() {
    const CHECKING: &str = "reconciler checking";
    let mut pg = pg();
    let redis = RedisServer::start();
    pg_row(&pg, "RC8", 0, 7, 1);
    let url = pg.url("reader", "S3cretPw");
    let checks = |r: &Reconciler| {
        r.metric("seatboard_reconcile_checks_total{kind=\"incremental\"}")
            + r.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}")
    };

    // A clean start: the line once the first check has read both, no warning.
    let (rec, rx) = Reconciler::start_logged(&url, PG_QUERY, &redis.uri());
    let mut log = Vec::new();
    wait_for(Duration::from_secs(10), || {
        log.extend(rx.try_iter());
        (count(&log, CHECKING) > 0).then_some(())
    })
    .unwrap_or_else(|| panic!("no `{CHECKING}` line: {log:#?}"));
    assert!(checks(&rec) >= 1.0, "logged before a check completed");
    // Later checks (and the repair of the section) add no second line.
    rec.next_checks(3.0);
    wait_for(Duration::from_secs(10), || {
        (hash_version(&redis, "RC8", 0) == Some(1)).then_some(())
    })
    .expect("the section is written");
    log.extend(rx.try_iter());
    assert_eq!(count(&log, CHECKING), 1, "{log:#?}");
    let line = log.iter().find(|l| l.contains(CHECKING)).expect("line");
    assert!(line.contains("INFO"), "{line}");
    assert!(warnings(&log).is_empty(), "a clean start warned: {log:#?}");

    // The database lost and back: a warning, then "answer again", and still
    // one checking line.
    pg.stop();
    wait_for(Duration::from_secs(10), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0).then_some(())
    })
    .expect("the database down is counted");
    pg.restart();
    wait_for(Duration::from_secs(40), || {
        log.extend(rx.try_iter());
        (count(&log, "database and Redis answer again") > 0).then_some(())
    })
    .unwrap_or_else(|| panic!("no recovery line: {log:#?}"));
    assert_eq!(count(&log, CHECKING), 1, "{log:#?}");
    assert!(!warnings(&log).is_empty(), "the outage was not logged");
    drop(rec);

    // Down at start: no checking line until the database answers, then one
    // (and no "answer again": nothing had answered before).
    pg.stop();
    let (rec, rx) = Reconciler::start_logged(&url, PG_QUERY, &redis.uri());
    wait_for(Duration::from_secs(10), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0).then_some(())
    })
    .expect("the database down is counted");
    let mut log: Vec<String> = rx.try_iter().collect();
    assert_eq!(count(&log, CHECKING), 0, "{log:#?}");
    pg.restart();
    wait_for(Duration::from_secs(40), || {
        log.extend(rx.try_iter());
        (count(&log, CHECKING) > 0).then_some(())
    })
    .unwrap_or_else(|| panic!("no `{CHECKING}` line once the database is back: {log:#?}"));
    rec.next_checks(2.0);
    log.extend(rx.try_iter());
    assert_eq!(count(&log, CHECKING), 1, "{log:#?}");
    assert_eq!(count(&log, "answer again"), 0, "{log:#?}");
}

#[test]
fn redis_down_shows_on_healthz_within_10_s_while_the_database_is_quiet() {
    let pg = pg();
    let mut redis = RedisServer::start();
    pg_row(&pg, "RC9", 0, 3, 1);
    let rec = Reconciler::start(&pg.url("reader", "S3cretPw"), PG_QUERY, &redis.uri(), &[]);
    wait_for(Duration::from_secs(10), || {
        (hash_version(&redis, "RC9", 0) == Some(1) && rec.healthz()["status"] == "ok").then_some(())
    })
    .unwrap_or_else(|| panic!("the section is written: {}", rec.healthz()));
    let errors = |r: &Reconciler| r.metric("seatboard_reconcile_errors_total{kind=\"redis\"}");
    let before = errors(&rec);
    // The database is quiet from here on: no check needs Redis.
    redis.kill();
    let t = Instant::now();
    let h = wait_for(Duration::from_secs(12), || {
        let h = rec.healthz();
        (h["redis"] == false).then_some(h)
    })
    .unwrap_or_else(|| panic!("Redis down is not seen: {}", rec.healthz()));
    assert!(t.elapsed() <= Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(
        (&h["status"], &h["db"]),
        (&Value::from("degraded"), &Value::Bool(true)),
        "{h}"
    );
    assert_eq!(rec.metric("seatboard_reconcile_redis_up"), 0.0);
    assert!(errors(&rec) > before, "the failed PING is counted");
    // Back once it answers.
    redis.restart();
    wait_for(Duration::from_secs(10), || {
        (rec.healthz()["redis"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("Redis back is not seen: {}", rec.healthz()));
    assert_eq!(rec.healthz()["status"], "ok");
    assert_eq!(rec.metric("seatboard_reconcile_redis_up"), 1.0);
}

/// `seatboard reconcile` (`--check` or the long run) with `query` against
/// `db`, where nothing listens: its exit code and stderr, or a panic if it
/// is still running after 5 s (a query taken and retried).
fn refused(db: &str, query: &str, check: bool) -> (Option<i32>, String) {
    let mut cmd = seatboard_command();
    cmd.args([
        "reconcile",
        "--redis",
        "redis://127.0.0.1:1",
        "--metrics",
        "",
    ])
    .args(["--query", query])
    .env("SEATBOARD_RECONCILE_DB", db)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if check {
        cmd.arg("--check");
    }
    let mut child = cmd.spawn().expect("spawn seatboard reconcile");
    let done = wait_for(Duration::from_secs(5), || child.try_wait().ok().flatten());
    if done.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("still running after 5 s with --query {query:?} (--check: {check})");
    }
    let out = child.wait_with_output().expect("its output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_query_with_a_second_bind_parameter_or_statement_exits_2_naming_it() {
    let pg_db = format!("postgres://reader:S3cretPw@127.0.0.1:{}/x", free_port());
    let my_db = format!("mysql://reader:S3cretPw@127.0.0.1:{}/x", free_port());
    for (db, query) in [
        (&pg_db, format!("{PG_QUERY} AND updated_at < $2")),
        (&pg_db, format!("{PG_QUERY}; SELECT 1")),
        (&my_db, format!("{MY_QUERY} AND updated_at < ?")),
        (&my_db, format!("{MY_QUERY}; SELECT 1")),
    ] {
        for check in [true, false] {
            let (code, err) = refused(db, &query, check);
            assert_eq!(code, Some(2), "{query} (--check: {check}): {err}");
            let first = err.lines().next().unwrap_or("");
            assert!(first.contains("'--query'"), "{query}: {err}");
        }
    }
    // Taken (the database is then found down: exit 3): `$1` twice, a
    // trailing `;`, and `$2` or `;` inside a literal, a name or a comment.
    for query in [
        format!("{PG_QUERY} OR updated_at > $1;"),
        format!("{PG_QUERY} AND course <> '$2; SELECT 1' /* $3 */ AND \"section\" >= 0 -- ;$4\n"),
    ] {
        let (code, err) = refused(&pg_db, &query, true);
        assert_eq!(code, Some(3), "{query}: {err}");
    }
}

#[test]
fn every_section_found_ahead_is_logged_once_with_its_course_and_section() {
    const AHEAD: &str = "Redis holds a version the database does not";
    let pg = pg();
    let redis = RedisServer::start();
    for section in 0..4 {
        pg_row(&pg, "RC10", section, 5, 5);
        publish_v(&redis, "RC10", section, 9, 9);
    }
    let (rec, rx) = Reconciler::start_logged(&pg.url("reader", "S3cretPw"), PG_QUERY, &redis.uri());
    rec.wait_metric("seatboard_reconcile_ahead_total", 4.0);
    // Still ahead at the checks after: not logged again.
    rec.next_checks(3.0);
    let log: Vec<String> = rx.try_iter().collect();
    let lines: Vec<&String> = log.iter().filter(|l| l.contains(AHEAD)).collect();
    assert_eq!(lines.len(), 4, "{log:#?}");
    for section in 0..4 {
        let named = format!("section={section} ");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("course=RC10") && l.contains(&named)),
            "section {section} is not named: {lines:#?}"
        );
    }
    assert_eq!(rec.metric("seatboard_reconcile_ahead_total"), 4.0);
}

const MY_QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM seats WHERE updated_at >= ?";

fn my_row(m: &Mariadb, course: &str, section: u32, taken: u32, version: u64) {
    m.sql(&format!(
        "INSERT INTO sel.seats VALUES ('{course}', {section}, 40, {taken}, {version}, '{{\"room\":\"B12\"}}', NOW(6))
         ON DUPLICATE KEY UPDATE seats_taken = VALUES(seats_taken), version = VALUES(version), updated_at = NOW(6)"
    ));
}

/// A MariaDB with the table `sel.seats` and a role that may only SELECT it.
fn mariadb() -> Mariadb {
    let m = Mariadb::start();
    m.sql(
        "CREATE DATABASE sel; CREATE TABLE sel.seats (course varchar(64) NOT NULL, section int NOT NULL,
           total_seats int NOT NULL, seats_taken int NOT NULL, version bigint, seat_info json,
           updated_at datetime(6) NOT NULL, PRIMARY KEY (course, section), KEY (updated_at));
         CREATE USER 'reader'@'%' IDENTIFIED BY 'S3cretPw'; GRANT SELECT ON sel.seats TO 'reader'@'%';",
    );
    m
}

#[test]
fn mariadb_heals_a_lost_publish_replaces_ahead_checks_and_cuts_a_slow_statement() {
    let m = mariadb();
    let redis = RedisServer::start();
    my_row(&m, "RM1", 0, 10, 1);
    my_row(&m, "RM1", 1, 20, 1);
    my_row(&m, "RM1", 2, 30, 4);
    publish_v(&redis, "RM1", 0, 10, 1);
    publish_v(&redis, "RM1", 2, 39, 1 << 53);
    // Rows dated before the year 1000 and at the zero date: a full check
    // reads them too.
    m.sql(
        "SET SESSION sql_mode = '';
         INSERT INTO sel.seats VALUES ('RM0', 0, 40, 1, 1, NULL, '0999-01-01 00:00:00'),
                                      ('RM0', 1, 40, 1, 1, NULL, '0000-00-00 00:00:00');",
    );
    let url = m.url("reader", "S3cretPw", "sel");
    // --check first: what differs, nothing written.
    let check = |db: &str| check_once(&redis, MY_QUERY, db);
    let out = check(&url);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for section in [0, 1] {
        let line = format!(
            r#"{{"course":"RM0","section":{section},"db_version":1,"redis_version":null,"state":"missing"}}"#
        );
        assert!(text.contains(&line), "{text}");
    }
    m.sql("DELETE FROM sel.seats WHERE course = 'RM0'");
    let out = check(&url);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains(r#""section":1,"db_version":1,"redis_version":null,"state":"missing""#),
        "{text}"
    );
    assert!(text.contains(r#""state":"ahead""#), "{text}");
    assert_eq!(hash_version(&redis, "RM1", 1), None);
    // `ssl-mode=PREFERRED` on a server without TLS: read in plain, the same.
    let out = check(&format!("{url}?ssl-mode=PREFERRED"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        text,
        "PREFERRED, no TLS"
    );

    let node = serve(&redis, &["--tick-ms", &TICK_MS.to_string()]);
    let mut ws = client(&node, "user=a");
    let mut board = Board::default();
    board.apply(&watch(&mut ws, "RM1"));
    let rec = Reconciler::start(&url, MY_QUERY, &redis.uri(), &["--ahead-repair-s", "2"]);
    board_until(&mut ws, &mut board, Duration::from_secs(10), |b| {
        taken(b, 1) == 20
    })
    .expect("never published: appears");
    my_row(&m, "RM1", 0, 40, 2);
    // Within about a second on a quiet box (grace + 2 x interval + a tick);
    // the margin is for a box busy with the rest of the suite.
    board_until(&mut ws, &mut board, Duration::from_secs(30), |b| {
        taken(b, 0) == 40
    })
    .expect("the lost publish is repaired");
    board_until(&mut ws, &mut board, Duration::from_secs(30), |b| {
        taken(b, 2) == 30 && b.version(2) == 4
    })
    .expect("the forged version is replaced");
    rec.wait_metric("seatboard_reconcile_repaired_total{reason=\"ahead\"}", 1.0);
    // One session (the statement's), under the SELECT-only user.
    let n = m.sql("SELECT count(*) FROM information_schema.processlist WHERE user = 'reader'");
    assert_eq!(n, "1");
    drop(rec);

    // Hostile rows are skipped, the good ones written; a slow statement is cut at its timeout.
    m.sql("CREATE TABLE sel.raw (course varchar(200), section bigint, total_seats bigint, seats_taken bigint, version bigint, seat_info longtext, updated_at datetime(6)); GRANT SELECT ON sel.raw TO 'reader'@'%';");
    m.sql("INSERT INTO sel.raw VALUES ('MGOOD', 1, 40, 3, 1, NULL, NOW(6)), ('BAD CODE', 1, 40, 3, 1, NULL, NOW(6)), ('MNEG', 1, 40, -1, 1, NULL, NOW(6)), ('MNULL', 1, 40, 1, NULL, NULL, NOW(6)), ('MJSON', 1, 40, 1, 1, '{nope', NOW(6))");
    let rq = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM sel.raw WHERE updated_at >= ?";
    let rec = Reconciler::start(&url, rq, &redis.uri(), &[]);
    wait_for(Duration::from_secs(10), || {
        (hash_version(&redis, "MGOOD", 1) == Some(1)).then_some(())
    })
    .expect("the good row is written");
    let (schema, json, large) = rejected(&rec);
    assert!(
        json >= 1.0 && schema == 3.0 * json && large == 0.0,
        "{schema} {json} {large}"
    );
    drop(rec);
    let slow = "SELECT course, section, total_seats, seats_taken, version, seat_info, updated_at FROM sel.seats WHERE updated_at >= ? AND SLEEP(1) = 0";
    let rec = Reconciler::start(&url, slow, &redis.uri(), &["--statement-timeout-ms", "300"]);
    wait_for(Duration::from_secs(15), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"timeout\"}") >= 1.0).then_some(())
    })
    .expect("cut off at its timeout");
    let t = Instant::now();
    my_row(&m, "RM1", 1, 21, 2);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the UPDATE waited {:?}",
        t.elapsed()
    );
}

#[test]
fn a_cluster_failover_that_loses_the_last_writes_is_healed() {
    let pg = pg();
    let mut cluster = testkit::cluster_util::Cluster::start();
    let course = "RCX";
    let key = format!("seatstate:{course}");
    pg_row(&pg, course, 0, 5, 1);
    let rec = Reconciler::start(
        &pg.url("reader", "S3cretPw"),
        PG_QUERY,
        &cluster.uri(),
        &["--sweep-s", "2", "--redis-mode", "cluster"],
    );
    let primary = cluster.owner(&key);
    // The field as this node holds it (a replica answers after READONLY).
    let field = |port: u16| -> Option<u64> {
        use std::io::Write as _;
        let mut c = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let _ = write!(c.stdin.take()?, "READONLY\nHGET {key} 0\n");
        let out = c.wait_with_output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<Value>(text.lines().nth(1)?).ok()?["version"].as_u64()
    };
    wait_for(Duration::from_secs(15), || {
        (field(primary.port) == Some(1)).then_some(())
    })
    .expect("the section is written on its primary");
    let replica = cluster.replica_of(&primary.id);
    wait_for(Duration::from_secs(10), || {
        (field(replica.port) == Some(1)).then_some(())
    })
    .expect("replicated");
    // The replica stops hearing its primary; the next repair reaches only the primary.
    let pid: i32 = cluster
        .cli(replica.port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("replica pid");
    // SAFETY: kill(2) on a redis-server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    cluster.cli(primary.port, &["CLIENT", "KILL", "TYPE", "replica"]);
    pg_row(&pg, course, 0, 6, 2);
    let written = wait_for(Duration::from_secs(10), || {
        (field(primary.port) == Some(2)).then_some(())
    });
    // The primary dies with that write; the replica, resumed, is promoted without it.
    cluster.kill(primary.port);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    written.expect("the repair reached the primary");
    let promoted = cluster.wait_promoted(replica.port, Duration::from_secs(30));
    assert_eq!(
        field(replica.port),
        Some(1),
        "the failover lost the last write"
    );
    wait_for(Duration::from_secs(40), || {
        (field(replica.port) == Some(2)).then_some(())
    })
    .expect("the sweep writes it again on the new primary");
    println!(
        "healed {:.1} s after the promotion",
        promoted.elapsed().as_secs_f64()
    );
    assert!(rec.metric("seatboard_reconcile_repaired_total{reason=\"behind\"}") >= 2.0);
}

/// `--check` with a query that lacks `seats_taken`: exit 3, the column and
/// `--query` named on stderr, nothing on stdout, the password never shown.
fn check_names_the_missing_column(redis: &RedisServer, query: &str, db: &str) {
    let out = check_once(redis, query, db);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        err.contains("seats_taken") && err.contains("--query") && !err.contains("S3cretPw"),
        "{err}"
    );
}

/// The reconciler run with a query that lacks `seats_taken`: each check a
/// database error (`errors_total{kind="db"}`, `db:false` while Redis is up),
/// logged naming the column; no row read, refused or compared.
fn runs_degraded_for_a_missing_column(db: &str, query: &str, redis: &RedisServer) {
    let (rec, rx) = Reconciler::start_logged(db, query, &redis.uri());
    wait_for(Duration::from_secs(5), || {
        (rec.metric("seatboard_reconcile_errors_total{kind=\"db\"}") >= 1.0).then_some(())
    })
    .unwrap_or_else(|| panic!("not counted as a database error: {}", rec.healthz()));
    db_down_redis_up(&rec);
    let mut log = Vec::new();
    wait_for(Duration::from_secs(5), || {
        log.extend(rx.try_iter());
        log.iter()
            .any(|l| l.contains("check failed") && l.contains("seats_taken"))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the missing column is not logged: {log:#?}"));
    assert_eq!(rejected(&rec), (0.0, 0.0, 0.0));
    assert_eq!(rec.metric("seatboard_reconcile_rows_total"), 0.0);
    assert_eq!(
        rec.metric("seatboard_reconcile_checks_total{kind=\"sweep\"}"),
        0.0
    );
}

/// A query lacking `seats_taken` against the database at `url`: with no
/// row at all (the result's columns still say what is missing), then with
/// `add_row`'s row of `course` that Redis lacks (not "they agree").
fn a_query_missing_a_column_is_a_database_error(
    url: &str,
    query: &str,
    course: &str,
    add_row: impl FnOnce(),
) {
    let redis = RedisServer::start();
    check_names_the_missing_column(&redis, query, url);
    add_row();
    check_names_the_missing_column(&redis, query, url);
    runs_degraded_for_a_missing_column(url, query, &redis);
    assert_eq!(hash_version(&redis, course, 0), None, "nothing written");
}

#[test]
fn postgresql_query_missing_a_column_is_a_database_error() {
    let pg = pg();
    let query = "SELECT course, section, total_seats, version, seat_info, updated_at FROM seats WHERE updated_at >= $1";
    a_query_missing_a_column_is_a_database_error(
        &pg.url("reader", "S3cretPw"),
        query,
        "RCC",
        || pg_row(&pg, "RCC", 0, 1, 1),
    );
}

#[test]
fn mariadb_query_missing_a_column_is_a_database_error() {
    let m = mariadb();
    let query = "SELECT course, section, total_seats, version, seat_info, updated_at FROM seats WHERE updated_at >= ?";
    a_query_missing_a_column_is_a_database_error(
        &m.url("reader", "S3cretPw", "sel"),
        query,
        "RCM",
        || my_row(&m, "RCM", 0, 1, 1),
    );
}
