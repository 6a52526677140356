//! Watching a course: the answer after the seed, the version rule of
//! snapshots, and a live snapshot that arrives before the seed.

use crate::rig::{
    actions, apply_truth, cfg, frames, interest, join, join_action, merge, one_viewer, pop_all,
    run_to, section_ids, snap, truth, unwatch, watch, Out,
};
use serde_json::json;
use shards::snapshot::Snapshot;
use shards::Shard;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[test]
fn watch_of_new_course_waits_for_the_seed() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let b = join(&mut s, "u2", 0);
    watch(&mut s, a, "CS101", 10);
    assert_eq!(
        actions(&mut s),
        vec![interest("CS101", true), join_action("CS101", "u1")]
    );
    assert_eq!(s.courses(), 1);
    // No answer before the seed, whatever the clock does.
    assert!(pop_all(&mut s, a).is_empty());
    watch(&mut s, b, "CS101", 20);
    // Interest is per shard: only the presence join of the second user.
    assert_eq!(actions(&mut s), vec![join_action("CS101", "u2")]);
    run_to(&mut s, &mut 20, 500);
    assert!(pop_all(&mut s, a).is_empty());
    assert!(pop_all(&mut s, b).is_empty());

    let seed = [snap("CS101", 3, 41, Some(17)), snap("CS101", 1, 5, None)];
    s.handle_seed("CS101", &seed, 600);
    for id in [a, b] {
        let out = pop_all(&mut s, id);
        assert_eq!(out.len(), 2, "{out:?}");
        let f = out[0].json();
        assert_eq!(f["type"], "frame");
        assert_eq!(f["course"], "CS101");
        assert_eq!(f["full"], true);
        assert_eq!(
            f["sections"],
            json!([
                {"section": 1, "total_seats": 50, "seats_taken": 5},
                {"section": 3, "total_seats": 50, "seats_taken": 41, "version": 17},
            ])
        );
        assert_eq!(
            out[1],
            Out::Json(json!({"type": "presence", "course": "CS101", "viewers": 2}))
        );
    }
    // The seed of a course nobody here watches is ignored.
    s.handle_seed("NOPE", &[snap("NOPE", 1, 1, None)], 600);
    assert!(actions(&mut s).is_empty());
    assert_eq!(s.courses(), 1);
}

#[test]
fn watch_of_seeded_course_is_answered_at_once_sorted() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    watch(&mut s, a, "CS101", 0);
    let seed: Vec<_> = [7u32, 2, 5, 0, 3]
        .iter()
        .map(|&k| snap("CS101", k, k * 2, Some(1)))
        .collect();
    s.handle_seed("CS101", &seed, 0);
    pop_all(&mut s, a);
    actions(&mut s);

    let b = join(&mut s, "u2", 5);
    watch(&mut s, b, "CS101", 5);
    assert_eq!(actions(&mut s), vec![join_action("CS101", "u2")]);
    let out = pop_all(&mut s, b);
    assert_eq!(out.len(), 2);
    let f = out[0].json();
    assert_eq!(f["full"], true);
    assert_eq!(section_ids(f), vec![0, 2, 3, 5, 7]);
    assert_eq!(
        f["sections"][1],
        json!({"section": 2, "total_seats": 50, "seats_taken": 4, "version": 1})
    );
    assert_eq!(out[1].json()["viewers"], 2);
    // Nothing for the old viewer: the answer is private.
    assert!(pop_all(&mut s, a).is_empty());

    // Watching again re-answers with the whole board, and nothing else happens.
    watch(&mut s, b, "CS101", 6);
    assert!(actions(&mut s).is_empty());
    let out = pop_all(&mut s, b);
    assert_eq!(frames(&out).len(), 1);
    assert_eq!(frames(&out)[0]["full"], true);
}

#[test]
fn empty_board_answers_empty_sections() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    watch(&mut s, a, "EMPTY", 0);
    s.handle_seed("EMPTY", &[], 0);
    let out = pop_all(&mut s, a);
    assert_eq!(
        out[0],
        Out::Json(json!({"type": "frame", "course": "EMPTY", "full": true, "sections": []}))
    );
    assert_eq!(out[1].json()["viewers"], 1);
    // And a later viewer of the still-empty board too.
    let b = join(&mut s, "u2", 0);
    watch(&mut s, b, "EMPTY", 1);
    assert_eq!(pop_all(&mut s, b)[0].json()["sections"], json!([]));
}

