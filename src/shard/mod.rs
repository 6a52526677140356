//! The shell of one shard thread: the sans-IO [`shards::Shard`] plus the sockets,
//! timers and channels around it. One file per runtime holds only its loops
//! (`monoio_shell.rs`: io_uring or epoll; `tokio_shell.rs` with the
//! `tokio-shell` feature), around the runtime-free steps they share
//! (`steps.rs`); nothing is shared with other shards but the node's atomics.

pub mod allocator;
mod csp;
mod handshake;
mod http;
pub mod monoio_shell;
pub mod notify;
mod pages;
mod response;
pub mod send_ring;
mod steps;
#[cfg(feature = "tokio-shell")]
pub mod tokio_shell;

/// How a shard thread reports that it serves (its driver's name) or why not.
pub type Ready = crossbeam_channel::Sender<Result<&'static str, String>>;

use crate::channels::wake::IngestTx;
use crate::channels::{Inbox, IngestCmd, PresenceCmd};
use crate::metrics::ShardMetrics;
use crate::node::Node;
use bytes::Bytes;
use crossbeam_channel::Sender;
use notify::LocalNotify;
use send_ring::SendRing;
use shards::rate::TokenBucket;
use shards::{Action, ConnId, Shard};
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::Waker;

/// Who writes a connection's socket now. Only one writer at a time: the
/// shard's flush step writes at once while the socket takes whole frames, a
/// writer task takes over only when it does not (and hands back when the
/// queue is empty), so an idle connection holds no writer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSide {
    /// Nothing in flight: the flush step writes queued frames with `send(2)`.
    Direct,
    /// A writer task waits for the socket to take the rest.
    Task,
    /// The close frame went out (and the write side was shut down), or a
    /// write failed: nothing more is written.
    Done,
}

/// A connection's socket as its shell holds it, so the runtime-free flush
/// step can start that runtime's writer task when the socket is full.
pub trait Socket {
    /// Spawns a writer task that writes `rest` (what the socket did not take
    /// at once), then the connection's queue, and ends when the queue is empty.
    fn spawn_writer(self: Rc<Self>, ctx: Rc<ShardCtx>, io: Rc<ConnIo>, id: ConnId, rest: Bytes);
}

/// The shell's half of one WebSocket connection, shared by its reader task,
/// the flush step and (while the socket is full) its writer task.
pub struct ConnIo {
    /// Who writes the socket now.
    pub write_side: Cell<WriteSide>,
    /// The shard queued the close frame: once the queue is empty, the write
    /// side is shut down (FIN after the close frame, RFC 6455 section 7.1.1).
    pub closing: Cell<bool>,
    /// The reader task, waiting (after its last read) for the writer task to end.
    pub reader_waiting: Cell<Option<Waker>>,
    /// Set just before the socket is released, so no one touches a reused fd.
    pub finished: Cell<bool>,
    /// The socket is registered with the shard's send ring (in the slot of
    /// its connection's index), and must be released from it at the end.
    pub registered: Cell<bool>,
    /// The socket, for writes from the flush step and a forced shutdown.
    pub fd: RawFd,
    /// The socket as the shell holds it, to start a writer task.
    pub socket: Rc<dyn Socket>,
    /// The connection's place in the node's and its user's caps, given back
    /// when the connection is gone.
    _slot: handshake::Slot,
}

impl ConnIo {
    /// The shell's half of a just-upgraded connection on socket `fd`.
    pub fn new(fd: RawFd, socket: Rc<dyn Socket>, slot: handshake::Slot) -> Self {
        ConnIo {
            write_side: Cell::new(WriteSide::Direct),
            closing: Default::default(),
            reader_waiting: Default::default(),
            finished: Default::default(),
            registered: Default::default(),
            fd,
            socket,
            _slot: slot,
        }
    }

    /// Called when the queue was written out: after the close frame, shuts the
    /// write side down and writes nothing more.
    pub fn after_queue_empty(&self) {
        if self.closing.get() && !self.finished.get() {
            self.write_side.set(WriteSide::Done);
            // SAFETY: `finished` is false, so the socket behind `fd` is still
            // owned by this connection; shutdown does not close the descriptor.
            unsafe { libc::shutdown(self.fd, libc::SHUT_WR) };
        }
    }

