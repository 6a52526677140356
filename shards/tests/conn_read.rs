//! The read side of a connection, owned by the core: raw client bytes go into
//! `Shard::handle_read` and come out as replies, closes and actions — frame
//! rules, the 4 KiB limit, the 20-per-second window, ping/pong, "only the
//! peer's close counts after ours" and the 3 s close grace, with no socket.

use serde_json::Value;
use shards::shard::CLOSE_GRACE_MS;
use shards::ws_codec::client_frame;
use shards::{Action, ConnId, Reading, Role, Shard, ShardConfig, WsOptions};

const M: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

fn text(s: &str) -> Vec<u8> {
    client_frame(true, 0x1, s.as_bytes(), M)
}

#[derive(Debug, PartialEq)]
enum Out {
    Json(Value),
    Close(u16),
    Pong(Vec<u8>),
}

fn pop_all(s: &mut Shard, id: ConnId) -> Vec<Out> {
    std::iter::from_fn(|| s.poll_frame(id))
        .map(|f| {
            let p = &f[2..];
            assert!(f[1] < 126, "short frames only here");
            match f[0] {
                0x81 => Out::Json(serde_json::from_slice(p).expect("JSON")),
                0x88 => Out::Close(u16::from_be_bytes([p[0], p[1]])),
                0x8a => Out::Pong(p.to_vec()),
                other => panic!("unexpected {other:#04x}"),
            }
        })
        .collect()
}

fn actions(s: &mut Shard) -> Vec<Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn closes(s: &mut Shard) -> Vec<u16> {
    actions(s)
        .into_iter()
        .filter_map(|a| match a {
            Action::Close { code, .. } => Some(code),
            _ => None,
        })
        .collect()
}

fn setup() -> (Shard, ConnId) {
    let mut s = Shard::new(ShardConfig::default());
    let id = s.connect("u1", Role::Student, WsOptions::VIEWER, 0);
    let hello = pop_all(&mut s, id);
    assert!(matches!(&hello[..], [Out::Json(v)] if v["type"] == "hello"));
    actions(&mut s);
    (s, id)
}

