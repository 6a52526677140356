//! A connection's life outside its courses: the hello, pings and the idle
//! close, and a stale connection id.

use crate::rig::{
    actions, cfg, drain_ready, interest, join, join_action, leave_action, pop_all, watch, Out,
};
use serde_json::json;
use shards::ws_codec::text_frame;
use shards::{Action, ConnId, Role, Shard, ShardConfig, WsOptions};
use std::collections::HashMap;

#[test]
fn connect_queues_hello() {
    let mut s = Shard::new(cfg());
    let id = s.connect("u1", Role::Student, WsOptions::VIEWER, 0);
    assert_eq!(s.connections(), 1);
    assert_eq!(drain_ready(&mut s), vec![id]);
    let out = pop_all(&mut s, id);
    assert_eq!(
        out,
        vec![Out::Json(json!({
            "type": "hello", "user": "u1", "role": "student", "tick_ms": 200, "node": "n1"
        }))]
    );
    assert_eq!(s.queued_bytes(id), 0);
    assert_eq!(s.user(id), Some("u1"));

    let admin = s.connect("boss", Role::Admin, WsOptions::VIEWER, 0);
    let out = pop_all(&mut s, admin);
    assert_eq!(out[0].json()["role"], "admin");
    assert_eq!(out[0].json()["user"], "boss");
}

#[test]
fn hello_escapes_user_and_node() {
    let mut s = Shard::new(ShardConfig {
        node: "n\"1\\".into(),
        tick_ms: 150,
        ..ShardConfig::default()
    });
    let nasty = "a\"b\\c\n\u{1}é";
    let id = s.connect(nasty, Role::Student, WsOptions::VIEWER, 0);
    let out = pop_all(&mut s, id);
    assert_eq!(out.len(), 1);
    let v = out[0].json();
    assert_eq!(v["user"], nasty);
    assert_eq!(v["node"], "n\"1\\");
    assert_eq!(v["tick_ms"], 150);
}

#[test]
fn pings_and_idle_close() {
    let mut s = Shard::new(cfg()); // ping 30 s, idle 75 s
    let silent = join(&mut s, "silent", 0);
    let chatty = join(&mut s, "chatty", 0);
    let mut now = 0;
    let mut pings: HashMap<ConnId, Vec<u64>> = HashMap::new();
    let mut closes = Vec::new();
    while now < 100_000 {
        let next = s.poll_timeout().expect("live connections keep a deadline");
        assert!(next > now);
        assert!(next - now <= 1_000, "swept at least every second");
        now = next;
        if now % 10_000 < 1_000 {
            s.handle_activity(chatty, now);
        }
        s.handle_timeout(now);
        for a in actions(&mut s) {
            closes.push((a, now));
        }
        for id in [silent, chatty] {
            for o in pop_all(&mut s, id) {
                match o {
                    Out::Ping => pings.entry(id).or_default().push(now),
                    Out::Close(code) => {
                        assert_eq!(id, silent);
                        assert_eq!(code, 1000);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
    // The idle close, then, with the socket still open 3 s later, its cut.
    assert_eq!(closes.len(), 2, "{closes:?}");
    let (a, t) = &closes[0];
    assert_eq!(
        *a,
        Action::Close {
            conn: silent,
            code: 1000
        }
    );
    assert!((75_000..=76_000).contains(t), "idle close at {t}");
    assert_eq!(closes[1], (Action::Cut { conn: silent }, t + 3_000));
    assert_eq!(s.stats().idle_closes, 1);
    let p = &pings[&silent];
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        (30_000..=31_000).contains(&p[0]) && (60_000..=62_000).contains(&p[1]),
        "{p:?}"
    );
    // Pings go out whatever the activity.
    let p = &pings[&chatty];
    assert!(p.len() >= 3, "{p:?}");
    for w in p.windows(2) {
        assert!((30_000..=31_000).contains(&(w[1] - w[0])), "{p:?}");
    }
}

#[test]
fn stale_conn_id_does_nothing() {
    let mut s = Shard::new(cfg());
    let old = join(&mut s, "u1", 0);
    watch(&mut s, old, "C", 0);
    s.handle_seed("C", &[], 0);
    pop_all(&mut s, old);
    s.disconnect(old);
    assert_eq!(
        actions(&mut s),
        vec![
            interest("C", true),
            join_action("C", "u1"),
            leave_action("C", "u1"),
            interest("C", false)
        ]
    );
    assert_eq!(s.connections(), 0);
    let new = s.connect("u2", Role::Admin, WsOptions::VIEWER, 1);
    assert_ne!(old, new);
    let hello = s.queued_bytes(new);
    // Everything through the stale handle is ignored, even with the slot reused.
    s.handle_text(old, r#"{"op":"watch","course":"C"}"#, 2);
    s.handle_text(old, "junk", 2);
    s.handle_activity(old, 2);
    s.handle_peer_close(old, Some(1000), 2);
    s.close(old, 1000, "");
    s.deliver(old, text_frame("{}"));
    s.disconnect(old);
    assert!(s.poll_frame(old).is_none());
    assert_eq!(s.queued_bytes(old), 0);
    assert_eq!(s.user(old), None);
    assert!(actions(&mut s).is_empty());
    assert_eq!(s.courses(), 0);
    assert_eq!(s.connections(), 1);
    assert_eq!(s.queued_bytes(new), hello);
    assert_eq!(s.user(new), Some("u2"));
    assert_eq!(pop_all(&mut s, new).len(), 1);
    assert_eq!(s.stats().client_errors, 0);
}
