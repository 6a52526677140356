//! Render pacing: a token bucket per course (one token per tick, at most two
//! held), the course gate, the deadline, and one encoding per render.

use crate::rig::{
    apply_truth, cfg, decode, frames, join, merge, one_viewer, pop_all, pop_raw, run_to,
    section_ids, snap, truth, unwatch, watch, Board, Out, Rng,
};
use shards::{ConnId, Gate, Shard, Snapshot};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The contract's token bucket, written independently of the shard's: credit
/// in milliseconds, one tick of credit per token, at most two tokens.
struct ModelBucket {
    credit_ms: u64,
    at_ms: u64,
}

impl ModelBucket {
    fn full() -> Self {
        ModelBucket {
            credit_ms: 2 * TICK,
            at_ms: 0,
        }
    }

    fn holds_token(&mut self, now: u64) -> bool {
        self.credit_ms = (self.credit_ms + (now - self.at_ms)).min(2 * TICK);
        self.at_ms = now;
        self.credit_ms >= TICK
    }

    fn spend(&mut self, now: u64) {
        assert!(self.holds_token(now), "a frame without a token at {now}");
        self.credit_ms -= TICK;
    }
}

const TICK: u64 = 200;

/// Asserts that any `k` consecutive tick intervals hold at most `k + 1` of
/// the frame times `times` (sorted).
fn assert_k_plus_one(times: &[u64], what: &str) {
    for (i, &t0) in times.iter().enumerate() {
        for k in 1..=25u64 {
            let n = times[i..]
                .iter()
                .take_while(|&&t| t < t0 + k * TICK)
                .count() as u64;
            assert!(
                n <= k + 1,
                "{what}: {n} frames in [{t0}, +{k} ticks): {times:?}"
            );
        }
    }
}

#[test]
fn quiet_course_update_is_on_the_wire_at_once() {
    let mut s = Shard::new(cfg());
    let a = one_viewer(&mut s, &[snap("C", 0, 0, None)]);
    let mut now = 0;
    run_to(&mut s, &mut now, 5_000);
    assert!(pop_all(&mut s, a).is_empty());
    // Quiet course: a change is due now (poll_timeout not after now).
    now = 5_123;
    s.handle_snapshot(&snap("C", 0, 1, None));
    assert!(
        s.poll_timeout().is_some_and(|t| t <= now),
        "{:?}",
        s.poll_timeout()
    );
    s.handle_timeout(now);
    assert_eq!(frames(&pop_all(&mut s, a)).len(), 1);
    // The second token: a change right after goes out at once too.
    s.handle_snapshot(&snap("C", 0, 2, None));
    s.handle_timeout(now + 7);
    assert_eq!(
        frames(&pop_all(&mut s, a))[0]["sections"][0]["seats_taken"],
        2
    );
    // No token left: the next change waits for the next token, one tick after
    // the first frame.
    s.handle_snapshot(&snap("C", 0, 3, None));
    assert_eq!(s.poll_timeout(), Some(now + 200));
    s.handle_timeout(now + 199);
    assert!(pop_all(&mut s, a).is_empty());
    s.handle_timeout(now + 200);
    assert_eq!(
        frames(&pop_all(&mut s, a))[0]["sections"][0]["seats_taken"],
        3
    );
    // Quiet for two ticks: on the wire at once again.
    let t = now + 200 + 400;
    s.handle_snapshot(&snap("C", 0, 4, None));
    assert!(s.poll_timeout().is_some_and(|d| d <= t));
    s.handle_timeout(t);
    assert_eq!(frames(&pop_all(&mut s, a)).len(), 1);
}

