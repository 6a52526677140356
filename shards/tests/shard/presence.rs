//! Unwatch and disconnect bookkeeping: interest and presence per user, and
//! presence counts sent to viewers.

use crate::rig::{
    actions, cfg, frames, interest, join, join_action, leave_action, pop_all, run_to, snap,
    unwatch, watch, Out, Rng,
};
use serde_json::json;
use shards::{Action, ConnId, Shard};
use std::collections::{BTreeSet, HashSet};

#[test]
fn last_viewer_leaving_ends_interest_and_presence_per_user() {
    let mut s = Shard::new(cfg());
    let a1 = join(&mut s, "u1", 0);
    let a2 = join(&mut s, "u1", 0); // same user, second tab
    let b = join(&mut s, "u2", 0);
    for id in [a1, a2, b] {
        watch(&mut s, id, "X", 0);
    }
    assert_eq!(
        actions(&mut s),
        vec![
            interest("X", true),
            join_action("X", "u1"),
            join_action("X", "u2")
        ]
    );
    s.handle_seed("X", &[snap("X", 0, 0, None)], 0);
    for id in [a1, a2, b] {
        assert_eq!(
            pop_all(&mut s, id)[1].json()["viewers"],
            2,
            "distinct users"
        );
    }
    unwatch(&mut s, a1, "X", 1);
    assert!(
        actions(&mut s).is_empty(),
        "u1 still watches from another tab"
    );
    // The unwatched connection gets no more frames of X.
    s.handle_snapshot(&snap("X", 0, 1, None));
    s.handle_timeout(1);
    assert!(pop_all(&mut s, a1).is_empty());
    assert_eq!(frames(&pop_all(&mut s, a2)).len(), 1);
    assert_eq!(frames(&pop_all(&mut s, b)).len(), 1);
    // Unwatching twice, or something never watched, is a no-op.
    unwatch(&mut s, a1, "X", 2);
    unwatch(&mut s, a1, "NEVER", 2);
    assert!(actions(&mut s).is_empty());
    assert!(pop_all(&mut s, a1).is_empty());

    s.disconnect(a2);
    assert_eq!(actions(&mut s), vec![leave_action("X", "u1")]);
    assert_eq!(s.courses(), 1);
    s.close(b, 1000, "bye");
    assert_eq!(
        actions(&mut s),
        vec![
            leave_action("X", "u2"),
            interest("X", false),
            Action::Close {
                conn: b,
                code: 1000
            }
        ]
    );
    assert_eq!(pop_all(&mut s, b), vec![Out::Close(1000)]);
    assert_eq!(s.courses(), 0);
    // A snapshot of the course is now ignored; the close frame was the last word.
    s.handle_snapshot(&snap("X", 0, 5, None));
    s.handle_timeout(500);
    assert!(pop_all(&mut s, b).is_empty());
    // Text on a closing connection is ignored.
    watch(&mut s, b, "X", 600);
    assert!(actions(&mut s).is_empty());
    assert!(pop_all(&mut s, b).is_empty());
    s.disconnect(b);
    assert!(actions(&mut s).is_empty());
    assert_eq!(s.connections(), 1);

    // Re-watching after the course was forgotten asks for interest and a seed again.
    watch(&mut s, a1, "X", 700);
    assert_eq!(
        actions(&mut s),
        vec![interest("X", true), join_action("X", "u1")]
    );
    assert!(pop_all(&mut s, a1).is_empty());
    s.handle_seed("X", &[snap("X", 0, 5, None)], 700);
    let out = pop_all(&mut s, a1);
    assert_eq!(frames(&out)[0]["sections"][0]["seats_taken"], 5);
}

/// What the shell learned from the shard's actions: the courses with interest
/// and the (course, user) pairs present.
#[derive(Default)]
struct Ledger {
    interested: HashSet<String>,
    present: HashSet<(String, String)>,
}

impl Ledger {
    /// Plays the shell: takes every action, checking each against the ledger,
    /// and returns the ledger as it stands.
    fn pump(
        &mut self,
        s: &mut Shard,
        closed: &mut Vec<ConnId>,
    ) -> (HashSet<String>, HashSet<(String, String)>) {
        let Ledger {
            interested,
            present,
        } = self;
        for a in actions(s) {
            match a {
                Action::Interest { course, watching } => {
                    assert_eq!(interested.insert(course.to_string()), watching, "{course}");
                    if !watching {
                        interested.remove(&*course);
                    }
                }
                Action::PresenceJoin { course, user } => {
                    assert!(present.insert((course.to_string(), user.to_string())));
                }
                Action::PresenceLeave { course, user } => {
                    assert!(present.remove(&(course.to_string(), user.to_string())));
                }
                Action::Close { conn, .. } => closed.push(conn),
                other => panic!("unexpected {other:?}"),
            }
        }
        (interested.clone(), present.clone())
    }
}

/// The ledger the connections' watches call for: the courses with interest
/// and the (course, user) pairs present.
fn wanted(
    conns: &[(ConnId, String, BTreeSet<&str>)],
) -> (HashSet<String>, HashSet<(String, String)>) {
    let want_interest: HashSet<String> = conns
        .iter()
        .flat_map(|(_, _, w)| w.iter().map(|c| c.to_string()))
        .collect();
    let want_presence: HashSet<(String, String)> = conns
        .iter()
        .flat_map(|(_, u, w)| w.iter().map(move |c| (c.to_string(), u.clone())))
        .collect();
    (want_interest, want_presence)
}

