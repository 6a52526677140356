//! `seatboard analytics` against a real redis-server (one per test, free port):
//! per-bucket counts, idle buckets, read-only presence, one stream per session,
//! `report`, SIGTERM, and a Redis restart.

use crate::common;
use common::*;
use redis::streams::StreamRangeReply;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BUCKET_MS: u64 = 1000;

/// An analytics worker, killed on drop.
struct Worker(Child);

impl Worker {
    fn start(redis: &RedisServer, session: &str, bucket_ms: u64) -> Worker {
        Worker::start_with(redis, session, bucket_ms, &[])
    }

    fn start_with(redis: &RedisServer, session: &str, bucket_ms: u64, extra: &[&str]) -> Worker {
        let child = Command::new(bin())
            .args([
                "analytics",
                "--redis",
                &redis.uri(),
                "--session",
                session,
                "--bucket-ms",
                &bucket_ms.to_string(),
                "--log-level",
                "warn",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn seatboard analytics");
        Worker(child)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn con(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.uri())
        .and_then(|c| c.get_connection())
        .expect("redis connection")
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits until `n` clients hold a pattern subscription (the workers are listening).
fn wait_subscribed(redis: &RedisServer, n: usize) {
    wait_for(Duration::from_secs(10), || {
        let list = redis.cli(&["CLIENT", "LIST"]);
        let got = list.lines().filter(|l| l.contains(" psub=1 ")).count();
        (got >= n).then_some(())
    })
    .expect("analytics worker did not PSUBSCRIBE");
}

/// Sleeps to just after a bucket boundary, so a quick burst lands in one bucket.
fn align_to_bucket_start(bucket_ms: u64) {
    let into = unix_ms() % bucket_ms;
    if into > bucket_ms / 5 {
        std::thread::sleep(Duration::from_millis(bucket_ms - into + 20));
    }
}

fn payload(course: &str, section: u32, taken: u32, total: u32, version: u64) -> String {
    format!(
        r#"{{"course":"{course}","section":{section},"total_seats":{total},"seats_taken":{taken},"seat_info":{{"room":"B12"}},"version":{version},"ts":{}}}"#,
        unix_ms()
    )
}

/// Publishes `n` snapshots of `course` in one pipeline (sections 0 and 1 alternate,
/// seats_taken = i, total 100): section 0 ends at n-2 taken, section 1 at n-1.
fn publish_burst(c: &mut redis::Connection, course: &str, n: u32) {
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("PUBLISH")
            .arg(format!("seats:{course}"))
            .arg(payload(course, i % 2, i, 100, u64::from(i) + 1))
            .ignore();
    }
    let () = p.query(c).expect("publish");
}

/// The stream's entries: (bucket_start_ms, bucket_ms, courses).
fn entries(c: &mut redis::Connection, key: &str) -> Vec<(u64, u64, Vec<Value>)> {
    let reply: StreamRangeReply = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(c)
        .expect("XRANGE");
    reply
        .ids
        .iter()
        .map(|sid| {
            let start: String = sid.get("bucket_start_ms").expect("bucket_start_ms");
            let ms: String = sid.get("bucket_ms").expect("bucket_ms");
            let courses: String = sid.get("courses").expect("courses");
            (
                start.parse().expect("bucket_start_ms is a number"),
                ms.parse().expect("bucket_ms is a number"),
                match serde_json::from_str(&courses).expect("courses is JSON") {
                    Value::Array(v) => v,
                    other => panic!("courses is not an array: {other}"),
                },
            )
        })
        .collect()
}

fn course_updates(es: &[(u64, u64, Vec<Value>)], course: &str) -> Vec<(u64, u64)> {
    es.iter()
        .flat_map(|(_, _, cs)| cs.iter())
        .filter(|c| c["course"] == course)
        .map(|c| {
            (
                c["updates"].as_u64().expect("updates"),
                c["viewers"].as_u64().expect("viewers"),
            )
        })
        .collect()
}

#[test]
fn fifty_snapshots_three_viewers_one_entry_and_report() {
    let redis = RedisServer::start();
    let mut c = con(&redis);
    let now = unix_ms();
    // Three live viewers, one expired member that must be left alone and not counted.
    let live = (now + 600_000).to_string();
    let dead = (now - 5_000).to_string();
    redis.cli(&[
        "ZADD",
        "presence:CS101",
        &live,
        "u1",
        &live,
        "u2",
        &live,
        "u3",
        &dead,
        "gone",
    ]);
    let mut w = Worker::start(&redis, "s50", BUCKET_MS);
    wait_subscribed(&redis, 1);
    align_to_bucket_start(BUCKET_MS);
    publish_burst(&mut c, "CS101", 50);

    // Wait for the bucket with updates, then one more bucket so nothing is in flight.
    let es = wait_for(Duration::from_secs(10), || {
        let es = entries(&mut c, "analytics:s50");
        let with_updates = es
            .iter()
            .position(|(_, _, cs)| cs.iter().any(|x| x["updates"].as_u64() > Some(0)))?;
        (es.len() > with_updates + 1).then_some(es)
    })
    .expect("no entry with updates (and one after it) within 10 s");

    let rows = course_updates(&es, "CS101");
    let busy: Vec<_> = rows.iter().filter(|(u, _)| *u > 0).collect();
    assert_eq!(busy, vec![&(50, 3)], "entries: {es:?}");
    assert!(rows.iter().all(|(_, v)| *v == 3), "viewers: {rows:?}");
    let mut seen = false;
    for (start, ms, cs) in &es {
        assert_eq!(*ms, BUCKET_MS);
        assert_eq!(start % BUCKET_MS, 0, "bucket start not aligned: {start}");
        assert_eq!(cs.len(), 1, "only CS101 is active: {cs:?}");
        seen |= cs[0]["updates"].as_u64() > Some(0);
        // Before the burst no snapshot was seen; from it on, the latest ones:
        // section 0 at 48 taken, section 1 at 49; 100 seats each.
        let want = if seen { (97, 200) } else { (0, 0) };
        assert_eq!(
            (&cs[0]["seats_taken"], &cs[0]["total_seats"]),
            (&Value::from(want.0), &Value::from(want.1)),
            "{es:?}"
        );
    }
    // Consecutive entries are distinct, increasing buckets.
    assert!(es.windows(2).all(|p| p[0].0 < p[1].0), "{es:?}");

    // Presence is read only: the expired member is still there, nothing expires the key.
    assert_eq!(redis.cli(&["ZSCORE", "presence:CS101", "gone"]), dead);
    assert_eq!(redis.cli(&["ZCARD", "presence:CS101"]), "4");
    assert_eq!(redis.cli(&["TTL", "presence:CS101"]), "-1");

    // SIGTERM: exits 0 promptly.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(w.0.id() as i32, libc::SIGTERM) };
    let status = wait_for(Duration::from_secs(5), || w.0.try_wait().ok().flatten())
        .expect("analytics did not exit on SIGTERM");
    assert!(status.success(), "exit status {status:?}");

    // `report` prints what was written: CSV row for row, and a table.
    let written = entries(&mut c, "analytics:s50");
    let out = Command::new(bin())
        .args([
            "analytics",
            "report",
            "--redis",
            &redis.uri(),
            "--session",
            "s50",
            "--csv",
        ])
        .output()
        .expect("report");
    assert!(out.status.success(), "report --csv failed: {out:?}");
    let csv = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "id,bucket_start_ms,bucket_ms,course,updates,viewers,seats_taken,total_seats"
    );
    assert_eq!(lines.len() - 1, written.len(), "{csv}");
    for ((start, ms, cs), line) in written.iter().zip(&lines[1..]) {
        let want = format!(
            ",{start},{ms},CS101,{},{},{},{}",
            cs[0]["updates"], cs[0]["viewers"], cs[0]["seats_taken"], cs[0]["total_seats"]
        );
        assert!(line.ends_with(&want), "{line} vs {want}");
    }
    assert!(csv.contains(",CS101,50,3,97,200"), "{csv}");

    let out = Command::new(bin())
        .args(["analytics", "report", "--session", "s50"])
        .env("REALTIME_REDIS_URI", redis.uri())
        .output()
        .expect("report");
    assert!(out.status.success(), "report failed: {out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.contains(&"CS101") && w.contains(&"50")
        })
        .unwrap_or_else(|| panic!("no CS101 row with 50 updates in:\n{table}"));
    assert!(row.contains("48.5%"), "{row}");
    assert!(
        table.contains(&format!("{} entries", written.len())),
        "{table}"
    );
}

#[test]
fn idle_buckets_write_nothing_and_expired_members_stay() {
    let redis = RedisServer::start();
    let now = unix_ms();
    let dead = (now - 1_000).to_string();
    // Only expired members: zero viewers, so every bucket is idle.
    redis.cli(&["ZADD", "presence:MATH1", &dead, "old1", &dead, "old2"]);
    let _w = Worker::start(&redis, "idle", 200);
    wait_subscribed(&redis, 1);
    // Several buckets pass; nothing may be written (absence cannot be polled for).
    std::thread::sleep(Duration::from_millis(1_300));
    assert_eq!(redis.cli(&["EXISTS", "analytics:idle"]), "0");
    assert_eq!(redis.cli(&["ZCARD", "presence:MATH1"]), "2");
    assert_eq!(redis.cli(&["ZSCORE", "presence:MATH1", "old1"]), dead);

    // A malformed or mismatched payload is not an update either.
    redis.cli(&["PUBLISH", "seats:MATH1", "not json"]);
    redis.cli(&["PUBLISH", "seats:MATH1", &payload("OTHER", 0, 1, 2, 1)]);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(redis.cli(&["EXISTS", "analytics:idle"]), "0");

    // One good snapshot: exactly one entry appears.
    redis.cli(&["PUBLISH", "seats:MATH1", &payload("MATH1", 0, 1, 2, 1)]);
    let mut c = con(&redis);
    let es = wait_for(Duration::from_secs(5), || {
        let es = entries(&mut c, "analytics:idle");
        (!es.is_empty()).then_some(es)
    })
    .expect("no entry after a snapshot");
    std::thread::sleep(Duration::from_millis(600));
    let es2 = entries(&mut c, "analytics:idle");
    assert_eq!(es2.len(), 1, "{es2:?}");
    assert_eq!(course_updates(&es, "MATH1"), vec![(1, 0)]);
}

#[test]
fn two_sessions_write_two_streams() {
    let redis = RedisServer::start();
    let mut c = con(&redis);
    let _a = Worker::start(&redis, "fall", BUCKET_MS);
    let _b = Worker::start(&redis, "spring", BUCKET_MS);
    wait_subscribed(&redis, 2);
    publish_burst(&mut c, "BIO101", 7);
    for key in ["analytics:fall", "analytics:spring"] {
        let total = wait_for(Duration::from_secs(10), || {
            let es = entries(&mut c, key);
            let sum: u64 = course_updates(&es, "BIO101").iter().map(|r| r.0).sum();
            (sum == 7).then_some(sum)
        });
        assert_eq!(total, Some(7), "{key}: {:?}", entries(&mut c, key));
    }
    assert_eq!(redis.cli(&["EXISTS", "analytics:default"]), "0");
}

#[test]
fn survives_a_redis_restart() {
    let mut redis = RedisServer::start();
    let _w = Worker::start(&redis, "blip", 500);
    wait_subscribed(&redis, 1);
    redis.kill();
    std::thread::sleep(Duration::from_millis(300));
    redis.restart();
    // The worker comes back by itself (backoff capped at 2 s) and counts again.
    wait_subscribed(&redis, 1);
    let mut c = con(&redis);
    publish_burst(&mut c, "CHEM101", 5);
    let sum = wait_for(Duration::from_secs(10), || {
        let es = entries(&mut c, "analytics:blip");
        let sum: u64 = course_updates(&es, "CHEM101").iter().map(|r| r.0).sum();
        (sum == 5).then_some(sum)
    });
    assert_eq!(sum, Some(5), "{:?}", entries(&mut c, "analytics:blip"));
}

/// The worker's `/metrics` body once it answers 200.
fn worker_metrics(port: u16) -> String {
    wait_for(Duration::from_secs(10), || {
        let r = http_get(port, "/metrics").ok()?;
        (r.status == 200).then_some(r.body)
    })
    .expect("the worker's /metrics did not answer")
}

/// A Redis restart early in a long bucket, the worker back well before the
/// bucket ends: the bucket is given up at the reconnect (counted in
/// `/metrics`), and snapshots published after the reconnect, still inside
/// that bucket, are written. They used to be counted into the bucket marked
/// lost and dropped with it, with nothing logged but the loss itself (the
/// occasional failure of `survives_a_redis_restart`, whose 500 ms buckets
/// hit this only when the worker came back inside the bucket of the kill).
#[test]
fn snapshots_after_a_reconnect_inside_the_lost_bucket_are_written() {
    const BUCKET: u64 = 5_000;
    let mut redis = RedisServer::start();
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let _w = Worker::start_with(&redis, "inside", BUCKET, &["--metrics", &maddr]);
    wait_subscribed(&redis, 1);
    let lost = r#"seatboard_analytics_buckets_lost_total{reason="redis_down"}"#;
    assert_eq!(metric_value(&worker_metrics(mport), lost), 0.0);
    for attempt in 0..3u32 {
        let course = format!("CHEM{attempt}");
        // Early in a bucket: the restart and the resubscribe have 4 s of it left.
        align_to_bucket_start(BUCKET);
        let end = unix_ms() - unix_ms() % BUCKET + BUCKET;
        redis.restart();
        wait_subscribed(&redis, 1);
        // The worker has read the reconnect: the bucket of the restart is given up.
        let want = f64::from(attempt + 1);
        wait_for(Duration::from_secs(10), || {
            (metric_value(&worker_metrics(mport), lost) >= want).then_some(())
        })
        .expect("the bucket of the restart was not counted lost at the reconnect");
        let mut c = con(&redis);
        // A rehearsal's snapshots first, on the same connection: delivered
        // before the course's, and counted nowhere (section 7).
        publish_burst(&mut c, "REHEARSAL-A0001", 2);
        publish_burst(&mut c, &course, 5);
        if unix_ms() + 1_000 > end {
            // Too slow to land inside the bucket of the restart (a loaded
            // machine): that is not the case shown here, so again.
            eprintln!("attempt {attempt}: back too late in the bucket; again");
            continue;
        }
        let sum = wait_for(Duration::from_millis(BUCKET + 10_000), || {
            let es = entries(&mut c, "analytics:inside");
            let sum: u64 = course_updates(&es, &course).iter().map(|r| r.0).sum();
            (sum == 5).then_some(sum)
        });
        assert_eq!(sum, Some(5), "{:?}", entries(&mut c, "analytics:inside"));
        let m = worker_metrics(mport);
        assert_eq!(
            metric_value(&m, "seatboard_analytics_snapshots_total"),
            5.0,
            "{m}"
        );
        assert_eq!(metric_value(&m, "seatboard_analytics_redis_up"), 1.0, "{m}");
        let healthz = http_get(mport, "/healthz").expect("healthz");
        assert!(
            healthz.body.contains(r#""status":"ok""#),
            "{}",
            healthz.body
        );
        return;
    }
    panic!("Redis was never back within 4 s of a restart in three attempts");
}

/// Redis refusing the `XADD` (out of memory) while pub/sub goes on: the
/// entry is held back, snapshots keep being counted (they were dropped
/// unseen while the held entry could not be written), the bucket that ends
/// meanwhile is given up and counted, and once Redis takes writes again the
/// held entry and the next ones are written, in bucket order.
#[test]
fn a_refused_xadd_holds_the_entry_and_drops_nothing_unseen() {
    const BUCKET: u64 = 2_000;
    let redis = RedisServer::start();
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let _w = Worker::start_with(&redis, "oom", BUCKET, &["--metrics", &maddr]);
    wait_subscribed(&redis, 1);
    let mut c = con(&redis);
    let m = |name: &str| metric_value(&worker_metrics(mport), name);
    let until = |what: &str, f: &dyn Fn() -> bool| {
        wait_for(Duration::from_secs(15), || f().then_some(()))
            .unwrap_or_else(|| panic!("{what}: {}", worker_metrics(mport)));
    };
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    align_to_bucket_start(BUCKET);
    publish_burst(&mut c, "OOM1", 3);
    until("the refused entry is not held", &|| {
        m("seatboard_analytics_held_entry") == 1.0
    });
    // Published while the held entry cannot be written: counted, and their
    // bucket, which cannot be written before the held one, counted lost.
    publish_burst(&mut c, "OOM1", 4);
    until("snapshots dropped unseen", &|| {
        m("seatboard_analytics_snapshots_total") == 7.0
    });
    let unwritten = r#"seatboard_analytics_buckets_lost_total{reason="unwritten"}"#;
    until("the bucket behind the held entry not counted lost", &|| {
        m(unwritten) >= 1.0
    });
    assert_eq!(redis.cli(&["EXISTS", "analytics:oom"]), "0");
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    until("the held entry is not written", &|| {
        m("seatboard_analytics_held_entry") == 0.0
    });
    publish_burst(&mut c, "OOM1", 2);
    let es = wait_for(Duration::from_secs(15), || {
        let es = entries(&mut c, "analytics:oom");
        (course_updates(&es, "OOM1").len() == 2).then_some(es)
    })
    .unwrap_or_else(|| panic!("{:?}", entries(&mut c, "analytics:oom")));
    let rows: Vec<u64> = course_updates(&es, "OOM1").iter().map(|r| r.0).collect();
    assert_eq!(rows, vec![3, 2], "{es:?}");
    assert!(es.windows(2).all(|p| p[0].0 < p[1].0), "{es:?}");
    // Counted once the worker has the XADD's reply, after Redis has the entry.
    until("the two entries are not counted", &|| {
        m("seatboard_analytics_entries_total") == 2.0
    });
}

#[test]
fn hub_serves_history_to_admins_only() {
    let redis = RedisServer::start();
    let mut c = con(&redis);
    let _w = Worker::start(&redis, "hist", 500);
    wait_subscribed(&redis, 1);
    publish_burst(&mut c, "ECON101", 4);
    wait_for(Duration::from_secs(10), || {
        (!entries(&mut c, "analytics:hist").is_empty()).then_some(())
    })
    .expect("no analytics entry");
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &redis.uri(),
        "--session",
        "hist",
        "--shards",
        "1",
    ]);
    assert_eq!(
        http_get(sb.port, "/api/history?session=hist")
            .expect("get")
            .status,
        401
    );
    assert_eq!(
        http_get(sb.port, "/api/history?session=hist&user=s1")
            .expect("get")
            .status,
        403
    );
    assert_eq!(
        http_get(sb.port, "/api/history?session=a%20b&role=admin")
            .expect("get")
            .status,
        400
    );
    let body = wait_for(Duration::from_secs(10), || {
        let r = http_get(sb.port, "/api/history?session=hist&user=a1&role=admin").ok()?;
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_str(&r.body).ok()?;
        let updates: u64 = v["entries"]
            .as_array()?
            .iter()
            .filter_map(|e| e["updates"].as_u64())
            .sum();
        (updates == 4).then_some(v)
    })
    .expect("/api/history never showed the 4 updates");
    assert_eq!(body["session"], "hist");
    assert_eq!(body["entries"][0]["top"][0]["course"], "ECON101");
    // Another session is picked up on demand (empty here, but answered).
    let other = wait_for(Duration::from_secs(10), || {
        let r = http_get(sb.port, "/api/history?session=other&role=admin").ok()?;
        let v: Value = serde_json::from_str(&r.body).ok()?;
        (v["pending"] != true).then_some(v)
    })
    .expect("other session never refreshed");
    assert_eq!(other["entries"], Value::Array(vec![]));
}

