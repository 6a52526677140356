//! An RFC 6455 conformance set in the spirit of Autobahn's sections 1-7 and
//! 9-10, against seatboard's own read path, over raw sockets. The server only
//! takes JSON ops, so the observable "echo" of a text message is its answer: a
//! `watch` of CS101 (padded to the length under test) is answered with a full
//! frame, anything else with an `error` reply (synchronous, so it is the probe
//! used right before a violation). Each case asserts the exact
//! reaction: a reply, a pong with the same payload, a close code, a TCP drop.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use shards::ws_codec::client_frame;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// A message answered synchronously (an `unknown_op` error), for cases where a
/// violation follows in the same segment: a watch answer may wait for the
/// course's seed, and failing the connection drops what is still owed.
const PROBE: &[u8] = br#"{"op":"probe"}"#;

fn server() -> Seatboard {
    Seatboard::start(&["demo", "--shards", "2"])
}

/// A fresh connection past its hello (a new user each, so no cap is reached).
fn conn(sb: &Seatboard) -> RawWs {
    RawWs::hello(
        sb.port,
        &format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed)),
    )
}

/// A watch of CS101 exactly `len` bytes long (len >= 48).
fn watch_of_len(len: usize) -> Vec<u8> {
    let base = r#"{"op":"watch","course":"CS101","pad":""}"#;
    assert!(len >= base.len(), "{len}");
    format!(
        r#"{{"op":"watch","course":"CS101","pad":"{}"}}"#,
        "a".repeat(len - base.len())
    )
    .into_bytes()
}

/// The answer to a watch of CS101: its full frame.
fn expect_watch_answer(ws: &mut RawWs) {
    let v = ws.next_of_type("frame", T).expect("the watch answer");
    assert_eq!(v["course"], "CS101");
    assert_eq!(v["full"], true);
}

fn expect_pong(ws: &mut RawWs, payload: &[u8]) {
    match ws.next_control(T) {
        Got::Frame(f) => {
            assert_eq!(f.opcode, OP_PONG, "{f:?}");
            assert!(f.fin);
            assert_eq!(f.payload, payload);
        }
        other => panic!("expected a pong, got {other:?}"),
    }
}

/// Fails the connection: a close with `code`, then TCP closed.
fn expect_fail(ws: &mut RawWs, code: u16, what: &str) {
    match ws.next_control(T) {
        Got::Frame(f) if f.opcode == OP_CLOSE => {
            assert_eq!(f.close_code(), Some(code), "{what}")
        }
        other => panic!("{what}: expected close {code}, got {other:?}"),
    }
    ws.expect_eof(Duration::from_secs(5));
}

