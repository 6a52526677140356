//! A course holds at most 4,096 sections (contract §2): a state hash of
//! 100,000 fields is read up to the cap and the rest counted
//! `too_many_sections`, a live snapshot of a section past the cap is counted
//! the same way, and new viewers of other courses get their first frames
//! while the giant hash is read: a hash at the cap of sections of a
//! kilobyte each (4 MiB) holds up a small course read beside it by one step
//! of its read, not by the whole of it.

use crate::common::*;
use crate::redis_util::*;
use serde_json::json;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(15);
const CAP: usize = 4096;
const FIELDS: usize = 100_000;
const TOO_MANY: &str = "seatboard_ingest_rejected_total{reason=\"too_many_sections\"}";

#[test]
fn a_giant_state_hash_is_read_up_to_the_cap_and_delays_no_other_course() {
    let redis = RedisServer::start();
    let fill = "for i = 0, tonumber(ARGV[1]) - 1 do \
        redis.call('HSET', KEYS[1], i, '{\"course\":\"BIG\",\"section\":' .. i .. \
        ',\"total_seats\":10,\"seats_taken\":1,\"version\":1}') end return 1";
    redis.cli(&["EVAL", fill, "1", "seatstate:BIG", &FIELDS.to_string()]);
    assert_eq!(redis.cli(&["HLEN", "seatstate:BIG"]), FIELDS.to_string());
    seed_courses(&redis, 5);
    let sb = serve(&redis, &[]);
    assert!(
        sb.metrics().lines().any(|l| l == format!("{TOO_MANY} 0")),
        "too_many_sections not at 0 from start"
    );
    let mut big = client(&sb, "user=big");
    let mut others: Vec<Ws> = (0..5).map(|i| client(&sb, &format!("user=o{i}"))).collect();
    // The giant course is asked first, the others right behind it.
    send_json(&mut big, json!({"op":"watch","course":"BIG"}));
    let asked = Instant::now();
    for (i, ws) in others.iter_mut().enumerate() {
        send_json(ws, json!({"op":"watch","course":seeded_course(i)}));
    }
    let mut firsts = Vec::new();
    for (i, ws) in others.iter_mut().enumerate() {
        let f = next_of_type(ws, "frame", T).expect("first frame");
        firsts.push(asked.elapsed());
        assert_eq!(f["course"], seeded_course(i));
        assert_eq!(f["sections"].as_array().map(Vec::len), Some(3));
    }
    let f = next_of_type(&mut big, "frame", T).expect("BIG's first frame");
    let big_first = asked.elapsed();
    println!("first frames of 5 courses beside a {FIELDS}-field hash: {firsts:?}; BIG's own {big_first:?}");
    assert_eq!(f["course"], "BIG");
    assert_eq!(f["sections"].as_array().map(Vec::len), Some(CAP));
    // Read beside the giant hash's first step, not after its whole read.
    for t in &firsts {
        assert!(*t < big_first / 2, "{t:?} against BIG's {big_first:?}");
    }
    eventually(T, "the fields past the cap counted", || {
        sb.metric(TOO_MANY) >= (FIELDS - CAP) as f64
    });
    // A live snapshot of a new section past the cap: rejected, counted.
    let before = sb.metric(TOO_MANY);
    publish(&redis, "BIG", &payload("BIG", 500_000, 10, 1, 1));
    eventually(T, "a live section past the cap counted", || {
        sb.metric(TOO_MANY) > before
    });
    // A section the board holds still takes its updates.
    let held = f["sections"][0]["section"].as_u64().expect("a section") as u32;
    publish(&redis, "BIG", &payload("BIG", held, 10, 7, 2));
    let upd = read_until(&mut big, T, |m| {
        m["type"] == "frame" && section(m, u64::from(held)).is_some_and(|s| s["seats_taken"] == 7)
    });
    assert!(upd.is_some(), "a held section's update never came");
}

#[test]
fn a_course_read_beside_four_mib_of_state_gets_its_board_after_one_step_of_it() {
    let redis = RedisServer::start();
    // 4,096 sections of about a kilobyte each: a hash at the cap, 4 MiB.
    let fill = "local pad = string.rep('x', 1000) for i = 0, 4095 do \
        redis.call('HSET', KEYS[1], i, '{\"course\":\"MID\",\"section\":' .. i .. \
        ',\"total_seats\":10,\"seats_taken\":1,\"version\":1,\"seat_info\":{\"pad\":\"' .. pad .. '\"}}') end return 1";
    redis.cli(&["EVAL", fill, "1", "seatstate:MID"]);
    assert_eq!(redis.cli(&["HLEN", "seatstate:MID"]), CAP.to_string());
    seed_courses(&redis, 1);
    let sb = serve(&redis, &["--compression", "off"]);
    let mut mid = client(&sb, "user=m");
    let mut small = client(&sb, "user=s");
    send_json(&mut mid, json!({"op":"watch","course":"MID"}));
    let asked = Instant::now();
    send_json(&mut small, json!({"op":"watch","course":seeded_course(0)}));
    next_of_type(&mut small, "frame", T).expect("the small course's first frame");
    let small_first = asked.elapsed();
    let f = next_of_type(&mut mid, "frame", T).expect("MID's first frame");
    let mid_first = asked.elapsed();
    println!("a 1-section course beside 4 MiB of state: {small_first:?}; the 4 MiB course's own {mid_first:?}");
    assert_eq!(f["sections"].as_array().map(Vec::len), Some(CAP));
    assert!(
        small_first < mid_first / 2,
        "{small_first:?} against MID's {mid_first:?}"
    );
}
