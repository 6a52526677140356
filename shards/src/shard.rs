//! The per-core renderer: a state machine fed connection events, snapshots,
//! presence counts and the current time, emitting frames and actions.
//!
//! It owns no socket and reads no clock. The shell calls the `handle_*` methods,
//! then drains [`Shard::poll_action`], [`Shard::poll_ready`] and
//! [`Shard::poll_transmit`], and sleeps until [`Shard::poll_timeout`].
//!
//! The type, its configuration, actions and counters are here; its methods
//! are in `shard/` by concern: `connect` (arrival, departure), `read` (client
//! bytes and operations), `watch` (viewer lists, watch answers, owed frames),
//! `ingest` (snapshots, seeds, counts), `render` (the pacer, renders, the
//! sweep), `send` (queueing a frame in a connection's form), `close` (close,
//! grace and cut, drain), `admin_feed` (the admin aggregates) and `poll`
//! (what the shell drains).

use crate::conn::{Conn, ConnId};
use crate::course::Course;
use crate::deflate::Deflater;
use crate::phase::Phase;
use crate::timer::TimerTable;
use foldhash::{HashMap, HashMapExt};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

mod admin_feed;
mod close;
mod connect;
mod ingest;
mod poll;
mod read;
mod render;
mod send;
#[cfg(test)]
mod sse_tests;
#[cfg(test)]
mod tests;
mod watch;

pub use admin_feed::{AdminMsg, ADMIN_QUEUE_BYTES};

/// The most bytes [`Shard::poll_transmit`] joins into one write: a few full
/// frames and counts, small enough that copying them costs less than the
/// send each would take.
pub const JOIN_MAX: usize = 16 * 1024;

/// The presence layer's global viewer counts, (course, count) sorted by
/// course, shared by every shard of the node.
pub type Counts = Arc<Vec<(Arc<str>, u64)>>;

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
    /// How long the answers of a course seeded before any count of it wait
    /// for its first count (0: they go with the seed). A node's presence
    /// layer reads that count with the first viewers' write, a round trip
    /// that races the seed's subscribe and read; past the wait the answers
    /// show this shard's own estimate.
    pub count_patience_ms: u64,
    /// How long the count of a watch answer that brought a user new to the
    /// shard waits for a count read after that user's join was written (0:
    /// it goes with the board, the shard's estimate). The board goes at
    /// once; past the wait the count is the shard's estimate.
    pub count_hold_ms: u64,
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
            count_patience_ms: 0,
            count_hold_ms: 0,
        }
    }
}

/// Something the shell must do outside the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The shard's first viewer of a course arrived (`true`) or its last left.
    Interest { course: Arc<str>, watching: bool },
    /// A user's first connection on this shard started watching a course.
    /// It goes to the presence layer in batch [`Shard::presence_batch`]
    /// (as it is when the action is taken).
    PresenceJoin { course: Arc<str>, user: Arc<str> },
    /// A user's last connection on this shard stopped watching a course;
    /// batch as for [`Action::PresenceJoin`].
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
    /// permessage-deflate without context: the compressor of a render's frame.
    deflater: Deflater,
    /// The compressor of a course's whole board (see [`Deflater::quick`]).
    board_deflater: Deflater,
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
    /// Bumped by each event that can end a connection's wait for a seed (a
    /// seed, an unwatch, and so a disconnect): see [`Shard::wait_ends`].
    wait_ends: u64,
    /// The number of the presence batch the joins and leaves queued now go
    /// out in (see [`Shard::presence_batch`]).
    presence_batch: u64,
    /// The presence layer's last counts, sorted by course: a course new
    /// here starts from its count (see [`Shard::handle_counts`]).
    counts: Option<Counts>,
    /// Counts read with a presence write ([`Shard::handle_join_counts`])
    /// since the last whole list, newer than it, by course: kept for a
    /// course first watched here before the next presence tick.
    join_counts: HashMap<Arc<str>, u64>,
    /// Seeded courses whose answers wait for a first count, each with the
    /// moment it stops waiting, oldest first.
    count_waits: VecDeque<(u64, Arc<str>)>,
    /// Courses holding watch answers' counts, each with the moment its
    /// first held count stops waiting, earliest first.
    count_holds: VecDeque<(u64, Arc<str>)>,
}

/// The course at the front of a deadline queue (`count_waits`,
/// `count_holds`), taken off it if its moment is over by `now_ms`.
fn pop_due(queue: &mut VecDeque<(u64, Arc<str>)>, now_ms: u64) -> Option<Arc<str>> {
    if queue.front()?.0 > now_ms {
        return None;
    }
    queue.pop_front().map(|(_, course)| course)
}

/// Sweep interval for pings, silence and slow consumers.
const SWEEP_MS: u64 = 1_000;

/// How often an SSE stream gets its keepalive comment (contract: at least
/// every 30 s; half that keeps a proxy's 30 s idle timeout from ending it).
pub const SSE_KEEPALIVE_MS: u64 = 15_000;

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
            board_deflater: Deflater::quick(),
            timers: TimerTable::default(),
            draining: false,
            drain_schedule: Vec::new(),
            rng,
            stats: ShardStats::default(),
            cuts: VecDeque::new(),
            now_ms: 0,
            wait_ends: 0,
            presence_batch: 1,
            counts: None,
            join_counts: HashMap::new(),
            count_waits: VecDeque::new(),
            count_holds: VecDeque::new(),
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

    /// The next jitter value.
    fn rand(&mut self) -> u64 {
        // xorshift64*: deterministic for tests, good enough for jitter.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The live connection `id`, if its generation still matches.
    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.conns
            .get(id.idx as usize)?
            .as_ref()
            .filter(|c| c.gen == id.gen)
    }

    /// [`Shard::conn`], mutable.
    fn conn_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns
            .get_mut(id.idx as usize)?
            .as_mut()
            .filter(|c| c.gen == id.gen)
    }

    /// Every live connection's handle.
    fn live_ids(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.conns.iter().enumerate().filter_map(|(i, c)| {
            c.as_ref().map(|c| ConnId {
                idx: i as u32,
                gen: c.gen,
            })
        })
    }

    /// Where connection `id` is in its life (`None`: unknown or gone).
    pub fn phase(&self, id: ConnId) -> Option<Phase> {
        self.conn(id).map(|c| c.phase)
    }

    /// The shell's writer holds bytes for `id` that its socket did not take:
    /// its buffer is full from `now_ms` on (the slow-consumer clock runs,
    /// unless it already does), until [`Shard::socket_took`]. So a client
    /// that reads nothing is closed 4001 after 5 s however little its queue
    /// holds (a frame past the queue's bound goes out alone, and the socket
    /// may hold it).
    pub fn socket_stalled(&mut self, id: ConnId, now_ms: u64) {
        if let Some(c) = self.conn_mut(id) {
            c.queue.refused(now_ms);
        }
    }

    /// `id`'s socket took bytes from the shell's writer: the slow-consumer
    /// clock stops.
    pub fn socket_took(&mut self, id: ConnId) {
        if let Some(c) = self.conn_mut(id) {
            c.queue.took();
        }
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