#[test]
fn a_courses_gate_says_when_a_snapshot_must_wake_the_shard() {
    let mut s = Shard::new(cfg());
    let a = one_viewer(&mut s, &[snap("C", 0, 0, None)]);
    let gate = s.gate("C").expect("a watched course has a gate");
    assert_eq!(s.gate("C"), Some(gate.clone()), "one gate per course");
    assert!(s.gate("NOPE").is_none());
    let mut now = 0;
    run_to(&mut s, &mut now, 5_000);
    pop_all(&mut s, a);
    // Quiet, two tokens held: a snapshot may go out at once.
    assert!(gate.ready_at() <= 5_000, "{}", gate.ready_at());
    // Dirty and in the schedule: the timer is set, snapshots need no wake-up.
    s.handle_snapshot(&snap("C", 0, 1, None));
    assert_eq!(gate.ready_at(), Gate::ARMED);
    s.handle_snapshot(&snap("C", 0, 2, None));
    assert_eq!(gate.ready_at(), Gate::ARMED);
    // Rendered, one token left: ready at once again.
    s.handle_timeout(5_000);
    assert_eq!(frames(&pop_all(&mut s, a)).len(), 1);
    assert!(gate.ready_at() <= 5_000);
    s.handle_snapshot(&snap("C", 0, 3, None));
    s.handle_timeout(5_001);
    assert_eq!(frames(&pop_all(&mut s, a)).len(), 1);
    // No token left: the next one is a tick after the first frame.
    assert_eq!(gate.ready_at(), 5_200);
    s.handle_snapshot(&snap("C", 0, 4, None));
    assert_eq!(gate.ready_at(), Gate::ARMED);
    assert_eq!(s.poll_timeout(), Some(5_200));
}

#[test]
fn latest_state_wins_while_waiting_for_a_token() {
    let mut s = Shard::new(cfg());
    let a = one_viewer(&mut s, &[]);
    // Two changes spend both tokens.
    let mut now = 1;
    for taken in [1, 2] {
        s.handle_snapshot(&snap("C", 1, taken, None));
        s.handle_timeout(now);
        assert_eq!(frames(&pop_all(&mut s, a)).len(), 1);
    }
    // Many changes before the next token: one frame, the latest state of each
    // changed section.
    let mut latest: BTreeMap<u64, u32> = BTreeMap::new();
    for (i, t) in (2..200).step_by(7).enumerate() {
        run_to(&mut s, &mut now, t);
        let i = i as u32;
        s.handle_snapshot(&snap("C", 1, 100 + i, None));
        s.handle_snapshot(&snap("C", i % 3 + 2, i, None));
        latest.insert(1, 100 + i);
        latest.insert((i % 3 + 2) as u64, i);
        s.handle_timeout(t);
        assert!(pop_all(&mut s, a).is_empty(), "no token yet (t={t})");
    }
    assert_eq!(
        s.poll_timeout(),
        Some(201),
        "the next token, a tick after the first frame"
    );
    run_to(&mut s, &mut now, 200);
    assert!(pop_all(&mut s, a).is_empty());
    run_to(&mut s, &mut now, 201);
    let out = pop_all(&mut s, a);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["full"], false);
    assert_eq!(section_ids(f[0]), vec![1, 2, 3, 4]);
    for s in f[0]["sections"].as_array().unwrap() {
        assert_eq!(s["seats_taken"], latest[&s["section"].as_u64().unwrap()]);
    }
}

#[test]
fn k_ticks_carry_at_most_k_plus_one_frames_under_a_flood() {
    let mut s = Shard::new(cfg());
    let a = one_viewer(&mut s, &[]);
    let mut times = Vec::new();
    let mut last_taken = 0;
    // A change every millisecond for 10 s, the clock advanced every millisecond.
    for t in 1..=10_000u64 {
        s.handle_snapshot(&snap("C", (t % 5) as u32, (t % 50) as u32, Some(t)));
        s.handle_timeout(t);
        for f in frames(&pop_all(&mut s, a)) {
            times.push(t);
            last_taken = f["sections"].as_array().unwrap().last().unwrap()["seats_taken"]
                .as_u64()
                .unwrap();
        }
    }
    // 10 s = 50 ticks: the two held tokens, then one per tick.
    assert_eq!(times.len(), 51, "{times:?}");
    assert_eq!(&times[..3], &[1, 1 + 1, 201], "burst of two, then the tick");
    assert_k_plus_one(&times, "flood");
    assert!(last_taken > 0);
}

