//! Messages in: `hello`, `frame` (merged into the viewer's board and timed),
//! `presence`, `reconnect`, `error`; recovery checked after each frame.

use super::Gen;
use crate::board::merge;
use crate::hist::Hist;
use crate::now_us;
use crate::recovery::holds;
use serde::Deserialize;
use std::time::{Duration, Instant};

/// A server message, as much of it as a viewer reads.
#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(rename = "type", borrow)]
    ty: &'a str,
    #[serde(default, borrow)]
    course: Option<&'a str>,
    #[serde(default)]
    full: bool,
    #[serde(default)]
    sections: Vec<Sec>,
    #[serde(default)]
    after_ms: Option<u64>,
    #[serde(default)]
    tick_ms: Option<u64>,
}

#[derive(Deserialize)]
struct Sec {
    section: u32,
    seats_taken: u32,
    #[serde(default)]
    version: Option<u64>,
    #[serde(default)]
    seat_info: Option<Info>,
}

#[derive(Deserialize)]
struct Info {
    #[serde(default)]
    t: Option<u64>,
}

impl Gen {
    /// One whole text message of connection `idx`, by its type.
    pub(crate) fn on_text(&mut self, idx: usize, payload: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Msg>(payload) else {
            self.c.errors += 1;
            return;
        };
        match msg.ty {
            "frame" => {}
            "reconnect" => {
                self.c.hints += 1;
                if let Some(c) = self.conns[idx].as_mut() {
                    let after = msg.after_ms.unwrap_or(0);
                    c.hint_at = Some(Instant::now() + Duration::from_millis(after));
                }
                return;
            }
            "presence" => {
                self.c.presence += 1;
                return;
            }
            "error" => {
                self.c.errors += 1;
                return;
            }
            "hello" => {
                self.c.tick_ms = self.c.tick_ms.max(msg.tick_ms.unwrap_or(0));
                return;
            }
            _ => return,
        }
        self.on_frame(idx, &msg);
    }

    /// A `frame` merged into the viewer's board of its course, each newer
    /// section of a live (not `full`) frame timed from its publish time.
    fn on_frame(&mut self, idx: usize, msg: &Msg) {
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        let courses = &self.cfg.courses;
        let Some(k) = conn
            .courses
            .iter()
            .position(|&c| msg.course == Some(courses[c as usize].as_str()))
        else {
            self.c.errors += 1;
            return;
        };
        let board = &mut conn.boards[k];
        self.c.frames += 1;
        let now = now_us();
        self.seeding
            .frame(conn.courses[k], msg.full, now, self.c.open);
        if msg.full {
            self.c.full_frames += 1;
            board.clear();
            if !conn.had_board {
                conn.had_board = true;
                self.first_board
                    .record(conn.started_at.elapsed().as_micros() as u64);
            }
        }
        let survivor = self
            .viewers
            .get(conn.user as usize)
            .is_none_or(|v| !v.moved);
        let mut phase = if self.phase == "during" && !survivor {
            None
        } else {
            // Not `entry(self.phase.clone())`: no String per frame.
            if !self.phases.contains_key(&self.phase) {
                self.phases.insert(self.phase.clone(), Hist::default());
            }
            self.phases.get_mut(&self.phase)
        };
        let lat_iv = &mut self.lat_iv;
        let version_ts = self.cfg.version_ts;
        let sent_at = |s: &Sec| {
            s.seat_info.as_ref().and_then(|i| i.t).or_else(|| {
                (version_ts && s.version.is_some()).then(|| s.version.unwrap_or(0) / 1000 * 1000)
            })
        };
        let mut record = |lat: &mut Hist, d: u64| {
            lat.record(d);
            lat_iv.record(d);
            if let Some(h) = phase.as_mut() {
                h.record(d);
            }
        };
        for s in &msg.sections {
            self.c.sections += 1;
            let newer = merge(board, s.section, s.version.unwrap_or(0), s.seats_taken);
            if newer && !msg.full {
                if let Some(t) = sent_at(s) {
                    record(&mut self.lat, now.saturating_sub(t));
                }
            }
        }
        self.check_recovered(idx);
    }

    /// Ends `user`'s blind interval if its board holds the reference it needs.
    pub(crate) fn check_recovered(&mut self, idx: usize) {
        let Some(conn) = self.conns[idx].as_ref() else {
            return;
        };
        let Some(v) = self.viewers.get_mut(conn.user as usize) else {
            return;
        };
        let Some(since) = v.blind_since else {
            return;
        };
        if v.need > self.refs.len() || conn.boards.iter().all(Vec::is_empty) {
            return;
        }
        if v.need > 0 {
            let ok = holds(&self.refs[v.need - 1], &conn.courses, &conn.boards);
            if !ok {
                return;
            }
        }
        v.blind_since = None;
        self.intervals.push((since, now_us() / 1000));
        self.c.blind -= 1;
        self.c.recovered += 1;
    }
}
