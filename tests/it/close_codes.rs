//! Close codes after the upgrade (contract section 5), each provoked by a
//! raw-socket client sending masked frames, plus the recoverable errors that
//! must keep the connection open.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::time::{Duration, Instant};

fn demo() -> Seatboard {
    Seatboard::start(&["demo", "--shards", "2"])
}

#[test]
fn message_over_4_kib_closes_1009_whole_or_fragmented() {
    let sb = demo();
    // Exactly 4 KiB is fine (it is just bad JSON).
    let mut ws = RawWs::hello(sb.port, "big0");
    ws.text(&"a".repeat(4096));
    ws.expect_error("bad_json");

    let mut ws = RawWs::hello(sb.port, "big1");
    ws.text(&"a".repeat(4097));
    ws.expect_closed_with(1009);

    // 3 x 1500 bytes: no fragment is large, the message is.
    let mut ws = RawWs::hello(sb.port, "big2");
    let part = "b".repeat(1500);
    ws.send(false, OP_TEXT, part.as_bytes());
    ws.send(false, OP_CONT, part.as_bytes());
    ws.send(true, OP_CONT, part.as_bytes());
    ws.expect_closed_with(1009);

    // A huge declared length is refused from the header alone, before its payload.
    let mut ws = RawWs::hello(sb.port, "big3");
    let mut f = vec![0x81, 0x80 | 127];
    f.extend_from_slice(&(1u64 << 40).to_be_bytes());
    f.extend_from_slice(&MASK);
    ws.send_raw(&f);
    ws.expect_closed_with(1009);
    assert!(metric_value(&sb.metrics(), "seatboard_ws_closes_total{code=\"1009\"}") >= 3.0);
}

#[test]
fn more_than_4096_fragments_close_1009_and_4096_one_byte_fragments_are_one_message() {
    let sb = demo();
    // A watch padded to exactly 4 KiB, one byte per frame: understood.
    let mut watch = br#"{"op":"watch","course":"CS101"}"#.to_vec();
    watch.resize(4096, b' ');
    let mut bytes = Vec::new();
    for (i, b) in watch.iter().enumerate() {
        let op = if i == 0 { OP_TEXT } else { OP_CONT };
        let fin = i == watch.len() - 1;
        bytes.extend(shards::ws_codec::client_frame(fin, op, &[*b], MASK));
    }
    let mut ws = RawWs::hello(sb.port, "frag0");
    ws.send_raw(&bytes);
    let f = ws
        .next_of_type("frame", Duration::from_secs(10))
        .expect("the watch answer");
    assert_eq!(f["course"], "CS101");
    ws.assert_alive();

    // Endless empty continuations: the 4,097th frame closes with 1009.
    let closes = "seatboard_ws_closes_total{code=\"1009\"}";
    let before = metric_value(&sb.metrics(), closes);
    let mut flood = shards::ws_codec::client_frame(false, OP_TEXT, b"{", MASK);
    for _ in 0..4096 {
        flood.extend(shards::ws_codec::client_frame(false, OP_CONT, b"", MASK));
    }
    let mut ws = RawWs::hello(sb.port, "frag1");
    ws.send_raw(&flood);
    ws.expect_closed_with(1009);
    let counted = wait_for(Duration::from_secs(5), || {
        (metric_value(&sb.metrics(), closes) >= before + 1.0).then_some(())
    });
    assert!(counted.is_some(), "the 1009 close is not in /metrics");
}

#[test]
fn binary_closes_1003() {
    let sb = demo();
    let mut ws = RawWs::hello(sb.port, "bin");
    ws.send(true, OP_BINARY, b"{\"op\":\"watch\",\"course\":\"CS101\"}");
    ws.expect_closed_with(1003);
    // Also when the binary message is fragmented.
    let mut ws = RawWs::hello(sb.port, "bin2");
    ws.send(false, OP_BINARY, b"ab");
    ws.send(true, OP_CONT, b"cd");
    ws.expect_closed_with(1003);
}

#[test]
fn invalid_utf8_closes_1007() {
    let sb = demo();
    let mut ws = RawWs::hello(sb.port, "utf");
    ws.send(true, OP_TEXT, &[b'{', 0xff, b'}']);
    ws.expect_closed_with(1007);
    // Invalid inside a fragmented message: fails on the bad fragment, before FIN.
    let mut ws = RawWs::hello(sb.port, "utf2");
    ws.send(false, OP_TEXT, "κόσμε".as_bytes());
    ws.send(false, OP_CONT, &[0xed, 0xa0, 0x80]); // a UTF-16 surrogate
    ws.expect_closed_with(1007);
    // A close reason that is not UTF-8.
    let mut ws = RawWs::hello(sb.port, "utf3");
    ws.close(1000, &[0xff, 0xfe]);
    ws.expect_closed_with(1007);
}

