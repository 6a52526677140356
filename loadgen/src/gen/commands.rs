//! The rehearsal's commands, and new viewers at the connect rate.

use super::{Gen, Phase};
use crate::backoff::Loss;
use crate::message::Command;
use crate::recovery::Viewer;
use crate::{board::zipf_pick, now_us};
use std::os::fd::AsRawFd;
use std::time::Instant;

impl Gen {
    /// A command other than `Mark` and `Report` (the run answers those).
    pub(crate) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Arm => self.armed = true,
            Command::Lat { phase } => self.phase = phase,
            Command::Ref { versions } => {
                self.refs.push(versions);
                for idx in 0..self.conns.len() {
                    if self.conns[idx]
                        .as_ref()
                        .is_some_and(|c| c.phase == Phase::Open)
                    {
                        self.check_recovered(idx);
                    }
                }
            }
            Command::Drop => self.drop_all(),
            Command::Blind => {
                self.armed = true;
                let need = self.refs.len() + 1;
                let now = now_us() / 1000;
                for v in &mut self.viewers {
                    if v.blind_since.is_none() {
                        v.blind_since = Some(now);
                        self.c.blind += 1;
                    }
                    v.need = v.need.max(need);
                }
            }
            Command::Mark | Command::Report => {}
        }
    }

    /// Every open connection reset at once; each viewer is blind and comes
    /// back the way the page does after a lost connection.
    pub(crate) fn drop_all(&mut self) {
        self.armed = true;
        self.refusals.clear();
        for idx in 0..self.conns.len() {
            let Some(c) = self.conns[idx].as_ref() else {
                continue;
            };
            if c.phase != Phase::Open {
                continue;
            }
            let (user, opened) = (c.user, c.opened_at);
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: setsockopt on a socket we own, with a `linger` value.
            unsafe {
                libc::setsockopt(
                    c.io.sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    &linger as *const libc::linger as *const libc::c_void,
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
            self.close(idx);
            self.lost(user, true);
            self.retry(
                user,
                Loss {
                    opened,
                    ..Loss::default()
                },
            );
        }
    }

    /// Opens retries whose time came, then new viewers at the connect rate.
    pub(crate) fn start_new(&mut self) {
        let now = Instant::now();
        // Retries whose time has come.
        let mut i = 0;
        while i < self.pending.len() {
            if self.c.connecting as usize >= self.cfg.inflight {
                return;
            }
            if self.pending[i].0 <= now {
                let (_, user) = self.pending.swap_remove(i);
                let courses = self
                    .viewers
                    .get(user as usize)
                    .map(|v| v.courses.clone())
                    .unwrap_or_default();
                self.c.reconnects += 1;
                self.open(user, courses);
            } else {
                i += 1;
            }
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let allowed = (self.cfg.connect_rate * elapsed).max(1.0);
        while (self.cfg.churn || (self.next_user as usize) < self.cfg.clients)
            && self.opened < allowed
            && (self.c.connecting as usize) < self.cfg.inflight
        {
            let courses = self.pick_courses();
            let user = self.next_user;
            self.next_user += 1;
            self.opened += 1.0;
            if !self.cfg.churn {
                self.viewers.push(Viewer {
                    courses: courses.clone(),
                    ..Viewer::default()
                });
            }
            self.open(user, courses);
        }
    }

    /// 1..=max_courses distinct courses, each Zipf-drawn.
    pub(crate) fn pick_courses(&mut self) -> Vec<u32> {
        let want = self.rng.u32(1..=self.cfg.max_courses.max(1)) as usize;
        let want = want.min(self.cfg.courses.len().max(1));
        let mut out = Vec::with_capacity(want);
        for _ in 0..want * 8 {
            let c = zipf_pick(&self.cdf, &mut self.rng) as u32;
            if !out.contains(&c) {
                out.push(c);
            }
            if out.len() == want {
                break;
            }
        }
        out
    }
}
