//! One simulated node: the product's real ingest router (`Ingest`) over the
//! simulated source, its real shard cores (`shards::Shard`), its real presence
//! worker and Redis store over the simulated Redis, and the channels between
//! them, pumped in one thread.

use crate::adapter::{self, Link, ReadRequest, SimSource, SourceEvent, SubCmd};
use crate::presence::{Sets, SimLink};
use crossbeam_channel::{unbounded, Receiver};
use seatboard::channels::wake::IngestRx;
use seatboard::channels::{BatchTag, Control, Inbox, IngestCmd, Outlet, PresenceCmd};
use seatboard::ingest::Ingest;
use seatboard::metrics::Metrics;
use seatboard::presence::redis::RedisPresence;
use seatboard::presence::{PresenceTiming, Worker};
use shards::{Action, ConnId, Shard, ShardConfig};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The shard's send queue bound in the simulation (small, so that a viewer
/// that stops reading fills it).
pub const QUEUE_BYTES: usize = 4 * 1024;

/// The admin tick (ms).
pub const ADMIN_TICK_MS: u64 = 750;

/// The presence tick (ms): counts read and pushed this often.
pub const PRESENCE_TICK_MS: u64 = 500;
/// The presence TTL (ms): members re-scored every half of it.
pub const PRESENCE_TTL_MS: u64 = 2_000;
/// The presence keys' prefix.
const PRESENCE_PREFIX: &str = "presence:";

/// What a pump of the node asks of the world.
#[derive(Debug, Default)]
pub struct Out {
    /// Pub/sub commands to write to Redis.
    pub subs: Vec<SubCmd>,
    /// State reader requests.
    pub reads: Vec<ReadRequest>,
    /// Connections the shard ends: (shard, conn, cut).
    pub ends: Vec<(usize, ConnId, bool)>,
}

/// One node.
pub struct Node {
    /// The ingest router.
    pub ingest: Ingest<SimSource>,
    /// The shard cores.
    pub shards: Vec<Shard>,
    inboxes: Vec<Arc<Inbox>>,
    /// The source's side of the pub/sub connection.
    pub link: Arc<Mutex<Link>>,
    reads: Receiver<ReadRequest>,
    presence: Receiver<PresenceCmd>,
    /// The presence worker, its store the product's over the simulated Redis.
    pub worker: Worker<RedisPresence<SimLink>>,
    /// What the worker sends the router (its counts).
    to_ingest: IngestRx,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Per section, the highest version its board held and how many
    /// write-losing faults had happened when it first held it.
    high: HashMap<(Arc<str>, u32), (u64, u64)>,
}

impl Node {
    /// A node started at `now` with `shards` cores, connected to Redis
    /// (its presence keys in `sets`).
    pub fn new(id: usize, shards: usize, seed: u64, now: u64, sets: &Arc<Mutex<Sets>>) -> Node {
        let metrics = Arc::new(Metrics::new(shards));
        let inboxes: Vec<Arc<Inbox>> = (0..shards).map(|_| Inbox::new()).collect();
        let outlets = inboxes.iter().map(|i| Outlet::new(Arc::clone(i))).collect();
        let mut up = Link {
            connected: true,
            ..Link::default()
        };
        up.subs.connected();
        let link = Arc::new(Mutex::new(up));
        let (ptx, presence) = unbounded();
        let (rtx, reads) = unbounded();
        let ingest = Ingest::new(
            SimSource(Arc::clone(&link)),
            outlets,
            Arc::clone(&metrics),
            Some(ptx),
            rtx,
            ADMIN_TICK_MS,
            now,
        );
        let (itx, to_ingest) = seatboard::channels::wake::channel().expect("an eventfd");
        let store = RedisPresence::on(SimLink(Arc::clone(sets)), PRESENCE_PREFIX);
        let timing = PresenceTiming {
            tick_ms: PRESENCE_TICK_MS,
            ttl_ms: PRESENCE_TTL_MS,
        };
        let worker = Worker::new(
            store,
            timing,
            inboxes.clone(),
            Some(itx),
            Arc::clone(&metrics),
            now,
        );
        let shards = (0..shards)
            .map(|i| {
                Shard::new(ShardConfig {
                    tick_ms: 200,
                    send_queue_bytes: QUEUE_BYTES,
                    slow_consumer_ms: 5_000,
                    ping_ms: 30_000,
                    idle_ms: 75_000,
                    node: format!("n{id}"),
                    seed: seed ^ (i as u64 + 1),
                    count_patience_ms: seatboard::shard::COUNT_PATIENCE_MS,
                    count_hold_ms: seatboard::shard::COUNT_HOLD_MS,
                })
            })
            .collect();
        Node {
            ingest,
            shards,
            inboxes,
            link,
            reads,
            presence,
            worker,
            to_ingest,
            metrics,
            high: HashMap::new(),
        }
    }