#[test]
fn version_rule_and_last_write_wins() {
    let mut s = Shard::new(cfg());
    let a = one_viewer(&mut s, &[snap("C", 1, 10, Some(5))]);
    let mut board = HashMap::new();
    let applied = s.stats().snapshots_applied;
    // Older and equal versions are ignored, even with other content.
    s.handle_snapshot(&snap("C", 1, 11, Some(4)));
    s.handle_snapshot(&snap("C", 1, 12, Some(5)));
    assert_eq!(s.stats().snapshots_applied, applied);
    let mut now = 0;
    run_to(&mut s, &mut now, 1000);
    assert!(
        pop_all(&mut s, a).is_empty(),
        "nothing changed, nothing sent"
    );

    // A newer one is applied.
    s.handle_snapshot(&snap("C", 1, 13, Some(6)));
    assert_eq!(s.stats().snapshots_applied, applied + 1);
    run_to(&mut s, &mut now, 1001);
    let out = pop_all(&mut s, a);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["full"], false);
    assert_eq!(
        f[0]["sections"],
        json!([{"section": 1, "total_seats": 50, "seats_taken": 13, "version": 6}])
    );

    // Without versions, the last write wins, in both directions.
    s.handle_snapshot(&snap("C", 2, 30, None));
    s.handle_snapshot(&snap("C", 2, 20, None));
    s.handle_snapshot(&snap("C", 1, 1, None)); // no version beats version 6
    run_to(&mut s, &mut now, 1300);
    for o in pop_all(&mut s, a) {
        merge(&mut board, &o);
    }
    let c = &board["C"];
    assert_eq!(c[&2]["seats_taken"], 20);
    assert_eq!(c[&1]["seats_taken"], 1);
    assert!(c[&1].get("version").is_none());
    s.handle_snapshot(&snap("C", 1, 2, Some(1))); // any version beats none
    run_to(&mut s, &mut now, 1600);
    let out = pop_all(&mut s, a);
    assert_eq!(frames(&out)[0]["sections"][0]["seats_taken"], 2);

    // An identical snapshot is no change.
    let before = s.stats().snapshots_applied;
    s.handle_snapshot(&snap("C", 1, 2, Some(1)));
    s.handle_snapshot(&snap("C", 2, 20, None));
    assert_eq!(s.stats().snapshots_applied, before);
    // A snapshot of a course nobody watches here is ignored.
    s.handle_snapshot(&snap("OTHER", 1, 2, None));
    assert_eq!(s.stats().snapshots_applied, before);
    assert_eq!(s.courses(), 1);
    run_to(&mut s, &mut now, 2000);
    assert!(pop_all(&mut s, a).is_empty());
}

#[test]
fn replace_undoes_a_forged_version_and_later_versions_pass_it() {
    let mut s = Shard::new(cfg());
    let forged = snap("C", 1, 49, Some(1 << 53));
    let a = one_viewer(&mut s, &[forged]);
    let mut now = 0;
    // A real version cannot pass 2^53.
    s.handle_snapshot(&snap("C", 1, 50, Some(8)));
    run_to(&mut s, &mut now, 1000);
    assert!(pop_all(&mut s, a).is_empty());
    // The reconciler's replace is taken whatever version is held.
    let mut repair = Snapshot::build("C".into(), 1, 50, 50, None, Some(8), None);
    repair.replace = true;
    s.handle_snapshot(&Arc::new(repair));
    run_to(&mut s, &mut now, 1300);
    let out = pop_all(&mut s, a);
    assert_eq!(
        frames(&out)[0]["sections"],
        json!([{"section": 1, "total_seats": 50, "seats_taken": 50, "version": 8}])
    );
    // A seed (a state read answered before the repair) never takes it back.
    s.handle_seed("C", &[snap("C", 1, 49, Some(1 << 53))], now);
    run_to(&mut s, &mut now, 1600);
    assert!(pop_all(&mut s, a).is_empty());
    // Its version is the one to pass: equal is ignored, the next real one taken.
    s.handle_snapshot(&snap("C", 1, 3, Some(8)));
    s.handle_snapshot(&snap("C", 1, 49, Some(9)));
    run_to(&mut s, &mut now, 1900);
    let out = pop_all(&mut s, a);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["sections"][0]["seats_taken"], 49);
    assert_eq!(f[0]["sections"][0]["version"], 9);
}

