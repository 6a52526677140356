//! Unit tests of Server-Sent Events streams on a shard.

use super::*;
use crate::conn::{Role, WsOptions};
use crate::snapshot::Snapshot;
use crate::sse_event;
use crate::ws_codec::server_frame_payload;
use bytes::Bytes;

fn snap(section: u32, taken: u32, version: u64) -> Arc<Snapshot> {
    Arc::new(Snapshot::build(
        "C".into(),
        section,
        50,
        taken,
        None,
        Some(version),
        None,
    ))
}

fn drain(shard: &mut Shard, id: ConnId) -> Vec<Bytes> {
    std::iter::from_fn(|| shard.poll_frame(id)).collect()
}

#[test]
fn sse_viewers_share_one_event_per_render_with_the_websocket_json() {
    let mut shard = Shard::new(ShardConfig::default());
    let ws = shard.connect("w", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(ws, r#"{"op":"watch","course":"C"}"#, 0);
    let a = shard.connect_sse("a", Role::Student, &["C".into()], 0);
    let b = shard.connect_sse("b", Role::Student, &["C".into()], 0);
    assert_eq!(shard.sse_connections(), 2);
    shard.handle_seed("C", &[snap(1, 1, 1)], 0);
    let first = drain(&mut shard, a);
    assert!(first[0].starts_with(b"event: hello\ndata: {\"type\":\"hello\""));
    assert!(first[1]
        .starts_with(b"event: frame\ndata: {\"type\":\"frame\",\"course\":\"C\",\"full\":true"));
    assert!(first[2].starts_with(b"event: presence\ndata: "));
    drain(&mut shard, b);
    drain(&mut shard, ws);
    shard.handle_snapshot(&snap(1, 2, 2));
    shard.handle_timeout(1_000);
    let (ea, eb, w) = (
        drain(&mut shard, a),
        drain(&mut shard, b),
        drain(&mut shard, ws),
    );
    assert_eq!(ea.len(), 1);
    assert_eq!(
        ea[0].as_ptr(),
        eb[0].as_ptr(),
        "one event shared by both streams"
    );
    let json = server_frame_payload(&w[0]).expect("ws frame");
    let mut want = b"event: frame\ndata: ".to_vec();
    want.extend_from_slice(json);
    want.extend_from_slice(b"\n\n");
    assert_eq!(&ea[0][..], &want[..]);
}

#[test]
fn a_stream_that_missed_a_frame_heals_with_a_full_one_and_gets_comments_not_pings() {
    let mut shard = Shard::new(ShardConfig {
        send_queue_bytes: 300,
        ..ShardConfig::default()
    });
    let id = shard.connect_sse("a", Role::Student, &["C".into()], 0);
    shard.handle_seed("C", &[snap(1, 1, 1)], 0);
    for v in 2..10u64 {
        shard.handle_snapshot(&snap(1, v as u32, v));
        shard.handle_timeout(v * 200);
    }
    assert!(shard.stats().frames_dropped > 0, "the queue filled");
    drain(&mut shard, id);
    shard.handle_timeout(5_000);
    let healed = drain(&mut shard, id);
    assert!(
        healed.iter().any(|e| e.starts_with(
            b"event: frame\ndata: {\"type\":\"frame\",\"course\":\"C\",\"full\":true"
        )),
        "{healed:?}"
    );
    // Long past the ping and idle times: comments, never a close for silence.
    let mut comments = 0;
    for t in (6..200).map(|s| s * 1_000) {
        shard.handle_timeout(t);
        for e in drain(&mut shard, id) {
            assert_eq!(
                &e[..],
                sse_event::KEEPALIVE,
                "only comments while nothing changes"
            );
            comments += 1;
        }
    }
    assert!(comments >= 194 / 15, "a comment every 15 s: {comments}");
    assert_eq!(shard.phase(id), Some(Phase::Open));
    assert_eq!(shard.stats().idle_closes, 0);
}

#[test]
fn a_drained_stream_gets_retry_and_reconnect_then_ends_without_a_close_frame() {
    let mut shard = Shard::new(ShardConfig::default());
    let id = shard.connect_sse("a", Role::Student, &["C".into()], 0);
    drain(&mut shard, id);
    shard.start_drain(0, 0);
    shard.handle_timeout(0);
    let out = drain(&mut shard, id);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].starts_with(b"retry: "), "{out:?}");
    assert!(out[0].ends_with(b"}\n\n"));
    assert!(matches!(
        shard.phase(id),
        Some(Phase::Closing { code: 1012, .. })
    ));
    shard.disconnect(id);
    assert_eq!(shard.sse_connections(), 0);
}
