//! The simulated Redis: state hashes under the publish script's
//! compare-and-set rule, pub/sub per connection, presence sorted sets, the
//! faults that lose data (a restart without its keyspace, a failover to a
//! replica that missed the last writes).

use crate::presence::{self, Sets};
use shards::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// One node's pub/sub connection as Redis sees it.
#[derive(Debug, Default, Clone)]
pub struct SubConn {
    /// The connection's generation: bumped by every reset.
    pub gen: u64,
    /// Channels subscribed.
    pub channels: BTreeSet<String>,
    /// The pattern is subscribed.
    pub pattern: bool,
}

/// The keyspace and the pub/sub table.
#[derive(Debug, Default)]
pub struct Redis {
    /// State hashes: course -> section -> payload.
    pub hashes: BTreeMap<String, BTreeMap<u32, String>>,
    /// Pub/sub connections by node.
    pub subs: Vec<SubConn>,
    /// Until when (virtual ms) it answers nothing.
    pub frozen_until: u64,
    /// Presence keys, shared with every node's presence store.
    pub presence: Arc<Mutex<Sets>>,
    /// Writes that a replica may not have yet: (when, course, section, value before).
    undo: Vec<(u64, String, u32, Option<String>)>,
}

/// The stored entry's version as the script reads it: an integer `version`
/// (or `Version`) of a JSON object, else none.
fn stored_version(old: &str) -> Option<i128> {
    let v: serde_json::Value = serde_json::from_str(old).ok()?;
    let o = v.as_object()?;
    let n = o.get("version").or_else(|| o.get("Version"))?;
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

impl Redis {
    /// Redis with `nodes` pub/sub connections.
    pub fn new(nodes: usize) -> Redis {
        Redis {
            subs: vec![SubConn::default(); nodes],
            ..Redis::default()
        }
    }

    /// The publish script's compare-and-set (`src/publish/script.lua`):
    /// written when the field is absent, holds no integer version, or the
    /// snapshot's version is greater; a snapshot without one always writes.
    pub fn cas(&mut self, now: u64, snap: &Snapshot, payload: &str) -> bool {
        let hash = self.hashes.entry(snap.course.to_string()).or_default();
        let old = hash.get(&snap.section).cloned();
        if let (Some(new), Some(o)) = (snap.version, old.as_deref().and_then(stored_version)) {
            if i128::from(new) <= o {
                return false;
            }
        }
        hash.insert(snap.section, payload.to_owned());
        self.remember(now, snap, old);
        true
    }

    /// A write a failover may undo: the value it overwrote.
    fn remember(&mut self, now: u64, snap: &Snapshot, old: Option<String>) {
        self.undo
            .push((now, snap.course.to_string(), snap.section, old));
        // A replica lags by at most a few seconds: older writes are safe.
        let keep_from = now.saturating_sub(10_000);
        let cut = self.undo.partition_point(|(t, ..)| *t < keep_from);
        self.undo.drain(..cut);
    }

    /// A section's field as `HGET` reads it.
    pub fn field(&self, course: &str, section: u32) -> Option<&str> {
        self.hashes.get(course)?.get(&section).map(String::as_str)
    }

    /// `HSET` of a section's field, whatever it held (the reconciler's
    /// replacement of a version the database never had).
    pub fn set(&mut self, now: u64, snap: &Snapshot, payload: &str) {
        let hash = self.hashes.entry(snap.course.to_string()).or_default();
        let old = hash.insert(snap.section, payload.to_owned());
        self.remember(now, snap, old);
    }

    /// The nodes whose connection receives a publish on `course`, once per
    /// matching subscription: a connection subscribed to the channel and to
    /// the pattern receives it twice (`message` and `pmessage`), as Redis does.
    pub fn receivers(&self, course: &str) -> Vec<(usize, u64)> {
        let mut to = Vec::new();
        for (i, s) in self.subs.iter().enumerate() {
            if s.channels.contains(course) {
                to.push((i, s.gen));
            }
            if s.pattern {
                to.push((i, s.gen));
            }
        }
        to
    }

    /// A course's state hash, one payload per section.
    pub fn read(&self, course: &str) -> Vec<Vec<u8>> {
        self.hashes
            .get(course)
            .map(|h| h.values().map(|p| p.as_bytes().to_vec()).collect())
            .unwrap_or_default()
    }

    /// Every pub/sub connection dropped (their subscriptions with them).
    pub fn reset_all(&mut self) {
        for s in &mut self.subs {
            s.gen += 1;
            s.channels.clear();
            s.pattern = false;
        }
    }

    /// Restarted without its keyspace.
    pub fn lose_keyspace(&mut self) {
        self.hashes.clear();
        self.undo.clear();
        presence::lock(&self.presence).clear();
    }

    /// A failover to a replica that missed the writes of the last `lag_ms`.
    pub fn failover(&mut self, now: u64, lag_ms: u64) {
        presence::lock(&self.presence).failover(lag_ms);
        while let Some((t, ..)) = self.undo.last() {
            if *t + lag_ms < now {
                break;
            }
            let Some((_, course, section, old)) = self.undo.pop() else {
                break;
            };
            let hash = self.hashes.entry(course).or_default();
            match old {
                Some(v) => {
                    hash.insert(section, v);
                }
                None => {
                    hash.remove(&section);
                }
            }
        }
        self.undo.clear();
    }
}
