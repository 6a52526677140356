//! The smoke that `tests/arm64.sh` runs against the cross-built aarch64 binary
//! under qemu (through `SEATBOARD_BIN` / `SEATBOARD_BIN_WRAPPER`); in the normal
//! suite it runs against the native binary. `serve` on Redis: a client watches,
//! gets the board from the state hash, and live frames arrive.

use crate::common;
use common::*;
use serde_json::json;
use std::time::Duration;
use tungstenite::Message;

fn publish(redis: &RedisServer, course: &str, section: u32, taken: u32, version: u64) {
    let payload = json!({"course":course,"section":section,"total_seats":40,"seats_taken":taken,"version":version}).to_string();
    redis.cli(&[
        "HSET",
        &format!("seatstate:{course}"),
        &section.to_string(),
        &payload,
    ]);
    redis.cli(&["PUBLISH", &format!("seats:{course}"), &payload]);
}

/// The first `frame` the connection gets; if it ends first, the panic says
/// how (the messages before, the error or close) and what the node counted.
fn watch_answer(ws: &mut Ws, port: u16) -> serde_json::Value {
    let mut seen = Vec::new();
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                if v["type"] == "frame" {
                    return v;
                }
                seen.push(t.to_string());
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => {}
            other => {
                let counted: Vec<String> = http_get(port, "/metrics")
                    .map(|m| m.body)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("closes_total") || l.contains("error"))
                    .filter(|l| !l.starts_with('#'))
                    .map(str::to_string)
                    .collect();
                panic!("no watch answer: after {seen:?} the connection gave {other:?}; the node counted {counted:#?}");
            }
        }
    }
}

#[test]
fn serve_watch_and_frames() {
    let redis = RedisServer::start();
    publish(&redis, "ARM1", 1, 10, 1);
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &redis.uri(),
        "--shards",
        "2",
    ]);
    let health = wait_for(Duration::from_secs(20), || {
        let h = http_get(sb.port, "/healthz").ok()?;
        h.body.contains("\"redis\":true").then_some(h.body)
    });
    assert!(health.is_some(), "healthz never reported redis");
    let mut ws = ws_connect(sb.port, "/ws?user=arm").expect("connect");
    assert_eq!(next_json(&mut ws).expect("hello")["type"], "hello");
    send_json(&mut ws, json!({"op":"watch","course":"ARM1"}));
    let answer = watch_answer(&mut ws, sb.port);
    assert_eq!(answer["full"], true);
    assert_eq!(
        answer["sections"][0]["seats_taken"], 10,
        "answered from the state hash"
    );
    let mut board = Board::default();
    board.apply(&answer);
    for v in 2..=4u32 {
        publish(&redis, "ARM1", 1, 10 + v, v as u64);
    }
    let got = wait_for(Duration::from_secs(20), || {
        let f = next_of_type(&mut ws, "frame", Duration::from_secs(5))?;
        board.apply(&f);
        (board.version(1) == 4).then_some(())
    });
    assert!(
        got.is_some(),
        "live frames reach the client; board: {board:?}"
    );
    assert_eq!(board.0[&1]["seats_taken"], 14);
}
