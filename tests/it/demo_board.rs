//! `seatboard demo` end to end, on each shell (io_uring, epoll, and tokio with
//! the feature `tokio-shell`): hello, watch, full answer, frames that never
//! regress and converge on what a fresh viewer sees, the per-tick bound,
//! presence, ping and pong, the plain HTTP endpoints and refusals, and the
//! close handshake.

use crate::common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;

fn board_end_to_end(driver: &str) {
    let sb = Seatboard::start(&[
        "demo",
        "--driver",
        driver,
        "--shards",
        "2",
        "--tick-ms",
        "200",
    ]);
    let mut a = ws_connect(sb.port, "/ws?user=alice").expect("connect");
    let hello = next_json(&mut a).expect("hello");
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["user"], "alice");
    assert_eq!(hello["role"], "student");
    assert_eq!(hello["tick_ms"], 200);
    assert!(hello["node"].as_str().is_some_and(|s| !s.is_empty()));

    let course = "ART150"; // the simulator's hottest course
    send_json(&mut a, json!({"op":"watch","course":course}));
    let first = next_of_type(&mut a, "frame", Duration::from_secs(5)).expect("watch answer");
    assert_eq!(first["course"], course);
    assert_eq!(first["full"], true, "the watch answer is a full frame");
    let ids: Vec<u64> = first["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["section"].as_u64().unwrap())
        .collect();
    assert!(!ids.is_empty(), "the demo seeds every section");
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "sections sorted: {ids:?}"
    );
    let mut board = Board::default();
    board.apply(&first);

    // Frames for a few seconds: never a regression, at most one per tick.
    let mut times: Vec<Instant> = Vec::new();
    let mut got_presence = false;
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        let Some(m) = next_json(&mut a) else { break };
        match m["type"].as_str() {
            Some("frame") => {
                assert_eq!(m["full"], false);
                for s in m["sections"].as_array().unwrap() {
                    let id = s["section"].as_u64().unwrap();
                    let v = s["version"].as_u64().unwrap();
                    assert!(
                        v >= board.version(id),
                        "section {id} went from {} to {v}",
                        board.version(id)
                    );
                }
                board.apply(&m);
                times.push(Instant::now());
            }
            Some("presence") => {
                assert_eq!(m["course"], course);
                assert!(m["viewers"].as_u64().unwrap() >= 1);
                got_presence = true;
            }
            _ => {}
        }
    }
    assert!(got_presence, "presence is sent on watch");
    assert!(
        times.len() >= 5,
        "the hot course changes several times in 4 s, got {}",
        times.len()
    );
    // Arrival times can bunch up a little when the machine is busy (a late
    // frame followed by an on-time one), so count frames per second rather than
    // gaps: 5 per second at a 200 ms tick, plus slack for one late arrival.
    for (i, t) in times.iter().enumerate() {
        let in_window = times[i..]
            .iter()
            .take_while(|u| **u - *t < Duration::from_secs(1))
            .count();
        assert!(in_window <= 7, "{in_window} frames within one second");
    }
    assert!(
        times.len() <= 4 * 5 + 2,
        "at most one frame per tick: {}",
        times.len()
    );

    // A fresh viewer's full answer; afterwards the old viewer must hold at least
    // that state for every section, and nothing the fresh one lacks.
    let mut b = ws_connect(sb.port, "/ws?user=bob").expect("connect b");
    next_json(&mut b).expect("hello b");
    send_json(&mut b, json!({"op":"watch","course":course}));
    let fresh = next_of_type(&mut b, "frame", Duration::from_secs(5)).expect("b's answer");
    let mut fresh_board = Board::default();
    fresh_board.apply(&fresh);
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        if let Some(m) = next_json(&mut a) {
            if m["type"] == "frame" {
                board.apply(&m);
            }
        }
    }
    assert_eq!(
        board.0.keys().collect::<Vec<_>>(),
        fresh_board.0.keys().collect::<Vec<_>>(),
        "same sections"
    );
    for (id, s) in &fresh_board.0 {
        assert!(
            board.version(*id) >= s["version"].as_u64().unwrap(),
            "section {id} is behind"
        );
    }

    // Presence counts distinct users: alice and bob.
    let p = next_of_type(&mut b, "presence", Duration::from_secs(8));
    let counts: Vec<u64> = std::iter::successors(p, |_| {
        next_of_type(&mut b, "presence", Duration::from_secs(5))
    })
    .take(3)
    .filter_map(|m| m["viewers"].as_u64())
    .collect();
    assert!(counts.contains(&2), "two distinct viewers, saw {counts:?}");

    // Plain HTTP.
    let h = http_get(sb.port, "/healthz").unwrap();
    let v: serde_json::Value = serde_json::from_str(&h.body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["shards"], 2);
    assert_eq!(v["connections"], 2);
    assert_eq!(v["draining"], false);
    assert_eq!(http_get(sb.port, "/nope").unwrap().status, 404);
    assert_eq!(
        http_raw(sb.port, b"DELETE /healthz HTTP/1.1\r\n\r\n")
            .unwrap()
            .status,
        405
    );
    assert_eq!(http_get(sb.port, "/readyz").unwrap().status, 200);
    let page = http_get(sb.port, "/").unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<title>seatboard</title>"));
    let courses: Vec<String> =
        serde_json::from_str(&http_get(sb.port, "/api/courses").unwrap().body).unwrap();
    assert!(courses.contains(&course.to_string()));
    // Every course of the simulator, each seeded before the port opened.
    let mut all: Vec<String> = seatboard::cmd::simulator::DEMO_COURSES
        .iter()
        .map(|c| c.to_string())
        .collect();
    all.sort();
    let mut listed = courses.clone();
    listed.sort();
    assert_eq!(listed, all, "/api/courses of the demo");
    let m = sb.metrics();
    assert!(metric_value(&m, "seatboard_frames_sent_total") > 0.0);
    assert_eq!(metric_value(&m, "seatboard_connections{"), 2.0);
    let head = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    assert_eq!(http_raw(sb.port, head.as_bytes()).unwrap().status, 431);

    // Ping is answered with a pong carrying the payload.
    a.send(Message::Ping(b"hi".to_vec().into())).unwrap();
    let pong = (0..200).find_map(|_| match a.read() {
        Ok(Message::Pong(p)) => Some(p),
        _ => None,
    });
    assert_eq!(pong.as_deref(), Some(&b"hi"[..]));

    // The close handshake: our close is echoed, and the connection is released.
    a.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    }))
    .unwrap();
    let echoed = (0..200).find_map(|_| match a.read() {
        Ok(Message::Close(c)) => Some(c),
        Ok(_) => None,
        Err(_) => Some(None),
    });
    assert_eq!(
        echoed.flatten().map(|c| c.code),
        Some(CloseCode::Normal),
        "the close is echoed"
    );
    let released = wait_for(Duration::from_secs(5), || {
        let h = http_get(sb.port, "/healthz").ok()?;
        let v: serde_json::Value = serde_json::from_str(&h.body).ok()?;
        (v["connections"] == 1).then_some(())
    });
    assert!(
        released.is_some(),
        "the connection is released, bob's stays"
    );
}

#[test]
fn demo_board_on_io_uring() {
    board_end_to_end("uring");
}

#[test]
fn demo_board_on_epoll() {
    board_end_to_end("epoll");
}

#[cfg(feature = "tokio-shell")]
#[test]
fn demo_board_on_tokio() {
    board_end_to_end("tokio");
}