    /// Cuts the socket (the shard's close grace is over), unless it is already
    /// released. If the kernel still holds bytes the peer has not taken (a
    /// slow consumer), the close that follows resets the connection: a FIN
    /// would queue behind them, and the orphaned socket would keep up to its
    /// send buffer for minutes while the peer advertises no window.
    pub fn cut(&self) {
        if self.finished.get() {
            return;
        }
        let mut unsent: libc::c_int = 0;
        // SAFETY: `finished` is false, so the socket behind `fd` is still owned
        // by this connection; TIOCOUTQ writes one c_int to a live local.
        let queued = unsafe { libc::ioctl(self.fd, libc::TIOCOUTQ, &mut unsent) } == 0;
        if queued && unsent > 0 {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: as above; the option value points to a live `linger` of the length passed.
            unsafe {
                libc::setsockopt(
                    self.fd,
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
        }
        // SAFETY: as above; shutdown does not close the descriptor.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }
}

/// The shell's half of every live connection, by the slot number the core
/// gave it (dense: the core reuses the slots of closed connections), so a
/// lookup is an index and an entry costs 16 bytes.
#[derive(Default)]
pub struct ConnTable(Vec<Option<(ConnId, Rc<ConnIo>)>>);

impl ConnTable {
    /// The connection `id`, if it is live.
    pub fn get(&self, id: &ConnId) -> Option<&Rc<ConnIo>> {
        match self.0.get(id.index() as usize) {
            Some(Some((live, io))) if live == id => Some(io),
            _ => None,
        }
    }

    /// Adds a just-registered connection.
    pub fn insert(&mut self, id: ConnId, io: Rc<ConnIo>) {
        let i = id.index() as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some((id, io));
    }

    /// Forgets a connection (a stale id is ignored).
    pub fn remove(&mut self, id: &ConnId) {
        if let Some(slot) = self.0.get_mut(id.index() as usize) {
            if slot.as_ref().is_some_and(|(live, _)| live == id) {
                *slot = None;
            }
        }
    }
}

/// A shard's batched sends, each tagged with its connection.
pub type ShardSends = SendRing<(ConnId, Rc<ConnIo>)>;

/// Everything one shard thread's tasks share.
pub struct ShardCtx {
    /// Shard number.
    pub index: usize,
    /// Node-wide state.
    pub node: Arc<Node>,
    /// The renderer.
    pub shard: RefCell<Shard>,
    /// Messages from ingest and presence.
    pub inbox: Arc<Inbox>,
    /// To the ingest thread.
    pub ingest: IngestTx,
    /// To the presence worker.
    pub presence: Sender<PresenceCmd>,
    /// Live connections, looked up for every frame queued.
    pub conns: RefCell<ConnTable>,
    /// Wakes the tick loop to recompute its deadline.
    pub kick: LocalNotify,
    /// When the shard next returns freed memory to the OS (ms).
    pub next_purge_ms: Cell<u64>,
    /// Frames rendered as of the last return of freed memory.
    pub rendered_at_purge: Cell<u64>,
    /// This shard's share of the node's accept rate.
    pub bucket: RefCell<TokenBucket>,
    /// The flush step's batched sends, on a shard that runs on io_uring
    /// (`None`: one `send(2)` per frame, as on epoll and tokio).
    pub send_ring: RefCell<Option<ShardSends>>,
}

impl ShardCtx {
    /// This shard's metrics.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.node.metrics.shards[self.index]
    }

    /// Carries out what the shard asked for and writes the frames it queued.
    pub fn flush(self: &Rc<Self>) {
        let mut shard = self.shard.borrow_mut();
        while let Some(action) = shard.poll_action() {
            match action {
                Action::Interest { course, watching } => {
                    let gate = watching.then(|| shard.gate(&course)).flatten();
                    let _ = self.ingest.send(IngestCmd::Interest {
                        shard: self.index,
                        course,
                        watching,
                        gate,
                    });
                }
                Action::PresenceJoin { course, user } => {
                    let _ = self.presence.send(PresenceCmd::Join { course, user });
                }
                Action::PresenceLeave { course, user } => {
                    let _ = self.presence.send(PresenceCmd::Leave { course, user });
                }
                Action::Roster { conn, course } => {
                    let _ = self.presence.send(PresenceCmd::Roster {
                        shard: self.index,
                        conn,
                        course,
                    });
                }
                Action::AdminFeed { connected } => {
                    let _ = self.ingest.send(IngestCmd::AdminFeed {
                        shard: self.index,
                        connected,
                    });
                }
                // The close frame is queued behind the data; it goes out below.
                Action::Close { conn, code } => {
                    self.node.metrics.close(code);
                    if let Some(io) = self.conns.borrow().get(&conn) {
                        io.closing.set(true);
                    }
                }
                Action::Cut { conn } => {
                    if let Some(io) = self.conns.borrow().get(&conn) {
                        io.cut();
                    }
                }
            }
        }
        let conns = self.conns.borrow();
        match self.send_ring.borrow_mut().as_mut() {
            Some(ring) => steps::write_batched(self, &mut shard, &conns, ring),
            None => {
                while let Some(id) = shard.poll_ready() {
                    if let Some(io) = conns.get(&id) {
                        steps::write_queued(self, &mut shard, io, id);
                    }
                }
            }
        }
        drop(conns);
        drop(shard);
        self.kick.notify();
    }

    /// Copies the shard's counters into the node's metrics.
    pub fn publish_metrics(&self) {
        let shard = self.shard.borrow();
        let s = shard.stats();
        let m = self.metrics();
        m.connections.store(shard.connections() as u64, Relaxed);
        m.courses.store(shard.courses() as u64, Relaxed);
        m.frames_queued.store(s.frames_queued, Relaxed);
        m.frames_dropped.store(s.frames_dropped, Relaxed);
        m.resyncs.store(s.resyncs, Relaxed);
        m.frames_rendered.store(s.frames_rendered, Relaxed);
        m.ws_payload_bytes.store(s.payload_bytes, Relaxed);
        m.slow_consumer_closes
            .store(s.slow_consumer_closes, Relaxed);
        m.idle_closes.store(s.idle_closes, Relaxed);
        m.client_errors.store(s.client_errors, Relaxed);
    }
}
