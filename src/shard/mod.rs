//! The shell of one shard thread: the sans-IO [`shards::Shard`] plus the sockets,
//! timers and channels around it. One set of loops (`front_door.rs`,
//! `reading.rs`, `writing.rs`, `tick.rs`) runs on any [`runtime::Runtime`]:
//! monoio on io_uring or epoll (`monoio_runtime.rs`), or tokio
//! (`tokio_runtime.rs`, feature `tokio-shell`); nothing is shared with other
//! shards but the node's atomics.

pub mod allocator;
mod csp;
mod front_door;
mod handshake;
mod http;
pub mod monoio_runtime;
pub mod notify;
mod pages;
mod reading;
mod response;
mod runtime;
pub mod send_ring;
mod sockopt;
mod sse;
mod tick;
#[cfg(feature = "tokio-shell")]
pub mod tokio_runtime;
mod writing;

/// How a shard thread reports that it serves (its driver's name) or why not.
pub type Ready = crossbeam_channel::Sender<Result<&'static str, String>>;

use crate::channels::wake::IngestTx;
use crate::channels::{Inbox, IngestCmd, PresenceCmd};
use crate::metrics::ShardMetrics;
use crate::node::Node;
use crossbeam_channel::Sender;
use notify::LocalNotify;
use runtime::Runtime;
use shards::rate::TokenBucket;
use shards::{Action, Shard};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use writing::{ConnTable, ShardSends};

/// The shard's life on a built runtime: reports that it serves (or why not),
/// then runs its clock and its accept loop.
async fn serve<R: Runtime>(
    ctx: Rc<ShardCtx>,
    listener: std::net::TcpListener,
    name: &'static str,
    ready: Ready,
) {
    let listener = match R::listener(listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("listener setup failed: {e}")));
            return;
        }
    };
    if ctx.index == 0 {
        tracing::info!("shards run on {name}");
    }
    let _ = ready.send(Ok(name));
    drop(ready);
    R::spawn(tick::tick_loop::<R>(Rc::clone(&ctx)));
    front_door::accept_loop::<R>(ctx, listener).await
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
    /// This round's joins and leaves, sent as one batch by the tick step.
    pub presence_round: RefCell<Vec<PresenceCmd>>,
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
                    crate::hub::failure::trip(&course);
                    let gate = watching.then(|| shard.gate(&course)).flatten();
                    let _ = self.ingest.send(IngestCmd::Interest {
                        shard: self.index,
                        course,
                        watching,
                        gate,
                    });
                }
                Action::PresenceJoin { course, user } => {
                    let cmd = PresenceCmd::Join { course, user };
                    self.presence_round.borrow_mut().push(cmd);
                }
                Action::PresenceLeave { course, user } => {
                    let cmd = PresenceCmd::Leave { course, user };
                    self.presence_round.borrow_mut().push(cmd);
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
                // The close frame is queued behind the data; it goes out below,
                // and the write side ends after it (the core's phase says so).
                Action::Close { code, .. } => self.node.metrics.close(code),
                Action::Cut { conn } => {
                    if let Some(io) = self.conns.borrow().get(&conn) {
                        io.cut();
                    }
                }
            }
        }
        writing::write_ready(self, &mut shard);
        drop(shard);
        self.kick.notify();
    }

    /// Sends this round's joins and leaves to the presence worker, as one
    /// message (the flush step that queued them kicked the tick step).
    pub fn send_presence_round(&self) {
        let mut round = self.presence_round.borrow_mut();
        let cmd = match round.len() {
            0 => return,
            1 => round.pop(),
            _ => Some(PresenceCmd::Batch(std::mem::take(&mut *round))),
        };
        if let Some(cmd) = cmd {
            let _ = self.presence.send(cmd);
        }
    }

    /// Copies the shard's counters into the node's metrics.
    pub fn publish_metrics(&self) {
        let shard = self.shard.borrow();
        let s = shard.stats();
        let m = self.metrics();
        m.connections.store(shard.connections() as u64, Relaxed);
        m.sse_connections
            .store(shard.sse_connections() as u64, Relaxed);
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