/// Many snapshots at random times, `handle_timeout` at every millisecond: each
/// client sees exactly the frames the contract's bucket allows (a pending change
/// goes out as soon as a token is held), at most k+1 per k ticks, and ends
/// with the true board.
#[test]
fn frames_follow_the_token_bucket_exactly() {
    let mut s = Shard::new(cfg());
    let courses = ["A", "B"];
    let a = join(&mut s, "u1", 0);
    let b = join(&mut s, "u2", 0);
    let c = join(&mut s, "u3", 0);
    let watching: [(ConnId, &[&str]); 3] = [(a, &["A", "B"]), (b, &["A"]), (c, &["B"])];
    for (id, cs) in watching {
        for course in cs {
            watch(&mut s, id, course, 0);
        }
    }
    for course in courses {
        s.handle_seed(course, &[], 0);
    }
    let mut boards: HashMap<ConnId, HashMap<String, Board>> = HashMap::new();
    for (id, _) in watching {
        for o in pop_all(&mut s, id) {
            merge(boards.entry(id).or_default(), &o);
        }
    }
    let mut src: HashMap<&str, BTreeMap<u32, Arc<Snapshot>>> = HashMap::new();
    let mut rng = Rng(0x1234_5678);
    let mut times: HashMap<(ConnId, String), Vec<u64>> = HashMap::new();
    let mut bucket: HashMap<&str, ModelBucket> =
        courses.iter().map(|c| (*c, ModelBucket::full())).collect();
    let mut pending: HashSet<&str> = HashSet::new();
    let mut frames_seen = 0;
    for t in 1..=8_000u64 {
        // Bursts of 0-3 snapshots, denser in the middle (a flood), quiet at the end.
        let odds = if (2_000..4_000).contains(&t) { 2 } else { 40 };
        if t < 7_000 && rng.below(odds) == 0 {
            for _ in 0..rng.below(4) {
                let course = courses[rng.below(2) as usize];
                let sn = snap(course, rng.below(6) as u32, rng.below(50) as u32, None);
                let before = s.stats().snapshots_applied;
                s.handle_snapshot(&sn);
                apply_truth(src.entry(course).or_default(), &sn);
                if s.stats().snapshots_applied > before {
                    pending.insert(course);
                }
            }
        }
        s.handle_timeout(t);
        let mut rendered_now: HashSet<String> = HashSet::new();
        for (id, _) in watching {
            for o in pop_all(&mut s, id) {
                if let Out::Json(v) = &o {
                    if v["type"] == "frame" {
                        frames_seen += 1;
                        assert_eq!(v["full"], false, "nobody missed a frame");
                        let course = v["course"].as_str().unwrap().to_string();
                        times.entry((id, course.clone())).or_default().push(t);
                        rendered_now.insert(course);
                    }
                }
                merge(boards.get_mut(&id).unwrap(), &o);
            }
        }
        for course in courses {
            let rendered = rendered_now.contains(course);
            let due = pending.contains(course) && bucket.get_mut(course).unwrap().holds_token(t);
            assert_eq!(
                rendered, due,
                "{course} at {t}: frame {rendered}, due {due}"
            );
            if rendered {
                bucket.get_mut(course).unwrap().spend(t);
                pending.remove(course);
            }
        }
    }
    assert!(pending.is_empty());
    assert!(frames_seen > 80, "the test exercised little: {frames_seen}");
    for ((id, course), ts) in &times {
        assert_k_plus_one(ts, &format!("{id:?} {course}"));
    }
    for (id, cs) in watching {
        for course in cs {
            assert_eq!(boards[&id][*course], truth(&src[course]), "{id:?} {course}");
        }
    }
}

