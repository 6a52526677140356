//! The admin feed: its lifecycle, the full aggregate and deltas, and its
//! queue bound.

use crate::rig::{actions, cfg, decode, join, pop_all, pop_raw};
use shards::ws_codec::text_frame;
use shards::{Action, Role, Shard, WsOptions};

fn admin_msg(full: &str, delta: Option<&str>) -> shards::AdminMsg {
    shards::AdminMsg {
        full: text_frame(full),
        delta: delta.map(text_frame),
    }
}

/// An admin message listing `n` courses, `pad` bytes of code each.
fn admin_text(full: bool, n: usize, pad: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"course":"C{i:0pad$}","sections":1}}"#))
        .collect();
    format!(
        r#"{{"type":"admin","full":{full},"courses":[{}]}}"#,
        rows.join(",")
    )
}

#[test]
fn a_new_admin_gets_the_full_aggregate_and_the_others_the_delta() {
    let mut s = Shard::new(cfg());
    let old = s.connect("boss", Role::Admin, WsOptions::ADMIN_FEED, 0);
    pop_all(&mut s, old);
    // Before the node's first aggregate arrives, the feed waits for it.
    s.handle_admin(&admin_msg(&admin_text(true, 3, 4), None));
    let got = pop_all(&mut s, old);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["full"], true);
    s.handle_admin(&admin_msg(
        &admin_text(true, 3, 4),
        Some(&admin_text(false, 1, 4)),
    ));
    let got = pop_all(&mut s, old);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["full"], false);
    // A newcomer gets the latest full at once, then deltas like the others.
    let new = s.connect("boss2", Role::Admin, WsOptions::ADMIN_FEED, 0);
    let got = pop_all(&mut s, new);
    assert_eq!(got[0].json()["type"], "hello");
    assert_eq!(got[1].json()["full"], true);
    assert_eq!(got[1].json()["courses"].as_array().map(Vec::len), Some(3));
    s.handle_admin(&admin_msg(
        &admin_text(true, 3, 4),
        Some(&admin_text(false, 2, 4)),
    ));
    for id in [old, new] {
        let got = pop_all(&mut s, id);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].json()["full"], false);
    }
    // A full-only message (for another shard's newcomer) sends nothing here.
    s.handle_admin(&admin_msg(&admin_text(true, 3, 4), None));
    assert!(pop_all(&mut s, old).is_empty());
}

#[test]
fn an_admin_message_is_never_dropped_for_its_size_and_a_full_one_heals_an_overflow() {
    // 10,000 courses: far past the viewers' 64 KiB bound.
    let mut s = Shard::new(cfg());
    let admin = s.connect("boss", Role::Admin, WsOptions::ADMIN_FEED, 0);
    pop_all(&mut s, admin);
    let big = admin_text(true, 10_000, 8);
    assert!(big.len() > 64 * 1024);
    s.handle_admin(&admin_msg(&big, None));
    let got = pop_all(&mut s, admin);
    assert_eq!(got.len(), 1, "an empty queue takes it whatever its size");
    assert_eq!(
        got[0].json()["courses"].as_array().map(Vec::len),
        Some(10_000)
    );
    // A client that does not read: deltas queue up to 4 MiB, then one is
    // refused and a full message is owed.
    let delta = admin_text(false, 2_000, 8);
    let per = delta.len() + 4;
    let fit = shards::shard::ADMIN_QUEUE_BYTES / per;
    for _ in 0..fit + 1 {
        s.handle_admin(&admin_msg(&big, Some(&delta)));
    }
    assert!(s.queued_bytes(admin) <= shards::shard::ADMIN_QUEUE_BYTES);
    let got = pop_all(&mut s, admin);
    assert_eq!(got.len(), fit);
    assert!(got.iter().all(|m| m.json()["full"] == false));
    // Its queue drained: the next message it gets is the full one.
    s.handle_admin(&admin_msg(&big, Some(&delta)));
    let got = pop_all(&mut s, admin);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["full"], true);
    // Or, with nothing changing, the sweep sends it.
    for _ in 0..fit + 1 {
        s.handle_admin(&admin_msg(&big, Some(&delta)));
    }
    pop_all(&mut s, admin);
    s.handle_timeout(1_000);
    let got = pop_all(&mut s, admin);
    assert!(got
        .iter()
        .any(|m| m.is_type("admin") && m.json()["full"] == true));
}

#[test]
fn admin_feed_lifecycle_and_admin_frames() {
    let mut s = Shard::new(cfg());
    let student = join(&mut s, "st", 0);
    let admin_plain = s.connect("boss", Role::Admin, WsOptions::VIEWER, 0);
    assert!(actions(&mut s).is_empty());
    let f1 = s.connect("boss", Role::Admin, WsOptions::ADMIN_FEED, 0);
    assert_eq!(actions(&mut s), vec![Action::AdminFeed { connected: true }]);
    let f2 = s.connect("boss2", Role::Admin, WsOptions::ADMIN_FEED, 0);
    assert!(actions(&mut s).is_empty(), "only the first feed announces");
    for id in [admin_plain, f1, f2] {
        pop_all(&mut s, id);
    }
    let msg = admin_msg(r#"{"type":"admin","full":true,"courses":[]}"#, None);
    s.handle_admin(&msg);
    let r1 = pop_raw(&mut s, f1);
    let r2 = pop_raw(&mut s, f2);
    assert_eq!(r1.len(), 1);
    assert_eq!(r1[0].as_ptr(), r2[0].as_ptr(), "built once, shared");
    assert_eq!(decode(&r1[0]).json()["type"], "admin");
    assert!(pop_all(&mut s, student).is_empty());
    assert!(pop_all(&mut s, admin_plain).is_empty());
    s.disconnect(f1);
    assert!(actions(&mut s).is_empty());
    s.handle_admin(&admin_msg(
        r#"{"type":"admin","full":true,"courses":[]}"#,
        Some(r#"{"type":"admin","full":false,"courses":[]}"#),
    ));
    assert_eq!(pop_all(&mut s, f2).len(), 1);
    s.close(f2, 1000, "");
    assert_eq!(
        actions(&mut s),
        vec![Action::Close {
            conn: f2,
            code: 1000
        }]
    );
    s.disconnect(f2);
    assert_eq!(
        actions(&mut s),
        vec![Action::AdminFeed { connected: false }]
    );
    // And again from scratch.
    let f3 = s.connect("boss", Role::Admin, WsOptions::ADMIN_FEED, 0);
    assert_eq!(actions(&mut s), vec![Action::AdminFeed { connected: true }]);
    s.disconnect(f3);
    assert_eq!(
        actions(&mut s),
        vec![Action::AdminFeed { connected: false }]
    );
}