/// Sends bytes one at a time with a short pause (Autobahn's "chopped" variants).
fn send_chopped(ws: &mut RawWs, bytes: &[u8]) {
    for b in bytes {
        ws.send_raw(std::slice::from_ref(b));
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn frame(fin: bool, op: u8, payload: &[u8]) -> Vec<u8> {
    client_frame(fin, op, payload, MASK)
}

#[test]
fn s1_framing_text_lengths_7_16_64_bit() {
    let sb = server();
    // 7-bit lengths up to 125, 16-bit from 126, up to the 4 KiB message limit.
    for len in [48usize, 125, 126, 127, 128, 1000, 4095, 4096] {
        let mut ws = conn(&sb);
        ws.send_raw(&frame(true, OP_TEXT, &watch_of_len(len)));
        expect_watch_answer(&mut ws);
        // The same, one byte at a time.
        let mut ws = conn(&sb);
        send_chopped(&mut ws, &frame(true, OP_TEXT, &watch_of_len(len)));
        expect_watch_answer(&mut ws);
    }
    // Empty text message: answered (it is not JSON), not a protocol error.
    let mut ws = conn(&sb);
    ws.send(true, OP_TEXT, b"");
    ws.expect_error("bad_json");
    // Non-minimal encodings are legal: a 64-bit and a 16-bit length for 48 bytes.
    for hdr in [vec![0x81u8, 0x80 | 127], vec![0x81u8, 0x80 | 126]] {
        let payload = watch_of_len(48);
        let mut f = hdr.clone();
        if hdr[1] & 0x7f == 127 {
            f.extend_from_slice(&(payload.len() as u64).to_be_bytes());
        } else {
            f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        f.extend_from_slice(&MASK);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i & 3]));
        let mut ws = conn(&sb);
        ws.send_raw(&f);
        expect_watch_answer(&mut ws);
    }
    // An all-zero mask is still a mask.
    let mut ws = conn(&sb);
    ws.send_raw(&client_frame(true, OP_TEXT, &watch_of_len(60), [0; 4]));
    expect_watch_answer(&mut ws);
    // Two messages in one TCP segment.
    let mut ws = conn(&sb);
    let mut two = frame(true, OP_TEXT, b"{}");
    two.extend(frame(true, OP_TEXT, &watch_of_len(50)));
    ws.send_raw(&two);
    ws.expect_error("unknown_op");
    expect_watch_answer(&mut ws);
    // Over the limit: 1009, for 16- and 64-bit lengths alike.
    for len in [4097usize, 65535, 65536, 1 << 20] {
        let mut ws = conn(&sb);
        let mut f = vec![0x81u8];
        if len <= 65535 {
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
        f.extend_from_slice(&MASK);
        f.extend(std::iter::repeat_n(b'a', len.min(8192)));
        ws.send_raw(&f);
        expect_fail(&mut ws, 1009, &format!("length {len}"));
    }
    // A 64-bit length with the most significant bit set.
    let mut ws = conn(&sb);
    let mut f = vec![0x81u8, 0xff];
    f.extend_from_slice(&(1u64 << 63 | 5).to_be_bytes());
    f.extend_from_slice(&MASK);
    ws.send_raw(&f);
    expect_fail(&mut ws, 1002, "64-bit length with MSB set");
    // Binary messages are not spoken here: 1003, whatever their length.
    for len in [0usize, 125, 126, 4096] {
        let mut ws = conn(&sb);
        ws.send(true, OP_BINARY, &vec![0xfe; len]);
        expect_fail(&mut ws, 1003, &format!("binary {len}"));
    }
    // Unmasked frames: 1002.
    let mut ws = conn(&sb);
    ws.send_raw(&[0x81, 0x02, b'{', b'}']);
    expect_fail(&mut ws, 1002, "unmasked text");
}

#[test]
fn s2_pings_and_pongs() {
    let sb = server();
    let payloads: Vec<Vec<u8>> = vec![
        vec![],
        b"Hello, world!".to_vec(),
        vec![0x00, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0x00, 0xff],
        vec![0xfe; 125],
    ];
    for p in &payloads {
        let mut ws = conn(&sb);
        ws.send(true, OP_PING, p);
        expect_pong(&mut ws, p);
        // Chopped into single bytes.
        let mut ws = conn(&sb);
        send_chopped(&mut ws, &frame(true, OP_PING, p));
        expect_pong(&mut ws, p);
    }
    // 126 bytes: not a legal control frame.
    let mut ws = conn(&sb);
    ws.send(true, OP_PING, &[0xfe; 126]);
    expect_fail(&mut ws, 1002, "ping of 126 bytes");
    // Unsolicited pongs are ignored; a ping after them is answered.
    let mut ws = conn(&sb);
    ws.send(true, OP_PONG, b"");
    ws.send(true, OP_PONG, b"unsolicited");
    ws.send(true, OP_PING, b"after");
    expect_pong(&mut ws, b"after");
    ws.assert_alive();
    // Ten pings, ten pongs in order (also byte-wise).
    for chopped in [false, true] {
        let mut ws = conn(&sb);
        let mut all = Vec::new();
        for i in 0..10 {
            all.extend(frame(true, OP_PING, format!("ping {i}").as_bytes()));
        }
        if chopped {
            send_chopped(&mut ws, &all);
        } else {
            ws.send_raw(&all);
        }
        for i in 0..10 {
            expect_pong(&mut ws, format!("ping {i}").as_bytes());
        }
    }
}

#[test]
fn s3_reserved_bits() {
    let sb = server();
    for rsv in 1u8..=7 {
        let bits = rsv << 4;
        // On a text frame, after a valid message that must still be answered.
        let mut ws = conn(&sb);
        let mut bytes = frame(true, OP_TEXT, PROBE);
        bytes.extend(frame(true, bits | OP_TEXT, b"{}"));
        ws.send_raw(&bytes);
        ws.expect_error("unknown_op");
        expect_fail(&mut ws, 1002, &format!("RSV {rsv} on text"));
        // On a ping and on a close.
        for op in [OP_PING, OP_CLOSE] {
            let mut ws = conn(&sb);
            ws.send(true, bits | op, b"");
            expect_fail(&mut ws, 1002, &format!("RSV {rsv} on op {op}"));
        }
    }
}

#[test]
fn s4_reserved_opcodes() {
    let sb = server();
    for op in [3u8, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
        for payload in [&b""[..], b"reserved"] {
            let mut ws = conn(&sb);
            let mut bytes = frame(true, OP_TEXT, PROBE);
            bytes.extend(frame(true, op, payload));
            bytes.extend(frame(true, OP_PING, b"never answered"));
            ws.send_raw(&bytes);
            ws.expect_error("unknown_op");
            expect_fail(&mut ws, 1002, &format!("opcode {op:#x}"));
        }
    }
}

#[test]
fn s5_fragmentation() {
    let sb = server();
    // Fragmented control frames: 1002.
    for op in [OP_PING, OP_PONG] {
        let mut ws = conn(&sb);
        ws.send(false, op, b"frag");
        ws.send(true, OP_CONT, b"ment");
        expect_fail(&mut ws, 1002, "fragmented control frame");
    }
    // A text message in 2, 3 and many fragments, also with empty fragments.
    let msg = watch_of_len(200);
    for parts in [2usize, 3, 7, 200] {
        let mut ws = conn(&sb);
        let chunks: Vec<&[u8]> = msg.chunks(msg.len().div_ceil(parts)).collect();
        let mut bytes = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let op = if i == 0 { OP_TEXT } else { OP_CONT };
            bytes.extend(frame(i + 1 == chunks.len(), op, c));
        }
        ws.send_raw(&bytes);
        expect_watch_answer(&mut ws);
    }
    let mut ws = conn(&sb);
    ws.send(false, OP_TEXT, b"");
    ws.send(false, OP_CONT, &msg);
    ws.send(true, OP_CONT, b"");
    expect_watch_answer(&mut ws);
    // Pings between fragments are answered at once, the message after its end.
    for chopped in [false, true] {
        let mut ws = conn(&sb);
        let mut bytes = frame(false, OP_TEXT, &msg[..50]);
        bytes.extend(frame(true, OP_PING, b"between 1"));
        bytes.extend(frame(false, OP_CONT, &msg[50..120]));
        bytes.extend(frame(true, OP_PONG, b"unsolicited between"));
        bytes.extend(frame(true, OP_PING, b"between 2"));
        bytes.extend(frame(true, OP_CONT, &msg[120..]));
        if chopped {
            send_chopped(&mut ws, &bytes);
        } else {
            ws.send_raw(&bytes);
        }
        expect_pong(&mut ws, b"between 1");
        expect_pong(&mut ws, b"between 2");
        expect_watch_answer(&mut ws);
    }
    // A close between fragments is honoured: echoed, message dropped.
    let mut ws = conn(&sb);
    ws.send(false, OP_TEXT, &msg[..50]);
    ws.close(1000, b"");
    expect_fail(&mut ws, 1000, "close between fragments");
    // Continuations with nothing to continue, FIN or not: 1002.
    for fin in [true, false] {
        let mut ws = conn(&sb);
        ws.send(fin, OP_CONT, b"{}");
        expect_fail(&mut ws, 1002, "stray continuation");
        // Also right after a complete message.
        let mut ws = conn(&sb);
        let mut bytes = frame(true, OP_TEXT, PROBE);
        bytes.extend(frame(fin, OP_CONT, b"{}"));
        ws.send_raw(&bytes);
        ws.expect_error("unknown_op");
        expect_fail(&mut ws, 1002, "continuation after a complete message");
    }
    // A new text (or binary) start inside a fragmented message: 1002.
    for op in [OP_TEXT, OP_BINARY] {
        let mut ws = conn(&sb);
        ws.send(false, OP_TEXT, b"{\"op\":");
        ws.send(true, op, b"\"watch\"}");
        expect_fail(&mut ws, 1002, "data frame inside a fragmented message");
    }
}

