//! `seatboard demo --driver tokio` (feature `tokio-shell`): the tokio shell
//! around the same core speaks the same protocol — hello, watch, the full
//! answer, live frames that never regress, presence, the close handshake, and
//! the plain HTTP answers and refusals of the front door.
#![cfg(feature = "tokio-shell")]

use crate::common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;

#[test]
fn demo_board_on_tokio() {
    let sb = Seatboard::start(&[
        "demo",
        "--driver",
        "tokio",
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

    let course = "ART150"; // the simulator's hottest course
    send_json(&mut a, json!({"op":"watch","course":course}));
    let first = next_of_type(&mut a, "frame", Duration::from_secs(5)).expect("watch answer");
    assert_eq!(first["course"], course);
    assert_eq!(first["full"], true, "the watch answer is a full frame");
    assert!(!first["sections"].as_array().unwrap().is_empty());
    let mut board = Board::default();
    board.apply(&first);

    // Live frames for a few seconds: deltas, never a regression, at most one per tick.
    let mut frames = 0;
    let mut got_presence = false;
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        let Some(m) = next_json(&mut a) else { break };
        match m["type"].as_str() {
            Some("frame") => {
                assert_eq!(m["course"], course);
                assert_eq!(m["full"], false);
                for s in m["sections"].as_array().unwrap() {
                    let id = s["section"].as_u64().unwrap();
                    assert!(s["version"].as_u64().unwrap() >= board.version(id));
                }
                board.apply(&m);
                frames += 1;
            }
            Some("presence") => {
                assert!(m["viewers"].as_u64().unwrap() >= 1);
                got_presence = true;
            }
            _ => {}
        }
    }
    assert!(frames >= 3, "the hot course changes in 3 s, got {frames}");
    assert!(frames <= 3 * 5 + 2, "at most one frame per tick: {frames}");
    assert!(got_presence, "presence is sent on watch");

    // Ping is answered with a pong carrying the payload.
    a.send(Message::Ping(b"hi".to_vec().into())).unwrap();
    let pong = (0..200).find_map(|_| match a.read() {
        Ok(Message::Pong(p)) => Some(p),
        _ => None,
    });
    assert_eq!(pong.as_deref(), Some(&b"hi"[..]));

    // Plain HTTP and the front door's refusals.
    let h = http_get(sb.port, "/healthz").unwrap();
    let v: serde_json::Value = serde_json::from_str(&h.body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["shards"], 2);
    assert_eq!(v["connections"], 1);
    assert_eq!(http_get(sb.port, "/nope").unwrap().status, 404);
    assert_eq!(
        http_raw(sb.port, b"DELETE /healthz HTTP/1.1\r\n\r\n")
            .unwrap()
            .status,
        405
    );
    let head = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
    assert_eq!(http_raw(sb.port, head.as_bytes()).unwrap().status, 431);
    let page = http_get(sb.port, "/").unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<title>seatboard</title>"));

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
        (v["connections"] == 0).then_some(())
    });
    assert!(released.is_some(), "the connection is released");
    let m = sb.metrics();
    assert!(metric_value(&m, "seatboard_frames_sent_total") > 0.0);
}
