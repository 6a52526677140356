//! Bounded send queues: drops, the resync by a full frame, and the close of
//! a slow consumer.

use crate::rig::{
    actions, apply_truth, cfg, frames, join, merge, pop_all, run_to, section_ids, snap, truth,
    watch, Out,
};
use shards::{Action, Shard, ShardConfig, Snapshot};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[test]
fn full_queue_drops_then_resyncs_with_a_full_frame() {
    let mut s = Shard::new(ShardConfig {
        send_queue_bytes: 400,
        ..cfg()
    });
    let stuck = join(&mut s, "stuck", 0);
    let healthy = join(&mut s, "ok", 0);
    watch(&mut s, stuck, "C", 0);
    watch(&mut s, healthy, "C", 0);
    let seed: Vec<_> = (0..4).map(|k| snap("C", k, 0, Some(0))).collect();
    s.handle_seed("C", &seed, 0);
    let mut src: BTreeMap<u32, Arc<Snapshot>> = BTreeMap::new();
    for sn in &seed {
        apply_truth(&mut src, sn);
    }
    let mut boards_stuck = HashMap::new();
    let mut boards_ok = HashMap::new();
    for o in pop_all(&mut s, stuck) {
        merge(&mut boards_stuck, &o);
    }
    for o in pop_all(&mut s, healthy) {
        merge(&mut boards_ok, &o);
    }
    let mut now = 0;
    for k in 1..=20u64 {
        let t = k * 200;
        let sn = snap("C", (k % 4) as u32, k as u32, Some(k));
        s.handle_snapshot(&sn);
        apply_truth(&mut src, &sn);
        run_to(&mut s, &mut now, t);
        let out = pop_all(&mut s, healthy);
        let f = frames(&out);
        assert_eq!(f.len(), 1, "healthy viewer gets every tick's frame (t={t})");
        assert_eq!(f[0]["full"], false);
        assert_eq!(section_ids(f[0]), vec![k % 4]);
        for o in &out {
            merge(&mut boards_ok, o);
        }
        assert!(s.queued_bytes(stuck) <= 400);
    }
    let dropped = s.stats().frames_dropped;
    assert!(dropped > 10, "the stuck queue dropped frames: {dropped}");
    let resyncs = s.stats().resyncs;
    assert_eq!(resyncs, 0);

    // The stuck client catches up with what fitted, then gets a full frame next
    // tick though the course did not change again.
    let out = pop_all(&mut s, stuck);
    assert!(frames(&out).iter().all(|f| f["full"] == false));
    for o in &out {
        merge(&mut boards_stuck, o);
    }
    assert_ne!(boards_stuck["C"], truth(&src), "it missed frames");
    let until = now + 200;
    run_to(&mut s, &mut now, until);
    let out = pop_all(&mut s, stuck);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["full"], true);
    assert_eq!(section_ids(f[0]), vec![0, 1, 2, 3]);
    for o in &out {
        merge(&mut boards_stuck, o);
    }
    assert_eq!(boards_stuck["C"], truth(&src));
    assert_eq!(s.stats().resyncs, resyncs + 1);
    assert!(
        pop_all(&mut s, healthy).is_empty(),
        "the healthy viewer owed nothing"
    );
    assert_eq!(boards_ok["C"], truth(&src));
    // Healed: nothing more to render, and no further resync.
    let until = now + 1000;
    run_to(&mut s, &mut now, until);
    assert!(pop_all(&mut s, stuck).is_empty());
    assert_eq!(s.stats().resyncs, resyncs + 1);
    assert_eq!(s.stats().frames_dropped, dropped);
}

#[test]
fn slow_consumer_is_closed_with_4001_and_draining_ones_are_not() {
    let mut s = Shard::new(ShardConfig {
        send_queue_bytes: 300,
        slow_consumer_ms: 5_000,
        ..cfg()
    });
    let stuck = join(&mut s, "stuck", 0);
    let fast = join(&mut s, "fast", 0); // drains every second
    let slow = join(&mut s, "slow", 0); // drains every four seconds
    for id in [stuck, fast, slow] {
        watch(&mut s, id, "C", 0);
    }
    s.handle_seed("C", &[], 0);
    for id in [stuck, fast, slow] {
        pop_all(&mut s, id);
    }
    actions(&mut s);
    let mut first_drop = None;
    let mut closed_at = None;
    for t in 1..=15_000u64 {
        if t % 200 == 0 {
            s.handle_snapshot(&snap("C", (t / 200 % 5) as u32, (t / 200) as u32, None));
        }
        let dropped = s.stats().frames_dropped;
        s.handle_timeout(t);
        if first_drop.is_none() && s.stats().frames_dropped > dropped {
            first_drop = Some(t);
        }
        for a in actions(&mut s) {
            match a {
                Action::Close { conn, code } => {
                    assert_eq!(conn, stuck);
                    assert_eq!(code, 4001);
                    assert!(closed_at.is_none());
                    closed_at = Some(t);
                }
                Action::PresenceLeave { user, .. } => assert_eq!(&*user, "stuck"),
                // The close grace of the stuck connection, 3 s after its close.
                Action::Cut { conn } => {
                    assert_eq!(conn, stuck);
                    assert_eq!(closed_at.map(|c| t - c), Some(3_000));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if t % 1000 == 0 {
            pop_all(&mut s, fast);
        }
        if t % 4000 == 0 {
            pop_all(&mut s, slow);
        }
    }
    let first_drop = first_drop.expect("the stuck queue filled up");
    let closed_at = closed_at.expect("the stuck client was closed");
    assert!(
        closed_at >= first_drop + 5_000 && closed_at <= first_drop + 6_000,
        "first drop {first_drop}, closed at {closed_at}"
    );
    assert_eq!(s.stats().slow_consumer_closes, 1);
    let out = pop_all(&mut s, stuck);
    assert_eq!(out.last(), Some(&Out::Close(4001)));
    assert_eq!(out.iter().filter(|o| matches!(o, Out::Close(_))).count(), 1);
    // Nothing more after the close frame, even on later ticks.
    s.handle_snapshot(&snap("C", 0, 999, None));
    s.handle_timeout(15_200);
    assert!(pop_all(&mut s, stuck).is_empty());
    for id in [fast, slow] {
        let out = pop_all(&mut s, id);
        assert!(!out.iter().any(|o| matches!(o, Out::Close(_))));
    }
    assert!(s.stats().frames_dropped > 0);
    assert_eq!(s.connections(), 3, "closing is not disconnecting");
    s.disconnect(stuck);
    assert_eq!(s.connections(), 2);
}
