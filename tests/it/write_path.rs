//! The write path: a shard writes a queued frame at once while the socket takes
//! it, and hands the rest to a writer task only while the socket is full. A
//! frame several times larger than the socket's buffers arrives intact, and a
//! consumer that stops reading mid-stream has its frames dropped at the queue
//! bound, owes a full frame, and gets it (every section at its latest version)
//! when it reads again, without being closed. Both monoio drivers, and the
//! tokio shell when built with `tokio-shell`.

use crate::common;
use crate::raw;
use crate::redis_util;
use common::*;
use raw::*;
use redis_util::*;
use serde_json::{json, Value};
use socket2::{Domain, Socket, Type};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const COURSE: &str = "BIG";
const SECTIONS: u32 = 8;
/// Padding per section: 8 sections make a full frame of ~480 KB, several
/// times the server's pinned send buffer plus the client's receive buffer.
const PAD: usize = 60_000;

fn big_payload(section: u32, version: u64) -> String {
    json!({"course":COURSE,"section":section,"total_seats":100,
           "seats_taken":version % 100,"seat_info":{"pad":"x".repeat(PAD)},"version":version})
    .to_string()
}

/// A client with a 4 KiB receive buffer, watching [`COURSE`].
fn small_window_client(port: u16) -> RawWs {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    s.connect(&addr.into()).unwrap();
    let stream: TcpStream = s.into();
    let mut ws = RawWs::connect_with(stream, "/ws?user=slow");
    let hello = ws.next_json(Duration::from_secs(10)).expect("hello");
    assert_eq!(hello["type"], "hello");
    ws.text(&format!(r#"{{"op":"watch","course":"{COURSE}"}}"#));
    ws
}

/// The next frame message of [`COURSE`] (presence and pings skipped); panics
/// on a close or a dropped connection.
fn next_frame(ws: &mut RawWs, timeout: Duration) -> Option<Value> {
    let end = Instant::now() + timeout;
    loop {
        match ws.read(end.saturating_duration_since(Instant::now())) {
            Got::Frame(f) if f.opcode == OP_TEXT => {
                let v = f.json().expect("every text frame is whole JSON");
                if v["type"] == "frame" {
                    assert_eq!(v["course"], COURSE);
                    return Some(v);
                }
            }
            Got::Frame(f) if f.opcode == OP_CLOSE => panic!("closed: {:?}", f.close_code()),
            Got::Frame(_) => {}
            Got::Eof => panic!("the connection was dropped"),
            Got::Timeout => return None,
        }
    }
}

/// Applies a frame's sections (each must be whole) to `board` (section → version).
fn apply(board: &mut BTreeMap<u64, u64>, frame: &Value) {
    if frame["full"] == true {
        board.clear();
    }
    for s in frame["sections"].as_array().expect("sections") {
        assert_eq!(
            s["seat_info"]["pad"].as_str().map(str::len),
            Some(PAD),
            "section arrived whole"
        );
        let version = s["version"].as_u64().expect("version");
        assert_eq!(s["seats_taken"].as_u64(), Some(version % 100));
        board.insert(s["section"].as_u64().expect("section"), version);
    }
}

fn large_frames_and_a_paused_consumer(driver: &str) {
    let redis = RedisServer::start();
    for s in 1..=SECTIONS {
        redis.cli(&[
            "HSET",
            &format!("seatstate:{COURSE}"),
            &s.to_string(),
            &big_payload(s, 1),
        ]);
    }
    let sb = serve(
        &redis,
        &["--shards", "1", "--driver", driver, "--compression", "off"],
    );
    let mut ws = small_window_client(sb.port);
    // Not read for a while: the ~480 KB answer fills both socket buffers and
    // the rest waits for room.
    std::thread::sleep(Duration::from_millis(500));
    let answer = next_frame(&mut ws, Duration::from_secs(10)).expect("watch answer");
    assert_eq!(answer["full"], true);
    let mut board = BTreeMap::new();
    apply(&mut board, &answer);
    let seeded: BTreeMap<u64, u64> = (1..=SECTIONS as u64).map(|s| (s, 1)).collect();
    assert_eq!(board, seeded, "the whole board, intact");

    // Mid-stream the client stops reading while every section keeps changing:
    // each ~60 KB delta fills the 64 KiB queue, so the next ones are dropped.
    let dropped = sb.metric("seatboard_frames_dropped_total");
    let resyncs = sb.metric("seatboard_resyncs_total");
    let mut latest: BTreeMap<u64, u64> = seeded.clone();
    let mut version = 1;
    let pause = Instant::now();
    while pause.elapsed() < Duration::from_millis(2500) {
        version += 1;
        let section = (version % SECTIONS as u64) + 1;
        publish(&redis, COURSE, &big_payload(section as u32, version));
        latest.insert(section, version);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        sb.metric("seatboard_frames_dropped_total") > dropped,
        "frames to the paused consumer were dropped at the queue bound"
    );

    // Reading again: whole frames only, a full frame heals the missed ones,
    // and the board ends at the latest version of every section.
    let mut healed = false;
    let end = Instant::now() + Duration::from_secs(20);
    while board != latest || !healed {
        assert!(
            Instant::now() < end,
            "board {board:?} never reached {latest:?} (healed: {healed})"
        );
        let Some(f) = next_frame(&mut ws, Duration::from_secs(5)) else {
            continue;
        };
        healed |= f["full"] == true;
        apply(&mut board, &f);
    }
    assert!(sb.metric("seatboard_resyncs_total") > resyncs);
    assert_eq!(sb.metric("seatboard_slow_consumer_closes_total"), 0.0);
    // An io_uring shard sent those frames in batches; the others one by one.
    let on_uring = sb.metric("seatboard_driver_shards{driver=\"io_uring\"}") == 1.0;
    let batches = sb.metric("seatboard_send_batches_total");
    assert_eq!(
        batches > 0.0,
        on_uring,
        "{batches} send batches, io_uring: {on_uring}"
    );
}

#[test]
fn large_frames_and_a_paused_consumer_on_io_uring() {
    large_frames_and_a_paused_consumer("auto");
}

#[test]
fn large_frames_and_a_paused_consumer_on_epoll() {
    large_frames_and_a_paused_consumer("epoll");
}

#[cfg(feature = "tokio-shell")]
#[test]
fn large_frames_and_a_paused_consumer_on_tokio() {
    large_frames_and_a_paused_consumer("tokio");
}