/// Many connections watching subsets of courses, removed (unwatch, close,
/// disconnect) in random orders: after every removal, frames reach exactly the
/// remaining viewers, once each, and interest/presence stay consistent.
#[test]
fn swap_remove_bookkeeping_survives_random_removal_orders() {
    const COURSES: [&str; 3] = ["A", "B", "C"];
    for seed in 1..=25u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut s = Shard::new(cfg());
        let mut now = 0u64;
        let n = 24;
        let mut conns: Vec<(ConnId, String, BTreeSet<&str>)> = Vec::new();
        for i in 0..n {
            let user = format!("u{}", i % 9);
            let id = join(&mut s, &user, 0);
            conns.push((id, user, BTreeSet::new()));
        }
        // Random watch order, random subsets.
        for _ in 0..60 {
            let i = rng.below(n as u64) as usize;
            let c = COURSES[rng.below(3) as usize];
            watch(&mut s, conns[i].0, c, 0);
            conns[i].2.insert(c);
        }
        let mut ledger = Ledger::default();
        let mut pump = |s: &mut Shard, closed: &mut Vec<ConnId>| ledger.pump(s, closed);
        let mut closed = Vec::new();
        pump(&mut s, &mut closed);
        for c in COURSES {
            s.handle_seed(c, &[], 0);
        }
        for (id, _, _) in &conns {
            pop_all(&mut s, *id);
        }
        let mut round = 0u32;
        loop {
            // Every course changes; one tick later each viewer has one frame per course.
            round += 1;
            for c in COURSES {
                s.handle_snapshot(&snap(c, 0, round, None));
            }
            let until = now + 200;
            run_to(&mut s, &mut now, until);
            let (interest_now, presence_now) = pump(&mut s, &mut closed);
            let (want_interest, want_presence) = wanted(&conns);
            assert_eq!(interest_now, want_interest, "seed {seed}");
            assert_eq!(s.courses(), want_interest.len());
            assert_eq!(presence_now, want_presence, "seed {seed}");
            for (id, _, w) in &conns {
                let out = pop_all(&mut s, *id);
                let got: Vec<&str> = frames(&out)
                    .iter()
                    .map(|f| {
                        assert_eq!(f["full"], false);
                        assert_eq!(f["sections"][0]["seats_taken"], round);
                        f["course"].as_str().unwrap()
                    })
                    .collect();
                let mut got_sorted = got.clone();
                got_sorted.sort_unstable();
                assert_eq!(
                    got_sorted,
                    w.iter().copied().collect::<Vec<_>>(),
                    "seed {seed}"
                );
            }
            // Remove something at random.
            let watching: Vec<usize> = (0..conns.len())
                .filter(|&i| !conns[i].2.is_empty())
                .collect();
            if watching.is_empty() {
                break;
            }
            let i = watching[rng.below(watching.len() as u64) as usize];
            match rng.below(6) {
                0 => {
                    s.disconnect(conns[i].0);
                    conns.swap_remove(i);
                }
                1 => {
                    s.close(conns[i].0, 1000, "");
                    pump(&mut s, &mut closed);
                    assert_eq!(closed.pop(), Some(conns[i].0));
                    assert_eq!(pop_all(&mut s, conns[i].0), vec![Out::Close(1000)]);
                    s.disconnect(conns[i].0);
                    conns.swap_remove(i);
                }
                _ => {
                    let w: Vec<&str> = conns[i].2.iter().copied().collect();
                    let c = w[rng.below(w.len() as u64) as usize];
                    unwatch(&mut s, conns[i].0, c, now);
                    conns[i].2.remove(c);
                }
            }
        }
        assert_eq!(s.courses(), 0);
        let (i, p) = pump(&mut s, &mut closed);
        assert!(i.is_empty() && p.is_empty());
    }
}

#[test]
fn presence_goes_to_viewers_only_when_it_changes() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let b = join(&mut s, "u2", 0);
    let c = join(&mut s, "u3", 0);
    watch(&mut s, a, "X", 0);
    watch(&mut s, b, "X", 0);
    watch(&mut s, c, "Y", 0);
    s.handle_seed("X", &[], 0);
    s.handle_seed("Y", &[], 0);
    for id in [a, b, c] {
        pop_all(&mut s, id);
    }
    s.handle_presence("X", 5, s.presence_batch());
    let want = Out::Json(json!({"type": "presence", "course": "X", "viewers": 5}));
    assert_eq!(pop_all(&mut s, a), vec![want.clone()]);
    assert_eq!(pop_all(&mut s, b), vec![want]);
    assert!(pop_all(&mut s, c).is_empty());
    s.handle_presence("X", 5, s.presence_batch());
    assert!(
        pop_all(&mut s, a).is_empty(),
        "unchanged count is not resent"
    );
    assert!(pop_all(&mut s, b).is_empty());
    s.handle_presence("X", 7, s.presence_batch());
    assert_eq!(pop_all(&mut s, a)[0].json()["viewers"], 7);
    assert_eq!(pop_all(&mut s, b)[0].json()["viewers"], 7);
    s.handle_presence("Z", 3, s.presence_batch());
    for id in [a, b, c] {
        assert!(pop_all(&mut s, id).is_empty());
    }
    // A new watcher is told the current count in its answer: the last
    // count and itself, whose join that count does not include.
    let d = join(&mut s, "u4", 0);
    watch(&mut s, d, "X", 0);
    assert_eq!(pop_all(&mut s, d)[1].json()["viewers"], 8);
}