#[test]
fn history_with_jwt_needs_an_admin_token() {
    use seatboard::auth::mint;
    use shards::Role;
    let redis = RedisServer::start();
    let sb = Seatboard::start(&[
        "serve",
        "--redis",
        &redis.uri(),
        "--shards",
        "1",
        "--jwt-secret",
        TEST_SECRET,
        "--session",
        "jwt",
    ]);
    let exp = unix_ms() / 1000 + 600;
    let student = mint(TEST_SECRET.as_bytes(), "stu", Role::Student, exp);
    let admin = mint(TEST_SECRET.as_bytes(), "boss", Role::Admin, exp);
    let get = |extra: &str, query: &str| {
        http_raw(
            sb.port,
            format!("GET /api/history{query} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n")
                .as_bytes(),
        )
        .expect("GET /api/history")
    };
    // `?role=admin` means nothing with JWT auth.
    assert_eq!(get("", "?role=admin&user=x").status, 401);
    assert_eq!(
        get(&format!("Authorization: Bearer {student}\r\n"), "").status,
        403
    );
    for (extra, query) in [
        (format!("Authorization: Bearer {admin}\r\n"), String::new()),
        (String::new(), format!("?token={admin}")),
        (
            format!("Cookie: seatboard_token={admin}\r\n"),
            String::new(),
        ),
    ] {
        let r = get(&extra, &query);
        assert_eq!(r.status, 200, "{extra}{query}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(v["session"], "jwt");
        assert!(v["entries"].is_array(), "{v}");
    }
}

#[test]
fn a_clean_start_logs_one_subscribed_line_and_no_warning() {
    use std::io::{BufRead, BufReader};
    let redis = RedisServer::start();
    let mut child = Command::new(bin())
        .args(["analytics", "--redis", &redis.uri(), "--session", "clean"])
        .args(["--log-level", "info"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn seatboard analytics");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let worker = Worker(child);
    let mut log = Vec::new();
    let subscribed = wait_for(Duration::from_secs(10), || {
        log.extend(rx.try_iter());
        log.iter()
            .any(|l| l.contains("analytics worker subscribed"))
            .then_some(())
    });
    assert!(subscribed.is_some(), "no subscribed line: {log:#?}");
    // Working: a pattern subscription is held.
    wait_subscribed(&redis, 1);
    drop(worker);
    log.extend(rx.iter());
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("analytics worker subscribed"))
            .count(),
        1,
        "{log:#?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.contains("WARN") || l.contains("ERROR")),
        "a clean start warned: {log:#?}"
    );
}