#[test]
fn more_than_20_messages_a_second_closes_1008_control_frames_do_not_count() {
    let sb = demo();
    // 40 pings and 19 texts in well under a second: pings are free.
    let mut ws = RawWs::hello(sb.port, "calm");
    for i in 0..40 {
        ws.send(true, OP_PING, format!("p{i}").as_bytes());
    }
    for _ in 0..18 {
        ws.text("{}");
    }
    let mut pongs = 0;
    let mut errors = 0;
    let end = Instant::now() + Duration::from_secs(10);
    while (pongs < 40 || errors < 18) && Instant::now() < end {
        match ws.read(Duration::from_secs(5)) {
            Got::Frame(f) if f.opcode == OP_PONG => {
                assert_eq!(f.payload, format!("p{pongs}").as_bytes(), "pongs in order");
                pongs += 1;
            }
            Got::Frame(f) if f.opcode == OP_TEXT => {
                if f.json().unwrap()["type"] == "error" {
                    errors += 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((pongs, errors), (40, 18));
    ws.assert_alive(); // the 20th message

    // 21 in a burst: the 21st closes with 1008.
    let mut ws = RawWs::hello(sb.port, "flood");
    for _ in 0..21 {
        ws.text("{}");
    }
    let mut seen_errors = 0;
    let code = loop {
        match ws.read(Duration::from_secs(10)) {
            Got::Frame(f) if f.opcode == OP_TEXT => seen_errors += 1,
            Got::Frame(f) if f.opcode == OP_CLOSE => break f.close_code(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(code, Some(1008));
    assert_eq!(seen_errors, 20, "the first 20 were answered");
    // The client answers the close; the server then closes TCP.
    ws.close(1008, b"");
    ws.expect_eof(Duration::from_secs(3));
}

#[test]
fn more_than_100_control_frames_a_second_close_1008() {
    let sb = demo();
    // 100 pings in a burst are all answered, and the connection stays open.
    let mut ws = RawWs::hello(sb.port, "pinger");
    for i in 0..100 {
        ws.send(true, OP_PING, format!("p{i}").as_bytes());
    }
    for i in 0..100 {
        match ws.read(Duration::from_secs(10)) {
            Got::Frame(f) if f.opcode == OP_PONG => {
                assert_eq!(f.payload, format!("p{i}").as_bytes(), "pongs in order")
            }
            other => panic!("pong {i}: unexpected {other:?}"),
        }
    }
    ws.assert_alive();

    // A flood of 300 pings and pongs: the 101st within a second closes with 1008.
    let mut ws = RawWs::hello(sb.port, "flooder");
    for i in 0..300 {
        if i % 2 == 0 {
            ws.send(true, OP_PING, b"");
        } else {
            ws.send(true, OP_PONG, b"");
        }
    }
    let mut pongs = 0;
    let code = loop {
        match ws.read(Duration::from_secs(10)) {
            Got::Frame(f) if f.opcode == OP_PONG => pongs += 1,
            Got::Frame(f) if f.opcode == OP_CLOSE => break f.close_code(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(code, Some(1008));
    assert_eq!(pongs, 50, "the pings among the first 100 were answered");
    ws.close(1008, b"");
    ws.expect_eof(Duration::from_secs(3));
}

#[test]
fn protocol_errors_close_1002() {
    let sb = demo();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("unmasked", vec![0x81, 0x02, b'{', b'}']),
        ("unmasked ping", vec![0x89, 0x00]),
        (
            "rsv1",
            shards::ws_codec::client_frame(true, 0x40 | OP_TEXT, b"{}", MASK),
        ),
        (
            "rsv2",
            shards::ws_codec::client_frame(true, 0x20 | OP_TEXT, b"{}", MASK),
        ),
        (
            "rsv3",
            shards::ws_codec::client_frame(true, 0x10 | OP_TEXT, b"{}", MASK),
        ),
        (
            "ping 126",
            shards::ws_codec::client_frame(true, OP_PING, &[b'x'; 126], MASK),
        ),
        (
            "fragmented ping",
            shards::ws_codec::client_frame(false, OP_PING, b"x", MASK),
        ),
        (
            "fragmented close",
            shards::ws_codec::client_frame(false, OP_CLOSE, &[3, 232], MASK),
        ),
        (
            "stray continuation",
            shards::ws_codec::client_frame(true, OP_CONT, b"x", MASK),
        ),
        (
            "close 1 byte",
            shards::ws_codec::client_frame(true, OP_CLOSE, &[3], MASK),
        ),
    ];
    for op in [3u8, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
        cases.push((
            "reserved opcode",
            shards::ws_codec::client_frame(true, op, b"", MASK),
        ));
    }
    for code in [
        0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
    ] {
        cases.push((
            "bad close code",
            shards::ws_codec::client_frame(true, OP_CLOSE, &code.to_be_bytes(), MASK),
        ));
    }
    // A new text message while a fragmented one is open.
    let mut nested = shards::ws_codec::client_frame(false, OP_TEXT, b"{", MASK);
    nested.extend(shards::ws_codec::client_frame(true, OP_TEXT, b"}", MASK));
    cases.push(("text inside fragmented text", nested));
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let mut ws = RawWs::hello(sb.port, &format!("p{i}"));
        ws.send_raw(bytes);
        let code = ws.expect_close_frame(Duration::from_secs(10));
        assert_eq!(code, Some(1002), "{what}: {bytes:02x?}");
        ws.expect_eof(Duration::from_secs(5));
    }
}

#[test]
fn client_close_is_echoed_and_tcp_closed_within_3_s() {
    let sb = demo();
    for (code, reason) in [
        (1000u16, &b""[..]),
        (1001, b"bye"),
        (3000, b""),
        (4999, b"x"),
    ] {
        let mut ws = RawWs::hello(sb.port, "closer");
        ws.close(code, reason);
        let started = Instant::now();
        assert_eq!(ws.expect_close_frame(Duration::from_secs(3)), Some(code));
        ws.expect_eof(Duration::from_secs(3));
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    // An empty close is answered with a close too (1000).
    let mut ws = RawWs::hello(sb.port, "closer");
    ws.send(true, OP_CLOSE, b"");
    let got = ws.expect_close_frame(Duration::from_secs(3));
    assert!(matches!(got, None | Some(1000)), "{got:?}");
    ws.expect_eof(Duration::from_secs(3));
    // The slots were given back.
    assert!(wait_for(Duration::from_secs(5), || {
        (metric_value(&sb.metrics(), "seatboard_connections{") == 0.0).then_some(())
    })
    .is_some());
}

#[test]
fn server_close_without_client_answer_still_drops_tcp() {
    let sb = demo();
    let mut ws = RawWs::hello(sb.port, "mute");
    for _ in 0..21 {
        ws.text("{}");
    }
    assert_eq!(ws.expect_close_frame(Duration::from_secs(10)), Some(1008));
    // The client never answers: the server cuts it after its grace (3 s).
    let t = Instant::now();
    ws.expect_eof(Duration::from_secs(6));
    assert!(t.elapsed() <= Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn recoverable_errors_keep_the_connection_open() {
    let sb = demo();
    let mut ws = RawWs::hello(sb.port, "oops");
    for (msg, code) in [
        ("hello", "bad_json"),
        ("[1,2]", "bad_json"),
        ("{\"op\":", "bad_json"),
        ("{\"course\":\"CS101\"}", "unknown_op"),
        ("{\"op\":\"subscribe\",\"course\":\"CS101\"}", "unknown_op"),
        ("{\"op\":\"watch\"}", "bad_course"),
        ("{\"op\":\"watch\",\"course\":\"CS 101\"}", "bad_course"),
        (
            &format!("{{\"op\":\"watch\",\"course\":\"{}\"}}", "A".repeat(65)),
            "bad_course",
        ),
        ("{\"op\":\"roster\",\"course\":\"CS101\"}", "forbidden"),
    ] {
        ws.text(msg);
        ws.expect_error(code);
    }
    // 32 courses are fine, the 33rd is refused; paced under 20 messages/s.
    std::thread::sleep(Duration::from_millis(1100));
    for i in 0..32 {
        ws.text(&format!("{{\"op\":\"watch\",\"course\":\"C{i}\"}}"));
        std::thread::sleep(Duration::from_millis(60));
    }
    std::thread::sleep(Duration::from_millis(1100));
    ws.text("{\"op\":\"watch\",\"course\":\"C32\"}");
    ws.expect_error("too_many_courses");
    // Unwatching one makes room again.
    ws.text("{\"op\":\"unwatch\",\"course\":\"C0\"}");
    ws.text("{\"op\":\"watch\",\"course\":\"CS101\"}");
    let f = ws
        .next_of_type("frame", Duration::from_secs(10))
        .expect("watch answer");
    assert_eq!(f["course"], "CS101");
    assert_eq!(f["full"], true);
    ws.assert_alive();
}
