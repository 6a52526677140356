//! The admin view at a real university's size on real Redis (contract §5,
//! Admin): 10,000 courses with state hashes reach a new admin in one full
//! message, compressed or not, then deltas of what changed; and a student
//! watching hundreds of made-up names while an admin is connected leaves no
//! trace in the next admin's full message, and nothing held by the node.

use crate::common;
use crate::raw;
use crate::redis_util;
use common::*;
use raw::RawWs;
use redis_util::*;
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
const OFFER: &str = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";

/// Opens an admin feed and reads its hello; `deflate`: offers permessage-deflate.
fn admin(port: u16, deflate: bool) -> RawWs {
    let (mut ws, head) = RawWs::connect_extra(
        port,
        "/ws/admin?user=boss&role=admin",
        if deflate { OFFER } else { "" },
    );
    assert_eq!(ws.deflate, deflate, "{head}");
    assert_eq!(ws.next_json(T).expect("hello")["type"], "hello");
    ws
}

/// The next admin message, and whether it came compressed.
fn next_admin(ws: &mut RawWs, timeout: Duration) -> Option<(Value, bool)> {
    let end = Instant::now() + timeout;
    loop {
        match ws.read(end.saturating_duration_since(Instant::now())) {
            raw::Got::Frame(f) if f.opcode == raw::OP_TEXT => {
                let v = f.json().expect("JSON");
                if v["type"] == "admin" {
                    return Some((v, f.compressed));
                }
            }
            raw::Got::Frame(f) if f.opcode == raw::OP_CLOSE => return None,
            raw::Got::Frame(_) => {}
            _ => return None,
        }
    }
}

fn codes(msg: &Value) -> Vec<String> {
    msg["courses"]
        .as_array()
        .expect("courses")
        .iter()
        .map(|c| c["course"].as_str().expect("code").to_owned())
        .collect()
}

/// Connects an admin and returns its first admin message, how long it took
/// from connect, and whether it came compressed.
fn first_admin(port: u16, deflate: bool) -> (RawWs, Value, Duration, bool) {
    let t0 = Instant::now();
    let mut ws = admin(port, deflate);
    let (msg, compressed) = next_admin(&mut ws, T).expect("first admin message");
    (ws, msg, t0.elapsed(), compressed)
}

#[test]
fn ten_thousand_courses_reach_a_new_admin_in_one_full_message_then_deltas() {
    let n = 10_000;
    let redis = RedisServer::start();
    seed_courses(&redis, n);
    let sb = serve(&redis, &["--shards", "2"]);
    let want: Vec<String> = (0..n).map(seeded_course).collect();

    // Compressed, the firehose turning on for it (standalone Redis: the state
    // hashes are scanned).
    let (mut a, msg, took, compressed) = first_admin(sb.port, true);
    eprintln!("first admin message, compressed, firehose off before: {took:?}");
    assert_eq!(msg["full"], true);
    assert!(compressed, "a message of 1 MB goes compressed");
    assert_eq!(codes(&msg), want, "every course with a state hash, sorted");
    let row = &msg["courses"][7];
    assert_eq!(
        (row["sections"].as_u64(), row["total_seats"].as_u64()),
        (Some(3), Some(120))
    );
    assert_eq!(row["seats_taken"], 60);
    // Then only what changed.
    publish(
        &redis,
        &seeded_course(42),
        &payload(&seeded_course(42), 2, 40, 40, 2),
    );
    let (delta, _) = next_admin(&mut a, T).expect("delta");
    assert_eq!(delta["full"], false);
    assert_eq!(codes(&delta), [seeded_course(42)]);
    assert_eq!(delta["courses"][0]["seats_taken"], 80);
    assert_eq!(delta["courses"][0]["full_sections"], 1);
    // Uncompressed, the firehose already on: a full message too, current.
    let (mut b, msg, took, compressed) = first_admin(sb.port, false);
    eprintln!("first admin message, uncompressed, firehose on: {took:?}");
    assert!(!compressed);
    assert_eq!(msg["full"], true);
    assert_eq!(codes(&msg).len(), n);
    let hot = msg["courses"].as_array().unwrap()[42].clone();
    assert_eq!(
        (hot["course"].as_str(), hot["seats_taken"].as_u64()),
        (Some("U00042"), Some(80))
    );
    // Both get the next delta (the rate of U00042 falling to 0 is a change).
    publish(
        &redis,
        &seeded_course(7),
        &payload(&seeded_course(7), 1, 40, 11, 2),
    );
    for ws in [&mut a, &mut b] {
        let got = wait_for(T, || {
            let (m, _) = next_admin(ws, T)?;
            assert_eq!(m["full"], false);
            assert!(
                codes(&m).len() <= 2,
                "only changed entries: {:?}",
                codes(&m)
            );
            codes(&m).contains(&seeded_course(7)).then_some(m)
        });
        assert!(got.is_some(), "a delta naming U00007");
    }
    drop(a);
    drop(b);
    eventually(T, "firehose off", || numpat(&redis) == 0);

    // Uncompressed with the firehose off before.
    let (_c, msg, took, _) = first_admin(sb.port, false);
    eprintln!("first admin message, uncompressed, firehose off before: {took:?}");
    assert_eq!(msg["full"], true);
    assert_eq!(codes(&msg), want);
}