#[test]
fn s6_utf8_handling() {
    let sb = server();
    // Valid UTF-8 split at every byte position across two fragments.
    let msg = r#"{"op":"watch","course":"CS101","x":"κόσμε 𝄞 €"}"#.as_bytes();
    let start = msg.iter().position(|b| *b >= 0x80).unwrap();
    for cut in start..start + 14 {
        let mut ws = conn(&sb);
        ws.send(false, OP_TEXT, &msg[..cut]);
        ws.send(true, OP_CONT, &msg[cut..]);
        expect_watch_answer(&mut ws);
    }
    // The same, one byte per fragment.
    let mut ws = conn(&sb);
    let mut bytes = Vec::new();
    for (i, b) in msg.iter().enumerate() {
        let op = if i == 0 { OP_TEXT } else { OP_CONT };
        bytes.extend(frame(i + 1 == msg.len(), op, std::slice::from_ref(b)));
    }
    ws.send_raw(&bytes);
    expect_watch_answer(&mut ws);
    // Boundary code points are valid UTF-8 (answered: they are just not a course).
    for valid in [
        "\u{7f}",
        "\u{80}",
        "\u{7ff}",
        "\u{800}",
        "\u{ffff}",
        "\u{10000}",
        "\u{10ffff}",
        "\u{fffd}",
    ] {
        let mut ws = conn(&sb);
        ws.text(&format!("{{\"op\":\"{valid}\"}}"));
        ws.expect_error("unknown_op");
    }
    let invalid: Vec<&[u8]> = vec![
        &[0x80], // lone continuation byte
        &[0xbf],
        &[0xc0, 0x80], // overlong
        &[0xc1, 0xbf],
        &[0xe0, 0x80, 0xaf],       // overlong 3-byte
        &[0xf0, 0x80, 0x80, 0xaf], // overlong 4-byte
        &[0xed, 0xa0, 0x80],       // UTF-16 surrogate
        &[0xed, 0xbf, 0xbf],
        &[0xf4, 0x90, 0x80, 0x80],       // above U+10FFFF
        &[0xf8, 0x88, 0x80, 0x80, 0x80], // 5-byte form
        &[0xfe],
        &[0xff],
        &[0xce, 0xba, 0xe1, 0xbd], // truncated at the end of the message
        &[0xc2, 0x41],             // missing continuation
    ];
    for bad in &invalid {
        let mut text = b"{\"op\":\"".to_vec();
        text.extend_from_slice(bad);
        // Whole message.
        let mut ws = conn(&sb);
        let mut m = text.clone();
        m.extend_from_slice(b"\"}");
        if bad == &invalid[12] {
            m = text.clone(); // ends inside the code point
        }
        ws.send(true, OP_TEXT, &m);
        expect_fail(&mut ws, 1007, &format!("{bad:02x?}"));
    }
    // Fail fast: an impossible sequence in a non-final fragment is refused before
    // the message ends (the final fragment is never sent).
    for bad in [
        &[0xff][..],
        &[0xc0, 0x80],
        &[0xed, 0xa0, 0x80],
        &[0xf4, 0x90],
    ] {
        let mut ws = conn(&sb);
        let mut first = b"{\"op\":\"".to_vec();
        first.extend_from_slice(bad);
        ws.send(false, OP_TEXT, &first);
        expect_fail(&mut ws, 1007, &format!("fail fast {bad:02x?}"));
    }
    // A code point split across fragments and then broken: fails on the fragment
    // that breaks it.
    let mut ws = conn(&sb);
    ws.send(false, OP_TEXT, &[b'"', 0xe2, 0x82]);
    ws.send(false, OP_CONT, b"x");
    expect_fail(&mut ws, 1007, "broken across fragments");
    // Incomplete at the end of a message whose fragments were all fine so far.
    let mut ws = conn(&sb);
    ws.send(false, OP_TEXT, &[b'"', 0xe2]);
    ws.send(true, OP_CONT, &[0x82]);
    expect_fail(&mut ws, 1007, "message ends inside a code point");
}