    /// Checks the node's own board against the highest versions it held: a
    /// section's version never goes down while its board is kept, except
    /// below one first held before the latest of `faults` write-losing faults
    /// (a state hash that lost the write may then be read afresh), or where
    /// `replaced(course, section, from, to)` (the reconciler's replacement,
    /// which a board takes whatever it holds). A board dropped (its last
    /// viewer gone) starts afresh. Names the section that went back.
    pub fn went_backwards(
        &mut self,
        faults: u64,
        replaced: impl Fn(&str, u32, u64, u64) -> bool,
    ) -> Option<String> {
        let mut seen = HashSet::new();
        let mut back = None;
        for (course, section, version) in self.ingest.held() {
            let key = (Arc::clone(course), section);
            seen.insert(key.clone());
            let Some(v) = version else { continue };
            match self.high.get_mut(&key) {
                Some((high, at)) if v < *high => {
                    // The first by name, whatever order the board map keeps.
                    let first = back
                        .as_ref()
                        .is_none_or(|(k, _): &((Arc<str>, u32), String)| key < *k);
                    if *at == faults && first && !replaced(course, section, *high, v) {
                        let d = format!(
                            "{course}/{section} held v{high}, now v{v} with no write lost since"
                        );
                        back = Some((key.clone(), d));
                    }
                    *high = v;
                    *at = faults;
                }
                Some((high, at)) if v > *high => {
                    *high = v;
                    *at = faults;
                }
                Some(_) => {}
                None => {
                    self.high.insert(key, (v, faults));
                }
            }
        }
        self.high.retain(|k, _| seen.contains(k));
        back.map(|(_, d)| d)
    }

    /// A source event into the router; the virtual clock stands for both the
    /// monotonic and the wall clock (no snapshot carries a `ts`).
    pub fn event(&mut self, ev: SourceEvent, now: u64) {
        self.ingest.event(ev, now, now);
    }

    /// A command into the router (a state reader answer).
    pub fn command(&mut self, cmd: IngestCmd, now: u64) {
        self.ingest.command(cmd, now);
    }

    /// The earliest timer of the router, the presence worker and the shards.
    pub fn next_timer(&self) -> Option<u64> {
        let shards = self.shards.iter().filter_map(Shard::poll_timeout).min();
        let t = match (self.ingest.poll_timeout(), shards) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        };
        Some(t.min(self.worker.poll_timeout()))
    }

    /// Runs every timer due at `now`.
    pub fn timers(&mut self, now: u64) {
        if self.ingest.poll_timeout().is_some_and(|t| t <= now) {
            self.ingest.handle_timeout(now);
        }
        if self.worker.poll_timeout() <= now {
            self.worker.handle_timeout(now);
        }
        for s in &mut self.shards {
            if s.poll_timeout().is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
        }
    }

    /// Moves everything between the router and the shards until nothing is
    /// left to move, and collects what goes out of the node.
    pub fn pump(&mut self, now: u64, out: &mut Out) {
        for _ in 0..64 {
            let mut moved = false;
            // The router's commands to the worker (count every course while
            // an admin watches), then the worker's counts to the router.
            for cmd in self.presence.try_iter() {
                moved = true;
                self.worker.command(cmd, now);
            }
            while let Some(cmd) = self.to_ingest.try_recv() {
                moved = true;
                self.ingest.command(cmd, now);
            }
            let mut joins = Vec::new();
            self.ingest.flush();
            for (i, shard) in self.shards.iter_mut().enumerate() {
                let inbox = &self.inboxes[i];
                while let Some(batch) = inbox.try_snapshots() {
                    moved = true;
                    for s in &batch {
                        shard.handle_snapshot(s);
                    }
                }
                while let Some(c) = inbox.try_control() {
                    moved = true;
                    match c {
                        Control::Seed { course, sections } => {
                            shard.handle_seed(&course, &sections, now)
                        }
                        Control::Presence { counts, applied } => {
                            shard.handle_counts(&counts, applied)
                        }
                        Control::JoinCounts { counts, applied } => {
                            shard.handle_join_counts(&counts, applied)
                        }
                        Control::Roster { conn, frame } => shard.deliver(conn, frame),
                        Control::Admin(msg) => shard.handle_admin(&msg),
                        Control::Drain | Control::CloseAll | Control::Probe | Control::Stop => {}
                    }
                }
                let round = joins.len();
                while let Some(a) = shard.poll_action() {
                    moved = true;
                    let from = BatchTag {
                        shard: i,
                        batch: shard.presence_batch(),
                    };
                    match a {
                        Action::Interest { course, watching } => {
                            let gate = if watching { shard.gate(&course) } else { None };
                            let cmd = IngestCmd::Interest {
                                shard: i,
                                course,
                                watching,
                                gate,
                            };
                            self.ingest.command(cmd, now);
                        }
                        Action::PresenceJoin { course, user } => {
                            joins.push(PresenceCmd::Join { course, user, from })
                        }
                        Action::PresenceLeave { course, user } => {
                            joins.push(PresenceCmd::Leave { course, user, from })
                        }
                        Action::Roster { .. } => {}
                        Action::AdminFeed { connected } => {
                            let cmd = IngestCmd::AdminFeed {
                                shard: i,
                                connected,
                            };
                            self.ingest.command(cmd, now);
                        }
                        Action::Close { conn, .. } => out.ends.push((i, conn, false)),
                        Action::Cut { conn } => out.ends.push((i, conn, true)),
                    }
                }
                while shard.poll_ready().is_some() {}
                // This shard's joins and leaves go to the worker below, as
                // one batch.
                if joins.len() > round {
                    shard.presence_batch_sent();
                }
            }
            // What the shards' round reported goes to the worker as one batch.
            if !joins.is_empty() {
                self.worker.commands(joins, now);
            }
            self.ingest.flush();
            if !moved {
                break;
            }
        }
        out.reads.extend(self.reads.try_iter());
        out.subs.append(&mut adapter::lock(&self.link).outbox);
    }
}
