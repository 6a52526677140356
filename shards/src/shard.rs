//! The per-core renderer: a state machine fed connection events, snapshots,
//! presence counts and the current time, emitting frames and actions.
//!
//! It owns no socket and reads no clock. The shell calls the `handle_*` methods,
//! then drains [`Shard::poll_action`], [`Shard::poll_ready`] and
//! [`Shard::poll_write`], and sleeps until [`Shard::poll_timeout`].

use crate::client_op::{ClientOp, OpError};
use crate::conn::{Conn, ConnId, Role};
use crate::course::{Course, Viewer};
use crate::deflate::Deflater;
use crate::gate::Gate;
use crate::phase::Phase;
use crate::send_queue::Push;
use crate::server_msg;
use crate::snapshot::Snapshot;
use crate::sse;
use crate::timer::{Timer, TimerTable};
use crate::ws_codec::{
    close, close_frame, deflated_frame, ping_frame, pong_frame, server_frame_payload, Violation,
    WsEvent,
};
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

mod admin_feed;
pub use admin_feed::{AdminMsg, ADMIN_QUEUE_BYTES};

/// The most bytes [`Shard::poll_write`] joins into one write: a few full
/// frames and counts, small enough that copying them costs less than the
/// send each would take.
pub const JOIN_MAX: usize = 16 * 1024;

/// Courses one connection may watch.
pub const MAX_COURSES_PER_CONN: usize = 32;

/// Knobs of a shard, all times in milliseconds.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Student frame interval.
    pub tick_ms: u64,
    /// Bytes a connection may have queued before frames are dropped.
    pub send_queue_bytes: usize,
    /// How long a queue may stay full before close 4001.
    pub slow_consumer_ms: u64,
    /// Server ping interval.
    pub ping_ms: u64,
    /// Silence after which a connection is closed.
    pub idle_ms: u64,
    /// Node id sent in `hello`.
    pub node: String,
    /// Seed of the jitter used for drain spreading and reconnect hints.
    pub seed: u64,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            tick_ms: 200,
            send_queue_bytes: 64 * 1024,
            slow_consumer_ms: 5_000,
            ping_ms: 30_000,
            idle_ms: 75_000,
            node: "node".into(),
            seed: 0x5eed,
        }
    }
}

/// Something the shell must do outside the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The shard's first viewer of a course arrived (`true`) or its last left.
    Interest { course: Arc<str>, watching: bool },
    /// A user's first connection on this shard started watching a course.
    PresenceJoin { course: Arc<str>, user: Arc<str> },
    /// A user's last connection on this shard stopped watching a course.
    PresenceLeave { course: Arc<str>, user: Arc<str> },
    /// An admin asked for a course's roster; answer with [`Shard::deliver`].
    Roster { conn: ConnId, course: Arc<str> },
    /// The first admin feed on this shard opened (`true`) or the last one closed.
    AdminFeed { connected: bool },
    /// A close frame is queued: flush the queue, then end the connection.
    Close { conn: ConnId, code: u16 },
    /// The close grace ([`CLOSE_GRACE_MS`]) of a closing connection is over and
    /// its socket is still open: shut it down (this also ends a write stuck on
    /// a slow consumer).
    Cut { conn: ConnId },
}

/// What the shell does with a connection's read side after [`Shard::handle_read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Keep reading.
    More,
    /// Stop reading: the peer's close arrived, or a violation closed the connection.
    Stop,
}

/// How long a closing connection may take to finish the close handshake
/// before its socket is cut (contract §5: "within 3 s").
pub const CLOSE_GRACE_MS: u64 = 3_000;

/// Counters the shell exports in `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct ShardStats {
    /// Frames (of any kind) queued to connections.
    pub frames_queued: u64,
    /// Course frames dropped because a queue was full.
    pub frames_dropped: u64,
    /// Full frames sent to heal a connection that missed one.
    pub resyncs: u64,
    /// Bytes queued to connections, as they go on the wire (compressed or not).
    pub bytes_queued: u64,
    /// Payload bytes queued to connections, counted before compression.
    pub payload_bytes: u64,
    /// Course frames rendered (encoded), one per course per tick at most.
    pub frames_rendered: u64,
    /// Connections closed with 4001.
    pub slow_consumer_closes: u64,
    /// Connections closed for silence.
    pub idle_closes: u64,
    /// Client mistakes answered with an error message, by code.
    pub client_errors: u64,
    /// Snapshots applied (changed the board).
    pub snapshots_applied: u64,
}

/// The per-core renderer.
#[derive(Debug)]
pub struct Shard {
    cfg: ShardConfig,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    live: usize,
    /// Of `live`, the Server-Sent Events streams.
    live_sse: usize,
    /// Keyed by course code; foldhash with a per-process random seed (codes
    /// come from clients, so the hash is keyed, but cheaper than SipHash).
    courses: HashMap<Arc<str>, Course>,
    /// Courses waiting for their pacer, earliest due first: exactly one entry
    /// per course whose `scheduled` is set (a course's due moment only moves
    /// when it renders, which pops it first).
    scheduled: BinaryHeap<Reverse<(u64, Arc<str>)>>,
    actions: VecDeque<Action>,
    ready: VecDeque<ConnId>,
    /// Admin feeds and the aggregate they are at.
    admin: admin_feed::AdminFeeds,
    /// permessage-deflate without context: one compressor for the whole shard.
    deflater: Deflater,
    /// The sweep, drain and cut deadlines.
    timers: TimerTable,
    draining: bool,
    /// Drain moments, latest first, so the due ones pop off the end.
    drain_schedule: Vec<(u64, ConnId)>,
    rng: u64,
    stats: ShardStats,
    /// Close-grace deadlines in the order closes happened (the grace is one
    /// constant, so the front is always the next one due).
    cuts: VecDeque<(u64, ConnId)>,
    /// The latest time passed in, for closes started without one.
    now_ms: u64,
}

