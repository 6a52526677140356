//! Closing: the drain's spread reconnect hints and 1012 closes, close-all,
//! and the echo of a peer's close.

use crate::rig::{actions, cfg, interest, join, pop_all, run_to, watch, Out};
use shards::{Action, ConnId, Shard};
use std::collections::{BTreeSet, HashMap};

#[test]
fn drain_spreads_reconnect_hints_and_1012_over_the_window() {
    let mut s = Shard::new(cfg());
    let mut ids = Vec::new();
    for i in 0..40 {
        let id = join(&mut s, &format!("u{i}"), 0);
        watch(&mut s, id, "C", 0);
        ids.push(id);
    }
    s.handle_seed("C", &[], 0);
    for id in &ids {
        pop_all(&mut s, *id);
    }
    actions(&mut s);
    assert!(!s.draining());
    let (start, window) = (1_000u64, 10_000u64);
    s.start_drain(start, window);
    assert!(s.draining());
    s.start_drain(start, window); // a second call changes nothing
    let mut closed_at: HashMap<ConnId, u64> = HashMap::new();
    let mut t = start;
    while t <= start + window + 2_000 {
        s.handle_timeout(t);
        for a in actions(&mut s) {
            match a {
                Action::Close { conn, code } => {
                    assert_eq!(code, 1012);
                    assert!(closed_at.insert(conn, t).is_none());
                }
                Action::PresenceLeave { .. }
                | Action::Cut { .. }
                | Action::Interest {
                    watching: false, ..
                } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        for id in &ids {
            let out = pop_all(&mut s, *id);
            if out.is_empty() {
                continue;
            }
            assert_eq!(out.len(), 2, "{out:?}");
            let hint = out[0].json();
            assert_eq!(hint["type"], "reconnect");
            let after = hint["after_ms"].as_u64().expect("after_ms is an integer");
            assert!(after <= 5_000);
            assert_eq!(hint.as_object().unwrap().len(), 2);
            assert_eq!(out[1], Out::Close(1012));
            assert_eq!(closed_at.get(id), Some(&t));
        }
        t += 1;
    }
    assert_eq!(closed_at.len(), ids.len(), "every connection drained");
    let moments: BTreeSet<u64> = closed_at.values().copied().collect();
    assert!(moments.iter().all(|m| (start..=start + window).contains(m)));
    assert!(moments.len() >= 20, "spread, not all at once: {moments:?}");
    let (lo, hi) = (moments.first().unwrap(), moments.last().unwrap());
    assert!(
        *lo < start + window / 4 && *hi > start + 3 * window / 4,
        "{moments:?}"
    );
    assert_eq!(s.courses(), 0);
    assert_eq!(
        s.connections(),
        ids.len(),
        "the shell disconnects after flushing"
    );
}

#[test]
fn drain_hints_are_jittered() {
    let mut s = Shard::new(cfg());
    let ids: Vec<_> = (0..30).map(|i| join(&mut s, &format!("u{i}"), 0)).collect();
    s.start_drain(0, 0);
    s.handle_timeout(0);
    let afters: BTreeSet<u64> = ids
        .iter()
        .map(|id| {
            let out = pop_all(&mut s, *id);
            assert_eq!(out[1], Out::Close(1012));
            out[0].json()["after_ms"].as_u64().unwrap()
        })
        .collect();
    assert!(afters.len() > 10, "{afters:?}");
    assert!(afters.iter().all(|a| *a <= 5_000));
}

#[test]
fn close_all_closes_everything_at_once() {
    let mut s = Shard::new(cfg());
    let ids: Vec<_> = (0..5).map(|i| join(&mut s, &format!("u{i}"), 0)).collect();
    watch(&mut s, ids[0], "C", 0);
    s.close(ids[4], 1000, "");
    actions(&mut s);
    pop_all(&mut s, ids[4]);
    s.start_drain(0, 60_000);
    s.close_all(1001);
    let acts = actions(&mut s);
    let closes: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Close { conn, code } => Some((*conn, *code)),
            _ => None,
        })
        .collect();
    assert_eq!(
        closes,
        ids[..4].iter().map(|id| (*id, 1001)).collect::<Vec<_>>()
    );
    assert!(acts.contains(&interest("C", false)));
    for id in &ids[..4] {
        assert_eq!(pop_all(&mut s, *id), vec![Out::Close(1001)]);
    }
    assert!(pop_all(&mut s, ids[4]).is_empty(), "already closed once");
    // The drain that was under way sends nothing more.
    s.handle_timeout(60_000);
    for id in &ids {
        assert!(pop_all(&mut s, *id).is_empty());
    }
}

#[test]
fn peer_close_is_echoed() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let b = join(&mut s, "u2", 0);
    s.handle_peer_close(a, Some(4000), 5);
    s.handle_peer_close(b, None, 5);
    assert_eq!(
        actions(&mut s),
        vec![
            Action::Close {
                conn: a,
                code: 4000
            },
            Action::Close {
                conn: b,
                code: 1000
            }
        ]
    );
    assert_eq!(pop_all(&mut s, a), vec![Out::Close(4000)]);
    assert_eq!(pop_all(&mut s, b), vec![Out::Close(1000)]);
}

/// A connection whose upgrade completes just after the drain started (the
/// shell checked `draining` before the handshake finished) joins the drain
/// schedule too: left out, it would never be told to reconnect and the
/// process could not finish draining.
#[test]
fn connection_arriving_during_a_drain_is_drained_too() {
    let mut s = Shard::new(cfg());
    let early = join(&mut s, "u1", 0);
    s.start_drain(1_000, 2_000);
    let late = join(&mut s, "u2", 1_500);
    watch(&mut s, late, "C", 1_500);
    let mut now = 1_500;
    run_to(&mut s, &mut now, 10_000);
    let closes: Vec<_> = actions(&mut s)
        .into_iter()
        .filter(|a| matches!(a, Action::Close { .. }))
        .collect();
    assert_eq!(closes.len(), 2, "{closes:?}");
    for id in [early, late] {
        assert!(closes.contains(&Action::Close {
            conn: id,
            code: 1012
        }));
        let out = pop_all(&mut s, id);
        let n = out.len();
        assert!(n >= 2);
        assert_eq!(out[n - 2].json()["type"], "reconnect");
        assert_eq!(out[n - 1], Out::Close(1012));
    }
    assert_eq!(s.courses(), 0);
}
