//! What a loop answers: progress and the report.

use super::{connect::say_goodbye, Gen, Phase};
use crate::board::digest;
use crate::message::Progress;
use crate::report::{count_boards, Report};

impl Gen {
    /// A progress value: counters, refusals so far, latency since the last one.
    pub(crate) fn progress(&mut self) -> Progress {
        Progress {
            counters: self.c.clone(),
            refusals: self.refusals.iter().map(|(&s, &n)| (s, n)).collect(),
            latency: std::mem::take(&mut self.lat_iv),
        }
    }

    /// Every open WebSocket sends a close 1000 and a FIN.
    pub(crate) fn goodbye(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            if c.phase == Phase::Open && !self.cfg.sse {
                say_goodbye(c);
            }
        }
    }

    /// Everything this loop saw.
    pub(crate) fn report(&self) -> Report {
        let boards = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.phase == Phase::Open)
            .flat_map(|c| c.courses.iter().zip(&c.boards))
            .map(|(&course, board)| (course, digest(board)));
        let mut live = vec![false; self.viewers.len()];
        for c in self.conns.iter().flatten() {
            if c.phase == Phase::Open {
                if let Some(l) = live.get_mut(c.user as usize) {
                    *l = true;
                }
            }
        }
        let boards_not_live = self
            .viewers
            .iter()
            .zip(&live)
            .filter(|(_, &l)| !l)
            .map(|(v, _)| v.courses.len() as u64)
            .sum();
        Report {
            error: None,
            boards_not_live,
            intervals: self.intervals.clone(),
            still_blind: self.viewers.iter().filter_map(|v| v.blind_since).collect(),
            phases: self
                .phases
                .iter()
                .map(|(k, h)| (k.clone(), h.clone()))
                .collect(),
            close_codes: self.close_codes.iter().map(|(&c, &n)| (c, n)).collect(),
            counters: self.c.clone(),
            latency: self.lat.clone(),
            connect: self.connect.clone(),
            first_board: self.first_board.clone(),
            digests: count_boards(boards),
            refusals: self.refusals.iter().map(|(&s, &n)| (s, n)).collect(),
            first_refusal_ms: self.first_refusal_ms,
            tls_error: self.tls_error.clone(),
            per_second: self.per_second.clone(),
            seeding: self.seeding.record(),
        }
    }
}
