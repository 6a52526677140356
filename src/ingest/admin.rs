//! The node's admin aggregate (contract §5, Admin), built once per node while
//! an admin is connected: which courses it covers (every state hash, found when
//! the firehose turns on and rescanned every 5 s, plus every course a snapshot
//! named; a course whose hash a rescan no longer finds, unwatched and not
//! named since, leaves it), and each tick's messages: the full aggregate, kept
//! by shards for newcomers, and the delta of entries that changed since the
//! last message (the full aggregate again when a course left).

use super::{Board, Ingest};
use crate::channels::Control;
use crate::channels::PresenceCmd;
use crate::redis::pubsub::Source;
use shards::server_msg::{self, AdminRow};
use shards::AdminMsg;
use std::sync::Arc;

/// How often the state hashes are scanned for new courses while the firehose is on (ms).
pub const RESCAN_MS: u64 = 5_000;

/// A course's admin entry as last sent, to tell what changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Shown {
    sections: usize,
    total_seats: u64,
    seats_taken: u64,
    full_sections: usize,
    updates_per_s: f64,
    viewers: u64,
}

impl Shown {
    fn of(b: &Board, updates_per_s: f64, viewers: u64) -> Shown {
        Shown {
            sections: b.sections.len(),
            total_seats: b.sections.values().map(|s| s.total_seats as u64).sum(),
            seats_taken: b.sections.values().map(|s| s.seats_taken as u64).sum(),
            full_sections: b
                .sections
                .values()
                .filter(|s| s.seats_taken >= s.total_seats)
                .count(),
            updates_per_s,
            viewers,
        }
    }

    fn row<'a>(&self, course: &'a str) -> AdminRow<'a> {
        AdminRow {
            course,
            sections: self.sections,
            total_seats: self.total_seats,
            seats_taken: self.seats_taken,
            full_sections: self.full_sections,
            updates_per_s: self.updates_per_s,
            viewers: self.viewers,
        }
    }
}

impl<S: Source> Ingest<S> {
    /// The admin tick: rates over the tick just ended, then a message to every
    /// admin shard if any entry changed.
    pub(super) fn admin_tick(&mut self) {
        if !self.firehose() {
            self.reset_updates();
            return;
        }
        let secs = self.admin_tick_ms as f64 / 1000.0;
        if let Some(msg) = self.admin_msg(Some(secs)) {
            self.send_admin(msg, self.admin_shards);
        }
    }

    /// A shard's first admin feed opened: it needs a full aggregate now, not at
    /// the next tick. Entries that changed since the last message go to every
    /// admin shard as a delta (rates stay as last shown: the tick is not over),
    /// this one included: a feed there that a tick already gave a full
    /// aggregate (a tick can pass while the discovery is read) takes the
    /// delta, a feed still owed one the full aggregate.
    pub(super) fn admin_answer(&mut self, shard: usize) {
        match self.admin_msg(None) {
            Some(msg) => self.send_admin(msg, self.admin_shards | 1 << shard),
            None => {
                let full = AdminMsg {
                    full: self.admin_full(),
                    delta: None,
                };
                self.send_admin(full, 1 << shard);
            }
        }
    }

    fn send_admin(&self, msg: AdminMsg, mut mask: u128) {
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(o) = self.outlets.get(i) {
                o.inbox().control(Control::Admin(msg.clone()));
            }
        }
    }

    /// Brings every named course's entry up to date (`tick_secs`: a tick
    /// ended, rates are recomputed and counting starts afresh); `None` if no
    /// entry changed.
    fn admin_msg(&mut self, tick_secs: Option<f64>) -> Option<AdminMsg> {
        let viewers = &self.viewers;
        let mut changed: Vec<(Arc<str>, Shown)> = Vec::new();
        for (name, b) in self.boards.iter_mut() {
            if !b.named {
                continue;
            }
            let rate = match tick_secs {
                Some(secs) => {
                    let r = (b.updates as f64 / secs * 10.0).round() / 10.0;
                    b.updates = 0;
                    r
                }
                None => b.shown.map_or(0.0, |s| s.updates_per_s),
            };
            let now = Shown::of(b, rate, viewers.get(name).copied().unwrap_or(0));
            if b.shown != Some(now) {
                b.shown = Some(now);
                changed.push((Arc::clone(name), now));
            }
        }
        if std::mem::take(&mut self.admin_shrunk) {
            let full = self.admin_full();
            return Some(AdminMsg {
                full: full.clone(),
                delta: Some(full),
            });
        }
        if changed.is_empty() {
            return None;
        }
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        let delta = server_msg::admin(false, changed.iter().map(|(c, s)| s.row(c)));
        Some(AdminMsg {
            full: self.admin_full(),
            delta: Some(delta),
        })
    }

    /// Every named course's entry as last shown, sorted by course.
    fn admin_full(&self) -> bytes::Bytes {
        let mut rows: Vec<(&Arc<str>, Shown)> = self
            .boards
            .iter()
            .filter_map(|(c, b)| Some((c, b.shown?)))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        server_msg::admin(true, rows.iter().map(|(c, s)| s.row(c)))
    }

    /// Courses the node counts viewers of for admins: those a snapshot or a
    /// state hash named (a made-up name is counted only while watched).
    pub fn known_courses(&self) -> Vec<Arc<str>> {
        self.boards
            .iter()
            .filter(|(_, b)| b.named)
            .map(|(c, _)| Arc::clone(c))
            .collect()
    }

    /// Tells the presence worker which courses to count for admins.
    pub(super) fn admin_presence(&self) {
        if self.firehose() {
            if let Some(p) = &self.presence {
                let _ = p.send(PresenceCmd::Extra(self.known_courses()));
            }
        }
    }
}