/// The shell's real loop: it wakes only when a snapshot arrives or at
/// [`Shard::poll_timeout`]. Over 40 courses whose last viewer sometimes leaves
/// while the course waits for a token (and comes back), every wake renders
/// exactly the courses the model bucket says are due, and the deadline the
/// shard reports is exactly the model's next due moment (or the sweep).
#[test]
fn deadline_is_the_earliest_due_course_across_unwatch_and_rewatch() {
    const N: usize = 40;
    let mut s = Shard::new(cfg());
    let names: Vec<String> = (0..N).map(|i| format!("K{i}")).collect();
    let ids: Vec<ConnId> = (0..N).map(|i| join(&mut s, &format!("u{i}"), 0)).collect();
    for (id, name) in ids.iter().zip(&names) {
        watch(&mut s, *id, name, 0);
        s.handle_seed(name, &[], 0);
        pop_all(&mut s, *id);
    }
    let mut bucket: Vec<ModelBucket> = (0..N).map(|_| ModelBucket::full()).collect();
    let mut pending = [false; N];
    let mut watching = [true; N];
    let mut rng = Rng(0xdead_beef);
    let mut next_sweep = 1_000u64;
    let mut now = 0u64;
    let mut next_snap = 1u64;
    let mut frames_seen = 0;
    let mut rewatches = 0;
    let mut wakes = 0;
    while now < 20_000 {
        let deadline = s.poll_timeout().expect("connections are open");
        assert!(
            deadline > now || now == 0,
            "a deadline in the past at {now}"
        );
        now = deadline.min(next_snap).max(now);
        wakes += 1;
        assert!(wakes < 100_000, "the loop does not advance");
        if now == next_snap {
            next_snap += 1 + rng.below(30);
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(N as u64) as usize;
                if !watching[i] {
                    watch(&mut s, ids[i], &names[i], now);
                    s.handle_seed(&names[i], &[], now);
                    assert!(pop_all(&mut s, ids[i])[0].is_type("frame"), "watch answer");
                    (watching[i], pending[i], bucket[i]) = (true, false, ModelBucket::full());
                    bucket[i].at_ms = now;
                    rewatches += 1;
                } else if rng.below(12) == 0 {
                    // The last viewer leaves, maybe while the course waits.
                    unwatch(&mut s, ids[i], &names[i], now);
                    (watching[i], pending[i]) = (false, false);
                } else {
                    let sn = snap(&names[i], rng.below(4) as u32, rng.below(50) as u32, None);
                    let before = s.stats().snapshots_applied;
                    s.handle_snapshot(&sn);
                    pending[i] |= s.stats().snapshots_applied > before;
                }
            }
        }
        s.handle_timeout(now);
        if now >= next_sweep {
            next_sweep = now + 1_000;
        }
        for i in 0..N {
            let rendered = pop_all(&mut s, ids[i])
                .iter()
                .filter(|o| o.is_type("frame"))
                .count();
            let due = pending[i] && bucket[i].holds_token(now);
            assert_eq!(rendered, due as usize, "{} at {now}", names[i]);
            if due {
                bucket[i].spend(now);
                pending[i] = false;
                frames_seen += 1;
            }
        }
        // The model's next due moment: a pending course's next token.
        let model = (0..N)
            .filter(|&i| pending[i])
            .map(|i| {
                let b = &bucket[i];
                let credit = (b.credit_ms + (now - b.at_ms)).min(2 * TICK);
                now + TICK.saturating_sub(credit)
            })
            .min();
        let want = model.map_or(next_sweep, |m| m.min(next_sweep));
        assert_eq!(s.poll_timeout(), Some(want), "deadline at {now}");
    }
    assert!(
        frames_seen > 300,
        "the test exercised little: {frames_seen}"
    );
    assert!(rewatches > 20, "few courses came back: {rewatches}");
}

#[test]
fn every_viewer_gets_the_same_bytes_encoded_once() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let b = join(&mut s, "u2", 0);
    watch(&mut s, a, "C", 0);
    watch(&mut s, b, "C", 0);
    s.handle_seed("C", &[snap("C", 1, 1, Some(1))], 0);
    // The watch answers share the one full frame.
    let (ra, rb) = (pop_raw(&mut s, a), pop_raw(&mut s, b));
    assert_eq!(ra[0].as_ptr(), rb[0].as_ptr());
    assert_eq!(ra[0], rb[0]);
    let rendered = s.stats().frames_rendered;
    s.handle_snapshot(&snap("C", 1, 2, Some(2)));
    s.handle_snapshot(&snap("C", 4, 2, Some(2)));
    s.handle_timeout(10);
    assert_eq!(s.stats().frames_rendered, rendered + 1);
    let (ra, rb) = (pop_raw(&mut s, a), pop_raw(&mut s, b));
    assert_eq!((ra.len(), rb.len()), (1, 1));
    assert_eq!(
        ra[0].as_ptr(),
        rb[0].as_ptr(),
        "the delta was serialized once"
    );
    // A later watcher of the unchanged board gets the cached full frame.
    let c = join(&mut s, "u3", 20);
    let d = join(&mut s, "u4", 20);
    watch(&mut s, c, "C", 20);
    watch(&mut s, d, "C", 20);
    let (rc, rd) = (pop_raw(&mut s, c), pop_raw(&mut s, d));
    assert_eq!(rc[0].as_ptr(), rd[0].as_ptr());
    assert_eq!(section_ids(decode(&rc[0]).json()), vec![1, 4]);
}
