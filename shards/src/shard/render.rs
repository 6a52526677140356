//! Time: the pacer's schedule of courses to render, each render's frames to
//! every viewer (a delta, or a full frame to heal one that missed some), and
//! the sweep for pings, keepalives, silence and slow consumers.

use super::send::payload_len;
use super::{Shard, SSE_KEEPALIVE_MS, SWEEP_MS};
use crate::conn::ConnId;
use crate::course::Viewer;
use crate::gate::Gate;
use crate::send_queue::Push;
use crate::sse_event;
use crate::timer::Timer;
use crate::ws_codec::{close, deflated_frame, ping_frame};
use bytes::Bytes;
use std::cmp::Reverse;
use std::sync::Arc;

impl Shard {
    /// Puts a course that has something to render into the schedule, and
    /// keeps its gate in step either way.
    pub(super) fn schedule(&mut self, course: &Arc<str>) {
        if let Some(c) = self.courses.get_mut(course) {
            let due = c.due_ms(self.cfg.tick_ms);
            // An unseeded course renders nothing until its seed answers the watchers.
            if !c.scheduled && c.ready() && c.wants_render() {
                c.scheduled = true;
                self.scheduled.push(Reverse((due, Arc::clone(course))));
            }
            c.gate.set(if c.scheduled { Gate::ARMED } else { due });
        }
    }

    /// Renders due courses and runs the sweep; call when [`Shard::poll_timeout`] passed.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        while let Some(Reverse((due, _))) = self.scheduled.peek() {
            if *due > now_ms {
                break;
            }
            let Some(Reverse((_, name))) = self.scheduled.pop() else {
                break;
            };
            if let Some(c) = self.courses.get_mut(&name) {
                c.scheduled = false;
            }
            self.render(&name, now_ms);
            self.schedule(&name);
        }
        self.count_waits_due(now_ms);
        self.holds_due(now_ms);
        self.drain_due(now_ms);
        self.cut_due(now_ms);
        if self.timers.is_expired(Timer::Sweep, now_ms) {
            self.timers.set(Timer::Sweep, now_ms + SWEEP_MS);
            self.sweep(now_ms);
        }
    }

    /// Renders one due course: its delta to every viewer, a full frame to
    /// the viewers owed one (with the count they may have missed).
    fn render(&mut self, name: &Arc<str>, now_ms: u64) {
        let Some(c) = self.courses.get_mut(name) else {
            return;
        };
        if !c.ready() || !c.wants_render() {
            return;
        }
        let delta = (!c.dirty.is_empty()).then(|| c.delta_frame());
        // Encoded only for viewers owed one (or cached for the next watch).
        let full = (c.owed > 0).then(|| c.full_frame());
        c.dirty.clear();
        c.pacer.spend(self.cfg.tick_ms, now_ms);
        self.stats.frames_rendered += 1;
        // The count a healed viewer gets with its board (it may have missed one).
        let (count, presence) = match (c.owed > 0).then(|| c.count_with_board()) {
            Some((n, m)) => (Viewer::count(n), Some(m)),
            None => (Viewer::NO_COUNT, None),
        };
        let mut presence_sse: Option<Bytes> = None;
        // The compressed twins, made at most once each for every viewer that
        // negotiated permessage-deflate.
        let mut delta_deflated: Option<Bytes> = None;
        // The event twin, made at most once for every SSE viewer.
        let mut delta_sse: Option<Bytes> = None;
        let mut owed = c.owed;
        let mut viewers = std::mem::take(&mut c.viewers);
        for v in viewers.iter_mut() {
            let Some(conn) = self.conns[v.conn.idx as usize].as_mut() else {
                continue;
            };
            let (plain, frame) = match (&delta, &full, v.owes_full) {
                (_, Some(full), true) if conn.transport.is_sse() => (full, c.full_frame_sse()),
                (_, Some(full), true) if conn.transport.deflates() => {
                    (full, c.full_frame_deflated(&mut self.board_deflater))
                }
                (_, Some(full), true) => (full, full.clone()),
                (_, None, true) => continue,
                (Some(d), _, false) if conn.transport.is_sse() => (
                    d,
                    delta_sse
                        .get_or_insert_with(|| sse_event::event(d).unwrap_or_default())
                        .clone(),
                ),
                (Some(d), _, false) if conn.transport.deflates() => (
                    d,
                    delta_deflated
                        .get_or_insert_with(|| deflated_frame(&mut self.deflater, d))
                        .clone(),
                ),
                (Some(d), _, false) => (d, d.clone()),
                (None, _, false) => continue,
            };
            let len = frame.len() as u64;
            match conn.push(frame, now_ms) {
                Push::Queued => {
                    self.stats.frames_queued += 1;
                    self.stats.bytes_queued += len;
                    self.stats.payload_bytes += payload_len(plain);
                    if v.owes_full {
                        v.owes_full = false;
                        owed -= 1;
                        self.stats.resyncs += 1;
                        // A healed viewer may have missed a count too: it goes
                        // with the board, past the bound as a watch answer's does.
                        if let Some(plain) = presence.as_ref().filter(|_| v.shown != count) {
                            let p = if conn.transport.is_sse() {
                                presence_sse
                                    .get_or_insert_with(|| {
                                        sse_event::event(plain).unwrap_or_default()
                                    })
                                    .clone()
                            } else {
                                plain.clone()
                            };
                            conn.queue.push_always(p.clone());
                            v.shown = count;
                            self.stats.frames_queued += 1;
                            self.stats.bytes_queued += p.len() as u64;
                            self.stats.payload_bytes += payload_len(plain);
                        }
                    }
                    if !conn.in_ready {
                        conn.in_ready = true;
                        self.ready.push_back(v.conn);
                    }
                }
                Push::Full => {
                    self.stats.frames_dropped += 1;
                    if !v.owes_full && conn.phase.is_open() {
                        v.owes_full = true;
                        owed += 1;
                    }
                }
            }
        }
        c.viewers = viewers;
        c.owed = owed;
    }

    /// Pings (or keepalive comments), idle closes and slow-consumer closes.
    fn sweep(&mut self, now_ms: u64) {
        self.admin_heal();
        let cfg = self.cfg.clone();
        let ids: Vec<ConnId> = self.live_ids().collect();
        for id in ids {
            let Some(c) = self.conn(id) else { continue };
            if !c.phase.is_open() {
                continue;
            }
            if c.queue
                .full_since()
                .is_some_and(|t| now_ms >= t + cfg.slow_consumer_ms)
            {
                self.stats.slow_consumer_closes += 1;
                self.close(id, close::SLOW_CONSUMER, "slow consumer");
            } else if !c.transport.is_sse() && now_ms >= c.last_rx_ms + cfg.idle_ms {
                self.stats.idle_closes += 1;
                self.close(id, close::NORMAL, "idle");
            } else if now_ms
                >= c.last_ping_ms
                    + if c.transport.is_sse() {
                        SSE_KEEPALIVE_MS
                    } else {
                        cfg.ping_ms
                    }
            {
                if let Some(c) = self.conn_mut(id) {
                    c.last_ping_ms = now_ms;
                }
                let ping = ping_frame(b"");
                let keepalive = Bytes::from_static(sse_event::KEEPALIVE);
                self.send_or_drop_as(id, &ping, &ping, Some(&keepalive));
            }
        }
    }
}
