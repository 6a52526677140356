//! The shared rig: the test plays the shell (feeds events and the clock, pops
//! frames and actions) and the browser (decodes server frames, merges course frames).

use bytes::Bytes;
use serde_json::{json, Value};
use shards::read_server_frame;
use shards::{Action, ConnId, Role, Shard, ShardConfig, Snapshot, WsOptions};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One decoded server frame.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Out {
    Json(Value),
    Close(u16),
    Ping,
}

impl Out {
    pub(crate) fn json(&self) -> &Value {
        match self {
            Out::Json(v) => v,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    pub(crate) fn is_type(&self, t: &str) -> bool {
        matches!(self, Out::Json(v) if v["type"] == t)
    }
}

/// Decodes one unmasked server frame (7/16/64-bit lengths).
pub(crate) fn decode(f: &[u8]) -> Out {
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

pub(crate) fn pop_raw(s: &mut Shard, id: ConnId) -> Vec<Bytes> {
    std::iter::from_fn(|| s.poll_frame(id)).collect()
}

/// Pops every queued frame of `id`, decoded.
pub(crate) fn pop_all(s: &mut Shard, id: ConnId) -> Vec<Out> {
    pop_raw(s, id).iter().map(|b| decode(b)).collect()
}

pub(crate) fn actions(s: &mut Shard) -> Vec<Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

pub(crate) fn drain_ready(s: &mut Shard) -> Vec<ConnId> {
    std::iter::from_fn(|| s.poll_ready()).collect()
}

pub(crate) fn cfg() -> ShardConfig {
    ShardConfig {
        node: "n1".into(),
        ..ShardConfig::default()
    }
}

pub(crate) fn snap(course: &str, section: u32, taken: u32, version: Option<u64>) -> Arc<Snapshot> {
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

pub(crate) fn watch(s: &mut Shard, id: ConnId, course: &str, now: u64) {
    s.handle_text(id, &format!(r#"{{"op":"watch","course":"{course}"}}"#), now);
}

pub(crate) fn unwatch(s: &mut Shard, id: ConnId, course: &str, now: u64) {
    s.handle_text(
        id,
        &format!(r#"{{"op":"unwatch","course":"{course}"}}"#),
        now,
    );
}

/// Connects and throws the hello away.
pub(crate) fn join(s: &mut Shard, user: &str, now: u64) -> ConnId {
    let id = s.connect(user, Role::Student, WsOptions::VIEWER, now);
    let hello = pop_all(s, id);
    assert_eq!(hello.len(), 1);
    assert!(hello[0].is_type("hello"));
    id
}

pub(crate) fn frames(outs: &[Out]) -> Vec<&Value> {
    outs.iter()
        .filter(|o| o.is_type("frame"))
        .map(|o| o.json())
        .collect()
}

pub(crate) fn section_ids(frame: &Value) -> Vec<u64> {
    frame["sections"]
        .as_array()
        .expect("sections is a list")
        .iter()
        .map(|s| s["section"].as_u64().unwrap())
        .collect()
}

pub(crate) fn interest(course: &str, watching: bool) -> Action {
    Action::Interest {
        course: course.into(),
        watching,
    }
}

pub(crate) fn join_action(course: &str, user: &str) -> Action {
    Action::PresenceJoin {
        course: course.into(),
        user: user.into(),
    }
}

pub(crate) fn leave_action(course: &str, user: &str) -> Action {
    Action::PresenceLeave {
        course: course.into(),
        user: user.into(),
    }
}

/// What a browser holds per course: section id -> section JSON.
pub(crate) type Board = BTreeMap<u64, Value>;

/// The client merge rule: `full:true` replaces, `full:false` upserts by section.
pub(crate) fn merge(boards: &mut HashMap<String, Board>, out: &Out) {
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
pub(crate) fn truth(sections: &BTreeMap<u32, Arc<Snapshot>>) -> Board {
    sections
        .iter()
        .map(|(k, s)| (*k as u64, serde_json::from_str(&s.json).unwrap()))
        .collect()
}

/// The source-of-truth rule: `Snapshot::supersedes` (version or last write).
pub(crate) fn apply_truth(board: &mut BTreeMap<u32, Arc<Snapshot>>, s: &Arc<Snapshot>) {
    match board.get(&s.section) {
        Some(cur) if !s.supersedes(cur) => {}
        _ => {
            board.insert(s.section, Arc::clone(s));
        }
    }
}

/// A tiny deterministic generator for the randomized deterministic tests.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs the shard's clock from `*now` to `until`, waking at every deadline it asks for.
pub(crate) fn run_to(s: &mut Shard, now: &mut u64, until: u64) {
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

/// One viewer of a seeded course `C`, hello and answer popped.
pub(crate) fn one_viewer(s: &mut Shard, seed: &[Arc<Snapshot>]) -> ConnId {
    let a = join(s, "u1", 0);
    watch(s, a, "C", 0);
    s.handle_seed("C", seed, 0);
    // The seeded sections may go out once more on the first render: flush it.
    s.handle_timeout(0);
    pop_all(s, a);
    actions(s);
    a
}