#[test]
fn made_up_course_names_watched_under_an_admin_leave_no_trace() {
    let redis = RedisServer::start();
    seed_courses(&redis, 50);
    let sb = serve(&redis, &["--shards", "2"]);
    let mut boss = admin(sb.port, false);
    let (first, _) = next_admin(&mut boss, T).expect("first admin message");
    assert_eq!(codes(&first).len(), 50);
    wait_for(T, || {
        (sb.metric("seatboard_ingest_courses") == 50.0).then_some(())
    })
    .expect("the node holds the 50 real courses");
    let rss_before = rss_kb(sb.pid());

    // One student at a time, 16 connections (the per-user cap), 19 made-up
    // names each (under the 20 messages/s limit), three rounds.
    let mut round = 0;
    for r in 0..3 {
        let user = format!("user=mallory{r}");
        let mut conns: Vec<Ws> = (0..16).map(|_| client(&sb, &user)).collect();
        for ws in conns.iter_mut() {
            for _ in 0..19 {
                round += 1;
                let name = format!("FAKE{round}");
                send_json(ws, json!({"op":"watch","course":name}));
            }
        }
        for ws in conns.iter_mut() {
            // Every watch answered (an empty board): the names are held now.
            for _ in 0..19 {
                next_of_type(ws, "frame", T).expect("watch answer");
            }
        }
        assert!(sb.metric("seatboard_ingest_courses") >= 50.0 + 304.0);
        drop(conns);
        wait_for(T, || {
            (sb.metric("seatboard_ingest_courses") == 50.0).then_some(())
        })
        .expect("every made-up name let go once its watchers left");
    }
    assert_eq!(round, 912);
    // Nothing reached the admin, and the next admin's full message has none.
    while let Some((m, _)) = next_admin(&mut boss, Duration::from_millis(1_600)) {
        assert!(codes(&m).iter().all(|c| !c.starts_with("FAKE")), "{m}");
    }
    let mut next = admin(sb.port, false);
    let (full, _) = next_admin(&mut next, T).expect("full");
    assert_eq!(full["full"], true);
    assert_eq!(codes(&full).len(), 50);
    let rss_after = rss_kb(sb.pid());
    eprintln!("RSS before {rss_before} kB, after 912 made-up names {rss_after} kB");
    assert!(
        rss_after < rss_before + 4 * 1024,
        "RSS grew from {rss_before} to {rss_after} kB"
    );
}

/// Resident set size of a process (kB).
fn rss_kb(pid: i32) -> u64 {
    let mut s = String::new();
    std::fs::File::open(format!("/proc/{pid}/status"))
        .and_then(|mut f| f.read_to_string(&mut s))
        .expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}
