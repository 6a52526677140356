//! Courses named in the upgrade (`GET /ws?course=C&course=D`, contract
//! section 5) against a real `seatboard demo`: each is watched as if a
//! `watch` message had arrived right after the upgrade (its full frame and
//! presence follow the `hello` with no message from the client), a course a
//! `watch` would refuse gets the same `error` and the connection stays open.
//! Run on io_uring, epoll and tokio (`tests/run.sh`'s shell tests).

use crate::common;
use crate::raw;
use crate::redis_util;
use common::*;
use raw::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use testkit::delay_proxy::RedisAtDistance;

const T: Duration = Duration::from_secs(10);

fn demo() -> Seatboard {
    Seatboard::start(&["demo", "--shards", "2"])
}

/// Upgrades with `courses` in the query and reads the `hello`; sends nothing.
fn named(port: u16, user: &str, courses: &[&str]) -> RawWs {
    let query: String = courses.iter().map(|c| format!("&course={c}")).collect();
    let mut ws = RawWs::connect(port, &format!("/ws?user={user}{query}"));
    let hello = ws.next_json(T).expect("hello");
    assert_eq!(hello["type"], "hello", "{hello}");
    ws
}

/// Reads until every course of `want` has had its full frame and presence
/// (every message between them is one of those or an `error`); returns the
/// `error` codes seen on the way.
fn expect_boards(ws: &mut RawWs, want: &[&str]) -> Vec<String> {
    let mut frames = BTreeSet::new();
    let mut presence = BTreeSet::new();
    let mut errors = Vec::new();
    let want: BTreeSet<String> = want.iter().map(|c| c.to_string()).collect();
    while frames != want || presence != want {
        let m = ws
            .next_json(T)
            .unwrap_or_else(|| panic!("boards of {want:?}: have {frames:?} {presence:?}"));
        let course = m["course"].as_str().unwrap_or("").to_string();
        match m["type"].as_str() {
            Some("frame") => {
                assert_eq!(m["full"], true, "the watch answer is a full frame: {m}");
                assert!(m["sections"].is_array(), "{m}");
                assert!(frames.insert(course), "one answer per course: {m}");
            }
            Some("presence") => {
                assert!(m["viewers"].as_u64().is_some_and(|n| n >= 1), "{m}");
                presence.insert(course);
            }
            Some("error") => errors.push(m["code"].as_str().unwrap_or("").to_string()),
            _ => panic!("unexpected message {m}"),
        }
    }
    errors
}