#[test]
fn s7_close_handling() {
    let sb = server();
    // Valid codes, with and without a reason, are echoed; TCP closes within 3 s.
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
    ] {
        for reason in [&b""[..], b"Hello World!", "κόσμε".as_bytes()] {
            let mut ws = conn(&sb);
            ws.close(code, reason);
            let t = Instant::now();
            assert_eq!(ws.expect_close_frame(T), Some(code), "echo of {code}");
            ws.expect_eof(Duration::from_secs(3));
            assert!(t.elapsed() < Duration::from_secs(3));
        }
    }
    // Longest legal reason (123 bytes).
    let mut ws = conn(&sb);
    ws.close(1000, &[b'*'; 123]);
    assert_eq!(ws.expect_close_frame(T), Some(1000));
    ws.expect_eof(Duration::from_secs(3));
    // Empty close: answered by a close, TCP closed.
    let mut ws = conn(&sb);
    ws.send(true, OP_CLOSE, b"");
    let got = ws.expect_close_frame(T);
    assert!(matches!(got, None | Some(1000)), "{got:?}");
    ws.expect_eof(Duration::from_secs(3));
    // Close payload of 1 byte, or over 125 bytes: 1002.
    let mut ws = conn(&sb);
    ws.send(true, OP_CLOSE, &[0x03]);
    expect_fail(&mut ws, 1002, "1-byte close");
    let mut ws = conn(&sb);
    let mut p = 1000u16.to_be_bytes().to_vec();
    p.extend_from_slice(&[b'*'; 124]);
    ws.send(true, OP_CLOSE, &p);
    expect_fail(&mut ws, 1002, "126-byte close");
    // Codes that must never be on the wire: 1002.
    for code in [
        0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
    ] {
        let mut ws = conn(&sb);
        ws.close(code, b"");
        expect_fail(&mut ws, 1002, &format!("close code {code}"));
    }
    // A reason that is not UTF-8: the connection is failed (1007).
    let mut ws = conn(&sb);
    ws.close(
        1000,
        &[
            0xce, 0xba, 0xe1, 0xbd, 0xb9, 0xcf, 0x83, 0xce, 0xbc, 0xce, 0xb5, 0xed, 0xa0, 0x80,
        ],
    );
    expect_fail(&mut ws, 1007, "invalid UTF-8 reason");
    // Nothing after a close is processed: the ping and text that follow it in the
    // same segment are not answered.
    let mut ws = conn(&sb);
    let mut bytes = frame(true, OP_CLOSE, &1000u16.to_be_bytes());
    bytes.extend(frame(true, OP_PING, b"after close"));
    bytes.extend(frame(true, OP_TEXT, &watch_of_len(48)));
    ws.send_raw(&bytes);
    match ws.read(T) {
        Got::Frame(f) => assert_eq!(f.close_code(), Some(1000), "{f:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ws.read(Duration::from_secs(3)), Got::Eof);
    // A message, then a close: the message is answered first.
    let mut ws = conn(&sb);
    let mut bytes = frame(true, OP_TEXT, PROBE);
    bytes.extend(frame(true, OP_CLOSE, &1000u16.to_be_bytes()));
    ws.send_raw(&bytes);
    ws.expect_error("unknown_op");
    assert_eq!(ws.expect_close_frame(T), Some(1000));
    ws.expect_eof(Duration::from_secs(3));
}

#[test]
fn s9_s10_limits_and_fragment_sizes() {
    let sb = server();
    // The largest message in fragments of 1..4096 bytes (Autobahn 9.4 / 10.1).
    let msg = watch_of_len(4096);
    for size in [1usize, 4, 16, 64, 256, 1024, 4096] {
        let mut ws = conn(&sb);
        let chunks: Vec<&[u8]> = msg.chunks(size).collect();
        let mut bytes = Vec::with_capacity(msg.len() + chunks.len() * 8);
        for (i, c) in chunks.iter().enumerate() {
            let op = if i == 0 { OP_TEXT } else { OP_CONT };
            bytes.extend(frame(i + 1 == chunks.len(), op, c));
        }
        ws.send_raw(&bytes);
        expect_watch_answer(&mut ws);
    }
    // One byte more, in fragments: 1009 as soon as the total passes 4 KiB.
    let big = [msg.clone(), b"x".to_vec()].concat();
    let mut ws = conn(&sb);
    for (i, c) in big.chunks(1000).enumerate() {
        ws.send(false, if i == 0 { OP_TEXT } else { OP_CONT }, c);
    }
    expect_fail(&mut ws, 1009, "4097 bytes in fragments");
    // 20 messages in a second are fine, all answered in order.
    let mut ws = conn(&sb);
    let mut bytes = Vec::new();
    for i in 0..20 {
        bytes.extend(frame(
            true,
            OP_TEXT,
            format!("{{\"op\":\"n{i}\"}}").as_bytes(),
        ));
    }
    ws.send_raw(&bytes);
    for _ in 0..20 {
        ws.expect_error("unknown_op");
    }
    // Bulk pings with max payloads are all answered, up to the 100 control
    // frames a second allowed (they do not count as messages).
    let mut ws = conn(&sb);
    let mut bytes = Vec::new();
    for i in 0..100u8 {
        bytes.extend(frame(true, OP_PING, &[i; 125]));
    }
    ws.send_raw(&bytes);
    for i in 0..100u8 {
        expect_pong(&mut ws, &[i; 125]);
    }
}
