//! A connection's arrival (a WebSocket upgrade or a Server-Sent Events
//! stream) and its departure once the socket is gone.

use super::{Action, Shard, ADMIN_QUEUE_BYTES, SWEEP_MS};
use crate::conn::{Conn, ConnId, Role, Transport, WsOptions};
use crate::server_msg;
use crate::timer::Timer;
use std::sync::Arc;

impl Shard {
    /// Registers an upgraded WebSocket and queues its `hello`. With
    /// [`WsOptions::deflate`] (it negotiated permessage-deflate, section 4a)
    /// its course frames and other text messages of 256 B or more go
    /// compressed; with [`WsOptions::admin_feed`] it gets the admin aggregates.
    pub fn connect(
        &mut self,
        user: impl Into<Arc<str>>,
        role: Role,
        ws: WsOptions,
        now_ms: u64,
    ) -> ConnId {
        let transport = Transport::WebSocket {
            deflate: ws.deflate,
        };
        self.connect_as(user.into(), role, ws.admin_feed, transport, now_ms)
    }

    /// Registers a Server-Sent Events stream (section 4c) watching `courses`
    /// (checked by the shell: valid codes, at most [`super::MAX_COURSES_PER_CONN`]):
    /// its `hello`, then every course's watch answer, as for a WebSocket that
    /// sent those watches. It reads nothing and gets keepalive comments.
    pub fn connect_sse(
        &mut self,
        user: impl Into<Arc<str>>,
        role: Role,
        courses: &[String],
        now_ms: u64,
    ) -> ConnId {
        let id = self.connect_as(user.into(), role, false, Transport::Sse, now_ms);
        for course in courses {
            // Refusals (too many courses) were answered 400 before the stream.
            let _ = self.watch(id, course, now_ms);
        }
        id
    }

    /// Registers a connection of either transport and queues its `hello`.
    fn connect_as(
        &mut self,
        user: Arc<str>,
        role: Role,
        admin_feed: bool,
        transport: Transport,
        now_ms: u64,
    ) -> ConnId {
        self.now_ms = self.now_ms.max(now_ms);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as u32
            }
        };
        // A random generation: a stale handle never matches the slot's next tenant.
        let gen = self.rand() as u32 | 1;
        let conn = Conn::new(
            gen,
            Arc::clone(&user),
            role,
            admin_feed,
            transport,
            self.queue_limit(admin_feed),
            now_ms,
        );
        self.conns[idx as usize] = Some(conn);
        self.live += 1;
        self.live_sse += usize::from(transport.is_sse());
        let id = ConnId { idx, gen };
        let hello = server_msg::hello(&user, role, self.cfg.tick_ms, &self.cfg.node);
        self.send_always(id, hello);
        if admin_feed {
            self.admin_feed_opened(id);
            if self.admin.len() == 1 {
                self.actions
                    .push_back(Action::AdminFeed { connected: true });
            }
        }
        if self.timers.get(Timer::Sweep).is_none() {
            self.timers.set(Timer::Sweep, now_ms + SWEEP_MS);
        }
        if self.draining {
            // An upgrade that completed after the drain began: hint and close at
            // once, or the drain would never see its last connection go.
            self.drain_schedule.push((now_ms, id));
            self.drain_schedule.sort_unstable_by(|a, b| b.cmp(a));
            self.arm_drain();
        }
        id
    }

    /// The bytes a connection may have queued: 4 MiB for an admin feed (a full
    /// aggregate of thousands of courses must fit), else the viewers' bound.
    fn queue_limit(&self, admin_feed: bool) -> usize {
        if admin_feed {
            ADMIN_QUEUE_BYTES
        } else {
            self.cfg.send_queue_bytes
        }
    }

    /// The socket is gone: forget the connection.
    pub fn disconnect(&mut self, id: ConnId) {
        let Some(conn) = self.conn(id) else { return };
        let courses: Vec<Arc<str>> = conn.watched.iter().map(|(c, _)| Arc::clone(c)).collect();
        for c in courses {
            self.unwatch(id, &c);
        }
        if let Some(conn) = self.conns[id.idx as usize].take() {
            self.free.push(id.idx);
            self.live -= 1;
            self.live_sse -= usize::from(conn.transport.is_sse());
            if self.live == 0 {
                self.timers.stop(Timer::Sweep);
            }
            if conn.admin_feed && self.admin_feed_closed(id) {
                self.actions
                    .push_back(Action::AdminFeed { connected: false });
            }
        }
    }
}
