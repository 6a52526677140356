//! Deterministic tests of `shards::Shard` through its public API only: the test
//! plays the shell (feeds events and the clock, pops frames) and the browser
//! (decodes server frames, merges course frames).

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Value};
use shards::read_server_frame;
use shards::ws_codec::text_frame;
use shards::{Action, ConnId, Gate, Role, Shard, ShardConfig, Snapshot, WsOptions};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

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

// ---------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------

/// One decoded server frame.
#[derive(Debug, Clone, PartialEq)]
enum Out {
    Json(Value),
    Close(u16),
    Ping,
}

impl Out {
    fn json(&self) -> &Value {
        match self {
            Out::Json(v) => v,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    fn is_type(&self, t: &str) -> bool {
        matches!(self, Out::Json(v) if v["type"] == t)
    }
}

/// Decodes one unmasked server frame (7/16/64-bit lengths).
fn decode(f: &[u8]) -> Out {
    assert!(f.len() >= 2, "short frame {f:02x?}");
    let frame = match read_server_frame(f) {
        Ok(Some(frame)) => frame,
        Ok(None) => panic!("one frame per Bytes, exact length: {f:02x?}"),
        Err(e) => panic!("server frames are never masked: {e}"),
    };
    assert_eq!(f.len(), frame.len, "one frame per Bytes, exact length");
    let p = frame.payload;
    match f[0] {
        0x81 => Out::Json(serde_json::from_slice(p).expect("text frames carry JSON")),
        0x88 => {
            assert!(p.len() >= 2, "close frames carry a code");
            Out::Close(u16::from_be_bytes([p[0], p[1]]))
        }
        0x89 => Out::Ping,
        other => panic!("unexpected first byte {other:#04x}"),
    }
}

fn pop_raw(s: &mut Shard, id: ConnId) -> Vec<Bytes> {
    std::iter::from_fn(|| s.poll_frame(id)).collect()
}

/// Pops every queued frame of `id`, decoded.
fn pop_all(s: &mut Shard, id: ConnId) -> Vec<Out> {
    pop_raw(s, id).iter().map(|b| decode(b)).collect()
}

fn actions(s: &mut Shard) -> Vec<Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn drain_ready(s: &mut Shard) -> Vec<ConnId> {
    std::iter::from_fn(|| s.poll_ready()).collect()
}

fn cfg() -> ShardConfig {
    ShardConfig {
        node: "n1".into(),
        ..ShardConfig::default()
    }
}

fn snap(course: &str, section: u32, taken: u32, version: Option<u64>) -> Arc<Snapshot> {
    Arc::new(Snapshot::build(
        course.into(),
        section,
        50,
        taken,
        None,
        version,
        None,
    ))
}

fn watch(s: &mut Shard, id: ConnId, course: &str, now: u64) {
    s.handle_text(id, &format!(r#"{{"op":"watch","course":"{course}"}}"#), now);
}

fn unwatch(s: &mut Shard, id: ConnId, course: &str, now: u64) {
    s.handle_text(
        id,
        &format!(r#"{{"op":"unwatch","course":"{course}"}}"#),
        now,
    );
}

/// Connects and throws the hello away.
fn join(s: &mut Shard, user: &str, now: u64) -> ConnId {
    let id = s.connect(user, Role::Student, WsOptions::VIEWER, now);
    let hello = pop_all(s, id);
    assert_eq!(hello.len(), 1);
    assert!(hello[0].is_type("hello"));
    id
}

fn frames(outs: &[Out]) -> Vec<&Value> {
    outs.iter()
        .filter(|o| o.is_type("frame"))
        .map(|o| o.json())
        .collect()
}

fn section_ids(frame: &Value) -> Vec<u64> {
    frame["sections"]
        .as_array()
        .expect("sections is a list")
        .iter()
        .map(|s| s["section"].as_u64().unwrap())
        .collect()
}

fn interest(course: &str, watching: bool) -> Action {
    Action::Interest {
        course: course.into(),
        watching,
    }
}

fn join_action(course: &str, user: &str) -> Action {
    Action::PresenceJoin {
        course: course.into(),
        user: user.into(),
    }
}

fn leave_action(course: &str, user: &str) -> Action {
    Action::PresenceLeave {
        course: course.into(),
        user: user.into(),
    }
}

/// What a browser holds per course: section id -> section JSON.
type Board = BTreeMap<u64, Value>;

/// The client merge rule: `full:true` replaces, `full:false` upserts by section.
fn merge(boards: &mut HashMap<String, Board>, out: &Out) {
    let Out::Json(v) = out else { return };
    if v["type"] != "frame" {
        return;
    }
    let course = v["course"].as_str().unwrap().to_string();
    let board = boards.entry(course).or_default();
    if v["full"] == json!(true) {
        board.clear();
    } else {
        assert_eq!(v["full"], json!(false));
    }
    let mut last = None;
    for s in v["sections"].as_array().unwrap() {
        let id = s["section"].as_u64().unwrap();
        assert!(last < Some(id), "sections sorted by section, no duplicates");
        last = Some(id);
        board.insert(id, s.clone());
    }
}

/// The true board of a course as the browser should hold it.
fn truth(sections: &BTreeMap<u32, Arc<Snapshot>>) -> Board {
    sections
        .iter()
        .map(|(k, s)| (*k as u64, serde_json::from_str(&s.json).unwrap()))
        .collect()
}

/// The source-of-truth rule: `Snapshot::supersedes` (version or last write).
fn apply_truth(board: &mut BTreeMap<u32, Arc<Snapshot>>, s: &Arc<Snapshot>) {
    match board.get(&s.section) {
        Some(cur) if !s.supersedes(cur) => {}
        _ => {
            board.insert(s.section, Arc::clone(s));
        }
    }
}

/// A tiny deterministic generator for the randomized deterministic tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs the shard's clock from `*now` to `until`, waking at every deadline it asks for.
fn run_to(s: &mut Shard, now: &mut u64, until: u64) {
    let mut guard = 0;
    while let Some(t) = s.poll_timeout() {
        if t > until {
            break;
        }
        *now = (*now).max(t);
        s.handle_timeout(*now);
        assert!(
            s.poll_timeout().is_none_or(|t| t > *now),
            "deadline not in the future after handle_timeout({now})"
        );
        guard += 1;
        assert!(guard < 100_000, "poll_timeout never advances");
    }
    *now = until;
    s.handle_timeout(until);
}

// ---------------------------------------------------------------------------
// hello
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// watch answers
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// snapshots
// ---------------------------------------------------------------------------

/// One viewer of a seeded course `C`, hello and answer popped.
fn one_viewer(s: &mut Shard, seed: &[Arc<Snapshot>]) -> ConnId {
    let a = join(s, "u1", 0);
    watch(s, a, "C", 0);
    s.handle_seed("C", seed, 0);
    // The seeded sections may go out once more on the first render: flush it.
    s.handle_timeout(0);
    pop_all(s, a);
    actions(s);
    a
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

// ---------------------------------------------------------------------------
// pacing: a token bucket per course, one token per tick, at most two held
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// bounded queues, resyncs, slow consumers
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// pings and silence
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// client mistakes and admin requests
// ---------------------------------------------------------------------------

fn error_code(out: &[Out]) -> String {
    assert_eq!(out.len(), 1, "{out:?}");
    let v = out[0].json();
    assert_eq!(v["type"], "error");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    v["code"].as_str().unwrap().to_string()
}

#[test]
fn recoverable_errors_keep_the_connection() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let cases = [
        ("not json", "bad_json"),
        ("[1,2]", "bad_json"),
        ("{\"op\":", "bad_json"),
        (r#"{"course":"CS101"}"#, "unknown_op"),
        (r#"{"op":"subscribe","course":"CS101"}"#, "unknown_op"),
        (r#"{"op":"watch"}"#, "bad_course"),
        (r#"{"op":"watch","course":"CS 101"}"#, "bad_course"),
        (r#"{"op":"watch","course":""}"#, "bad_course"),
        (r#"{"op":"roster","course":"CS101"}"#, "forbidden"),
    ];
    for (i, (text, code)) in cases.iter().enumerate() {
        s.handle_text(a, text, i as u64);
        assert_eq!(error_code(&pop_all(&mut s, a)), *code, "{text}");
        assert!(actions(&mut s).is_empty(), "{text}");
    }
    assert_eq!(s.stats().client_errors, cases.len() as u64);
    assert_eq!(s.connections(), 1);

    // 32 courses are fine, the 33rd is refused, re-watching one is not an error.
    for k in 0..32 {
        watch(&mut s, a, &format!("C{k}"), 100);
        s.handle_seed(&format!("C{k}"), &[], 100);
    }
    assert_eq!(s.courses(), 32);
    assert_eq!(actions(&mut s).len(), 64);
    pop_all(&mut s, a);
    watch(&mut s, a, "C32", 101);
    assert_eq!(error_code(&pop_all(&mut s, a)), "too_many_courses");
    assert!(actions(&mut s).is_empty());
    assert_eq!(s.courses(), 32);
    watch(&mut s, a, "C7", 102);
    let out = pop_all(&mut s, a);
    assert_eq!(frames(&out).len(), 1);
    // Still usable: unwatch one, then the 33rd fits.
    unwatch(&mut s, a, "C0", 103);
    watch(&mut s, a, "C32", 103);
    s.handle_seed("C32", &[], 103);
    assert_eq!(
        sorted(actions(&mut s)),
        sorted(vec![
            leave_action("C0", "u1"),
            interest("C0", false),
            interest("C32", true),
            join_action("C32", "u1"),
        ])
    );
    assert_eq!(frames(&pop_all(&mut s, a))[0]["course"], "C32");
    assert_eq!(s.courses(), 32);
}

fn sorted(mut v: Vec<Action>) -> Vec<Action> {
    v.sort_by_key(|a| format!("{a:?}"));
    v
}

#[test]
fn admin_roster_becomes_an_action_and_reply_is_delivered() {
    let mut s = Shard::new(cfg());
    let admin = s.connect("boss", Role::Admin, WsOptions::VIEWER, 0);
    pop_all(&mut s, admin);
    s.handle_text(admin, r#"{"op":"roster","course":"CS101"}"#, 1);
    assert_eq!(
        actions(&mut s),
        vec![Action::Roster {
            conn: admin,
            course: "CS101".into()
        }]
    );
    assert!(
        pop_all(&mut s, admin).is_empty(),
        "the reply is built outside"
    );
    let reply = shards::server_msg::roster("CS101", 3, &["u1".into(), "q\"uote".into()]);
    s.deliver(admin, reply);
    let out = pop_all(&mut s, admin);
    assert_eq!(
        out,
        vec![Out::Json(json!({
            "type": "roster", "course": "CS101", "total": 3, "viewers": ["u1", "q\"uote"]
        }))]
    );
    // Roster does not watch anything.
    assert_eq!(s.courses(), 0);
    assert_eq!(s.stats().client_errors, 0);
}

// ---------------------------------------------------------------------------
// unwatch, disconnect, bookkeeping
// ---------------------------------------------------------------------------

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
        let mut interested: HashSet<String> = HashSet::new();
        let mut present: HashSet<(String, String)> = HashSet::new();
        let mut pump = |s: &mut Shard, closed: &mut Vec<ConnId>| {
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
        };
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
            let want_interest: HashSet<String> = conns
                .iter()
                .flat_map(|(_, _, w)| w.iter().map(|c| c.to_string()))
                .collect();
            assert_eq!(interest_now, want_interest, "seed {seed}");
            assert_eq!(s.courses(), want_interest.len());
            let want_presence: HashSet<(String, String)> = conns
                .iter()
                .flat_map(|(_, u, w)| w.iter().map(move |c| (c.to_string(), u.clone())))
                .collect();
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
    s.handle_presence("X", 5);
    let want = Out::Json(json!({"type": "presence", "course": "X", "viewers": 5}));
    assert_eq!(pop_all(&mut s, a), vec![want.clone()]);
    assert_eq!(pop_all(&mut s, b), vec![want]);
    assert!(pop_all(&mut s, c).is_empty());
    s.handle_presence("X", 5);
    assert!(
        pop_all(&mut s, a).is_empty(),
        "unchanged count is not resent"
    );
    assert!(pop_all(&mut s, b).is_empty());
    s.handle_presence("X", 7);
    assert_eq!(pop_all(&mut s, a)[0].json()["viewers"], 7);
    assert_eq!(pop_all(&mut s, b)[0].json()["viewers"], 7);
    s.handle_presence("Z", 3);
    for id in [a, b, c] {
        assert!(pop_all(&mut s, id).is_empty());
    }
    // A new watcher is told the current count in its answer.
    let d = join(&mut s, "u4", 0);
    watch(&mut s, d, "X", 0);
    assert_eq!(pop_all(&mut s, d)[1].json()["viewers"], 7);
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

// ---------------------------------------------------------------------------
// drain and shutdown
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// edge cases: a hang, a race with the drain, an early snapshot
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// property: every client converges to the source's state
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// A published snapshot (section 0..8, maybe versioned).
    Update {
        course: usize,
        section: u32,
        taken: u32,
        version: Option<u64>,
    },
    /// The clock moves on by this many ms, the shell waking at every deadline.
    Advance(u64),
    /// A client reads everything queued to it (unless stuck).
    Pop(usize),
    /// A client stops reading.
    Stick(usize),
    /// A client reads again, at once.
    Unstick(usize),
    Watch(usize, usize),
    Unwatch(usize, usize),
    /// The ingest answers a pending interest with the current board.
    Seed(usize),
    /// The client's socket drops and it connects again.
    Reconnect(usize),
    Presence(usize, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..3usize, 0..8u32, 0..50u32, prop::option::of(0..12u64)).prop_map(
            |(course, section, taken, version)| Op::Update { course, section, taken, version }
        ),
        5 => (1..60u64).prop_map(Op::Advance),
        3 => (0..4usize).prop_map(Op::Pop),
        1 => (0..4usize).prop_map(Op::Stick),
        1 => (0..4usize).prop_map(Op::Unstick),
        3 => (0..4usize, 0..3usize).prop_map(|(c, k)| Op::Watch(c, k)),
        1 => (0..4usize, 0..3usize).prop_map(|(c, k)| Op::Unwatch(c, k)),
        2 => (0..3usize).prop_map(Op::Seed),
        1 => (0..4usize).prop_map(Op::Reconnect),
        1 => (0..3usize, 0..5u64).prop_map(|(k, n)| Op::Presence(k, n)),
    ]
}

struct Client {
    id: ConnId,
    user: String,
    stuck: bool,
    watched: BTreeSet<usize>,
    boards: HashMap<String, Board>,
}

struct Sim {
    s: Shard,
    now: u64,
    courses: Vec<String>,
    src: Vec<BTreeMap<u32, Arc<Snapshot>>>,
    clients: Vec<Client>,
    interested: HashSet<String>,
    pending_seed: BTreeSet<String>,
    presence: HashSet<(String, String)>,
    /// Connections the shell was told have frames, since their last full read.
    ready: HashSet<ConnId>,
}

impl Sim {
    fn new(tick_ms: u64, queue: usize, seed: u64, ncourses: usize, nclients: usize) -> Sim {
        let mut s = Shard::new(ShardConfig {
            tick_ms,
            send_queue_bytes: queue,
            slow_consumer_ms: u64::MAX / 4,
            ping_ms: u64::MAX / 4,
            idle_ms: u64::MAX / 4,
            node: "p".into(),
            seed,
        });
        let clients = (0..nclients)
            .map(|i| {
                // Clients 0 and 2 share a user: presence is per user.
                let user = format!("u{}", i % 2);
                Client {
                    id: s.connect(user.as_str(), Role::Student, WsOptions::VIEWER, 0),
                    user,
                    stuck: false,
                    watched: BTreeSet::new(),
                    boards: HashMap::new(),
                }
            })
            .collect();
        Sim {
            s,
            now: 0,
            courses: ["A", "B.2", "c-3"][..ncourses]
                .iter()
                .map(|c| c.to_string())
                .collect(),
            src: vec![BTreeMap::new(); ncourses],
            clients,
            interested: HashSet::new(),
            pending_seed: BTreeSet::new(),
            presence: HashSet::new(),
            ready: HashSet::new(),
        }
    }

    fn read(&mut self, i: usize) {
        let c = &mut self.clients[i];
        for b in std::iter::from_fn(|| self.s.poll_frame(c.id)) {
            merge(&mut c.boards, &decode(&b));
        }
        self.ready.remove(&c.id);
    }

    fn advance(&mut self, dt: u64) {
        let until = self.now + dt;
        let mut guard = 0;
        while let Some(t) = self.s.poll_timeout() {
            if t > until {
                break;
            }
            self.now = self.now.max(t);
            self.s.handle_timeout(self.now);
            let next = self.s.poll_timeout();
            assert!(
                next.is_none_or(|t| t > self.now),
                "busy deadline {next:?} at {}",
                self.now
            );
            guard += 1;
            assert!(guard < 10_000);
        }
        self.now = until;
        self.s.handle_timeout(until);
    }

    fn step(&mut self, op: &Op) {
        let nc = self.courses.len();
        let nl = self.clients.len();
        match *op {
            Op::Update {
                course,
                section,
                taken,
                version,
            } => {
                let k = course % nc;
                // A version names one state of a section: same version, same content.
                let taken = version.map_or(taken, |v| ((v * 7 + section as u64 * 3) % 50) as u32);
                let info = (taken % 4 == 0).then_some(r#"{"room":"B12","note":"ok"}"#);
                let sn = Arc::new(Snapshot::build(
                    self.courses[k].as_str().into(),
                    section,
                    50,
                    taken,
                    info,
                    version,
                    None,
                ));
                apply_truth(&mut self.src[k], &sn);
                self.s.handle_snapshot(&sn);
            }
            Op::Advance(dt) => self.advance(dt),
            Op::Pop(i) => {
                if !self.clients[i % nl].stuck {
                    self.read(i % nl);
                }
            }
            Op::Stick(i) => self.clients[i % nl].stuck = true,
            Op::Unstick(i) => {
                self.clients[i % nl].stuck = false;
                self.read(i % nl);
            }
            Op::Watch(i, k) => {
                let c = &mut self.clients[i % nl];
                c.watched.insert(k % nc);
                let id = c.id;
                watch(&mut self.s, id, &self.courses[k % nc], self.now);
            }
            Op::Unwatch(i, k) => {
                let c = &mut self.clients[i % nl];
                c.watched.remove(&(k % nc));
                let id = c.id;
                unwatch(&mut self.s, id, &self.courses[k % nc], self.now);
            }
            Op::Seed(k) => self.seed(k % nc),
            Op::Reconnect(i) => {
                let c = &mut self.clients[i % nl];
                self.s.disconnect(c.id);
                self.ready.remove(&c.id);
                c.id = self
                    .s
                    .connect(c.user.as_str(), Role::Student, WsOptions::VIEWER, self.now);
                c.watched.clear();
                c.boards.clear();
            }
            Op::Presence(k, n) => self.s.handle_presence(&self.courses[k % nc], n),
        }
        self.pump();
    }

    fn seed(&mut self, k: usize) {
        if self.pending_seed.remove(&self.courses[k]) {
            let board: Vec<_> = self.src[k].values().cloned().collect();
            self.s.handle_seed(&self.courses[k], &board, self.now);
        }
    }

    /// Plays the shell: actions and readiness, checking the bookkeeping.
    fn pump(&mut self) {
        while let Some(a) = self.s.poll_action() {
            match a {
                Action::Interest {
                    course,
                    watching: true,
                } => {
                    assert!(
                        self.interested.insert(course.to_string()),
                        "double interest {course}"
                    );
                    self.pending_seed.insert(course.to_string());
                }
                Action::Interest {
                    course,
                    watching: false,
                } => {
                    assert!(
                        self.interested.remove(&*course),
                        "interest end without start {course}"
                    );
                    self.pending_seed.remove(&*course);
                }
                Action::PresenceJoin { course, user } => {
                    assert!(self.presence.insert((course.to_string(), user.to_string())));
                }
                Action::PresenceLeave { course, user } => {
                    assert!(self
                        .presence
                        .remove(&(course.to_string(), user.to_string())));
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        while let Some(id) = self.s.poll_ready() {
            self.ready.insert(id);
        }
        let want_interest: HashSet<String> = self
            .clients
            .iter()
            .flat_map(|c| c.watched.iter().map(|&k| self.courses[k].clone()))
            .collect();
        assert_eq!(self.interested, want_interest);
        assert_eq!(self.s.courses(), want_interest.len());
        let want_presence: HashSet<(String, String)> = self
            .clients
            .iter()
            .flat_map(|c| {
                c.watched
                    .iter()
                    .map(|&k| (self.courses[k].clone(), c.user.clone()))
            })
            .collect();
        assert_eq!(self.presence, want_presence);
        for c in &self.clients {
            if self.s.queued_bytes(c.id) > 0 {
                assert!(
                    self.ready.contains(&c.id),
                    "frames queued but never announced ready"
                );
            }
        }
        assert_eq!(self.s.connections(), self.clients.len());
    }

    /// Everyone reads again, pending seeds arrive, a few ticks pass.
    fn settle(&mut self, tick: u64) {
        for c in &mut self.clients {
            c.stuck = false;
        }
        let pending: Vec<usize> = (0..self.courses.len())
            .filter(|&k| self.pending_seed.contains(&self.courses[k]))
            .collect();
        for k in pending {
            self.seed(k);
        }
        self.pump();
        for _ in 0..4 {
            for i in 0..self.clients.len() {
                self.read(i);
            }
            self.advance(tick);
            self.pump();
        }
        for i in 0..self.clients.len() {
            self.read(i);
        }
    }

    fn check_converged(&self) -> Result<(), TestCaseError> {
        for (i, c) in self.clients.iter().enumerate() {
            for &k in &c.watched {
                let course = &self.courses[k];
                let got = c.boards.get(course).cloned().unwrap_or_default();
                prop_assert_eq!(got, truth(&self.src[k]), "client {} course {}", i, course);
            }
        }
        Ok(())
    }
}

proptest! {
    // A fixed seed keeps the suite deterministic; PROPTEST_RNG_SEED=<n> explores others.
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 4096,
        rng_seed: match std::env::var_os("PROPTEST_RNG_SEED") {
            Some(_) => ProptestConfig::default().rng_seed,
            None => proptest::test_runner::RngSeed::Fixed(0x5ea7_b0a2d),
        },
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_client_converges_to_the_source(
        tick in prop::sample::select(vec![5u64, 10, 40]),
        queue in 48usize..1200,
        seed in any::<u64>(),
        ncourses in 1usize..=3,
        nclients in 1usize..=4,
        ops in prop::collection::vec(op(), 1..160),
    ) {
        let mut sim = Sim::new(tick, queue, seed, ncourses, nclients);
        sim.pump();
        for op in &ops {
            sim.step(op);
        }
        sim.settle(tick);
        sim.check_converged()?;
        // Once healed, nothing is owed: more ticks send nothing.
        sim.advance(tick * 3);
        for c in &sim.clients {
            prop_assert_eq!(sim.s.queued_bytes(c.id), 0);
        }
    }
}
