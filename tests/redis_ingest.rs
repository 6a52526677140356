//! `serve` on a real Redis: the watch answer from the state hash, live frames,
//! Go field names, stale versions, rejects by reason, per-course subscriptions
//! that follow viewers, and the admin firehose (pattern only, no double count).

mod common;
mod redis_util;
use common::*;
use redis_util::*;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[test]
fn watch_is_answered_from_the_state_hash() {
    let redis = Redis::start();
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
    // /api/courses is built from the state hashes.
    let courses: Vec<String> =
        serde_json::from_str(&http_get(sb.port, "/api/courses").unwrap().body).unwrap();
    assert_eq!(courses, vec!["CS101".to_string()]);
    let h: serde_json::Value =
        serde_json::from_str(&http_get(sb.port, "/healthz").unwrap().body).unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["redis"], true);
}

#[test]
fn live_frames_go_names_stale_versions_and_rejects() {
    let redis = Redis::start();
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
    let redis = Redis::start();
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
    let redis = Redis::start();
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
