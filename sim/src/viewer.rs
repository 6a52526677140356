//! A simulated viewer: one browser's connection to one shard, its watches,
//! and the board it holds, checked frame by frame.

use serde_json::Value;
use shards::{read_server_frame, ConnId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where a viewer is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// Node index.
    pub node: usize,
    /// That node's generation when it connected.
    pub node_gen: u64,
    /// Shard index.
    pub shard: usize,
    /// The shard's connection id.
    pub conn: ConnId,
}

/// A viewer.
#[derive(Debug)]
pub struct Viewer {
    /// Its user id (shared by some viewers: presence counts users).
    pub user: Arc<str>,
    /// Its connection, while it has one.
    pub at: Option<At>,
    /// Where it connects next after losing its connection.
    pub next: (usize, usize),
    /// Courses it wants to watch.
    pub watching: BTreeSet<String>,
    /// It reads nothing.
    pub stalled: bool,
    /// Boards: course -> section -> section JSON, on this connection.
    pub boards: BTreeMap<String, BTreeMap<u32, Value>>,
    /// The highest version shown per (course, section) on this connection and watch.
    pub seen: BTreeMap<(String, u32), u64>,
    /// The last viewer count shown per course on this connection and watch.
    pub presence: BTreeMap<String, u64>,
    /// Courses unwatched while frames were still queued, with the bytes
    /// queued then and not read yet: those frames belong to the old watch.
    pub rewatch: BTreeMap<String, usize>,
}

/// What a frame a viewer read breaks, if anything.
#[derive(Debug)]
pub enum Read {
    /// A frame read and merged.
    Ok,
    /// The server closed the connection.
    Closed,
    /// An invariant broke: (name, detail).
    Broke(&'static str, String),
}

impl Viewer {
    /// A viewer with no connection yet.
    pub fn new(user: &str, node: usize, shard: usize) -> Viewer {
        Viewer {
            user: Arc::from(user),
            at: None,
            next: (node, shard),
            watching: BTreeSet::new(),
            stalled: false,
            boards: BTreeMap::new(),
            seen: BTreeMap::new(),
            presence: BTreeMap::new(),
            rewatch: BTreeMap::new(),
        }
    }

    /// Forgets what the last connection showed.
    pub fn fresh(&mut self) {
        self.boards.clear();
        self.seen.clear();
        self.presence.clear();
        self.rewatch.clear();
    }

    /// Forgets a course (unwatched) with `queued` bytes still to read: the
    /// frames among them belong to the old watch.
    pub fn forget(&mut self, course: &str, queued: usize) {
        self.boards.remove(course);
        self.presence.remove(course);
        if queued == 0 {
            self.seen.retain(|(c, _), _| c != course);
        } else {
            self.rewatch.insert(course.to_owned(), queued);
        }
    }

    /// Merges one server frame, checking each section shown against what was
    /// published (`published(course, section, version)`: its JSON, if that
    /// version was published); a version shown goes down only where
    /// `replaced(course, section, from, to)` (the reconciler's replacement,
    /// which a board takes whatever it holds).
    pub fn merge(
        &mut self,
        bytes: &[u8],
        published: impl Fn(&str, u32, u64) -> Option<Value>,
        replaced: impl Fn(&str, u32, u64, u64) -> bool,
    ) -> Read {
        let frame = match read_server_frame(bytes) {
            Ok(Some(f)) => f,
            Ok(None) => return Read::Broke("frames whole", format!("{} bytes", bytes.len())),
            Err(e) => return Read::Broke("frames whole", e.to_string()),
        };
        match bytes.first() {
            Some(0x88) => return Read::Closed,
            Some(0x81) => {}
            _ => return Read::Ok,
        }
        // Frames queued before an unwatch belong to the old watch; past
        // them, a new watch of the course starts afresh.
        let olds: BTreeSet<String> = self.rewatch.keys().cloned().collect();
        for left in self.rewatch.values_mut() {
            *left = left.saturating_sub(bytes.len());
        }
        let done: Vec<String> = self
            .rewatch
            .iter()
            .filter(|(_, left)| **left == 0)
            .map(|(c, _)| c.clone())
            .collect();
        for c in done {
            self.rewatch.remove(&c);
            self.seen.retain(|(k, _), _| *k != c);
        }
        let v: Value = match serde_json::from_slice(frame.payload) {
            Ok(v) => v,
            Err(e) => return Read::Broke("text frames are JSON", e.to_string()),
        };
        if v["type"] == "presence" {
            if let (Some(course), Some(n)) = (v["course"].as_str(), v["viewers"].as_u64()) {
                if self.watching.contains(course) && !olds.contains(course) {
                    self.presence.insert(course.to_owned(), n);
                }
            }
            return Read::Ok;
        }
        if v["type"] != "frame" {
            return Read::Ok;
        }
        let Some(course) = v["course"].as_str() else {
            return Read::Broke("frames name a course", v.to_string());
        };
        if !self.watching.contains(course) || olds.contains(course) {
            return Read::Ok;
        }
        let board = self.boards.entry(course.to_owned()).or_default();
        if v["full"] == Value::Bool(true) {
            board.clear();
        }
        let Some(sections) = v["sections"].as_array() else {
            return Read::Broke("frames carry sections", v.to_string());
        };
        for s in sections {
            let (Some(id), Some(version)) = (s["section"].as_u64(), s["version"].as_u64()) else {
                return Read::Broke("never shown an unpublished state", s.to_string());
            };
            let id = id as u32;
            match published(course, id, version) {
                Some(p) if p == *s => {}
                _ => {
                    return Read::Broke(
                        "never shown an unpublished state",
                        format!("{course}/{id} shown {s}"),
                    )
                }
            }
            let key = (course.to_owned(), id);
            if let Some(&before) = self.seen.get(&key) {
                if version < before && !replaced(course, id, before, version) {
                    return Read::Broke(
                        "a viewer never sees a version go down",
                        format!("{course}/{id} went from {before} to {version}"),
                    );
                }
            }
            self.seen.insert(key, version);
            board.insert(id, s.clone());
        }
        Read::Ok
    }
}
