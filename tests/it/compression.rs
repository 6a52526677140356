//! permessage-deflate end to end (contract section 4a) with a raw-socket client:
//! the negotiation answer, course frames that arrive compressed and inflate on
//! their own, compressed client messages, their bounds and refusals, offers
//! that are ignored, `--compression off`, and the byte metrics.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::time::{Duration, Instant};

const OFFER: &str = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
const ANSWER: &str = "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n";

fn demo(extra: &[&str]) -> Seatboard {
    let mut args = vec!["demo", "--shards", "2"];
    args.extend_from_slice(extra);
    Seatboard::start(&args)
}

/// Connects offering `offer`; returns the connection (its hello read) and the head.
fn offering(port: u16, user: &str, offer: &str) -> (RawWs, String) {
    let (mut ws, head) = RawWs::connect_extra(port, &format!("/ws?user={user}"), offer);
    let hello = ws.read(Duration::from_secs(10));
    let Got::Frame(hello) = hello else {
        panic!("no hello: {hello:?}")
    };
    assert!(!hello.compressed, "a hello under 256 B goes uncompressed");
    assert_eq!(hello.json().expect("hello JSON")["type"], "hello");
    (ws, head)
}

#[test]
fn frames_arrive_compressed_and_decode_into_the_board() {
    let sb = demo(&[]);
    let (mut ws, head) = offering(sb.port, "zip", OFFER);
    assert!(head.contains(ANSWER), "{head}");
    // The watches compressed, as a browser may send them: the 15 hottest demo
    // courses (within the 20 messages/s limit), because one course alone goes
    // quiet for long stretches once it is full (only releases touch it).
    let watched = &seatboard::cmd::simulator::DEMO_COURSES[..15];
    for c in watched {
        let watch = format!(r#"{{"op":"watch","course":"{c}"}}"#);
        ws.send(true, OP_TEXT | 0x40, &deflate(watch.as_bytes()));
    }
    let mut full = None;
    let mut compressed_deltas = 0;
    // Deltas of 256 B or more need several sections of a course changed
    // within a tick, which the demo's random simulator does every few
    // seconds; the loop ends at the third, and the byte check below needs them.
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && (full.is_none() || compressed_deltas < 3) {
        let Got::Frame(f) = ws.read(end.saturating_duration_since(Instant::now())) else {
            continue;
        };
        let Some(v) = f.json() else { continue };
        if v["type"] != "frame" {
            continue;
        }
        assert!(watched.iter().any(|c| v["course"] == *c), "{}", v["course"]);
        assert_eq!(
            f.compressed,
            f.payload.len() >= 256,
            "compressed exactly when 256 B or more ({} B)",
            f.payload.len()
        );
        if v["full"] == true {
            if v["course"] == "ART150" {
                assert!(f.compressed, "the hottest board is over 256 B: compressed");
                full = Some(v);
            }
        } else if f.compressed {
            compressed_deltas += 1;
        }
    }
    let full = full.expect("the watch answer of ART150");
    assert!(!full["sections"].as_array().unwrap().is_empty());
    // The byte metrics: on the wire below the payload for this connection's frames.
    let m = sb.metrics();
    let wire = metric_value(&m, "seatboard_ws_bytes_sent_total");
    let payload = metric_value(&m, "seatboard_ws_payload_bytes_total");
    assert!(
        wire > 0.0 && payload > wire,
        "wire {wire} payload {payload}"
    );
}

#[test]
fn offers_that_cannot_be_accepted_are_ignored_and_off_never_negotiates() {
    let sb = demo(&[]);
    for offer in [
        "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=10\r\n",
        "Sec-WebSocket-Extensions: permessage-deflate; bogus\r\n",
        "Sec-WebSocket-Extensions: x-webkit-deflate-frame\r\n",
    ] {
        let (mut ws, head) = offering(sb.port, "plain", offer);
        assert!(
            !head
                .to_ascii_lowercase()
                .contains("sec-websocket-extensions"),
            "{head}"
        );
        // Upgraded without compression: frames come plain (the client asserts
        // no RSV bit), and RSV1 from the client is a protocol error.
        ws.text(r#"{"op":"watch","course":"ART150"}"#);
        let frame = ws
            .next_of_type("frame", Duration::from_secs(10))
            .expect("answer");
        assert_eq!(frame["full"], true);
        ws.send(true, OP_TEXT | 0x40, &deflate(b"{}"));
        ws.expect_closed_with(1002);
    }
    // The second offer of a list is taken when the first cannot be.
    let (_ws, head) = offering(
        sb.port,
        "second",
        "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=9, permessage-deflate\r\n",
    );
    assert!(head.contains(ANSWER), "{head}");
    let off = demo(&["--compression", "off"]);
    let (_ws, head) = offering(off.port, "off", OFFER);
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{head}"
    );
}

#[test]
fn compressed_client_messages_are_bounded() {
    let sb = demo(&[]);
    let open = |user: &str| {
        let (ws, head) = offering(sb.port, user, OFFER);
        assert!(head.contains(ANSWER), "{head}");
        ws
    };
    // RSV1 on a control frame.
    let mut ws = open("ctl");
    ws.send(true, OP_PING | 0x40, &deflate(b"x"));
    ws.expect_closed_with(1002);
    // RSV1 on a continuation frame.
    let mut ws = open("cont");
    ws.send(false, OP_TEXT, b"{\"op\":");
    ws.send(true, OP_CONT | 0x40, &deflate(b"\"watch\"}"));
    ws.expect_closed_with(1002);
    // Inflates past 4 KiB: a zip bomb (4 MiB of spaces in a few KiB) gets 1009.
    let mut ws = open("bomb");
    let bomb = deflate(&vec![b' '; 4 << 20]);
    assert!(bomb.len() < 4096, "{}", bomb.len());
    ws.send(true, OP_TEXT | 0x40, &bomb);
    ws.expect_closed_with(1009);
    // Does not inflate.
    let mut ws = open("junk");
    ws.send(true, OP_TEXT | 0x40, &[0xff, 0xff, 0xff, 0xff]);
    ws.expect_closed_with(1007);
    // Inflates to invalid UTF-8.
    let mut ws = open("utf");
    ws.send(true, OP_TEXT | 0x40, &deflate(&[b'{', 0xff, b'}']));
    ws.expect_closed_with(1007);
    // A compressed mistake is answered like a plain one; the connection stays.
    let mut ws = open("oops");
    ws.send(true, OP_TEXT | 0x40, &deflate(b"not json"));
    let err = ws
        .next_of_type("error", Duration::from_secs(10))
        .expect("error");
    assert_eq!(err["code"], "bad_json");
    let m = sb.metrics();
    assert!(metric_value(&m, "seatboard_ws_closes_total{code=\"1009\"}") >= 1.0);
    assert!(metric_value(&m, "seatboard_ws_closes_total{code=\"1002\"}") >= 2.0);
}
