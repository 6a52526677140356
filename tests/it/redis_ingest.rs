//! `serve` on a real Redis: the watch answer from the state hash, live frames,
//! Go field names, stale versions, rejects by reason, per-course subscriptions
//! that follow viewers, the admin firehose (pattern only, no double count),
//! and a storm on one course waking its shard per token, not per snapshot,
//! while an update to a quiet course still goes out at once.

use crate::common;
use crate::redis_util;
use common::*;
use redis_util::*;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

#[test]
fn watch_is_answered_from_the_state_hash() {
    let redis = RedisServer::start();
    // Only the hash: nothing is ever published.
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "3",
        &payload("CS101", 3, 42, 41, 17),
    ]);
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        &payload("CS101", 1, 30, 2, 4),
    ]);
    // A key under the state prefix that is no hash is no course.
    redis.cli(&["SET", "seatstate:STRKEY1", "x"]);
    let sb = serve(&redis, &[]);
    let mut ws = client(&sb, "user=alice");
    let f = watch(&mut ws, "CS101");
    let ids: Vec<u64> = f["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["section"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 3]);
    let s3 = section(&f, 3).unwrap();
    assert_eq!(s3["total_seats"], 42);
    assert_eq!(s3["seats_taken"], 41);
    assert_eq!(s3["version"], 17);
    assert_eq!(s3["seat_info"], json!({"room":"B12"}));
    // A course without a hash answers with an empty list.
    let e = watch(&mut ws, "EMPTY1");
    assert_eq!(e["sections"], json!([]));
    // /api/courses is built from the state hashes (not from STRKEY1).
    let courses: Vec<String> =
        serde_json::from_str(&http_get(sb.port, "/api/courses").unwrap().body).unwrap();
    assert_eq!(courses, vec!["CS101".to_string()]);
    let h: serde_json::Value =
        serde_json::from_str(&http_get(sb.port, "/healthz").unwrap().body).unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["redis"], true);
}

#[test]
fn a_state_key_that_is_no_hash_leaves_the_courses_read_beside_it_whole() {
    let redis = RedisServer::start();
    redis.cli(&["SET", "seatstate:STRKEY2", "x"]);
    redis.cli(&[
        "HSET",
        "seatstate:NEXT1",
        "1",
        &payload("NEXT1", 1, 30, 2, 4),
    ]);
    let sb = serve(&redis, &["--shards", "1"]);
    // Both named in the upgrade: their state keys are read together.
    let mut ws = client(&sb, "user=a&course=STRKEY2&course=NEXT1");
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 2 {
        let f = next_of_type(&mut ws, "frame", T).expect("both watch answers");
        answers.insert(f["course"].as_str().unwrap_or_default().to_string(), f);
    }
    assert_eq!(answers["STRKEY2"]["sections"], json!([]));
    let next = section(&answers["NEXT1"], 1).expect("NEXT1 read beside STRKEY2");
    assert_eq!(
        (&next["seats_taken"], &next["version"]),
        (&json!(2), &json!(4))
    );
    // A later viewer of NEXT1 on a node that kept reading is answered whole too.
    let mut late = client(&sb, "user=b");
    assert!(section(&watch(&mut late, "NEXT1"), 1).is_some());
}

#[test]
fn a_state_read_redis_refuses_for_now_is_asked_again_not_taken_as_empty() {
    let redis = RedisServer::start();
    // The node's user may not read hashes yet (`NOPERM`, as `CLUSTERDOWN`
    // or `LOADING` would say while Redis cannot serve).
    let acl = [
        "ACL", "SETUSER", "sb", "on", ">pw", "~*", "&*", "+@all", "-hscan",
    ];
    assert_eq!(redis.cli(&acl), "OK");
    redis.cli(&["HSET", "seatstate:ACL1", "1", &payload("ACL1", 1, 30, 7, 3)]);
    let uri = redis.uri().replacen("redis://", "redis://sb:pw@", 1);
    let sb = serve_on(&uri, &["--shards", "1"]);
    let mut ws = client(&sb, "user=a");
    let first = watch(&mut ws, "ACL1");
    assert_eq!(first["sections"], json!([]), "{first}");
    assert_eq!(redis.cli(&["ACL", "SETUSER", "sb", "+hscan"]), "OK");
    let f = read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 1).is_some()
    })
    .expect("the board once Redis serves the read");
    assert_eq!(section(&f, 1).expect("section 1")["seats_taken"], json!(7));
}

