//! Unit tests of the shard: seeds racing snapshots, joined writes, healing.

use super::*;
use crate::conn::{Role, WsOptions};
use crate::server_msg;
use crate::snapshot::Snapshot;
use crate::ws_codec::server_frame_payload;

fn snap(section: u32, taken: u32, version: Option<u64>) -> Arc<Snapshot> {
    Arc::new(Snapshot::build(
        "C".into(),
        section,
        50,
        taken,
        None,
        version,
        None,
    ))
}

#[test]
fn snapshot_before_seed_neither_hangs_nor_loses_to_the_older_seed() {
    let mut shard = Shard::new(ShardConfig::default());
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
    // A live unversioned snapshot overtakes the seed (data drained first).
    shard.handle_snapshot(&snap(1, 9, None));
    shard.handle_timeout(0);
    assert_eq!(
        shard.poll_timeout(),
        Some(1_000),
        "nothing to render before the seed"
    );
    shard.handle_seed("C", &[snap(1, 3, None), snap(2, 4, None)], 0);
    shard.handle_timeout(0);
    let mut frames = Vec::new();
    while let Some(f) = shard.poll_frame(id) {
        frames.push(String::from_utf8_lossy(&f).into_owned());
    }
    let answer = frames
        .iter()
        .find(|f| f.contains("\"full\":true"))
        .expect("watch answer");
    assert!(
        answer.contains(r#"{"section":1,"total_seats":50,"seats_taken":9}"#),
        "{answer}"
    );
    assert!(
        answer.contains(r#"{"section":2,"total_seats":50,"seats_taken":4}"#),
        "{answer}"
    );
}

#[test]
fn a_watch_answer_and_its_count_are_one_write_and_a_big_frame_goes_alone() {
    let mut shard = Shard::new(ShardConfig::default());
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    let hello = shard.poll_transmit(id).expect("hello");
    assert!(String::from_utf8_lossy(&hello).contains("\"type\":\"hello\""));
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    let write = shard.poll_transmit(id).expect("the watch answer");
    // Two whole frames, back to back: the full board, then the count.
    let count = server_msg::presence("C", 1);
    let (board, rest) = write.split_at(write.len() - count.len());
    assert_eq!(rest, &count[..]);
    let board = server_frame_payload(board).expect("one whole frame");
    assert!(String::from_utf8_lossy(board).contains("\"full\":true"));
    assert_eq!(shard.poll_transmit(id), None, "one write for both");
    // A frame past the join limit is handed over alone.
    let big: Vec<Arc<Snapshot>> = (1..=400).map(|s| snap(s, 1, None)).collect();
    shard.handle_seed("C", &big, 0);
    let other = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    assert!(shard.poll_transmit(other).is_some(), "hello");
    shard.handle_text(other, r#"{"op":"watch","course":"C"}"#, 0);
    let board = shard.poll_transmit(other).expect("the big board");
    assert!(board.len() > JOIN_MAX, "{}", board.len());
    assert_eq!(
        shard.poll_transmit(other).expect("its count"),
        server_msg::presence("C", 2)
    );
}

#[test]
fn a_healed_viewer_gets_the_count_it_missed() {
    let mut shard = Shard::new(ShardConfig {
        send_queue_bytes: 200,
        ..ShardConfig::default()
    });
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
    // Stuck: the queue fills with frames, the next count does not fit.
    for v in 2..10u64 {
        shard.handle_snapshot(&snap(1, v as u32, Some(v)));
        shard.handle_timeout(v * 200);
    }
    shard.handle_presence("C", 7, shard.presence_batch());
    let mut before = Vec::new();
    while let Some(f) = shard.poll_frame(id) {
        before.push(String::from_utf8_lossy(&f).into_owned());
    }
    assert!(
        !before.iter().any(|f| f.contains("\"viewers\":7")),
        "the count was dropped"
    );
    shard.handle_timeout(10_000);
    let mut after = Vec::new();
    while let Some(f) = shard.poll_frame(id) {
        after.push(String::from_utf8_lossy(&f).into_owned());
    }
    assert!(
        after.iter().any(|f| f.contains("\"full\":true")),
        "{after:?}"
    );
    assert!(
        after.iter().any(|f| f.contains("\"viewers\":7")),
        "{after:?}"
    );
}

/// The counts a connection was sent, in order.
fn counts(shard: &mut Shard, id: ConnId) -> Vec<u64> {
    let mut seen = Vec::new();
    while let Some(f) = shard.poll_frame(id) {
        let text = String::from_utf8_lossy(&f).into_owned();
        if let Some(at) = text.find("\"viewers\":") {
            let n: String = text[at + 10..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            seen.extend(n.parse::<u64>().ok());
        }
    }
    seen
}

#[test]
fn a_viewer_shown_its_own_watch_count_gets_the_next_count_even_if_unchanged() {
    // Found by the simulator (seed 251): the watch answer counts the shard's
    // own users (2) above the last count pushed (1); when that count came
    // again it was taken as unchanged, and the viewer kept 2 for ever.
    let mut shard = Shard::new(ShardConfig::default());
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    shard.handle_presence("C", 1, shard.presence_batch());
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(v, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, v), vec![2], "its own watch counted");
    shard.handle_text(u, r#"{"op":"unwatch","course":"C"}"#, 0);
    shard.handle_presence("C", 1, shard.presence_batch());
    assert_eq!(
        counts(&mut shard, v).last(),
        Some(&1),
        "the true count again"
    );
    // Once every viewer holds the count, an unchanged one is not sent again.
    shard.handle_presence("C", 1, shard.presence_batch());
    assert_eq!(counts(&mut shard, v), Vec::<u64>::new());
}

/// A viewer of course C that read its watch answer and then stopped reading,
/// with one delta of C queued to it (at t = 400).
#[test]
fn a_viewer_gets_a_count_only_when_it_differs_from_the_one_it_was_shown() {
    let mut shard = Shard::new(ShardConfig::default());
    let a = shard.connect("a", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(a, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
    // The watch answer shows the shard's own user: 1.
    assert_eq!(counts(&mut shard, a), [1]);
    // The presence layer agrees: nothing new for the viewer.
    shard.handle_presence("C", 1, shard.presence_batch());
    assert_eq!(counts(&mut shard, a), Vec::<u64>::new());
    // A second user: its answer shows 2 (the shard's own users), before
    // the presence layer knows.
    let b = shard.connect("b", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(b, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, b), [2]);
    // The count 2 goes to the first viewer only; the same count again to none.
    shard.handle_presence("C", 2, shard.presence_batch());
    assert_eq!(counts(&mut shard, a), [2]);
    assert_eq!(counts(&mut shard, b), Vec::<u64>::new());
    shard.handle_presence("C", 2, shard.presence_batch());
    assert_eq!(
        (counts(&mut shard, a), counts(&mut shard, b)),
        (vec![], vec![])
    );
    // A change goes to both.
    shard.handle_presence("C", 3, shard.presence_batch());
    assert_eq!(
        (counts(&mut shard, a), counts(&mut shard, b)),
        (vec![3], vec![3])
    );
}

fn stalled_on_a_delta(shard: &mut Shard) -> ConnId {
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
    while shard.poll_frame(id).is_some() {}
    shard.handle_snapshot(&snap(1, 2, Some(2)));
    shard.handle_timeout(400);
    id
}

#[test]
fn a_count_dropped_for_a_full_queue_comes_with_the_next_full_frame() {
    // Found by the simulator (seeds 1002356, 1003625, 1004227): a viewer that
    // stopped reading had its queue full when the count changed; the count
    // was dropped, nothing was owed, and it kept the old count for ever.
    let count = server_msg::presence("C", 2);
    // A queue that holds one delta and not a count after it.
    let delta = {
        let mut probe = Shard::new(ShardConfig::default());
        let id = stalled_on_a_delta(&mut probe);
        probe.queued_bytes(id)
    };
    assert!(delta > 0, "the probe queued a delta");
    let bound = delta + count.len() - 1;
    let mut shard = Shard::new(ShardConfig {
        send_queue_bytes: bound,
        ..ShardConfig::default()
    });
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
    // The hello read, so the watch answer's board fits.
    while shard.poll_frame(id).is_some() {}
    shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
    shard.handle_presence("C", 1, shard.presence_batch());
    while shard.poll_frame(id).is_some() {}
    shard.handle_snapshot(&snap(1, 2, Some(2)));
    shard.handle_timeout(400);
    let queued = shard.queued_bytes(id);
    assert!(
        queued > 0 && queued + count.len() > bound,
        "{queued} of {bound} queued"
    );
    shard.handle_presence("C", 2, shard.presence_batch());
    let mut shown = counts(&mut shard, id);
    assert!(!shown.contains(&2), "no room for the count: {shown:?}");
    shard.handle_timeout(2_000);
    shown.extend(counts(&mut shard, id));
    assert_eq!(
        shown.last(),
        Some(&2),
        "the count comes with the full frame"
    );
}

#[test]
fn a_watch_answer_whose_count_finds_no_room_still_brings_the_count() {
    // Found by the simulator (seed 1900369): a viewer that had stopped
    // reading watched a course; its board fitted in the queue and the count
    // after it did not, so the count was dropped, and with the count
    // unchanged the viewer was shown none for ever.
    let d = |taken: u32, version: u64| {
        Arc::new(Snapshot::build(
            "D".into(),
            1,
            50,
            taken,
            None,
            Some(version),
            None,
        ))
    };
    let count = server_msg::presence("D", 1);
    // The sizes: a delta of C, and D's board in a watch answer.
    let (delta, board) = {
        let mut probe = Shard::new(ShardConfig::default());
        let id = stalled_on_a_delta(&mut probe);
        let delta = probe.queued_bytes(id);
        while probe.poll_frame(id).is_some() {}
        probe.handle_text(id, r#"{"op":"watch","course":"D"}"#, 400);
        probe.handle_seed("D", &[d(1, 1)], 400);
        (delta, probe.queued_bytes(id) - count.len())
    };
    assert!(
        delta > 0 && board > 0,
        "the probe queued a delta and a board"
    );
    // Room for the delta and the board, not for the count after them.
    let bound = delta + board + count.len() - 1;
    let mut shard = Shard::new(ShardConfig {
        send_queue_bytes: bound,
        ..ShardConfig::default()
    });
    let id = stalled_on_a_delta(&mut shard);
    assert_eq!(shard.queued_bytes(id), delta, "the delta waits unread");
    shard.handle_text(id, r#"{"op":"watch","course":"D"}"#, 400);
    shard.handle_seed("D", &[d(1, 1)], 400);
    let mut frames = Vec::new();
    while let Some(f) = shard.poll_frame(id) {
        frames.push(f);
    }
    assert!(
        frames
            .iter()
            .any(|f| String::from_utf8_lossy(f).contains(r#""full":true"#)),
        "D's board"
    );
    assert!(
        frames.iter().any(|f| f[..] == count[..]),
        "D's count goes with its board"
    );
}

/// A course's count of viewers owed a full frame, and how many are.
fn owed(shard: &Shard, course: &str) -> (u32, usize) {
    let c = &shard.courses[course];
    (c.owed, c.viewers.iter().filter(|v| v.owes_full).count())
}

#[test]
fn the_count_of_owed_full_frames_follows_heals_answers_and_unwatches() {
    // The count decides whether a render encodes a full frame and whether the
    // course is rendered at all: one left too high renders it every tick.
    let mut shard = Shard::new(ShardConfig {
        send_queue_bytes: 200,
        ..ShardConfig::default()
    });
    let ids: Vec<ConnId> = ["u", "v", "w"]
        .iter()
        .map(|u| {
            let id = shard.connect(*u, Role::Student, WsOptions::VIEWER, 0);
            shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
            id
        })
        .collect();
    shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
    // None reads: their queues fill and each comes to owe a full frame.
    let mut t = 0;
    for v in 2..12u64 {
        t = v * 200;
        shard.handle_snapshot(&snap(1, v as u32, Some(v)));
        shard.handle_timeout(t);
    }
    assert_eq!(owed(&shard, "C"), (3, 3), "all three owe one");
    // u unwatches, v watches again (the answer replaces what it owed).
    shard.handle_text(ids[0], r#"{"op":"unwatch","course":"C"}"#, t);
    assert_eq!(owed(&shard, "C"), (2, 2));
    while shard.poll_frame(ids[1]).is_some() {}
    shard.handle_text(ids[1], r#"{"op":"watch","course":"C"}"#, t);
    assert_eq!(owed(&shard, "C"), (1, 1));
    // w reads and heals at the next render: nothing is owed any more.
    while shard.poll_frame(ids[2]).is_some() {}
    shard.handle_timeout(t + 1_000);
    assert_eq!(owed(&shard, "C"), (0, 0));
    let rendered = shard.stats.frames_rendered;
    shard.handle_timeout(t + 5_000);
    assert_eq!(
        shard.stats.frames_rendered, rendered,
        "nothing changed and nothing owed: no render"
    );
}

/// The full frames of `course` among `id`'s queued messages.
fn full_frames(shard: &mut Shard, id: ConnId, course: &str) -> usize {
    let mut n = 0;
    while let Some(f) = shard.poll_frame(id) {
        let text = String::from_utf8_lossy(&f).into_owned();
        if text.contains("\"full\":true") && text.contains(&format!("\"course\":\"{course}\"")) {
            n += 1;
        }
    }
    n
}

#[test]
fn a_course_named_twice_in_the_upgrade_is_two_watches_of_one_course() {
    let mut shard = Shard::new(ShardConfig::default());
    // Held here: each name is answered with the board, as a second watch is.
    let holder = shard.connect("h", Role::Student, WsOptions::VIEWER, 0);
    shard.watch_named(holder, &["C".into()], 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.watch_named(id, &["C".into(), "C".into()], 0);
    assert_eq!(full_frames(&mut shard, id, "C"), 2);
    assert_eq!(shard.courses.get("C").map(|c| c.viewers.len()), Some(2));
    // Not held yet: the second name, like a second watch before the seed,
    // is answered by the one answer the seed brings.
    let late = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.watch_named(late, &["D".into(), "D".into()], 0);
    assert_eq!(
        full_frames(&mut shard, late, "D"),
        0,
        "nothing before the seed"
    );
    shard.handle_seed("D", &[snap(1, 3, None)], 0);
    assert_eq!(full_frames(&mut shard, late, "D"), 1);
    assert_eq!(shard.courses.get("D").map(|c| c.viewers.len()), Some(1));
}

#[test]
fn a_connection_awaits_a_seed_until_every_course_it_watches_is_seeded() {
    let mut shard = Shard::new(ShardConfig::default());
    let id = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    assert!(!shard.awaits_seed(id), "no course watched");
    shard.watch_named(id, &["C".into(), "D".into(), "bad code".into()], 0);
    assert!(shard.awaits_seed(id), "neither C nor D is seeded");
    let ends = shard.wait_ends();
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    assert!(shard.awaits_seed(id), "D is not seeded yet");
    assert!(shard.wait_ends() > ends, "a seed may end a wait");
    let ends = shard.wait_ends();
    shard.handle_seed("D", &[], 0);
    assert!(!shard.awaits_seed(id), "both seeded (D with nothing known)");
    assert!(shard.wait_ends() > ends);
    // A course this shard already holds is answered at once.
    let next = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.watch_named(next, &["C".into()], 0);
    assert!(!shard.awaits_seed(next));
    // An unwatched course (a message pipelined before the 101) or a closed
    // connection awaits nothing.
    let gone = shard.connect("w", Role::Student, WsOptions::VIEWER, 0);
    shard.watch_named(gone, &["E".into()], 0);
    assert!(shard.awaits_seed(gone));
    let ends = shard.wait_ends();
    shard.handle_text(gone, r#"{"op":"unwatch","course":"E"}"#, 0);
    assert!(!shard.awaits_seed(gone), "unwatched");
    assert!(shard.wait_ends() > ends, "an unwatch may end a wait");
    shard.watch_named(gone, &["F".into()], 0);
    assert!(shard.awaits_seed(gone));
    let ends = shard.wait_ends();
    shard.disconnect(gone);
    assert!(!shard.awaits_seed(gone), "closed");
    assert!(shard.wait_ends() > ends, "a close may end a wait");
}

/// The node's counts as the presence layer sends them: sorted by course.
fn node_counts(counts: &[(&str, u64)]) -> Arc<Vec<(Arc<str>, u64)>> {
    let mut v: Vec<(Arc<str>, u64)> = counts.iter().map(|(c, n)| ((*c).into(), *n)).collect();
    v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Arc::new(v)
}

/// A shard whose course C has viewer `u` (its join sent in batch 1) and a
/// global count of 3 that includes it (two more viewers elsewhere).
fn watched_with_count_3() -> (Shard, ConnId) {
    let mut shard = Shard::new(ShardConfig::default());
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    while shard.poll_action().is_some() {}
    assert_eq!(shard.presence_batch(), 1);
    shard.presence_batch_sent();
    shard.handle_counts(&node_counts(&[("C", 3)]), 1);
    assert_eq!(counts(&mut shard, u), [1, 3], "its answer, then the count");
    (shard, u)
}

#[test]
fn a_watch_answer_counts_the_new_viewer_on_top_of_the_global_count() {
    // The course's other viewers are on other shards or nodes: the global
    // count (3) has them and `u`; a new user here is the fourth.
    let (mut shard, _) = watched_with_count_3();
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(v, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, v), [4], "the global count and v");
    // A second connection of the same user is no new viewer.
    let v2 = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(v2, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, v2), [4]);
}

#[test]
fn a_count_that_includes_the_join_replaces_it_and_one_that_predates_it_does_not() {
    let (mut shard, u) = watched_with_count_3();
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(v, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(shard.presence_batch(), 2, "v's join goes in batch 2");
    while shard.poll_action().is_some() {}
    shard.presence_batch_sent();
    assert_eq!(counts(&mut shard, v), [4]);
    // A count read before batch 2 was applied: v is not in its 3, and the
    // viewers keep 4 (u is told 4, the number now; v hears nothing new).
    shard.handle_counts(&node_counts(&[("C", 3)]), 1);
    assert_eq!(counts(&mut shard, u), [4]);
    assert_eq!(counts(&mut shard, v), Vec::<u64>::new());
    // A third user's answer still counts v: 5.
    let w = shard.connect("w", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(w, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, w), [5]);
    while shard.poll_action().is_some() {}
    shard.presence_batch_sent();
    // A count that includes batch 2 (v) but not 3 (w): 4 from the layer, w
    // on top; u and v, shown 4, learn of w.
    shard.handle_counts(&node_counts(&[("C", 4)]), 2);
    assert_eq!(counts(&mut shard, u), [5]);
    assert_eq!(counts(&mut shard, v), [5]);
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new(), "shown 5");
    // The count that includes w: nothing changes for anyone.
    shard.handle_counts(&node_counts(&[("C", 5)]), 3);
    for id in [u, v, w] {
        assert_eq!(counts(&mut shard, id), Vec::<u64>::new());
    }
    // Once it includes both, a count is taken as it is: someone elsewhere
    // left (4), and so does v here (a leave the count does not have yet).
    shard.handle_text(v, r#"{"op":"unwatch","course":"C"}"#, 0);
    let x = shard.connect("x", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(x, r#"{"op":"watch","course":"C"}"#, 0);
    assert_eq!(counts(&mut shard, x), [5], "5 - v + x");
    shard.handle_counts(&node_counts(&[("C", 4)]), 3);
    assert_eq!(counts(&mut shard, u), [4], "4 - v + x");
}

#[test]
fn a_course_new_on_a_shard_starts_from_the_node_s_count() {
    // Another shard's viewers made the node count C (2); this shard holds
    // no viewer of C yet, and its first one is the third.
    let mut shard = Shard::new(ShardConfig::default());
    shard.handle_counts(&node_counts(&[("B", 9), ("C", 2), ("D", 1)]), 0);
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    assert_eq!(counts(&mut shard, u), [3]);
    // A course the node counts nobody on: this shard's own users.
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(v, r#"{"op":"watch","course":"E"}"#, 0);
    shard.handle_seed("E", &[], 0);
    assert_eq!(counts(&mut shard, v), [1]);
}

#[test]
fn a_first_count_before_the_seed_goes_in_the_watch_answer_and_nothing_before_it() {
    // The node's first viewer of C: its count (two viewers on other nodes
    // and this one, written with its batch) comes before the course's seed.
    let mut shard = Shard::new(ShardConfig::default());
    shard.handle_counts(&node_counts(&[("B", 9)]), 0);
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    while shard.poll_action().is_some() {}
    let batch = shard.presence_batch();
    shard.presence_batch_sent();
    shard.handle_join_counts(&node_counts(&[("C", 3)]), batch);
    assert_eq!(
        counts(&mut shard, u),
        Vec::<u64>::new(),
        "nothing before the board"
    );
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    assert_eq!(counts(&mut shard, u), [3]);
    // Not the whole list: the node's other counts are kept beside it...
    assert_eq!(shard.kept_count("B"), Some(9));
    assert_eq!(shard.kept_count("C"), Some(3));
    // ... until the next whole list.
    shard.handle_counts(&node_counts(&[("B", 8)]), batch);
    assert_eq!(shard.kept_count("C"), None);
}

/// A shard that waits up to 100 ms for a course's first count (and for a
/// count read after a new user's join), with `u`
/// watching C (its join sent in the batch returned), C not seeded yet.
fn patient_watcher() -> (Shard, ConnId, u64) {
    let mut shard = Shard::new(ShardConfig {
        count_patience_ms: 100,
        count_hold_ms: 100,
        ..ShardConfig::default()
    });
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    while shard.poll_action().is_some() {}
    let batch = shard.presence_batch();
    shard.presence_batch_sent();
    (shard, u, batch)
}

#[test]
fn a_seed_before_the_first_count_holds_the_answer_until_the_count_comes() {
    // The node's first viewer of C; a viewer of C on another node is in
    // the count the presence layer reads with u's join, which loses the
    // race to the seed.
    let (mut shard, u, batch) = patient_watcher();
    shard.handle_seed("C", &[snap(1, 3, None)], 10);
    assert!(shard.awaits_seed(u), "the answer waits for the count");
    shard.handle_timeout(60);
    assert_eq!(counts(&mut shard, u), Vec::<u64>::new(), "nothing yet");
    assert!(shard.poll_frame(u).is_none(), "no board either");
    shard.handle_join_counts(&node_counts(&[("C", 2)]), batch);
    assert!(!shard.awaits_seed(u));
    assert_eq!(counts(&mut shard, u), [2], "the board with both viewers");
    // Its wait ended with the count: no deadline is left to wake for.
    assert_eq!(shard.poll_timeout(), Some(1_000), "only the sweep");
    shard.handle_timeout(110);
    assert_eq!(counts(&mut shard, u), Vec::<u64>::new());
}

#[test]
fn an_answer_waiting_for_a_count_that_never_comes_goes_at_the_deadline() {
    let (mut shard, u, _) = patient_watcher();
    shard.handle_seed("C", &[snap(1, 3, None)], 10);
    assert_eq!(shard.poll_timeout(), Some(110), "the wait's deadline");
    shard.handle_timeout(109);
    assert!(shard.awaits_seed(u));
    // A viewer arriving meanwhile waits with the first one.
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 50);
    shard.handle_text(v, r#"{"op":"watch","course":"C"}"#, 50);
    assert!(shard.awaits_seed(v));
    shard.handle_timeout(110);
    assert!(!shard.awaits_seed(u) && !shard.awaits_seed(v));
    assert_eq!(counts(&mut shard, u), [2], "this shard's own two users");
    assert_eq!(counts(&mut shard, v), [2]);
}

#[test]
fn a_first_count_from_another_shard_s_viewer_starts_a_course_new_here() {
    // C is new to the node on the other shard (its first count: 2); this
    // shard's first viewer of C, before the next presence tick, is the third.
    let mut shard = Shard::new(ShardConfig::default());
    shard.handle_counts(&node_counts(&[("B", 9)]), 0);
    shard.handle_join_counts(&node_counts(&[("C", 2)]), 0);
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    assert_eq!(counts(&mut shard, u), [3]);
}

#[test]
fn a_count_read_with_a_join_shows_in_the_next_answer_and_waits_for_the_tick_elsewhere() {
    // C is watched here and counted (the tick: 1, this shard's u). Viewers
    // join on other nodes and shards; the presence write of one of them
    // counts C again: 4.
    let mut shard = Shard::new(ShardConfig::default());
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    while shard.poll_action().is_some() {}
    let batch = shard.presence_batch();
    shard.presence_batch_sent();
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    shard.handle_counts(&node_counts(&[("C", 1)]), batch);
    assert_eq!(counts(&mut shard, u), [1]);
    shard.handle_join_counts(&node_counts(&[("C", 4)]), batch);
    assert_eq!(
        counts(&mut shard, u),
        Vec::<u64>::new(),
        "one count per presence tick: u's comes with the next"
    );
    // A viewer arriving now is told all four others and itself.
    let v = shard.connect("v", Role::Student, WsOptions::VIEWER, 10);
    shard.handle_text(v, r#"{"op":"watch","course":"C"}"#, 10);
    assert_eq!(counts(&mut shard, v), [5]);
    while shard.poll_action().is_some() {}
    let joined = shard.presence_batch();
    shard.presence_batch_sent();
    // The tick's count has v: u gets it, v (shown 5 already) nothing.
    shard.handle_counts(&node_counts(&[("C", 5)]), joined);
    assert_eq!(counts(&mut shard, u), [5]);
    assert_eq!(counts(&mut shard, v), Vec::<u64>::new());
}

#[test]
fn join_counts_of_a_storm_of_new_courses_are_each_kept_and_the_newest_wins() {
    // One list per presence batch, one course new to the node in each: every
    // course keeps its count until the next whole list, a newer count of a
    // course replacing the older.
    let mut shard = Shard::new(ShardConfig::default());
    for i in 0..3_000u64 {
        shard.handle_join_counts(&node_counts(&[(&format!("C{i}"), i + 1)]), 0);
    }
    shard.handle_join_counts(&node_counts(&[("C7", 70)]), 0);
    assert_eq!(shard.kept_count("C0"), Some(1));
    assert_eq!(shard.kept_count("C2999"), Some(3_000));
    assert_eq!(shard.kept_count("C7"), Some(70));
    shard.handle_counts(&node_counts(&[("C7", 71)]), 0);
    assert_eq!(shard.kept_count("C0"), None);
    assert_eq!(shard.kept_count("C7"), Some(71));
}

/// A patient shard whose course C is seeded and counted (3: `u` here and
/// two viewers elsewhere), `u`'s answer and count taken.
fn patient_with_count_3() -> (Shard, ConnId) {
    let (mut shard, u, batch) = patient_watcher();
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    shard.handle_join_counts(&node_counts(&[("C", 3)]), batch);
    assert_eq!(counts(&mut shard, u), [3]);
    (shard, u)
}

/// Joins `user` to C at `now_ms` and sends its presence batch; the batch.
fn join_c(shard: &mut Shard, user: &str, now_ms: u64) -> (ConnId, u64) {
    let id = shard.connect(user, Role::Student, WsOptions::VIEWER, now_ms);
    shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, now_ms);
    while shard.poll_action().is_some() {}
    let batch = shard.presence_batch();
    shard.presence_batch_sent();
    (id, batch)
}

#[test]
fn a_new_user_s_watch_answer_counts_what_redis_counts_after_its_join() {
    // `w` already watches C on another node (the 3 has it): its watch here
    // is no new viewer, and since the tick two viewers elsewhere left. The
    // board goes at once, the count with the count read after w's join.
    let (mut shard, _) = patient_with_count_3();
    let (w, batch) = join_c(&mut shard, "w", 10);
    assert_eq!(full_frames(&mut shard, w, "C"), 1, "the board at once");
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new(), "no guess of 4");
    // A tick count read before w's batch is no answer for it.
    shard.handle_counts(&node_counts(&[("C", 3)]), batch - 1);
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new());
    shard.handle_join_counts(&node_counts(&[("C", 2)]), batch);
    assert_eq!(counts(&mut shard, w), [2], "u and w, once each");
    // Its count was the answer's: the next tick's (unchanged) sends nothing.
    shard.handle_counts(&node_counts(&[("C", 2)]), batch);
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new());
}

#[test]
fn a_held_count_that_no_count_answers_goes_at_the_patience_with_the_shards_own() {
    let (mut shard, _) = patient_with_count_3();
    let (w, _) = join_c(&mut shard, "w", 10);
    assert_eq!(shard.poll_timeout(), Some(110), "the hold's deadline");
    shard.handle_timeout(109);
    assert_eq!(full_frames(&mut shard, w, "C"), 1);
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new());
    shard.handle_timeout(110);
    assert_eq!(counts(&mut shard, w), [4], "the count held and w");
    assert_eq!(shard.poll_timeout(), Some(1_000), "only the sweep is left");
}

#[test]
fn a_second_connection_of_a_user_here_is_answered_at_once_and_a_gone_viewer_gets_nothing() {
    let (mut shard, u) = patient_with_count_3();
    // u's second tab: no join, nothing to wait for.
    let u2 = shard.connect("u", Role::Student, WsOptions::VIEWER, 10);
    shard.handle_text(u2, r#"{"op":"watch","course":"C"}"#, 10);
    assert_eq!(counts(&mut shard, u2), [3]);
    // A held viewer that unwatches before its count comes is sent none.
    let (w, batch) = join_c(&mut shard, "w", 20);
    shard.handle_text(w, r#"{"op":"unwatch","course":"C"}"#, 30);
    assert_eq!(full_frames(&mut shard, w, "C"), 1);
    shard.handle_join_counts(&node_counts(&[("C", 4)]), batch);
    assert_eq!(counts(&mut shard, w), Vec::<u64>::new());
    assert_eq!(
        counts(&mut shard, u),
        Vec::<u64>::new(),
        "one count per tick"
    );
}

#[test]
fn a_held_count_does_not_delay_a_first_count_s_shorter_wait() {
    // Counts held 500 ms, first counts awaited 100 ms: a course new here,
    // seeded after a count was held elsewhere, answers at its own deadline.
    let mut shard = Shard::new(ShardConfig {
        count_patience_ms: 100,
        count_hold_ms: 500,
        ..ShardConfig::default()
    });
    let u = shard.connect("u", Role::Student, WsOptions::VIEWER, 0);
    shard.handle_text(u, r#"{"op":"watch","course":"C"}"#, 0);
    shard.handle_seed("C", &[snap(1, 3, None)], 0);
    shard.handle_timeout(100);
    assert_eq!(counts(&mut shard, u), [1]);
    let (w, _) = join_c(&mut shard, "w", 10);
    assert_eq!(full_frames(&mut shard, w, "C"), 1);
    let d = shard.connect("d", Role::Student, WsOptions::VIEWER, 20);
    shard.handle_text(d, r#"{"op":"watch","course":"D"}"#, 20);
    shard.handle_seed("D", &[snap(1, 3, None)], 20);
    assert_eq!(shard.poll_timeout(), Some(120));
    shard.handle_timeout(120);
    assert!(!shard.awaits_seed(d), "D's answer went at its deadline");
    assert_eq!(counts(&mut shard, d), [1]);
    assert_eq!(
        counts(&mut shard, w),
        Vec::<u64>::new(),
        "w's count still held"
    );
    assert_eq!(shard.poll_timeout(), Some(510));
    shard.handle_timeout(510);
    assert_eq!(counts(&mut shard, w), [2]);
}