#[test]
fn one_course_in_the_upgrade_gets_its_board_with_no_message_sent() {
    let sb = demo();
    let mut ws = named(sb.port, "one", &["CS101"]);
    let f = ws.next_of_type("frame", T).expect("CS101's full frame");
    assert_eq!(f["course"], "CS101");
    assert_eq!(f["full"], true);
    assert!(
        f["sections"].as_array().is_some_and(|s| !s.is_empty()),
        "the demo's CS101 has sections: {f}"
    );
    let p = ws.next_of_type("presence", T).expect("presence");
    assert_eq!(p["course"], "CS101");
    // Live frames follow as for a watch message; a watch message still works.
    ws.text(r#"{"op":"watch","course":"MATH101"}"#);
    expect_boards(&mut ws, &["MATH101"]);
    ws.assert_alive();
}

#[test]
fn an_upgrade_whose_head_takes_several_reads_gets_its_board() {
    let sb = demo();
    // Over the 2 KiB a connection's first read takes: the rest of the head
    // is read through the runtime, then upgraded as a head read at once is.
    let pad = format!("X-Pad: {}\r\n", "p".repeat(3 * 1024));
    let (mut ws, _) = RawWs::connect_extra(sb.port, "/ws?user=long&course=CS101", &pad);
    let hello = ws.next_json(T).expect("hello");
    assert_eq!(hello["type"], "hello", "{hello}");
    let errors = expect_boards(&mut ws, &["CS101"]);
    assert!(errors.is_empty(), "{errors:?}");
    ws.assert_alive();
}

#[test]
fn eight_courses_in_the_upgrade_get_eight_boards() {
    let sb = demo();
    let eight = [
        "CS101", "CS102", "CS201", "MATH101", "MATH115", "BIO101", "ECON101", "PHYS101",
    ];
    let mut ws = named(sb.port, "eight", &eight);
    let errors = expect_boards(&mut ws, &eight);
    assert!(errors.is_empty(), "{errors:?}");
    ws.assert_alive();
}

#[test]
fn an_unknown_course_in_the_upgrade_gets_an_empty_board() {
    let sb = demo();
    let mut ws = named(sb.port, "unknown", &["NOPE-404", "CS101"]);
    let mut empty_seen = false;
    for _ in 0..2 {
        let f = ws.next_of_type("frame", T).expect("both answers");
        if f["course"] == "NOPE-404" {
            assert_eq!(f["full"], true);
            assert_eq!(f["sections"], serde_json::json!([]), "{f}");
            empty_seen = true;
        }
    }
    assert!(empty_seen);
    ws.assert_alive();
}

#[test]
fn hostile_codes_in_the_upgrade_get_bad_course_and_the_rest_are_watched() {
    let sb = demo();
    let before = metric_value(&sb.metrics(), "seatboard_client_errors_total");
    let long = "A".repeat(65);
    let hostile = [
        "%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "CS%20101",
        "a%00b",
        "%FF%FE",
        "",
        "..%2F..%2Fetc",
        long.as_str(),
    ];
    let mut courses: Vec<&str> = hostile.to_vec();
    courses.push("CS101");
    let mut ws = named(sb.port, "hostile", &courses);
    let errors = expect_boards(&mut ws, &["CS101"]);
    let mut all = errors;
    while all.len() < 7 {
        all.push(
            ws.next_of_type("error", T).expect("an error per bad code")["code"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    // `..%2F..%2Fetc` decodes to `../../etc`: malformed too.
    assert_eq!(all.len(), 7, "{all:?}");
    assert!(all.iter().all(|c| c == "bad_course"), "{all:?}");
    ws.assert_alive();
    assert!(
        wait_for(T, || {
            let n = metric_value(&sb.metrics(), "seatboard_client_errors_total");
            (n >= before + 7.0).then_some(())
        })
        .is_some(),
        "the refusals are counted"
    );
}

#[test]
fn more_than_32_courses_in_the_upgrade_are_refused_past_the_cap() {
    let sb = demo();
    let codes: Vec<String> = (0..34).map(|i| format!("C{i}")).collect();
    let refs: Vec<&str> = codes.iter().map(String::as_str).collect();
    let mut ws = named(sb.port, "many", &refs);
    let errors = expect_boards(&mut ws, &refs[..32]);
    let mut all = errors;
    while all.len() < 2 {
        all.push(
            ws.next_of_type("error", T).expect("an error past the cap")["code"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    assert_eq!(all, ["too_many_courses", "too_many_courses"]);
    // Unwatching one makes room, as for watch messages.
    ws.text(r#"{"op":"unwatch","course":"C0"}"#);
    ws.text(r#"{"op":"watch","course":"CS101"}"#);
    expect_boards(&mut ws, &["CS101"]);
    ws.assert_alive();
}

/// Upgrades with `path` on a raw socket and reads once: the whole frames
/// that came in that one read behind the `101`'s head (one send of the node
/// is one read on loopback).
fn first_read(port: u16, path: &str) -> Vec<serde_json::Value> {
    first_read_kept(port, path).0
}

/// [`first_read`], and the socket, open.
fn first_read_kept(port: u16, path: &str) -> (Vec<serde_json::Value>, TcpStream) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(T)).expect("timeout");
    s.write_all(upgrade_request(path, "").as_bytes())
        .expect("upgrade");
    let mut buf = vec![0u8; 256 * 1024];
    let n = s.read(&mut buf).expect("read");
    let end = buf[..n]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the 101's head")
        + 4;
    assert!(buf.starts_with(b"HTTP/1.1 101"));
    let mut at = end;
    let mut messages = Vec::new();
    while let Ok(Some(f)) = shards::read_server_frame(&buf[at..n]) {
        messages.push(serde_json::from_slice(f.payload).expect("JSON"));
        at += f.len;
    }
    assert_eq!(at, n, "whole frames only");
    (messages, s)
}

fn types(messages: &[serde_json::Value]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m["type"].as_str().unwrap_or(""))
        .collect()
}

#[test]
fn a_held_course_rides_in_the_same_write_as_the_101() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    // The first viewer makes the one shard hold CS101.
    let mut first = named(sb.port, "first", &["CS101"]);
    first.next_of_type("frame", T).expect("first board");
    let (got, mut s) = first_read_kept(sb.port, "/ws?user=second&course=CS101");
    assert_eq!(types(&got), ["hello", "frame"]);
    // The count follows (the demo's frames may come before it), read after
    // the new viewer's join was written.
    let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 4096]);
    let count = loop {
        let n = s.read(&mut chunk).expect("the count");
        assert!(n > 0, "closed before the count");
        buf.extend_from_slice(&chunk[..n]);
        let mut found = None;
        while let Ok(Some(f)) = shards::read_server_frame(&buf) {
            let m: serde_json::Value = serde_json::from_slice(f.payload).expect("JSON");
            let used = f.len;
            buf.drain(..used);
            if m["type"] != "frame" {
                found = Some(m);
                break;
            }
        }
        if let Some(m) = found {
            break m;
        }
    };
    assert_eq!(count["type"], "presence", "{count}");
    assert_eq!(count["viewers"], 2, "first and second");
}

/// `serve` on Redis `one_way` away behind the test kit's delay proxy, one
/// shard, once its pub/sub is up.
fn serve_far(far: &RedisAtDistance) -> Seatboard {
    let uri = far.far_uri();
    let args = ["serve", "--auth", "none", "--redis", &uri, "--shards", "1"];
    let sb = Seatboard::start(&args);
    wait_for(T, || (healthz_json(sb.port)["redis"] == true).then_some(()))
        .expect("the node's Redis connection did not come up");
    sb
}

#[test]
fn a_course_new_to_the_node_rides_in_the_same_write_as_the_101() {
    // Redis 40 ms away: the seed is a subscribe and a read away, so a `101`
    // written before it would reach the client alone.
    let far = RedisAtDistance::start(Duration::from_millis(20));
    far.redis.cli(&[
        "HSET",
        "seatstate:COLD1",
        "7",
        &redis_util::payload("COLD1", 7, 30, 29, 3),
    ]);
    let sb = serve_far(&far);
    let got = first_read(sb.port, "/ws?user=cold&course=COLD1&course=COLD2");
    assert_eq!(
        types(&got),
        ["hello", "frame", "presence", "frame", "presence"],
        "{got:?}"
    );
    let board = |course: &str| {
        got.iter()
            .find(|m| m["type"] == "frame" && m["course"] == course)
            .map(|m| m["sections"].clone())
    };
    assert_eq!(board("COLD1").expect("COLD1")[0]["seats_taken"], 29);
    assert_eq!(board("COLD2"), Some(serde_json::json!([])), "no state hash");
    // An SSE stream's head waits the same way.
    let sse = sse_first_read(sb.port, "/sse?course=COLD3&user=streamer");
    assert!(sse.contains("\"course\":\"COLD3\",\"full\":true"), "{sse}");
}

/// Opens `/sse` with `path` and reads once: the response head and what came with it.
fn sse_first_read(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(T)).expect("timeout");
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    s.write_all(req.as_bytes()).expect("request");
    let mut buf = vec![0u8; 64 * 1024];
    let n = s.read(&mut buf).expect("read");
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

#[test]
fn a_silent_redis_holds_the_101_no_longer_than_the_seed_patience() {
    let far = RedisAtDistance::start(Duration::from_millis(1));
    let sb = serve_far(&far);
    // Redis stops answering without closing (no RST, no FIN).
    far.proxy.blackhole(true);
    let asked = Instant::now();
    let got = first_read(sb.port, "/ws?user=patient&course=QUIET1");
    let took = asked.elapsed();
    assert_eq!(types(&got), ["hello", "frame", "presence"], "{got:?}");
    assert_eq!(
        got[1]["sections"],
        serde_json::json!([]),
        "what the node holds"
    );
    // The ingest thread answers within its 2 s patience; the node notices
    // the silent Redis only after that, within 10 s.
    assert!(took < Duration::from_secs(5), "the 101 waited {took:?}");
}

#[test]
fn a_course_named_twice_is_answered_twice_and_watched_once() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    // The one shard holds C0, so its board is there when the names are read.
    let mut first = named(sb.port, "first", &["C0"]);
    first.next_of_type("frame", T).expect("first board");
    // C0 twice among 32 distinct courses: each name is a `watch`, and a second
    // watch of a held, watched course re-answers with its board, taking no room.
    let mut codes: Vec<String> = (0..32).map(|i| format!("C{i}")).collect();
    codes.insert(1, "C0".into());
    let refs: Vec<&str> = codes.iter().map(String::as_str).collect();
    let mut ws = named(sb.port, "twice", &refs);
    let mut answers: std::collections::BTreeMap<String, u32> = Default::default();
    while answers.values().sum::<u32>() < 33 {
        let m = ws
            .next_json(T)
            .unwrap_or_else(|| panic!("33 answers: {answers:?}"));
        match m["type"].as_str() {
            Some("frame") => {
                assert_eq!(m["full"], true, "{m}");
                let course = m["course"].as_str().unwrap_or("").to_string();
                *answers.entry(course).or_default() += 1;
            }
            Some("presence") => {}
            _ => panic!("unexpected message {m}"),
        }
    }
    assert_eq!(answers.len(), 32, "{answers:?}");
    assert_eq!(answers["C0"], 2, "C0's board twice");
    assert!(
        answers.iter().all(|(c, n)| c == "C0" || *n == 1),
        "{answers:?}"
    );
    // The connection holds 32 courses: one more is past the cap.
    ws.text(r#"{"op":"watch","course":"CS101"}"#);
    let e = ws.next_of_type("error", T).expect("past the cap");
    assert_eq!(e["code"], "too_many_courses", "{e}");
    ws.assert_alive();
}

#[test]
fn a_held_course_s_count_is_read_after_the_join_with_redis_5_ms_away() {
    // Redis 2.5 ms each way. A viewer on another node is written after the
    // node's last count of the course; a new viewer here is answered with
    // the board at once and then with the count Redis holds after its own
    // join: the three of them, not the node's last count and itself.
    let far = RedisAtDistance::start(Duration::from_micros(2_500));
    let sb = serve_far(&far);
    let mut first = named(sb.port, "a", &["FAR1"]);
    let p = first.next_of_type("presence", T).expect("a's count");
    assert_eq!(p["viewers"], 1);
    let expiry = (std::time::SystemTime::now() + Duration::from_secs(60))
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        .to_string();
    far.redis.cli(&["ZADD", "presence:FAR1", &expiry, "b"]);
    let asked = Instant::now();
    let (got, mut s) = first_read_kept(sb.port, "/ws?user=c&course=FAR1");
    assert_eq!(types(&got), ["hello", "frame"], "{got:?}");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).expect("the count");
    let f = shards::read_server_frame(&buf[..n])
        .ok()
        .flatten()
        .expect("a whole frame");
    let count: serde_json::Value = serde_json::from_slice(f.payload).expect("JSON");
    println!("the count came {:?} after the upgrade", asked.elapsed());
    assert_eq!(count["type"], "presence", "{count}");
    assert_eq!(count["viewers"], 3, "a, b on another node, and c");
}
