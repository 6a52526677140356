//! The shard's context: everything one shard thread's tasks share, built once
//! per thread ([`ShardCtx::new`]), and the flush step that carries out what the
//! core asked for.

use super::conn::{lifecycle, ConnTable, Host, Openings, Sends, Shell};
use super::notify::LocalNotify;
use crate::channels::wake::IngestTx;
use crate::channels::{BatchTag, Inbox, IngestCmd, PresenceCmd};
use crate::clock;
use crate::metrics::ShardMetrics;
use crate::node::Node;
use crossbeam_channel::Sender;
use shards::{Action, Shard, ShardConfig};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// How long the watch answers of a course new to a shard, seeded before any
/// count of it came, wait for its first count: the presence worker reads it
/// with the first viewers' write, one round trip racing the seed's
/// subscribe and read (see [`ShardConfig::count_patience_ms`]).
pub const COUNT_PATIENCE_MS: u64 = 100;

/// How long the count of a watch answer that brought a user new to the
/// shard waits for a count read after that user's join was written (see
/// [`ShardConfig::count_hold_ms`]): the presence worker gathers joins for
/// up to 50 ms and writes them in one round trip; the board does not wait.
pub const COUNT_HOLD_MS: u64 = 500;

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
    /// Ends the shard's accept loop, and with it the thread (`Control::Stop`).
    pub stop: LocalNotify,
    /// When the shard next returns freed memory to the OS (ms).
    pub next_purge_ms: Cell<u64>,
    /// Frames rendered as of the last return of freed memory.
    pub rendered_at_purge: Cell<u64>,
    /// How this shard puts frames on the wire (set once its runtime is built).
    pub sends: RefCell<Sends>,
    /// Upgrades whose `101` waits for the board of a course they named.
    pub openings: RefCell<Openings>,
}

impl ShardCtx {
    /// Shard `index`'s state, before any runtime-specific task runs on it:
    /// its core and direct sends (a runtime on
    /// io_uring swaps in its send ring).
    pub fn new(
        index: usize,
        node: Arc<Node>,
        inbox: Arc<Inbox>,
        ingest: IngestTx,
        presence: Sender<PresenceCmd>,
    ) -> Self {
        ShardCtx {
            index,
            shard: RefCell::new(Shard::new(ShardConfig {
                tick_ms: node.config.tick_ms,
                node: node.id.clone(),
                seed: clock::unix_ms() ^ ((index as u64) << 48) | 1,
                count_patience_ms: COUNT_PATIENCE_MS,
                count_hold_ms: COUNT_HOLD_MS,
                ..ShardConfig::default()
            })),
            node,
            inbox,
            ingest,
            presence,
            presence_round: RefCell::default(),
            conns: RefCell::default(),
            kick: Default::default(),
            stop: Default::default(),
            next_purge_ms: Default::default(),
            rendered_at_purge: Default::default(),
            sends: RefCell::new(Sends::Direct),
            openings: RefCell::default(),
        }
    }

    /// This shard's metrics.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.node.metrics.shards[self.index]
    }

    /// Carries out what the shard asked for and writes the frames it queued,
    /// then the `101` of each upgrade whose boards came.
    pub fn flush(self: &Rc<Self>) {
        let mut shard = self.shard.borrow_mut();
        while let Some(action) = shard.poll_action() {
            self.act(&shard, action);
        }
        let conns = self.conns.borrow();
        self.sends.borrow_mut().flush(self, &mut shard, &conns);
        drop(conns);
        let opened = self.openings.borrow_mut().take_ready(&shard);
        drop(shard);
        lifecycle::open_held(self, opened);
        self.kick.notify();
    }

    /// Carries out one of the core's actions (the frames it queued go out
    /// after all of them, in [`flush`](Self::flush)).
    fn act(&self, shard: &Shard, action: Action) {
        match action {
            Action::Interest { course, watching } => {
                crate::failure::trip(&course);
                let gate = watching.then(|| shard.gate(&course)).flatten();
                let _ = self.ingest.send(IngestCmd::Interest {
                    shard: self.index,
                    course,
                    watching,
                    gate,
                });
            }
            // Each goes in the batch the core numbers now: the round's, sent
            // by `send_presence_round` before any other action is taken.
            Action::PresenceJoin { course, user } => {
                let from = self.batch_tag(shard);
                let cmd = PresenceCmd::Join { course, user, from };
                self.presence_round.borrow_mut().push(cmd);
            }
            Action::PresenceLeave { course, user } => {
                let from = self.batch_tag(shard);
                let cmd = PresenceCmd::Leave { course, user, from };
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
            // The close frame is queued behind the data; it goes out in the
            // flush, and the write side ends after it (the core's phase says so).
            Action::Close { code, .. } => self.node.metrics.close(code),
            Action::Cut { conn } => {
                if let Some(io) = self.conns.borrow().get(&conn) {
                    io.cut();
                }
            }
        }
    }

    /// The batch a join or leave taken from the core now goes in.
    fn batch_tag(&self, shard: &Shard) -> BatchTag {
        BatchTag {
            shard: self.index,
            batch: shard.presence_batch(),
        }
    }

    /// Sends this round's joins and leaves to the presence worker, as one
    /// message (the flush step that queued them kicked the tick step), and
    /// tells the core their batch is sent. Called right after a flush took
    /// every action from the core, so every join and leave numbered with
    /// this batch is in it.
    pub fn send_presence_round(&self) {
        let mut round = self.presence_round.borrow_mut();
        let cmd = match round.len() {
            0 => return,
            1 => round.pop(),
            _ => Some(PresenceCmd::Batch(std::mem::take(&mut *round))),
        };
        self.shard.borrow_mut().presence_batch_sent();
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

impl Host for ShardCtx {
    fn core(&self) -> &RefCell<Shard> {
        &self.shard
    }

    fn metrics(&self) -> &ShardMetrics {
        ShardCtx::metrics(self)
    }
}

impl Shell for ShardCtx {
    fn conns(&self) -> &RefCell<ConnTable> {
        &self.conns
    }

    fn sends(&self) -> &RefCell<Sends> {
        &self.sends
    }

    fn openings(&self) -> &RefCell<Openings> {
        &self.openings
    }

    fn flush(self: &Rc<Self>) {
        ShardCtx::flush(self)
    }
}