/// Runs `f` on a thread so that a hang fails the test instead of blocking the suite.
fn within_10s(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(10)) {
        Ok(()) => handle.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the shard hung"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(handle.join().unwrap_err())
        }
    }
}

/// The ingest subscribes first and reads the state hash second, so a live
/// snapshot can reach the shard before the seed. A render scheduled for it
/// cannot happen before the seed; rescheduling it at every `handle_timeout`
/// would spin forever (`poll_timeout` asking for an immediate wake-up), so the
/// core schedules nothing until the seed and loses nothing meanwhile.
#[test]
fn snapshot_before_seed_neither_spins_nor_is_lost() {
    within_10s(|| {
        let mut s = Shard::new(cfg());
        let a = join(&mut s, "u1", 0);
        let b = join(&mut s, "u2", 0);
        watch(&mut s, a, "C", 0);
        s.handle_snapshot(&snap("C", 2, 7, Some(3)));
        s.handle_snapshot(&snap("C", 5, 1, None));
        let deadline = s.poll_timeout();
        assert!(
            deadline.is_some_and(|t| t > 10),
            "nothing can be rendered before the seed: {deadline:?}"
        );
        s.handle_timeout(10);
        assert!(pop_all(&mut s, a).is_empty(), "no frame before the seed");
        watch(&mut s, b, "C", 20);
        assert!(pop_all(&mut s, b).is_empty());
        // The seed was read after the live snapshot: section 2 is older there.
        s.handle_seed(
            "C",
            &[snap("C", 1, 1, Some(1)), snap("C", 2, 6, Some(2))],
            30,
        );
        let mut now = 30;
        run_to(&mut s, &mut now, 1_000);
        let mut src = BTreeMap::new();
        for sn in [
            snap("C", 1, 1, Some(1)),
            snap("C", 2, 6, Some(2)),
            snap("C", 2, 7, Some(3)),
            snap("C", 5, 1, None),
        ] {
            apply_truth(&mut src, &sn);
        }
        for id in [a, b] {
            let out = pop_all(&mut s, id);
            assert_eq!(frames(&out)[0]["full"], true);
            let mut boards = HashMap::new();
            for o in &out {
                merge(&mut boards, o);
            }
            assert_eq!(boards["C"], truth(&src));
        }
        // And live updates flow normally afterwards.
        s.handle_snapshot(&snap("C", 2, 8, Some(4)));
        run_to(&mut s, &mut now, 1_001);
        assert_eq!(
            frames(&pop_all(&mut s, a))[0]["sections"][0]["seats_taken"],
            8
        );
    });
}

/// The same with a course that is forgotten and watched again (a second
/// interest, a second seed) while live snapshots keep flowing.
#[test]
fn rewatch_after_forget_with_early_snapshot() {
    within_10s(|| {
        let mut s = Shard::new(cfg());
        let a = join(&mut s, "u1", 0);
        watch(&mut s, a, "C", 0);
        s.handle_seed("C", &[snap("C", 0, 1, None)], 0);
        pop_all(&mut s, a);
        unwatch(&mut s, a, "C", 1);
        watch(&mut s, a, "C", 2);
        s.handle_snapshot(&snap("C", 0, 2, None));
        let mut now = 2;
        run_to(&mut s, &mut now, 500);
        assert!(pop_all(&mut s, a).is_empty());
        s.handle_seed("C", &[snap("C", 0, 2, None)], 500);
        run_to(&mut s, &mut now, 1_000);
        let out = pop_all(&mut s, a);
        assert_eq!(frames(&out)[0]["full"], true);
        assert_eq!(frames(&out)[0]["sections"][0]["seats_taken"], 2);
    });
}
