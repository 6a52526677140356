//! Shared by the Redis integration tests: a `serve` node on a test
//! Redis, watching a course, publishing raw payloads, reading until a condition.
#![allow(dead_code)]

pub mod cut;

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `seatboard serve --auth none` on `redis`, two shards, fast ticks, plus
/// `extra`; when `redis` runs, returns once the node's pub/sub connection is
/// up (`/healthz` answers 200 before that, and a course watched in between is
/// subscribed only when it connects, so a PUBLISH right after the watch
/// answer could go unseen).
pub fn serve(redis: &RedisServer, extra: &[&str]) -> Seatboard {
    let sb = serve_on(&redis.uri(), extra);
    if redis.running() {
        wait_for(Duration::from_secs(15), || {
            (healthz_json(sb.port)["redis"] == true).then_some(())
        })
        .expect("the node's Redis connection did not come up");
    }
    sb
}

/// `seatboard serve --auth none --redis uri`, two shards and fast ticks
/// unless `extra` says otherwise, plus `extra`; returns once it answers.
pub fn serve_on(uri: &str, extra: &[&str]) -> Seatboard {
    let mut args = vec!["serve", "--auth", "none", "--redis", uri];
    args.extend_from_slice(extra);
    if !extra.contains(&"--tick-ms") {
        args.extend_from_slice(&["--tick-ms", "50"]);
    }
    if !extra.contains(&"--shards") {
        args.extend_from_slice(&["--shards", "2"]);
    }
    Seatboard::start(&args)
}

/// A connected client (hello already read).
pub fn client(sb: &Seatboard, query: &str) -> Ws {
    let mut ws = ws_connect(sb.port, &format!("/ws?{query}")).expect("connect");
    let hello = next_json(&mut ws).expect("hello");
    assert_eq!(hello["type"], "hello");
    ws
}

/// Watches `course` and returns the watch answer (a full frame).
pub fn watch(ws: &mut Ws, course: &str) -> Value {
    send_json(ws, json!({"op":"watch","course":course}));
    let f = next_of_type(ws, "frame", Duration::from_secs(10)).expect("watch answer");
    assert_eq!(f["course"], course);
    assert_eq!(f["full"], true);
    f
}

/// A contract payload.
pub fn payload(course: &str, section: u32, total: u32, taken: u32, version: u64) -> String {
    json!({"course":course,"section":section,"total_seats":total,"seats_taken":taken,
           "seat_info":{"room":"B12"},"version":version})
    .to_string()
}

/// PUBLISH `payload` on `seats:<course>`.
pub fn publish(redis: &RedisServer, course: &str, payload: &str) {
    redis.cli(&["PUBLISH", &format!("seats:{course}"), payload]);
}

/// Reads messages until `pred` holds for one (returned) or `timeout` passes.
pub fn read_until(
    ws: &mut Ws,
    timeout: Duration,
    mut pred: impl FnMut(&Value) -> bool,
) -> Option<Value> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let m = next_json(ws)?;
        if pred(&m) {
            return Some(m);
        }
    }
    None
}

/// The channels Redis has subscribers for (`PUBSUB CHANNELS`), sorted.
pub fn channels(redis: &RedisServer) -> Vec<String> {
    let mut v: Vec<String> = redis
        .cli(&["PUBSUB", "CHANNELS"])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// `PUBSUB NUMPAT`.
pub fn numpat(redis: &RedisServer) -> u64 {
    redis
        .cli(&["PUBSUB", "NUMPAT"])
        .trim()
        .parse()
        .unwrap_or(u64::MAX)
}

/// Waits until `f` is true.
pub fn eventually(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    wait_for(timeout, || f().then_some(())).unwrap_or_else(|| panic!("timed out waiting: {what}"));
}

/// The section entry for `section` in a frame, if present.
pub fn section(frame: &Value, section: u64) -> Option<Value> {
    frame["sections"]
        .as_array()?
        .iter()
        .find(|s| s["section"].as_u64() == Some(section))
        .cloned()
}

/// One RESP command.
fn resp(args: &[&str]) -> String {
    let mut s = format!("*{}\r\n", args.len());
    for a in args {
        s.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s
}

/// The code of the `i`th course [`seed_courses`] writes: `U00000`, `U00001`, ...
pub fn seeded_course(i: usize) -> String {
    format!("U{i:05}")
}

/// Writes `n` state hashes of 3 sections each (40 seats; 10, 20 and 30
/// taken; version 1) in one pipeline, replies read.
pub fn seed_courses(redis: &RedisServer, n: usize) {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", redis.port)).expect("redis");
    let mut out = String::new();
    for i in 0..n {
        let c = seeded_course(i);
        let key = format!("seatstate:{c}");
        let p: Vec<String> = (1..=3).map(|s| payload(&c, s, 40, s * 10, 1)).collect();
        out.push_str(&resp(&["HSET", &key, "1", &p[0], "2", &p[1], "3", &p[2]]));
    }
    conn.write_all(out.as_bytes()).expect("pipeline");
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).expect("reply");
        assert!(line.starts_with(':'), "HSET reply: {line}");
    }
}
