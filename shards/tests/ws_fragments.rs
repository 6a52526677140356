//! A client message's frame count is bounded (contract section 5): more than
//! 4,096 frames, empty continuations included, close with 1009, while a
//! 4 KiB message in 4,096 one-byte fragments is still understood, by the
//! decoder and by a shard's read side.

use shards::ws_codec::{client_frame, close, Decoder, Violation, WsEvent, MAX_FRAGMENTS};
use shards::ws_codec::{close::TOO_BIG, MAX_MESSAGE};
use shards::{Action, ConnId, Role, Shard, ShardConfig, WsOptions};

const M: [u8; 4] = [0x5a, 0x01, 0xc3, 0x7e];

/// A message of `frames` frames: `first` in the first, `rest` in every other.
fn fragmented(frames: usize, first: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut out = client_frame(frames == 1, 0x1, first, M);
    for i in 1..frames {
        out.extend(client_frame(i == frames - 1, 0x0, rest, M));
    }
    out
}

/// Everything `bytes` decodes to, fed in reads of 1,000 bytes.
fn decode(bytes: &[u8]) -> (Vec<WsEvent>, Option<Violation>) {
    let mut d = Decoder::new();
    let mut out = Vec::new();
    for chunk in bytes.chunks(1000) {
        d.feed(chunk);
        loop {
            match d.next_event() {
                Ok(Some(e)) => out.push(e),
                Ok(None) => break,
                Err(v) => return (out, Some(v)),
            }
        }
    }
    (out, None)
}

#[test]
fn four_kib_in_4096_one_byte_fragments_is_one_message() {
    assert_eq!(MAX_FRAGMENTS, MAX_MESSAGE);
    let (events, err) = decode(&fragmented(MAX_FRAGMENTS, b"a", b"b"));
    assert_eq!(err, None);
    let want = format!("a{}", "b".repeat(MAX_FRAGMENTS - 1));
    assert_eq!(events, vec![WsEvent::Text(want)]);
}

#[test]
fn more_than_4096_frames_close_with_1009_empty_ones_included() {
    // 4,097 frames of one byte would also pass 4 KiB; empty ones never do.
    let (events, err) = decode(&fragmented(MAX_FRAGMENTS + 1, b"{}", b""));
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(err, Some(Violation(TOO_BIG)));
    // An endless stream of empty continuations stops at the 4,097th frame,
    // before any further byte is read.
    let mut endless = client_frame(false, 0x1, b"x", M);
    for _ in 0..MAX_FRAGMENTS - 1 {
        endless.extend(client_frame(false, 0x0, b"", M));
    }
    let (_, err) = decode(&endless);
    assert_eq!(err, None, "4,096 frames so far are fine");
    endless.extend(&client_frame(false, 0x0, b"", M)[..2]);
    assert_eq!(decode(&endless).1, Some(Violation(TOO_BIG)));
}

#[test]
fn the_count_starts_over_with_each_message_and_control_frames_do_not_count() {
    let mut bytes = Vec::new();
    for _ in 0..3 {
        let mut m = client_frame(false, 0x1, b"[", M);
        for i in 1..MAX_FRAGMENTS {
            if i % 512 == 0 {
                m.extend(client_frame(true, 0x9, b"p", M));
            }
            let last = i == MAX_FRAGMENTS - 1;
            m.extend(client_frame(last, 0x0, if last { b"]" } else { b"" }, M));
        }
        bytes.extend(m);
    }
    let (events, err) = decode(&bytes);
    assert_eq!(err, None);
    let texts = events
        .iter()
        .filter(|e| matches!(e, WsEvent::Text(t) if t == "[]"))
        .count();
    assert_eq!(texts, 3, "{} events", events.len());
}

fn close_codes(s: &mut Shard) -> Vec<u16> {
    std::iter::from_fn(|| s.poll_action())
        .filter_map(|a| match a {
            Action::Close { code, .. } => Some(code),
            _ => None,
        })
        .collect()
}

fn connect(s: &mut Shard) -> ConnId {
    let id = s.connect("u1", Role::Student, WsOptions::VIEWER, 0);
    while s.poll_frame(id).is_some() {}
    close_codes(s);
    id
}

#[test]
fn a_shard_closes_endless_fragments_with_1009_and_reads_4096_fragments() {
    let mut s = Shard::new(ShardConfig::default());
    let id = connect(&mut s);
    // A watch in 4,096 frames: one byte each, empty ones between.
    let watch = br#"{"op":"watch","course":"CS101"}"#;
    let mut payloads: Vec<&[u8]> = watch.chunks(1).collect();
    let pad = vec![&b""[..]; MAX_FRAGMENTS - watch.len()];
    payloads.splice(1..1, pad);
    assert_eq!(payloads.len(), MAX_FRAGMENTS);
    let mut bytes = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        let op = if i == 0 { 0x1 } else { 0x0 };
        bytes.extend(client_frame(i == MAX_FRAGMENTS - 1, op, p, M));
    }
    s.handle_read(id, &bytes, 10);
    let acted: Vec<Action> = std::iter::from_fn(|| s.poll_action()).collect();
    assert!(
        acted.iter().any(|a| matches!(a,
            Action::Interest { course, watching: true } if &**course == "CS101")),
        "4,096 frames are one message, a watch: {acted:?}"
    );
    assert!(!acted.iter().any(|a| matches!(a, Action::Close { .. })));

    let other = s.connect("u2", Role::Student, WsOptions::VIEWER, 20);
    while s.poll_frame(other).is_some() {}
    close_codes(&mut s);
    let mut flood = client_frame(false, 0x1, b"{", M);
    for _ in 0..MAX_FRAGMENTS {
        flood.extend(client_frame(false, 0x0, b"", M));
    }
    s.handle_read(other, &flood, 30);
    assert_eq!(close_codes(&mut s), vec![close::TOO_BIG]);
}
