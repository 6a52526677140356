//! The shell of one shard thread: the sans-IO [`shards::Shard`] plus the sockets,
//! timers and channels around it. One file per runtime holds only its loops
//! (`monoio_shell.rs`: io_uring or epoll; `tokio_shell.rs` with the
//! `tokio-shell` feature), around the runtime-free steps they share
//! (`steps.rs`); nothing is shared with other shards but the node's atomics.

mod csp;
mod handshake;
mod http;
pub mod monoio_shell;
pub mod notify;
mod pages;
mod response;
mod steps;
#[cfg(feature = "tokio-shell")]
pub mod tokio_shell;

/// How a shard thread reports that it serves (its driver's name) or why not.
pub type Ready = crossbeam_channel::Sender<Result<&'static str, String>>;

use crate::channels::wake::IngestTx;
use crate::channels::{Inbox, IngestCmd, PresenceCmd};
use crate::metrics::ShardMetrics;
use crate::node::Node;
use crossbeam_channel::Sender;
use foldhash::HashMap;
use notify::LocalNotify;
use shards::rate::TokenBucket;
use shards::{Action, ConnId, Shard};
use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The shell's half of one WebSocket connection, shared by its reader and writer.
pub struct ConnIo {
    /// Wakes the writer when frames are queued or the connection ends.
    pub writer: LocalNotify,
    /// Set when the shard queued a close frame.
    pub close_code: Cell<Option<u16>>,
    /// Set when the reader stopped.
    pub reader_done: Cell<bool>,
    /// Set just before the socket is released, so no one touches a reused fd.
    pub finished: Cell<bool>,
    /// The socket, for a forced shutdown.
    pub fd: RawFd,
}

impl ConnIo {
    /// The shell's half of a just-upgraded connection on socket `fd`.
    pub fn new(fd: RawFd) -> Self {
        ConnIo {
            writer: Default::default(),
            close_code: Default::default(),
            reader_done: Default::default(),
            finished: Default::default(),
            fd,
        }
    }

    /// Cuts the socket (the shard's close grace is over), unless it is already released.
    pub fn cut(&self) {
        if !self.finished.get() {
            // SAFETY: `finished` is false, so the socket behind `fd` is still
            // owned by this connection; shutdown does not close the descriptor.
            unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        }
    }
}

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
    /// Live connections, looked up for every frame queued (foldhash: the
    /// shard makes the ids).
    pub conns: RefCell<HashMap<ConnId, Rc<ConnIo>>>,
    /// Wakes the tick loop to recompute its deadline.
    pub kick: LocalNotify,
    /// This shard's share of the node's accept rate.
    pub bucket: RefCell<TokenBucket>,
}

impl ShardCtx {
    /// This shard's metrics.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.node.metrics.shards[self.index]
    }

    /// Carries out what the shard asked for and wakes writers with frames queued.
    pub fn flush(self: &Rc<Self>) {
        let mut shard = self.shard.borrow_mut();
        while let Some(action) = shard.poll_action() {
            match action {
                Action::Interest { course, watching } => {
                    let _ = self.ingest.send(IngestCmd::Interest {
                        shard: self.index,
                        course,
                        watching,
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
                Action::Close { conn, code } => {
                    self.node.metrics.close(code);
                    if let Some(io) = self.conns.borrow().get(&conn) {
                        io.close_code.set(Some(code));
                        io.writer.notify();
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
        while let Some(id) = shard.poll_ready() {
            if let Some(io) = conns.get(&id) {
                io.writer.notify();
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