#[test]
fn live_frames_go_names_stale_versions_and_rejects() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &[]);
    let m = sb.metrics();
    for reason in ["json", "schema", "channel_mismatch", "too_large"] {
        let line = format!("seatboard_ingest_rejected_total{{reason=\"{reason}\"}} 0");
        assert!(m.contains(&line), "{line} exported at start");
    }
    let mut ws = client(&sb, "user=alice");
    watch(&mut ws, "CS101");

    // Live frame.
    publish(&redis, "CS101", &payload("CS101", 3, 42, 10, 5));
    let f = read_until(&mut ws, T, |m| m["type"] == "frame").expect("live frame");
    assert_eq!(f["full"], false);
    assert_eq!(section(&f, 3).unwrap()["seats_taken"], 10);

    // The Go publisher's field names.
    let go = json!({"SharedCourseCode":"CS101","SectionID":4,"TotalSeats":20,"SeatsTaken":7,
                    "SeatInfo":{"room":"Z1"},"Version":2,"Ts":1764420000123u64});
    publish(&redis, "CS101", &go.to_string());
    let f = read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 4).is_some()
    })
    .expect("Go-named frame");
    let s4 = section(&f, 4).unwrap();
    assert_eq!(s4["total_seats"], 20);
    assert_eq!(s4["seats_taken"], 7);
    assert_eq!(s4["seat_info"], json!({"room":"Z1"}));

    // Stale and duplicate versions are ignored; a later good one flows.
    publish(&redis, "CS101", &payload("CS101", 3, 42, 99, 4));
    publish(&redis, "CS101", &payload("CS101", 3, 42, 98, 5));
    // Bad payloads of every kind, between good ones.
    publish(&redis, "CS101", "{not json");
    publish(
        &redis,
        "CS101",
        r#"{"course":"CS101","section":"three","total_seats":1,"seats_taken":0}"#,
    );
    publish(&redis, "CS101", &payload("OTHER9", 3, 42, 11, 9));
    let big = format!(
        "{{\"course\":\"CS101\",\"section\":3,\"total_seats\":1,\"seats_taken\":0,\"seat_info\":{{\"x\":\"{}\"}}}}",
        "a".repeat(70 * 1024)
    );
    publish(&redis, "CS101", &big);
    publish(&redis, "CS101", &payload("CS101", 3, 42, 12, 6));
    let f = read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 3).is_some_and(|s| s["version"] == 6)
    })
    .expect("good snapshot after the bad ones");
    assert_eq!(section(&f, 3).unwrap()["seats_taken"], 12);
    eventually(T, "rejects counted", || {
        let m = sb.metrics();
        ["json", "schema", "channel_mismatch", "too_large"]
            .iter()
            .all(|r| {
                metric_value(
                    &m,
                    &format!("seatboard_ingest_rejected_total{{reason=\"{r}\"}}"),
                ) == 1.0
            })
    });
    // A fresh viewer sees exactly the accepted state: never the stale 99/98.
    let mut b = client(&sb, "user=bob");
    let full = watch(&mut b, "CS101");
    assert_eq!(section(&full, 3).unwrap()["seats_taken"], 12);
    assert_eq!(section(&full, 3).unwrap()["version"], 6);
    assert_eq!(section(&full, 4).unwrap()["version"], 2);
}

#[test]
fn per_course_subscriptions_follow_viewers() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &["--shards", "3"]);
    assert!(channels(&redis).is_empty());
    let mut a = client(&sb, "user=alice");
    watch(&mut a, "CS101");
    eventually(T, "one channel", || channels(&redis) == ["seats:CS101"]);
    // More viewers on any shard: still one subscription per course.
    let mut others: Vec<Ws> = (0..5).map(|i| client(&sb, &format!("user=u{i}"))).collect();
    for o in &mut others {
        watch(o, "CS101");
    }
    watch(&mut a, "MATH1");
    eventually(T, "two channels", || {
        channels(&redis) == ["seats:CS101", "seats:MATH1"]
    });
    let subs = redis.cli(&["PUBSUB", "NUMSUB", "seats:CS101"]);
    assert!(subs.ends_with("\n1"), "one node subscription: {subs:?}");
    send_json(&mut a, json!({"op":"unwatch","course":"MATH1"}));
    eventually(T, "MATH1 unsubscribed", || {
        channels(&redis) == ["seats:CS101"]
    });
    drop(others);
    let _ = a.close(None);
    drop(a);
    eventually(T, "no channel left", || channels(&redis).is_empty());
    assert_eq!(numpat(&redis), 0);
}