/// Sweep interval for pings, silence and slow consumers.
const SWEEP_MS: u64 = 1_000;

/// How often an SSE stream gets its keepalive comment (contract: at least
/// every 30 s; half that keeps a proxy's 30 s idle timeout from ending it).
pub const SSE_KEEPALIVE_MS: u64 = 15_000;

/// `plain`, `deflated` or `sse` as connection `c` takes it: `None` for a
/// control frame on a Server-Sent Events stream (which has no counterpart).
fn encoded_for(c: &Conn, plain: &Bytes, deflated: &Bytes, sse: Option<&Bytes>) -> Option<Bytes> {
    if c.sse {
        sse.cloned().or_else(|| sse::event(plain))
    } else if c.deflate {
        Some(deflated.clone())
    } else {
        Some(plain.clone())
    }
}

/// The payload length of a server frame built here (its size before compression).
fn payload_len(frame: &[u8]) -> u64 {
    server_frame_payload(frame).map_or(0, |p| p.len() as u64)
}

impl Shard {
    /// An empty shard.
    pub fn new(cfg: ShardConfig) -> Self {
        let rng = cfg.seed | 1;
        Shard {
            cfg,
            conns: Vec::new(),
            free: Vec::new(),
            live: 0,
            live_sse: 0,
            courses: HashMap::new(),
            scheduled: BinaryHeap::new(),
            actions: VecDeque::new(),
            ready: VecDeque::new(),
            admin: admin_feed::AdminFeeds::default(),
            deflater: Deflater::default(),
            timers: TimerTable::default(),
            draining: false,
            drain_schedule: Vec::new(),
            rng,
            stats: ShardStats::default(),
            cuts: VecDeque::new(),
            now_ms: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &ShardConfig {
        &self.cfg
    }

    /// Counters for `/metrics`.
    pub fn stats(&self) -> &ShardStats {
        &self.stats
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.live
    }

    /// Open Server-Sent Events streams (counted in [`Shard::connections`] too).
    pub fn sse_connections(&self) -> usize {
        self.live_sse
    }

    /// Courses with at least one viewer here.
    pub fn courses(&self) -> usize {
        self.courses.len()
    }

    /// True once a drain started.
    pub fn draining(&self) -> bool {
        self.draining
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*: deterministic for tests, good enough for jitter.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns
            .get(id.idx as usize)?
            .as_ref()
            .filter(|c| c.gen == id.gen)
    }

    fn conn_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns
            .get_mut(id.idx as usize)?
            .as_mut()
            .filter(|c| c.gen == id.gen)
    }

    fn mark_ready(&mut self, id: ConnId) {
        if let Some(c) = self.conn_mut(id) {
            if !c.in_ready {
                c.in_ready = true;
                self.ready.push_back(id);
            }
        }
    }

    /// Queues past the bound (control answers, hints, close frames), uncompressed.
    fn send_always(&mut self, id: ConnId, frame: Bytes) {
        self.send_always_as(id, &frame, &frame, None);
    }

    /// Queues past the bound: `deflated` if the connection negotiated
    /// permessage-deflate, `sse` (or, without one, `plain` wrapped as an
    /// event here) on a Server-Sent Events stream, else `plain`.
    fn send_always_as(&mut self, id: ConnId, plain: &Bytes, deflated: &Bytes, sse: Option<&Bytes>) {
        let Some(c) = self.conn_mut(id) else { return };
        if !c.phase.is_open() {
            return;
        }
        let Some(frame) = encoded_for(c, plain, deflated, sse) else {
            return;
        };
        let len = frame.len() as u64;
        c.queue.push_always(frame);
        self.stats.frames_queued += 1;
        self.stats.bytes_queued += len;
        self.stats.payload_bytes += payload_len(plain);
        self.mark_ready(id);
    }

    /// Registers an upgraded connection and queues its `hello`. `deflate`: it
    /// negotiated permessage-deflate (section 4a), so its course frames and
    /// other text messages of 256 B or more go compressed.
    pub fn connect(
        &mut self,
        user: impl Into<Arc<str>>,
        role: Role,
        admin_feed: bool,
        deflate: bool,
        now_ms: u64,
    ) -> ConnId {
        self.connect_as(user.into(), role, admin_feed, deflate, false, now_ms)
    }

    /// Registers a Server-Sent Events stream (section 4c) watching `courses`
    /// (checked by the shell: valid codes, at most [`MAX_COURSES_PER_CONN`]):
    /// its `hello`, then every course's watch answer, as for a WebSocket that
    /// sent those watches. It reads nothing and gets keepalive comments.
    pub fn connect_sse(
        &mut self,
        user: impl Into<Arc<str>>,
        role: Role,
        courses: &[String],
        now_ms: u64,
    ) -> ConnId {
        let id = self.connect_as(user.into(), role, false, false, true, now_ms);
        for course in courses {
            // Refusals (too many courses) were answered 400 before the stream.
            let _ = self.watch(id, course, now_ms);
        }
        id
    }

    fn connect_as(
        &mut self,
        user: Arc<str>,
        role: Role,
        admin_feed: bool,
        deflate: bool,
        sse: bool,
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
        let mut conn = Conn::new(
            gen,
            Arc::clone(&user),
            role,
            admin_feed,
            deflate,
            self.queue_limit(admin_feed),
            now_ms,
        );
        conn.sse = sse;
        self.conns[idx as usize] = Some(conn);
        self.live += 1;
        self.live_sse += usize::from(sse);
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

    /// Any bytes arrived from the connection (pongs included): it is alive.
    pub fn handle_activity(&mut self, id: ConnId, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        if let Some(c) = self.conn_mut(id) {
            c.last_rx_ms = now_ms;
        }
    }

    /// Bytes read from a connection's socket (the first call may carry what was
    /// read past the request head): decodes them under the frame rules and the
    /// 4 KiB message limit (inflating permessage-deflate messages of a
    /// connection that negotiated it), answers pings, applies the 20-messages-per-second
    /// and 100-control-frames-per-second windows, and acts on every whole message. After our close frame only the
    /// peer's close counts. Returns whether the shell should read on.
    pub fn handle_read(&mut self, id: ConnId, data: &[u8], now_ms: u64) -> Reading {
        self.handle_activity(id, now_ms);
        let Some(c) = self.conn_mut(id) else {
            return Reading::Stop;
        };
        c.decoder.feed(data);
        loop {
            let Some(c) = self.conn_mut(id) else {
                return Reading::Stop;
            };
            let event = match c.decoder.next_event() {
                Ok(Some(e)) => e,
                Ok(None) => {
                    c.decoder.shrink();
                    return Reading::More;
                }
                Err(Violation(code)) => {
                    self.close(id, code, "");
                    return Reading::Stop;
                }
            };
            if !c.phase.is_open() && !matches!(event, WsEvent::Close(_)) {
                continue;
            }
            match event {
                WsEvent::Close(code) => {
                    self.handle_peer_close(id, code, now_ms);
                    return Reading::Stop;
                }
                WsEvent::Text(text) => {
                    if c.window.admit(now_ms) {
                        self.handle_text(id, &text, now_ms);
                    } else {
                        self.close(id, close::POLICY, "too many messages");
                    }
                }
                WsEvent::Ping(_) | WsEvent::Pong if !c.control.admit(now_ms) => {
                    self.close(id, close::POLICY, "too many control frames");
                }
                WsEvent::Ping(payload) => self.deliver(id, pong_frame(&payload)),
                WsEvent::Pong => {}
            }
        }
    }

    /// A whole client text message.
    pub fn handle_text(&mut self, id: ConnId, text: &str, now_ms: u64) {
        self.handle_activity(id, now_ms);
        let Some(conn) = self.conn(id) else { return };
        if !conn.phase.is_open() {
            return;
        }
        let role = conn.role;
        let result = ClientOp::parse(text).and_then(|op| match op {
            ClientOp::Watch(course) => self.watch(id, &course, now_ms),
            ClientOp::Unwatch(course) => {
                self.unwatch(id, &course);
                Ok(())
            }
            ClientOp::Roster(course) if role == Role::Admin => {
                self.actions.push_back(Action::Roster {
                    conn: id,
                    course: course.into(),
                });
                Ok(())
            }
            ClientOp::Roster(_) => Err(OpError::Forbidden),
        });
        if let Err(e) = result {
            self.stats.client_errors += 1;
            // Bounded: a client that sends mistakes but never reads is a slow consumer.
            let reply = server_msg::error(e);
            if self.fits(id, reply.len()) {
                self.send_always(id, reply);
            } else if let Some(c) = self.conn_mut(id) {
                c.queue.refused(now_ms);
            }
        }
    }

    fn watch(&mut self, id: ConnId, course: &str, now_ms: u64) -> Result<(), OpError> {
        let conn = self.conn(id).ok_or(OpError::Forbidden)?;
        if conn.watch_pos(course).is_some() {
            // Watching again re-answers with the whole board, nothing else.
            let c = self.courses.get(course).filter(|c| c.seeded);
            if let Some(c) = c {
                let name = Arc::clone(&c.name);
                self.answer_watch(id, &name, now_ms);
            }
            return Ok(());
        }
        if conn.watched.len() >= MAX_COURSES_PER_CONN {
            return Err(OpError::TooManyCourses);
        }
        let user = Arc::clone(&conn.user);
        let name: Arc<str> = match self.courses.get_key_value(course) {
            Some((k, _)) => Arc::clone(k),
            None => {
                let name: Arc<str> = course.into();
                self.courses
                    .insert(Arc::clone(&name), Course::new(Arc::clone(&name)));
                self.actions.push_back(Action::Interest {
                    course: Arc::clone(&name),
                    watching: true,
                });
                name
            }
        };
        let Some(c) = self.courses.get_mut(&name) else {
            return Ok(());
        };
        let pos = c.viewers.len() as u32;
        c.viewers.push(Viewer {
            conn: id,
            owes_full: false,
        });
        let n = c.users.entry(Arc::clone(&user)).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.actions.push_back(Action::PresenceJoin {
                course: Arc::clone(&name),
                user,
            });
        }
        let seeded = c.seeded;
        if !seeded {
            c.awaiting_seed.push(id);
        }
        if let Some(conn) = self.conn_mut(id) {
            conn.watched.push((Arc::clone(&name), pos));
        }
        if seeded {
            self.answer_watch(id, &name, now_ms);
        }
        Ok(())
    }

    /// The answer to a watch: the whole board and the viewer count.
    fn answer_watch(&mut self, id: ConnId, course: &str, now_ms: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        let plain = c.full_frame();
        let (deflate, sse) = self.conns[id.idx as usize]
            .as_ref()
            .map_or((false, false), |conn| (conn.deflate, conn.sse));
        let frame = if sse {
            c.full_frame_sse()
        } else if deflate {
            c.full_frame_deflated(&mut self.deflater)
        } else {
            plain.clone()
        };
        let viewers = c.presence.unwrap_or(0).max(c.users.len() as u64);
        let presence = server_msg::presence(course, viewers);
        // The answer replaces what came before; if the queue has no room for it
        // (a client that asks but never reads), a full frame is owed instead, so
        // what a client sends itself never grows its queue past the bound.
        self.clear_owed(id, course);
        if self.fits(id, frame.len()) {
            self.send_always_as(id, &plain, &frame, Some(&frame));
            self.send_always_bounded(id, presence);
        } else {
            self.mark_owed(id, course, now_ms);
        }
    }

    /// Whether `len` more bytes may be queued to `id` (an empty queue takes anything).
    fn fits(&self, id: ConnId, len: usize) -> bool {
        self.conn(id).is_some_and(|c| c.queue.fits(len))
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

    /// A frame for `id` did not fit: it is owed a full frame of `course` at the
    /// next render, and its queue counts as full from `now_ms`.
    fn mark_owed(&mut self, id: ConnId, course: &str, now_ms: u64) {
        let Some(conn) = self.conn_mut(id) else {
            return;
        };
        conn.queue.refused(now_ms);
        let Some(pos) = conn.watch_pos(course) else {
            return;
        };
        let vpos = conn.watched[pos].1 as usize;
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if let Some(v) = c.viewers.get_mut(vpos) {
            if !v.owes_full {
                v.owes_full = true;
                c.owed += 1;
            }
        }
        let name = Arc::clone(&c.name);
        self.schedule(&name);
    }

    fn clear_owed(&mut self, id: ConnId, course: &str) {
        let Some(pos) = self.conn(id).and_then(|c| c.watch_pos(course)) else {
            return;
        };
        let vpos = self.conn(id).map(|c| c.watched[pos].1 as usize);
        if let (Some(vpos), Some(c)) = (vpos, self.courses.get_mut(course)) {
            if let Some(v) = c.viewers.get_mut(vpos) {
                if v.owes_full {
                    v.owes_full = false;
                    c.owed -= 1;
                }
            }
        }
    }

    fn unwatch(&mut self, id: ConnId, course: &str) {
        let Some(conn) = self.conn_mut(id) else {
            return;
        };
        let Some(wpos) = conn.watch_pos(course) else {
            return;
        };
        let (name, vpos) = conn.watched.swap_remove(wpos);
        let user = Arc::clone(&conn.user);
        let Some(c) = self.courses.get_mut(&name) else {
            return;
        };
        let vpos = vpos as usize;
        let removed = c.viewers.swap_remove(vpos);
        if removed.owes_full {
            c.owed -= 1;
        }
        c.awaiting_seed.retain(|w| *w != id);
        // The viewer moved into `vpos` must learn its new index.
        let moved = c.viewers.get(vpos).map(|v| v.conn);
        if let Some(n) = c.users.get_mut(&user) {
            *n -= 1;
            if *n == 0 {
                c.users.remove(&user);
                self.actions.push_back(Action::PresenceLeave {
                    course: Arc::clone(&name),
                    user,
                });
            }
        }
        let empty = c.viewers.is_empty();
        if let Some(m) = moved {
            if let Some(mc) = self.conn_mut(m) {
                if let Some(w) = mc.watched.iter_mut().find(|(c, _)| *c == name) {
                    w.1 = vpos as u32;
                }
            }
        }
        if empty {
            if let Some(c) = self.courses.remove(&name) {
                if c.scheduled {
                    // Rare (the last viewer left): keeps one entry per scheduled course.
                    self.scheduled.retain(|Reverse((_, s))| *s != name);
                }
            }
            self.actions.push_back(Action::Interest {
                course: name,
                watching: false,
            });
        }
    }

    /// The peer sent a close frame: echo it and end the connection.
    pub fn handle_peer_close(&mut self, id: ConnId, code: Option<u16>, now_ms: u64) {
        self.handle_activity(id, now_ms);
        self.close(id, code.unwrap_or(close::NORMAL), "");
    }

    /// Closes a connection with `code` (a protocol violation found by the shell,
    /// a drain, a shutdown): unwatches everything and queues the close frame.
    pub fn close(&mut self, id: ConnId, code: u16, reason: &str) {
        let Some(conn) = self.conn(id) else { return };
        if !conn.phase.is_open() {
            return;
        }
        let courses: Vec<Arc<str>> = conn.watched.iter().map(|(c, _)| Arc::clone(c)).collect();
        for c in courses {
            self.unwatch(id, &c);
        }
        self.send_always(id, close_frame(code, reason));
        let cut_at = self.now_ms + CLOSE_GRACE_MS;
        if let Some(c) = self.conn_mut(id) {
            c.phase.start_close(code, cut_at);
        }
        // A stream with nothing queued (an SSE stream has no close frame)
        // still needs the write side to see it closing and end it.
        self.mark_ready(id);
        self.actions.push_back(Action::Close { conn: id, code });
        self.cuts.push_back((cut_at, id));
        self.arm_cut();
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
            self.live_sse -= usize::from(conn.sse);
            if self.live == 0 {
                self.timers.stop(Timer::Sweep);
            }
            if conn.admin_feed && self.admin_feed_closed(id) {
                self.actions
                    .push_back(Action::AdminFeed { connected: false });
            }
        }
    }

    /// Puts a course that has something to render into the schedule, and
    /// keeps its gate in step either way.
    fn schedule(&mut self, course: &Arc<str>) {
        if let Some(c) = self.courses.get_mut(course) {
            let due = c.due_ms(self.cfg.tick_ms);
            // An unseeded course renders nothing until its seed answers the watchers.
            if !c.scheduled && c.seeded && c.wants_render() {
                c.scheduled = true;
                self.scheduled.push(Reverse((due, Arc::clone(course))));
            }
            c.gate.set(if c.scheduled { Gate::ARMED } else { due });
        }
    }

    /// The gate of a course watched here: shared with the ingest thread, so
    /// that a snapshot wakes this shard only when its frame is due before the
    /// shard's own timer.
    pub fn gate(&self, course: &str) -> Option<Gate> {
        self.courses.get(course).map(|c| c.gate.clone())
    }

    /// A snapshot routed here by the ingest thread.
    pub fn handle_snapshot(&mut self, snap: &Arc<Snapshot>) {
        let Some(c) = self.courses.get_mut(&*snap.course) else {
            return;
        };
        if c.apply(snap) {
            self.stats.snapshots_applied += 1;
            let name = Arc::clone(&c.name);
            self.schedule(&name);
        }
    }

    /// The current board of a course, answering this shard's interest in it.
    pub fn handle_seed(&mut self, course: &str, sections: &[Arc<Snapshot>], now_ms: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        for s in sections {
            c.apply_seed(s);
        }
        if !c.seeded {
            // Every viewer of an unseeded course is waiting for this seed and gets
            // the whole board in its answer: nothing is left to send as a delta.
            c.dirty.clear();
        }
        // Watchers waiting for the seed get everything in their answer.
        c.seeded = true;
        let waiting = std::mem::take(&mut c.awaiting_seed);
        let name = Arc::clone(&c.name);
        for id in waiting {
            self.answer_watch(id, &name, now_ms);
        }
        self.schedule(&name);
    }

    /// The global viewer count of a course from the presence layer.
    pub fn handle_presence(&mut self, course: &str, viewers: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if c.presence == Some(viewers) {
            return;
        }
        c.presence = Some(viewers);
        let msg = server_msg::presence(course, viewers);
        c.presence_msg = Some(msg.clone());
        c.presence_sse = None;
        let targets: Vec<ConnId> = c.viewers.iter().map(|v| v.conn).collect();
        // Wrapped once, for the first SSE viewer, and shared by the rest.
        let mut as_sse: Option<Bytes> = None;
        for id in targets {
            if self.conn(id).is_some_and(|c| c.sse) && as_sse.is_none() {
                as_sse = sse::event(&msg);
            }
            self.send_bounded_as(id, &msg, &msg, as_sse.as_ref());
        }
        if let Some(c) = self.courses.get_mut(course) {
            c.presence_sse = as_sse;
        }
    }

    /// Small informational messages: dropped when the queue is full (the next
    /// count supersedes them), never counted as a missed frame.
    fn send_always_bounded(&mut self, id: ConnId, msg: Bytes) {
        self.send_bounded_as(id, &msg, &msg, None);
    }

    /// [`Shard::send_always_bounded`] with a compressed twin for deflate
    /// connections and an event twin for SSE streams.
    fn send_bounded_as(
        &mut self,
        id: ConnId,
        plain: &Bytes,
        deflated: &Bytes,
        sse: Option<&Bytes>,
    ) {
        if let Some(c) = self.conn(id) {
            let len = match (c.sse, sse) {
                (true, Some(e)) => e.len(),
                // An event is its JSON plus at most 32 bytes of field names.
                (true, None) => plain.len() + 32,
                (false, _) if c.deflate => deflated.len(),
                (false, _) => plain.len(),
            };
            if c.queue.within_bound(len) {
                self.send_always_as(id, plain, deflated, sse);
            }
        }
    }

    /// Delivers a reply built outside (a roster, a pong) to one connection.
    pub fn deliver(&mut self, id: ConnId, frame: Bytes) {
        let deflated = match self.conn(id) {
            Some(c) if c.deflate => deflated_frame(&mut self.deflater, &frame),
            _ => frame.clone(),
        };
        self.send_bounded_as(id, &frame, &deflated, None);
    }

    /// Starts a drain: every connection gets its reconnect hint and close 1012 at
    /// its own moment, uniformly spread over `window_ms`.
    pub fn start_drain(&mut self, now_ms: u64, window_ms: u64) {
        if self.draining {
            return;
        }
        self.draining = true;
        let ids: Vec<ConnId> = self.live_ids().collect();
        for id in ids {
            let at = now_ms
                + if window_ms == 0 {
                    0
                } else {
                    self.rand() % window_ms
                };
            self.drain_schedule.push((at, id));
        }
        self.drain_schedule.sort_unstable_by(|a, b| b.cmp(a));
        self.arm_drain();
    }

    /// Runs the drain timer until the next drain moment (or stops it).
    fn arm_drain(&mut self) {
        let next = self.drain_schedule.last().map(|d| d.0);
        self.timers.set_or_stop(Timer::Drain, next);
    }

    /// Runs the cut timer until the next close grace ends (or stops it).
    fn arm_cut(&mut self) {
        let next = self.cuts.front().map(|c| c.0);
        self.timers.set_or_stop(Timer::Cut, next);
    }

    fn drain_due(&mut self, now_ms: u64) {
        while let Some(&(at, id)) = self.drain_schedule.last() {
            if at > now_ms {
                break;
            }
            self.drain_schedule.pop();
            if self.conn(id).is_some_and(|c| c.phase.is_open()) {
                let after = self.rand() % 5001;
                let hint = server_msg::reconnect(after);
                let as_sse = sse::reconnect(after, &hint);
                self.send_always_as(id, &hint, &hint, as_sse.as_ref());
                self.close(id, close::RESTART, "draining");
            }
        }
        self.arm_drain();
    }

    /// Second signal: closes every connection at once.
    pub fn close_all(&mut self, code: u16) {
        let ids: Vec<ConnId> = self.live_ids().collect();
        for id in ids {
            self.close(id, code, "");
        }
    }

    fn live_ids(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.conns.iter().enumerate().filter_map(|(i, c)| {
            c.as_ref().map(|c| ConnId {
                idx: i as u32,
                gen: c.gen,
            })
        })
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
        self.drain_due(now_ms);
        while let Some(&(at, id)) = self.cuts.front() {
            if at > now_ms {
                break;
            }
            self.cuts.pop_front();
            if self
                .conn_mut(id)
                .is_some_and(|c| c.phase.cut_if_due(now_ms))
            {
                self.actions.push_back(Action::Cut { conn: id });
            }
        }
        self.arm_cut();
        if self.timers.is_expired(Timer::Sweep, now_ms) {
            self.timers.set(Timer::Sweep, now_ms + SWEEP_MS);
            self.sweep(now_ms);
        }
    }

    fn render(&mut self, name: &Arc<str>, now_ms: u64) {
        let Some(c) = self.courses.get_mut(name) else {
            return;
        };
        if !c.seeded || !c.wants_render() {
            return;
        }
        let delta = (!c.dirty.is_empty()).then(|| c.delta_frame());
        // Encoded only for viewers owed one (or cached for the next watch).
        let full = (c.owed > 0).then(|| c.full_frame());
        c.dirty.clear();
        c.pacer.spend(self.cfg.tick_ms, now_ms);
        self.stats.frames_rendered += 1;
        let presence = c.presence_msg.clone();
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
                (_, Some(full), true) if conn.sse => (full, c.full_frame_sse()),
                (_, Some(full), true) if conn.deflate => {
                    (full, c.full_frame_deflated(&mut self.deflater))
                }
                (_, Some(full), true) => (full, full.clone()),
                (_, None, true) => continue,
                (Some(d), _, false) if conn.sse => (
                    d,
                    delta_sse
                        .get_or_insert_with(|| sse::event(d).unwrap_or_default())
                        .clone(),
                ),
                (Some(d), _, false) if conn.deflate => (
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
                        // A healed viewer may have missed a count too.
                        let presence = if conn.sse {
                            c.presence_sse()
                        } else {
                            presence.clone()
                        };
                        if let Some(p) = presence
                            .as_ref()
                            .filter(|p| conn.queue.within_bound(p.len()))
                        {
                            conn.queue.push_always(p.clone());
                            self.stats.frames_queued += 1;
                            self.stats.bytes_queued += p.len() as u64;
                            self.stats.payload_bytes +=
                                c.presence_msg.as_deref().map_or(0, payload_len);
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
            } else if !c.sse && now_ms >= c.last_rx_ms + cfg.idle_ms {
                self.stats.idle_closes += 1;
                self.close(id, close::NORMAL, "idle");
            } else if now_ms >= c.last_ping_ms + if c.sse { SSE_KEEPALIVE_MS } else { cfg.ping_ms }
            {
                if let Some(c) = self.conn_mut(id) {
                    c.last_ping_ms = now_ms;
                }
                let ping = ping_frame(b"");
                let keepalive = Bytes::from_static(sse::KEEPALIVE);
                self.send_bounded_as(id, &ping, &ping, Some(&keepalive));
            }
        }
    }

    /// When the shell must next call [`Shard::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<u64> {
        let render = self.scheduled.peek().map(|Reverse((due, _))| *due);
        [render, self.timers.next_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next thing the shell must do outside the shard.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// A connection that has frames to write.
    pub fn poll_ready(&mut self) -> Option<ConnId> {
        let id = self.ready.pop_front()?;
        if let Some(c) = self.conn_mut(id) {
            c.in_ready = false;
        }
        Some(id)
    }

    /// The next frame to write to `id`, alone (what [`Shard::poll_write`]
    /// joins; tests and benches read frames one by one with it).
    pub fn poll_transmit(&mut self, id: ConnId) -> Option<Bytes> {
        self.conn_mut(id)?.queue.pop()
    }

    /// The next bytes to write to `id` in one send: its queued frames joined
    /// up to [`JOIN_MAX`] bytes (a larger frame goes alone), so frames queued
    /// in one round share a system call and a segment.
    pub fn poll_write(&mut self, id: ConnId) -> Option<Bytes> {
        self.conn_mut(id)?.queue.pop_joined(JOIN_MAX)
    }

    /// Where connection `id` is in its life (`None`: unknown or gone).
    pub fn phase(&self, id: ConnId) -> Option<Phase> {
        self.conn(id).map(|c| c.phase)
    }

    /// Bytes queued to `id` (for tests and the slow-consumer bench).
    pub fn queued_bytes(&self, id: ConnId) -> usize {
        self.conn(id).map_or(0, |c| c.queue.bytes())
    }

    /// The user a connection belongs to.
    pub fn user(&self, id: ConnId) -> Option<&str> {
        self.conn(id).map(|c| &*c.user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(section: u32, taken: u32, version: Option<u64>) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(
            "C".into(),
            section,
            50,
            taken,
            None,
            version,
            None,
        ))
    }

    #[test]
    fn snapshot_before_seed_neither_hangs_nor_loses_to_the_older_seed() {
        let mut shard = Shard::new(ShardConfig::default());
        let id = shard.connect("u", Role::Student, false, false, 0);
        shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
        // A live unversioned snapshot overtakes the seed (data drained first).
        shard.handle_snapshot(&snap(1, 9, None));
        shard.handle_timeout(0);
        assert_eq!(
            shard.poll_timeout(),
            Some(1_000),
            "nothing to render before the seed"
        );
        shard.handle_seed("C", &[snap(1, 3, None), snap(2, 4, None)], 0);
        shard.handle_timeout(0);
        let mut frames = Vec::new();
        while let Some(f) = shard.poll_transmit(id) {
            frames.push(String::from_utf8_lossy(&f).into_owned());
        }
        let answer = frames
            .iter()
            .find(|f| f.contains("\"full\":true"))
            .expect("watch answer");
        assert!(
            answer.contains(r#"{"section":1,"total_seats":50,"seats_taken":9}"#),
            "{answer}"
        );
        assert!(
            answer.contains(r#"{"section":2,"total_seats":50,"seats_taken":4}"#),
            "{answer}"
        );
    }

    #[test]
    fn a_watch_answer_and_its_count_are_one_write_and_a_big_frame_goes_alone() {
        let mut shard = Shard::new(ShardConfig::default());
        let id = shard.connect("u", Role::Student, false, false, 0);
        let hello = shard.poll_write(id).expect("hello");
        assert!(String::from_utf8_lossy(&hello).contains("\"type\":\"hello\""));
        shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
        shard.handle_seed("C", &[snap(1, 3, None)], 0);
        let write = shard.poll_write(id).expect("the watch answer");
        // Two whole frames, back to back: the full board, then the count.
        let count = server_msg::presence("C", 1);
        let (board, rest) = write.split_at(write.len() - count.len());
        assert_eq!(rest, &count[..]);
        let board = server_frame_payload(board).expect("one whole frame");
        assert!(String::from_utf8_lossy(board).contains("\"full\":true"));
        assert_eq!(shard.poll_write(id), None, "one write for both");
        // A frame past the join limit is handed over alone.
        let big: Vec<Arc<Snapshot>> = (1..=400).map(|s| snap(s, 1, None)).collect();
        shard.handle_seed("C", &big, 0);
        let other = shard.connect("v", Role::Student, false, false, 0);
        assert!(shard.poll_write(other).is_some(), "hello");
        shard.handle_text(other, r#"{"op":"watch","course":"C"}"#, 0);
        let board = shard.poll_write(other).expect("the big board");
        assert!(board.len() > JOIN_MAX, "{}", board.len());
        assert_eq!(
            shard.poll_write(other).expect("its count"),
            server_msg::presence("C", 2)
        );
    }

    #[test]
    fn a_healed_viewer_gets_the_count_it_missed() {
        let mut shard = Shard::new(ShardConfig {
            send_queue_bytes: 200,
            ..ShardConfig::default()
        });
        let id = shard.connect("u", Role::Student, false, false, 0);
        shard.handle_text(id, r#"{"op":"watch","course":"C"}"#, 0);
        shard.handle_seed("C", &[snap(1, 1, Some(1))], 0);
        // Stuck: the queue fills with frames, the next count does not fit.
        for v in 2..10u64 {
            shard.handle_snapshot(&snap(1, v as u32, Some(v)));
            shard.handle_timeout(v * 200);
        }
        shard.handle_presence("C", 7);
        let mut before = Vec::new();
        while let Some(f) = shard.poll_transmit(id) {
            before.push(String::from_utf8_lossy(&f).into_owned());
        }
        assert!(
            !before.iter().any(|f| f.contains("\"viewers\":7")),
            "the count was dropped"
        );
        shard.handle_timeout(10_000);
        let mut after = Vec::new();
        while let Some(f) = shard.poll_transmit(id) {
            after.push(String::from_utf8_lossy(&f).into_owned());
        }
        assert!(
            after.iter().any(|f| f.contains("\"full\":true")),
            "{after:?}"
        );
        assert!(
            after.iter().any(|f| f.contains("\"viewers\":7")),
            "{after:?}"
        );
    }
}

#[cfg(test)]
mod sse_tests {
    use super::*;

    fn snap(section: u32, taken: u32, version: u64) -> Arc<Snapshot> {
        Arc::new(Snapshot::build(
            "C".into(),
            section,
            50,
            taken,
            None,
            Some(version),
            None,
        ))
    }

    fn drain(shard: &mut Shard, id: ConnId) -> Vec<Bytes> {
        std::iter::from_fn(|| shard.poll_transmit(id)).collect()
    }

    #[test]
    fn sse_viewers_share_one_event_per_render_with_the_websocket_json() {
        let mut shard = Shard::new(ShardConfig::default());
        let ws = shard.connect("w", Role::Student, false, false, 0);
        shard.handle_text(ws, r#"{"op":"watch","course":"C"}"#, 0);
        let a = shard.connect_sse("a", Role::Student, &["C".into()], 0);
        let b = shard.connect_sse("b", Role::Student, &["C".into()], 0);
        assert_eq!(shard.sse_connections(), 2);
        shard.handle_seed("C", &[snap(1, 1, 1)], 0);
        let first = drain(&mut shard, a);
        assert!(first[0].starts_with(b"event: hello\ndata: {\"type\":\"hello\""));
        assert!(first[1].starts_with(
            b"event: frame\ndata: {\"type\":\"frame\",\"course\":\"C\",\"full\":true"
        ));
        assert!(first[2].starts_with(b"event: presence\ndata: "));
        drain(&mut shard, b);
        drain(&mut shard, ws);
        shard.handle_snapshot(&snap(1, 2, 2));
        shard.handle_timeout(1_000);
        let (ea, eb, w) = (
            drain(&mut shard, a),
            drain(&mut shard, b),
            drain(&mut shard, ws),
        );
        assert_eq!(ea.len(), 1);
        assert_eq!(
            ea[0].as_ptr(),
            eb[0].as_ptr(),
            "one event shared by both streams"
        );
        let json = server_frame_payload(&w[0]).expect("ws frame");
        let mut want = b"event: frame\ndata: ".to_vec();
        want.extend_from_slice(json);
        want.extend_from_slice(b"\n\n");
        assert_eq!(&ea[0][..], &want[..]);
    }

    #[test]
    fn a_stream_that_missed_a_frame_heals_with_a_full_one_and_gets_comments_not_pings() {
        let mut shard = Shard::new(ShardConfig {
            send_queue_bytes: 300,
            ..ShardConfig::default()
        });
        let id = shard.connect_sse("a", Role::Student, &["C".into()], 0);
        shard.handle_seed("C", &[snap(1, 1, 1)], 0);
        for v in 2..10u64 {
            shard.handle_snapshot(&snap(1, v as u32, v));
            shard.handle_timeout(v * 200);
        }
        assert!(shard.stats().frames_dropped > 0, "the queue filled");
        drain(&mut shard, id);
        shard.handle_timeout(5_000);
        let healed = drain(&mut shard, id);
        assert!(
            healed.iter().any(|e| e.starts_with(
                b"event: frame\ndata: {\"type\":\"frame\",\"course\":\"C\",\"full\":true"
            )),
            "{healed:?}"
        );
        // Long past the ping and idle times: comments, never a close for silence.
        let mut comments = 0;
        for t in (6..200).map(|s| s * 1_000) {
            shard.handle_timeout(t);
            for e in drain(&mut shard, id) {
                assert_eq!(
                    &e[..],
                    sse::KEEPALIVE,
                    "only comments while nothing changes"
                );
                comments += 1;
            }
        }
        assert!(comments >= 194 / 15, "a comment every 15 s: {comments}");
        assert_eq!(shard.phase(id), Some(Phase::Open));
        assert_eq!(shard.stats().idle_closes, 0);
    }

    #[test]
    fn a_drained_stream_gets_retry_and_reconnect_then_ends_without_a_close_frame() {
        let mut shard = Shard::new(ShardConfig::default());
        let id = shard.connect_sse("a", Role::Student, &["C".into()], 0);
        drain(&mut shard, id);
        shard.start_drain(0, 0);
        shard.handle_timeout(0);
        let out = drain(&mut shard, id);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].starts_with(b"retry: "), "{out:?}");
        assert!(out[0].ends_with(b"}\n\n"));
        assert!(matches!(
            shard.phase(id),
            Some(Phase::Closing { code: 1012, .. })
        ));
        shard.disconnect(id);
        assert_eq!(shard.sse_connections(), 0);
    }
}
