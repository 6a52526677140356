//! A client that never reads cannot grow its send queue past the bound by what
//! it sends itself (re-watches, mistakes): the answers respect the bound, the
//! connection is counted as a slow consumer and closed 4001. A socket that
//! takes nothing for 5 s is one too, however little its queue holds.

use shards::{Action, Role, Shard, ShardConfig, Snapshot, WsOptions};
use std::sync::Arc;

fn seeded_shard() -> (Shard, Vec<Arc<Snapshot>>) {
    let shard = Shard::new(ShardConfig::default());
    let info = format!("{{\"room\":\"{}\"}}", "r".repeat(400));
    let sections = (0..8)
        .map(|s| {
            Arc::new(Snapshot::build(
                "CS101".into(),
                s,
                40,
                10,
                Some(&info),
                Some(1),
                None,
            ))
        })
        .collect();
    (shard, sections)
}

#[test]
fn rewatch_and_error_spam_from_a_stuck_client_stays_bounded() {
    let (mut shard, sections) = seeded_shard();
    let limit = shard.config().send_queue_bytes;
    let stuck = shard.connect("stuck", Role::Student, WsOptions::VIEWER, 0);
    let mut now = 0;
    shard.handle_text(stuck, r#"{"op":"watch","course":"CS101"}"#, now);
    shard.handle_seed("CS101", &sections, now);
    let mut max = 0;
    let mut closed_with = None;
    // 19 messages a second for 30 s, never reading.
    for i in 0..(19 * 30) {
        now += 1000 / 19;
        let msg = if i % 2 == 0 {
            r#"{"op":"watch","course":"CS101"}"#
        } else {
            "not json"
        };
        shard.handle_text(stuck, msg, now);
        shard.handle_timeout(now);
        max = max.max(shard.queued_bytes(stuck));
        while let Some(a) = shard.poll_action() {
            if let Action::Close { code, .. } = a {
                closed_with = Some(code);
            }
        }
        if closed_with.is_some() {
            break;
        }
    }
    // One frame past the bound at most (the frame that found the queue full).
    assert!(
        max <= limit + 8 * 1024,
        "queue grew to {max} (bound {limit})"
    );
    assert_eq!(
        closed_with,
        Some(4001),
        "a stuck client is closed as a slow consumer"
    );
    assert!(now <= 30_000, "closed after {now} ms");
    assert_eq!(shard.stats().slow_consumer_closes, 1);
}

#[test]
fn a_rewatch_that_found_the_queue_full_is_healed_by_a_full_frame() {
    let (mut shard, sections) = seeded_shard();
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(id, r#"{"op":"watch","course":"CS101"}"#, 0);
    shard.handle_seed("CS101", &sections, 0);
    // Fill the queue with re-watch answers, never reading.
    let mut now = 0;
    for _ in 0..19 * 10 {
        now += 53;
        shard.handle_text(id, r#"{"op":"watch","course":"CS101"}"#, now);
    }
    // Now the client reads everything.
    while shard.poll_frame(id).is_some() {}
    // The last answers did not fit: the next tick brings the full frame they owed.
    now += 1000;
    shard.handle_timeout(now);
    let mut got_full = false;
    while let Some(f) = shard.poll_frame(id) {
        let text = String::from_utf8_lossy(&f);
        if text.contains("\"type\":\"frame\"") {
            assert!(text.contains("\"full\":true"), "{text}");
            got_full = true;
        }
    }
    assert!(got_full, "the owed full frame never came");
    assert_eq!(shard.queued_bytes(id), 0);
}

#[test]
fn a_socket_that_takes_nothing_for_5_s_is_a_slow_consumer_and_one_that_takes_some_is_not() {
    let (mut shard, _) = seeded_shard();
    let slow = shard.connect("slow", Role::Student, WsOptions::VIEWER, 0);
    let stuck = shard.connect("stuck", Role::Student, WsOptions::VIEWER, 0);
    // Both sockets are full at 0 (their queues hold next to nothing).
    shard.socket_stalled(slow, 0);
    shard.socket_stalled(stuck, 0);
    // The slow one's socket takes a little every 3 s.
    let mut closed = Vec::new();
    for now in (500..=9_000).step_by(500) {
        if now % 3_000 == 0 {
            shard.socket_took(slow);
            shard.socket_stalled(slow, now);
        }
        shard.handle_timeout(now);
        while let Some(a) = shard.poll_action() {
            if let Action::Close { conn, code } = a {
                closed.push((conn, code, now));
            }
        }
    }
    assert_eq!(closed.len(), 1, "{closed:?}");
    let (conn, code, at) = closed[0];
    assert_eq!((conn, code), (stuck, 4001));
    assert!((5_000..=6_000).contains(&at), "closed at {at}");
}