#[test]
fn admin_firehose_holds_only_the_pattern_and_counts_once() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &["--admin-tick-ms", "1000", "--shards", "2"]);
    let mut s = client(&sb, "user=stud");
    watch(&mut s, "CS101");
    watch(&mut s, "MATH1");
    eventually(T, "per-course channels", || channels(&redis).len() == 2);

    let mut admin = ws_connect(sb.port, "/ws/admin?user=a&role=admin").expect("admin");
    next_json(&mut admin).expect("hello");
    eventually(T, "pattern only", || {
        numpat(&redis) == 1 && channels(&redis).is_empty()
    });
    // Wait for one admin frame so counting starts on a tick boundary.
    next_of_type(&mut admin, "admin", T).expect("first admin frame");
    let n = 12u64;
    for v in 1..=n {
        publish(
            &redis,
            "CS101",
            &payload("CS101", (v % 3) as u32, 40, v as u32, 100 + v),
        );
    }
    // Sum updates_per_s * tick over admin frames until the count settles.
    let mut total = 0.0;
    // The tick after the burst may already carry the rate back at 0.
    let mut zero_seen = false;
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < end {
        let Some(m) = next_of_type(&mut admin, "admin", Duration::from_secs(3)) else {
            break;
        };
        for c in m["courses"].as_array().unwrap() {
            if c["course"] == "CS101" {
                total += c["updates_per_s"].as_f64().unwrap() * 1.0;
            }
        }
        if total >= n as f64 {
            // One more tick to catch any double count.
            if let Some(m) = next_of_type(&mut admin, "admin", Duration::from_millis(1500)) {
                for c in m["courses"].as_array().unwrap() {
                    if c["course"] == "CS101" {
                        total += c["updates_per_s"].as_f64().unwrap();
                        zero_seen = c["updates_per_s"].as_f64() == Some(0.0);
                    }
                }
            }
            break;
        }
    }
    assert_eq!(total.round() as u64, n, "each snapshot counted once");
    // Quiet again: the rate comes back down to 0 rather than freezing.
    let zero = (0..4).filter(|_| !zero_seen).find_map(|_| {
        let m = next_of_type(&mut admin, "admin", Duration::from_secs(3))?;
        let c = m["courses"]
            .as_array()?
            .iter()
            .find(|c| c["course"] == "CS101")?
            .clone();
        (c["updates_per_s"].as_f64() == Some(0.0)).then_some(c)
    });
    assert!(
        zero_seen || zero.is_some(),
        "an aggregate with updates_per_s 0 follows the burst"
    );
    // The student still gets frames through the pattern.
    let f = read_until(&mut s, T, |m| {
        m["type"] == "frame" && m["course"] == "CS101"
    })
    .expect("student frame under the firehose");
    assert_eq!(f["course"], "CS101");

    let _ = admin.close(None);
    drop(admin);
    eventually(T, "back to per-course channels", || {
        numpat(&redis) == 0 && channels(&redis) == ["seats:CS101", "seats:MATH1"]
    });
    // And frames keep flowing on them.
    publish(&redis, "MATH1", &payload("MATH1", 0, 10, 3, 1));
    read_until(&mut s, T, |m| {
        m["type"] == "frame" && m["course"] == "MATH1"
    })
    .expect("frame after the admin left");
}

/// A PUBLISH over one raw RESP connection (no process per message), with its reply read.
fn resp_publish(conn: &mut BufReader<TcpStream>, course: &str, payload: &str) {
    let channel = format!("seats:{course}");
    let cmd = format!(
        "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{channel}\r\n${}\r\n{payload}\r\n",
        channel.len(),
        payload.len()
    );
    conn.get_mut().write_all(cmd.as_bytes()).expect("publish");
    let mut reply = String::new();
    conn.read_line(&mut reply).expect("publish reply");
    assert!(reply.starts_with(':'), "PUBLISH answered {reply:?}");
}

