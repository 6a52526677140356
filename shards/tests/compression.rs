//! permessage-deflate through the shard's public API: each course frame is
//! compressed once per render and the same bytes go to every viewer that
//! negotiated it; the others get the plain frame; every compressed frame
//! inflates on its own (a reference inflater with a fresh context per message).

use bytes::Bytes;
use flate2::{Decompress, FlushDecompress};
use shards::ws_codec::server_frame_payload;
use shards::{ConnId, Role, Shard, ShardConfig, Snapshot, WsOptions};
use std::sync::Arc;

fn snap(section: u32, taken: u32, version: u64) -> Arc<Snapshot> {
    Arc::new(Snapshot::build(
        "CS101".into(),
        section,
        50,
        taken,
        None,
        Some(version),
        None,
    ))
}

/// Decodes one server frame: whether RSV1 was set, and its text (inflated
/// with a fresh raw inflater if so).
fn reference_decode(frame: &[u8]) -> (bool, String) {
    let rsv1 = frame[0] & 0x40 != 0;
    assert_eq!(
        frame[0] & 0xbf,
        0x81,
        "a final text frame: {:#04x}",
        frame[0]
    );
    let payload = server_frame_payload(frame).expect("one whole frame");
    let text = if rsv1 {
        let mut input = payload.to_vec();
        input.extend_from_slice(&[0, 0, 0xff, 0xff]);
        let mut d = Decompress::new(false);
        let mut out = Vec::with_capacity(1 << 20);
        d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
            .expect("inflates");
        assert_eq!(d.total_in() as usize, input.len(), "all input used");
        out
    } else {
        payload.to_vec()
    };
    (rsv1, String::from_utf8(text).expect("UTF-8"))
}

fn pop(s: &mut Shard, id: ConnId) -> Vec<Bytes> {
    std::iter::from_fn(|| s.poll_frame(id)).collect()
}

fn watcher(s: &mut Shard, user: &str, deflate: bool) -> ConnId {
    let id = s.connect(
        user,
        Role::Student,
        WsOptions::VIEWER.with_deflate(deflate),
        0,
    );
    s.handle_text(id, r#"{"op":"watch","course":"CS101"}"#, 0);
    id
}

#[test]
fn course_frames_are_compressed_once_and_shared() {
    let mut s = Shard::new(ShardConfig::default());
    let a = watcher(&mut s, "a", true);
    let b = watcher(&mut s, "b", true);
    let plain = watcher(&mut s, "c", false);
    let seed: Vec<_> = (0..12).map(|k| snap(k, k, 1)).collect();
    s.handle_seed("CS101", &seed, 0);
    let (fa, fb, fp) = (pop(&mut s, a), pop(&mut s, b), pop(&mut s, plain));
    // hello, full answer, presence: only the big full frame is compressed.
    let kinds = |fs: &[Bytes]| fs.iter().map(|f| reference_decode(f).0).collect::<Vec<_>>();
    assert_eq!(kinds(&fa), vec![false, true, false]);
    assert_eq!(kinds(&fp), vec![false, false, false]);
    assert_eq!(
        fa[1].as_ptr(),
        fb[1].as_ptr(),
        "the watch answer compressed once"
    );
    assert_eq!(reference_decode(&fa[1]).1, reference_decode(&fp[1]).1);
    assert!(
        fa[1].len() * 2 < fp[1].len(),
        "{} vs {}",
        fa[1].len(),
        fp[1].len()
    );

    // A render: one compression, the same bytes to both deflate viewers.
    let (wire0, payload0) = (s.stats().bytes_queued, s.stats().payload_bytes);
    for k in 0..8 {
        s.handle_snapshot(&snap(k, k + 1, 2));
    }
    s.handle_timeout(10);
    let (fa, fb, fp) = (pop(&mut s, a), pop(&mut s, b), pop(&mut s, plain));
    assert_eq!((fa.len(), fb.len(), fp.len()), (1, 1, 1));
    assert_eq!(fa[0].as_ptr(), fb[0].as_ptr(), "compressed once per render");
    let (rsv1, text) = reference_decode(&fa[0]);
    assert!(rsv1);
    assert_eq!(text, reference_decode(&fp[0]).1);
    assert!(
        text.starts_with(r#"{"type":"frame","course":"CS101","full":false"#),
        "{text}"
    );
    // Wire bytes count what was queued; payload bytes what it was before compression.
    let wire = s.stats().bytes_queued - wire0;
    let payload = s.stats().payload_bytes - payload0;
    assert_eq!(wire, (2 * fa[0].len() + fp[0].len()) as u64);
    assert_eq!(payload, 3 * text.len() as u64);

    // A small change goes out uncompressed, to everybody alike.
    s.handle_snapshot(&snap(0, 40, 3));
    s.handle_timeout(300);
    let (fa, fp) = (pop(&mut s, a), pop(&mut s, plain));
    assert_eq!(fa, fp);
    assert!(!reference_decode(&fa[0]).0);
}

#[test]
fn admin_frames_compressed_once_and_pongs_never() {
    let mut s = Shard::new(ShardConfig::default());
    let admin = s.connect(
        "adm",
        Role::Admin,
        WsOptions::ADMIN_FEED.with_deflate(true),
        0,
    );
    let other = s.connect(
        "adm2",
        Role::Admin,
        WsOptions::ADMIN_FEED.with_deflate(true),
        0,
    );
    pop(&mut s, admin);
    pop(&mut s, other);
    let body: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"course":"C{i}","sections":3,"total_seats":90,"seats_taken":{i}}}"#))
        .collect();
    let text = format!(
        r#"{{"type":"admin","full":true,"courses":[{}]}}"#,
        body.join(",")
    );
    s.handle_admin(&shards::AdminMsg {
        full: shards::ws_codec::text_frame(&text),
        delta: None,
    });
    let (fa, fo) = (pop(&mut s, admin), pop(&mut s, other));
    assert_eq!(fa[0].as_ptr(), fo[0].as_ptr());
    assert_eq!(reference_decode(&fa[0]), (true, text.clone()));
    // A newcomer gets the latest aggregate, compressed too.
    let late = s.connect(
        "adm3",
        Role::Admin,
        WsOptions::ADMIN_FEED.with_deflate(true),
        0,
    );
    let fl = pop(&mut s, late);
    assert_eq!(fl[1].as_ptr(), fa[0].as_ptr());
    // Control frames are never compressed.
    s.deliver(admin, shards::ws_codec::pong_frame(&[b'x'; 125]));
    assert_eq!(pop(&mut s, admin)[0][0], 0x8a);
}