#[test]
fn a_message_split_across_reads_is_acted_on_once_whole() {
    let (mut s, id) = setup();
    let bytes = text(r#"{"op":"watch","course":"CS101"}"#);
    for b in &bytes[..bytes.len() - 1] {
        assert_eq!(
            s.handle_read(id, std::slice::from_ref(b), 10),
            Reading::More
        );
        assert!(actions(&mut s).is_empty(), "nothing before the whole frame");
    }
    assert_eq!(
        s.handle_read(id, &bytes[bytes.len() - 1..], 10),
        Reading::More
    );
    let a = actions(&mut s);
    assert!(
        a.contains(&Action::Interest {
            course: "CS101".into(),
            watching: true
        }),
        "{a:?}"
    );
    // Two messages in one read are both handled.
    let mut two = text(r#"{"op":"nope"}"#);
    two.extend(text(r#"{"op":"unwatch","course":"CS101"}"#));
    assert_eq!(s.handle_read(id, &two, 20), Reading::More);
    let out = pop_all(&mut s, id);
    assert!(
        matches!(&out[..], [Out::Json(v)] if v["code"] == "unknown_op"),
        "{out:?}"
    );
    assert!(actions(&mut s).contains(&Action::Interest {
        course: "CS101".into(),
        watching: false
    }));
}

#[test]
fn pings_are_answered_with_their_payload_and_any_read_is_liveness() {
    let (mut s, id) = setup();
    let ping = client_frame(true, 0x9, b"abc", M);
    assert_eq!(s.handle_read(id, &ping, 5), Reading::More);
    assert_eq!(pop_all(&mut s, id), vec![Out::Pong(b"abc".to_vec())]);
    // A pong every 60 s keeps a connection that never sends a message open
    // past the 75 s idle limit.
    for t in (60_000..=300_000).step_by(60_000) {
        s.handle_read(id, &client_frame(true, 0xA, b"", M), t);
        s.handle_timeout(t + 1);
    }
    assert!(closes(&mut s).is_empty());
    assert_eq!(s.connections(), 1);
}

#[test]
fn the_twenty_first_message_in_a_second_closes_1008() {
    let (mut s, id) = setup();
    let msg = text(r#"{"op":"unwatch","course":"C"}"#);
    for i in 0..20 {
        assert_eq!(s.handle_read(id, &msg, 1_000 + i), Reading::More);
    }
    assert!(closes(&mut s).is_empty());
    // Control frames do not count.
    s.handle_read(id, &client_frame(true, 0x9, b"", M), 1_030);
    assert!(closes(&mut s).is_empty());
    s.handle_read(id, &msg, 1_500);
    assert_eq!(closes(&mut s), vec![1008]);
    // A slower sender is fine.
    let (mut s, id) = setup();
    for i in 0..100u64 {
        s.handle_read(id, &msg, i * 60);
    }
    assert!(closes(&mut s).is_empty());
}

#[test]
fn the_hundred_and_first_control_frame_in_a_second_closes_1008() {
    let (mut s, id) = setup();
    let ping = client_frame(true, 0x9, b"p", M);
    let pong = client_frame(true, 0xA, b"", M);
    for i in 0..100u64 {
        let frame = if i % 2 == 0 { &ping } else { &pong };
        assert_eq!(s.handle_read(id, frame, 1_000 + i), Reading::More);
    }
    assert!(closes(&mut s).is_empty());
    assert_eq!(pop_all(&mut s, id).len(), 50, "every ping answered");
    // They do not count toward the 20 messages: a message still goes through.
    let msg = text(r#"{"op":"unwatch","course":"C"}"#);
    s.handle_read(id, &msg, 1_200);
    assert!(closes(&mut s).is_empty());
    s.handle_read(id, &pong, 1_500);
    assert_eq!(closes(&mut s), vec![1008]);
    // A ping every 20 ms (50 a second) is fine.
    let (mut s, id) = setup();
    for i in 0..500u64 {
        s.handle_read(id, &ping, i * 20);
    }
    assert!(closes(&mut s).is_empty());
}

#[test]
fn violations_close_with_the_contract_code_and_stop_reading() {
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (vec![0x81, 0x01, b'x'], 1002),                    // unmasked
        (client_frame(true, 0x1 | 0x40, b"x", M), 1002),   // RSV1 without deflate
        (client_frame(true, 0x2, b"x", M), 1003),          // binary
        (client_frame(true, 0x1, &[b'a'; 4097], M), 1009), // too big
        (client_frame(true, 0x1, &[0xff, 0xfe], M), 1007), // not UTF-8
        (client_frame(true, 0x8, &[0x03], M), 1002),       // 1-byte close
    ];
    for (bytes, code) in cases {
        let (mut s, id) = setup();
        assert_eq!(s.handle_read(id, &bytes, 1), Reading::Stop, "{bytes:02x?}");
        assert_eq!(closes(&mut s), vec![code], "{bytes:02x?}");
        assert_eq!(pop_all(&mut s, id), vec![Out::Close(code)]);
    }
}

#[test]
fn after_our_close_only_the_peers_close_counts() {
    let (mut s, id) = setup();
    s.close(id, 1000, "bye");
    assert_eq!(closes(&mut s), vec![1000]);
    assert_eq!(pop_all(&mut s, id), vec![Out::Close(1000)]);
    // Messages, pings and floods after our close are ignored: no reply, no
    // second close.
    let mut late = text(r#"{"op":"watch","course":"C"}"#);
    late.extend(client_frame(true, 0x9, b"p", M));
    for _ in 0..30 {
        assert_eq!(s.handle_read(id, &late, 10), Reading::More);
    }
    assert!(pop_all(&mut s, id).is_empty());
    assert!(actions(&mut s).is_empty());
    // The peer's close ends reading, and is not answered twice.
    let bye = client_frame(true, 0x8, &1000u16.to_be_bytes(), M);
    assert_eq!(s.handle_read(id, &bye, 20), Reading::Stop);
    assert!(pop_all(&mut s, id).is_empty());
    assert!(actions(&mut s).is_empty());
}

#[test]
fn a_peer_close_is_echoed_with_its_code() {
    let (mut s, id) = setup();
    let bye = client_frame(true, 0x8, &4000u16.to_be_bytes(), M);
    assert_eq!(s.handle_read(id, &bye, 7), Reading::Stop);
    assert_eq!(closes(&mut s), vec![4000]);
    assert_eq!(pop_all(&mut s, id), vec![Out::Close(4000)]);
}

#[test]
fn the_close_grace_cuts_a_socket_still_open_3s_after_the_close() {
    let (mut s, id) = setup();
    let other = s.connect("u2", Role::Student, WsOptions::VIEWER, 0);
    s.handle_timeout(1_000);
    actions(&mut s);
    // Our close at 2 s: the cut is due at 5 s exactly.
    s.handle_read(id, &text(r#"{"op":"x"}"#), 2_000);
    s.close(id, 1000, "");
    assert_eq!(closes(&mut s), vec![1000]);
    let mut t = 2_000;
    let mut cut = None;
    while t < 10_000 {
        t = s.poll_timeout().expect("a deadline while connections live");
        s.handle_timeout(t);
        for a in actions(&mut s) {
            match a {
                Action::Cut { conn } => {
                    assert_eq!(conn, id);
                    assert!(cut.replace(t).is_none(), "one cut");
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(cut, Some(2_000 + CLOSE_GRACE_MS));
    // A connection that finished its close handshake in time is not cut.
    s.close(other, 1000, "");
    s.disconnect(other);
    s.handle_timeout(20_000);
    assert!(!actions(&mut s)
        .iter()
        .any(|a| matches!(a, Action::Cut { .. })));
}

#[test]
fn bytes_of_an_unknown_connection_stop_reading() {
    let (mut s, id) = setup();
    s.disconnect(id);
    assert_eq!(s.handle_read(id, &text("{}"), 1), Reading::Stop);
}

/// A client message compressed the way a browser does (raw deflate, sync
/// flush, the trailing `00 00 ff ff` dropped), framed with RSV1.
fn deflated_text(s: &str) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(s.len() + 64);
    c.compress_vec(s.as_bytes(), &mut out, FlushCompress::Sync)
        .expect("deflate");
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    client_frame(true, 0x1 | 0x40, &out, M)
}

#[test]
fn compressed_messages_are_read_only_on_a_connection_that_negotiated_deflate() {
    let watch = deflated_text(r#"{"op":"watch","course":"CS101"}"#);
    let mut s = Shard::new(ShardConfig::default());
    let id = s.connect("u1", Role::Student, WsOptions::VIEWER.with_deflate(true), 0);
    actions(&mut s);
    assert_eq!(s.handle_read(id, &watch, 1), Reading::More);
    assert!(actions(&mut s).contains(&Action::Interest {
        course: "CS101".into(),
        watching: true
    }));
    // Without the extension, RSV1 is a protocol error.
    let (mut s, id) = setup();
    assert_eq!(s.handle_read(id, &watch, 1), Reading::Stop);
    assert_eq!(closes(&mut s), vec![1002]);
}