#[test]
fn a_storm_on_one_course_wakes_its_shard_per_token_not_per_batch() {
    let redis = RedisServer::start();
    // A long tick, so the hot course's tokens are far apart.
    let sb = serve(&redis, &["--shards", "1", "--tick-ms", "1000"]);
    let mut ws = client(&sb, "user=alice");
    watch(&mut ws, "HOT1");
    watch(&mut ws, "QUIET1");
    // The storm: one snapshot of HOT1 every millisecond, each its own PUBLISH,
    // so the ingest thread hands the shard a batch about as often.
    let stop = Arc::new(AtomicBool::new(false));
    let storm = {
        let stop = Arc::clone(&stop);
        let port = redis.port;
        std::thread::spawn(move || {
            let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", port)).unwrap());
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                resp_publish(
                    &mut conn,
                    "HOT1",
                    &payload("HOT1", (v % 4) as u32, 100, 1, v),
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            v
        })
    };
    let mut conn = BufReader::new(TcpStream::connect(("127.0.0.1", redis.port)).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    let (w0, t0) = (thread_wakeups(sb.pid(), "seatboard-shard"), Instant::now());
    // A quiet course's update (over a tick apart, so its pacer holds a token)
    // goes out at once, storm or not: well within a tick, never at the next
    // token.
    let mut took = Vec::new();
    for v in 1..=6u64 {
        std::thread::sleep(Duration::from_millis(1100));
        let sent = Instant::now();
        resp_publish(&mut conn, "QUIET1", &payload("QUIET1", 1, 50, v as u32, v));
        read_until(&mut ws, T, |m| {
            m["course"] == "QUIET1" && section(m, 1).is_some_and(|s| s["version"] == v)
        })
        .expect("the quiet course's update");
        took.push(sent.elapsed());
    }
    let woke = thread_wakeups(sb.pid(), "seatboard-shard") - w0;
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let published = storm.join().expect("storm thread");
    // Unannounced, it would wait for the shard's next wake-up: the hot
    // course's token, or the timer wheel's next cascade (up to 64 ms).
    took.sort();
    assert!(
        took[took.len() / 2] < Duration::from_millis(25)
            && took[took.len() - 1] < Duration::from_millis(1000),
        "a quiet course's updates took {took:?} (tick 1 s)"
    );
    // A batch of a course already armed on the shard's timer wakes nobody:
    // about two wake-ups per token (1/s) and the quiet course's, not one per
    // batch (~1,000/s, as before gates).
    let per_s = woke as f64 / secs;
    assert!(
        per_s < 300.0,
        "the shard woke {per_s:.0} times/s under {published} snapshots in {secs:.1} s"
    );
    let hot = read_until(&mut ws, T, |m| m["course"] == "HOT1").expect("hot frames flow");
    assert_eq!(hot["type"], "frame");
}

/// The courses of an admin message.
fn admin_courses(m: &serde_json::Value) -> Vec<String> {
    m["courses"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["course"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_course_whose_state_hash_is_deleted_leaves_a_connected_admin_s_view() {
    let redis = RedisServer::start();
    for c in ["KEEP1", "GONE1"] {
        redis.cli(&[
            "HSET",
            &format!("seatstate:{c}"),
            "1",
            &payload(c, 1, 30, 2, 4),
        ]);
    }
    let sb = serve(&redis, &["--admin-tick-ms", "300"]);
    let mut admin = ws_connect(sb.port, "/ws/admin?user=a&role=admin").expect("admin");
    next_json(&mut admin).expect("hello");
    let first = next_of_type(&mut admin, "admin", T).expect("first admin message");
    assert_eq!(first["full"], true);
    assert_eq!(admin_courses(&first), ["GONE1", "KEEP1"]);
    // A rehearsal's cleanup deletes its hashes: at the next rescan (every
    // 5 s) the course leaves the view, in a whole aggregate for the feed that
    // holds one already.
    redis.cli(&["DEL", "seatstate:GONE1"]);
    let gone = read_until(&mut admin, Duration::from_secs(15), |m| {
        m["type"] == "admin" && m["full"] == true
    })
    .expect("a full aggregate without the deleted course");
    assert_eq!(admin_courses(&gone), ["KEEP1"]);
    // A newcomer's first message does not show it either.
    let mut late = ws_connect(sb.port, "/ws/admin?user=b&role=admin").expect("admin");
    next_json(&mut late).expect("hello");
    let first = next_of_type(&mut late, "admin", T).expect("first admin message");
    assert_eq!(admin_courses(&first), ["KEEP1"]);
}
