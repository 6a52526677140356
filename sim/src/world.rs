//! The simulated deployment on a virtual clock: Redis, nodes, publishers and
//! viewers, driven through a schedule, with every invariant checked as it runs.

use crate::adapter::{self, ReadRequest, SubCmd};
use crate::database::{row_snapshot, Database};
use crate::missed::Missed;
use crate::node::{Node, Out, PRESENCE_TICK_MS, PRESENCE_TTL_MS, QUEUE_BYTES};
use crate::presence;
use crate::reconciler::{self, Reconciler};
use crate::redis::Redis;
use crate::rng::Rng;
use crate::schedule::{Op, Shape, Step, COURSES};
use crate::viewer::{At, Read, Viewer};
use seatboard::channels::{Discovery, IngestCmd};
use seatboard::reconcile::decide::{Candidate, Field};
use serde_json::Value;
use shards::{Role, Snapshot, WsOptions};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

/// The start of the virtual clock (Unix ms, as the product's clocks read).
pub const T0: u64 = 1_764_420_000_000;
/// How long after the last fault every open viewer's board must equal the
/// truth: the contract's 2 s after Redis answers again, plus the simulated
/// reconnect backoff and link delays.
pub const BOUND_MS: u64 = 2_000 + MAX_BACKOFF_MS + 4 * MAX_DELAY_MS + VIEWER_TICK_MS;
/// With a reconciler, how long after the last fault Redis and every open
/// board equal the database: a publish slowed past the fault's end, the
/// replica's lag, the grace and the ahead delay, three checks with their
/// round trips (a replacement whose row was not read again waits for a
/// sweep), then the nodes' own bound.
pub const RECONCILE_BOUND_MS: u64 = 1_600
    + reconciler::MAX_LAG_MS
    + reconciler::GRACE_MS
    + reconciler::AHEAD_MS
    + 3 * (reconciler::INTERVAL_MS + 4 * MAX_DELAY_MS)
    + BOUND_MS;
/// How long after the last fault every count a viewer is shown equals the
/// distinct users watching the course on any node: a dead node's members
/// fall out one presence TTL after its last re-score, a lost write is
/// rewritten at the next re-score (TTL/2), then one presence tick to count,
/// the removals' window, and the viewers' read.
pub const PRESENCE_BOUND_MS: u64 = PRESENCE_TTL_MS
    + PRESENCE_TICK_MS
    + seatboard::presence::LEAVE_WINDOW_MS
    + VIEWER_TICK_MS
    + 4 * MAX_DELAY_MS;
/// The router's admin tick (ms), as the simulated nodes run it.
const ADMIN_TICK_MS: u64 = crate::node::ADMIN_TICK_MS;
/// How far back a delta's tick may reach: the tick, the shard's hand-over
/// and the admin's read.
const ADMIN_WINDOW_MS: u64 = ADMIN_TICK_MS + 2 * VIEWER_TICK_MS;
/// The longest one-way delay on a link in normal operation.
const MAX_DELAY_MS: u64 = 25;
/// The source's longest reconnect backoff.
const MAX_BACKOFF_MS: u64 = 400;
/// How often viewers that read take what is queued to them.
const VIEWER_TICK_MS: u64 = 50;
/// The version of the final round of publishes (above any drawn).
const FINAL_VERSION: u64 = 1 << 40;
/// A forged publish's version: one the database never holds (above any
/// drawn, below the final round's).
const FORGED_VERSION: u64 = 1 << 39;
/// Slack over a queue's bound: answers and close frames go past it.
const QUEUE_SLACK: usize = 16 * 1024;

/// A publish delivered to a node: (when, course, (section, version,
/// `replace`)): a replacement is a publish of its own, whatever its version.
type Delivery = (u64, String, (u32, Option<u64>, bool));

/// An invariant that broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The invariant's name.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
    /// Virtual ms from the start.
    pub at: u64,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] at t={}: {}", self.invariant, self.at, self.detail)
    }
}

/// A pub/sub connection's or the reader's end, as Redis sees it.
#[derive(Debug, Clone, Copy)]
enum Conn {
    Publisher,
    Sub { node: usize, gen: u64 },
    Reader { node: usize, node_gen: u64 },
    Reconciler,
}

/// A command arriving at Redis.
#[derive(Debug)]
enum Cmd {
    Publish(Arc<Snapshot>),
    Sub(SubCmd),
    Read {
        courses: Vec<Arc<str>>,
        epoch: u64,
    },
    Discover,
    /// The reconciler's `HGET`s, one per candidate.
    Lookup(Vec<Candidate>),
    /// The reconciler's repairs: written with the compare-and-set script,
    /// then set and published with `replace`, each section published.
    Repair {
        write: Vec<Snapshot>,
        replace: Vec<Snapshot>,
    },
}

/// Something due at a virtual moment.
#[derive(Debug)]
enum Ev {
    Step(usize),
    AtRedis(Conn, Cmd),
    /// A pub/sub delivery to a node's connection of generation `gen`.
    Message {
        node: usize,
        gen: u64,
        course: String,
        /// The publish's section, version and `replace` (what an admin rate may count).
        publish: (u32, Option<u64>, bool),
        payload: Arc<str>,
    },
    Ack {
        node: usize,
        gen: u64,
        course: Option<String>,
        subscribe: bool,
    },
    Answer {
        node: usize,
        node_gen: u64,
        cmd: IngestCmd,
    },
    Reconnect {
        node: usize,
        gen: u64,
    },
    ViewerTick,
    /// From now on every presence count shown must be the truth.
    PresenceSettled,
    /// Redis answers again: what it held is run in arrival order.
    Thaw,
    Quiet,
    CheckHash,
    /// With a reconciler: Redis and every open board equal the database.
    CheckDatabase,
    /// The reconciler starts a check.
    ReconcileCheck,
    /// Its lookups' answer (None: Redis was down).
    Looked(Option<Vec<(Candidate, Field)>>),
    /// Its repairs done (None: Redis was down), the sections written.
    Repaired(Option<Vec<Snapshot>>),
    FinalRound,
    CheckFinal,
}

struct Slot {
    node: Node,
    gen: u64,
    /// FIFO arrival of the last message each way on the pub/sub link and the reader's.
    up: u64,
    down: u64,
    reader: u64,
    /// Until when its subscriptions and read answers are slowed, and by how much.
    slow_until: u64,
    slow_ms: u64,
}

struct Publisher {
    last: u64,
    slow_until: u64,
    slow_ms: u64,
    lose_next: bool,
}

/// The whole deployment.
pub struct World {
    /// Virtual time (Unix ms).
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    redis: Redis,
    /// Redis is down (restarting) until then: commands fail.
    down_until: u64,
    slots: Vec<Slot>,
    viewers: Vec<Viewer>,
    publishers: Vec<Publisher>,
    /// The selection database: every version committed.
    db: Database,
    /// The reconciler, on for half the seeds.
    reconciler: Option<Reconciler>,
    /// Sections some step publishes (a forged version goes only where the
    /// database will hold a row the reconciler can compare it with).
    published_sections: BTreeSet<(usize, u32)>,
    /// Replacements nodes missed, and those they can no longer take.
    missed: Missed,
    /// Every (course, section, version) the reconciler published as a
    /// replacement.
    replacements: BTreeSet<(String, u32, u64)>,
    /// Every (course, section, version) PUBLISHed, with its section JSON.
    published: HashMap<(String, u32, u64), Value>,
    rng: Rng,
    steps: Vec<Step>,
    shape: Shape,
    /// Events handled.
    pub events: u64,
    trace: bool,
    /// Whether a fault lost writes the state hashes held.
    lossy: bool,
    /// Write-losing faults so far (a Redis restart, a failover).
    lost_writes: u64,
    /// The truth after the final round.
    final_truth: BTreeMap<String, BTreeMap<u32, Value>>,
    /// Commands that reached a frozen Redis, in arrival order.
    held: Vec<(Conn, Cmd)>,
    /// Past the presence bound: every count shown is checked.
    presence_settled: bool,
    /// Per node, its admin's connection (shard, conn, the node's generation,
    /// when it connected: the node's firehose has been on since).
    admins: Vec<Option<(usize, shards::ConnId, u64, u64)>>,
    /// Per node, pub/sub commands on their way to Redis.
    inflight: Vec<u64>,
    /// Per node, the publishes its pub/sub connection delivered lately:
    /// (when, course, (section, version)), one entry per delivery.
    delivered: Vec<std::collections::VecDeque<Delivery>>,
}

impl World {
    /// A deployment of `shape` that will run `steps`, its delays drawn from `seed`.
    pub fn new(seed: u64, shape: Shape, steps: Vec<Step>, trace: bool) -> World {
        let mut rng = Rng::new(seed.rotate_left(17) ^ 0xd1ce);
        let redis = Redis::new(shape.nodes);
        {
            let mut sets = presence::lock(&redis.presence);
            sets.now = T0;
            sets.reachable = true;
        }
        let slots = (0..shape.nodes)
            .map(|i| Slot {
                node: Node::new(i, shape.shards, seed ^ (i as u64) << 8, T0, &redis.presence),
                gen: 0,
                up: T0,
                down: T0,
                reader: T0,
                slow_until: 0,
                slow_ms: 0,
            })
            .collect();
        let viewers = (0..shape.viewers)
            .map(|v| {
                let node = rng.below(shape.nodes as u64) as usize;
                let shard = rng.below(shape.shards as u64) as usize;
                Viewer::new(&format!("u{}", v % 4), node, shard)
            })
            .collect();
        let publishers = (0..shape.publishers)
            .map(|_| Publisher {
                last: T0,
                slow_until: 0,
                slow_ms: 0,
                lose_next: false,
            })
            .collect();
        let lossy = steps.iter().any(|s| s.op.loses_writes());
        let published_sections = steps
            .iter()
            .filter_map(|s| match s.op {
                Op::Publish {
                    course, section, ..
                } => Some((course, section)),
                _ => None,
            })
            .collect();
        let reconciler = reconciler::drawn(seed).map(|lag| Reconciler::new(seed, lag));
        let mut w = World {
            now: T0,
            seq: 0,
            queue: BTreeMap::new(),
            redis,
            down_until: 0,
            slots,
            viewers,
            publishers,
            db: Database::default(),
            reconciler,
            published_sections,
            replacements: BTreeSet::new(),
            missed: Missed::default(),
            published: HashMap::new(),
            rng,
            steps,
            shape,
            events: 0,
            trace,
            lossy,
            lost_writes: 0,
            final_truth: BTreeMap::new(),
            held: Vec::new(),
            presence_settled: false,
            admins: vec![None; shape.nodes],
            inflight: vec![0; shape.nodes],
            delivered: vec![Default::default(); shape.nodes],
        };
        for i in 0..w.steps.len() {
            let at = T0 + w.steps[i].at;
            w.at(at, Ev::Step(i));
        }
        let last_fault = w
            .steps
            .iter()
            .filter(|s| s.op.is_fault())
            .map(|s| s.at + s.op.lasts_ms())
            .max()
            .unwrap_or(0);
        let quiet = T0 + w.shape.busy_ms.max(last_fault);
        w.at(T0, Ev::ViewerTick);
        w.at(quiet, Ev::Quiet);
        let settled = match &w.reconciler {
            Some(r) => {
                w.log(|| format!("reconciler on, its replica {} ms behind", r.lag_ms));
                w.at(T0 + reconciler::INTERVAL_MS, Ev::ReconcileCheck);
                w.at(quiet + RECONCILE_BOUND_MS, Ev::CheckDatabase);
                quiet + RECONCILE_BOUND_MS
            }
            None => {
                w.at(quiet + BOUND_MS, Ev::CheckHash);
                quiet + BOUND_MS
            }
        };
        w.at(quiet + PRESENCE_BOUND_MS, Ev::PresenceSettled);
        w.at(settled + 1, Ev::FinalRound);
        w.at(settled + BOUND_MS, Ev::CheckFinal);
        w
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), ev);
    }

    fn delay(&mut self) -> u64 {
        // Mostly quick, sometimes up to the bound: order differs across links.
        if self.rng.chance(100) {
            self.rng.range(5, MAX_DELAY_MS)
        } else {
            self.rng.range(0, 5)
        }
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.trace {
            println!("{:>7} {}", self.now - T0, what());
        }
    }

    fn fail(&self, invariant: &'static str, detail: String) -> Failure {
        Failure {
            invariant,
            detail,
            at: self.now - T0,
        }
    }

    /// Runs to the end; the first invariant broken, if any.
    pub fn run(&mut self) -> Result<(), Failure> {
        let mut same = 0u32;
        loop {
            let q = self.queue.keys().next().map(|k| k.0);
            let timer = self.slots.iter().filter_map(|s| s.node.next_timer()).min();
            let t = match (q, timer) {
                (None, _) => return Ok(()),
                (Some(q), Some(tm)) if tm < q => tm,
                (Some(q), _) => q,
            };
            if t <= self.now {
                same += 1;
                if same > 100_000 {
                    return Err(self.fail("no busy loop", "a timer is always due".into()));
                }
            } else {
                same = 0;
            }
            self.now = self.now.max(t);
            self.events += 1;
            {
                let mut sets = presence::lock(&self.redis.presence);
                sets.now = self.now;
                sets.reachable = self.now >= self.redis.frozen_until && self.now >= self.down_until;
            }
            if timer.is_some_and(|tm| tm == t && q.is_none_or(|q| tm < q)) {
                let now = self.now;
                for s in &mut self.slots {
                    s.node.timers(now);
                }
            } else if let Some((_, ev)) = self.queue.pop_first() {
                if let Some(done) = self.handle(ev)? {
                    return Ok(done);
                }
            }
            self.pump()?;
        }
    }

    fn pump(&mut self) -> Result<(), Failure> {
        for i in 0..self.slots.len() {
            let mut out = Out::default();
            let now = self.now;
            self.slots[i].node.pump(now, &mut out);
            for r in &out.reads {
                let ReadRequest::States { courses, .. } = r else {
                    continue;
                };
                let link = &self.slots[i].node.link;
                // The first by name, whatever order the router gathered them in.
                let early = courses.iter().filter(|c| !adapter::may_read(link, c)).min();
                if let Some(c) = early {
                    return Err(self.fail(
                        "a state read waits for its subscription's confirmation",
                        format!("node {i} asks to read {c} before Redis confirmed it"),
                    ));
                }
            }
            self.route(i, out);
            let (db, replacements, now) = (&self.db, &self.replacements, self.now);
            let replaced = |c: &str, s: u32, from: u64, to: u64| {
                rewind_allowed(db, replacements, now, (c, s), from, to)
            };
            if let Some(d) = self.slots[i]
                .node
                .went_backwards(self.lost_writes, replaced)
            {
                return Err(self.fail(
                    "a node's board never goes backwards",
                    format!("node {i}: {d}"),
                ));
            }
        }
        self.presence_keys_keep_their_ttl()?;
        self.pattern_alone()?;
        // Every queue stays within its bound.
        for (v, viewer) in self.viewers.iter().enumerate() {
            if let Some(at) = viewer.at {
                let q = self.slots[at.node].node.shards[at.shard].queued_bytes(at.conn);
                if q > QUEUE_BYTES + QUEUE_SLACK {
                    return Err(self.fail(
                        "every queue stays within its bound",
                        format!("viewer {v} has {q} bytes queued"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn route(&mut self, node: usize, out: Out) {
        let gen = self.redis.subs[node].gen;
        let slow = if self.now < self.slots[node].slow_until {
            self.slots[node].slow_ms
        } else {
            0
        };
        for c in out.subs {
            let d = self.delay() + slow;
            let s = &mut self.slots[node];
            s.up = s.up.max(self.now + d);
            let t = s.up;
            self.log(|| format!("node {node} writes {c:?}"));
            self.inflight[node] += 1;
            self.at(t, Ev::AtRedis(Conn::Sub { node, gen }, Cmd::Sub(c)));
        }
        for r in out.reads {
            let cmd = match r {
                ReadRequest::States { courses, epoch } => Cmd::Read { courses, epoch },
                ReadRequest::Discover { .. } => Cmd::Discover,
                ReadRequest::Reconnected | ReadRequest::Shutdown => continue,
            };
            let d = self.delay();
            let s = &mut self.slots[node];
            s.reader = s.reader.max(self.now + d);
            let (t, node_gen) = (s.reader, s.gen);
            self.log(|| format!("node {node} reader asks {cmd:?}"));
            self.at(t, Ev::AtRedis(Conn::Reader { node, node_gen }, cmd));
        }
        for (shard, conn, cut) in out.ends {
            if !cut {
                // The close frame is queued: the viewer reads it and goes.
                continue;
            }
            self.slots[node].node.shards[shard].disconnect(conn);
            for v in &mut self.viewers {
                if v.at
                    .is_some_and(|a| a.node == node && a.shard == shard && a.conn == conn)
                {
                    v.at = None;
                    v.fresh();
                }
            }
        }
    }

    /// Handles one event; `Some(())` when the run is over.
    fn handle(&mut self, ev: Ev) -> Result<Option<()>, Failure> {
        match ev {
            Ev::Step(i) => {
                let step = self.steps[i].clone();
                self.log(|| format!("STEP {step}"));
                self.step(step.op);
            }
            Ev::AtRedis(conn, cmd) => self.at_redis(conn, cmd)?,
            Ev::Message {
                node,
                gen,
                course,
                publish,
                payload,
            } => {
                if gen != self.redis.subs[node].gen {
                    // Lost with a reset: a replacement among them is missed.
                    if let Ok(s) = Snapshot::parse(payload.as_bytes(), Some(&course)) {
                        if s.replace {
                            self.missed.missed(node, &course, s.section);
                        }
                    }
                } else {
                    self.log(|| format!("node {node} gets {payload}"));
                    let d = &mut self.delivered[node];
                    d.push_back((self.now, course.clone(), publish));
                    // Only the last two admin ticks' worth is ever asked for.
                    while d
                        .front()
                        .is_some_and(|(t, ..)| *t + 2 * ADMIN_WINDOW_MS < self.now)
                    {
                        d.pop_front();
                    }
                    let ev = adapter::message(&course, payload.as_bytes());
                    let now = self.now;
                    self.slots[node].node.event(ev, now);
                }
            }
            Ev::Ack {
                node,
                gen,
                course,
                subscribe,
            } => {
                if gen == self.redis.subs[node].gen {
                    self.log(|| format!("node {node} ack {course:?} sub={subscribe}"));
                    let link = &self.slots[node].node.link;
                    if let Some(ev) = adapter::acked(link, course.as_deref(), subscribe) {
                        let now = self.now;
                        self.slots[node].node.event(ev, now);
                    }
                }
            }
            Ev::Answer {
                node,
                node_gen,
                cmd,
            } => {
                if node_gen == self.slots[node].gen {
                    self.log(|| format!("node {node} reader answers {cmd:?}"));
                    let now = self.now;
                    self.slots[node].node.command(cmd, now);
                }
            }
            Ev::Reconnect { node, gen } => {
                if gen == self.redis.subs[node].gen {
                    if self.now < self.down_until {
                        let t = self.down_until + self.rng.range(10, MAX_BACKOFF_MS);
                        self.at(t, Ev::Reconnect { node, gen });
                    } else {
                        self.log(|| format!("node {node} pub/sub reconnects"));
                        let ev = adapter::reconnect(&self.slots[node].node.link);
                        let now = self.now;
                        self.slots[node].node.event(ev, now);
                    }
                }
            }
            Ev::PresenceSettled => {
                self.log(|| "PRESENCE SETTLED: every count shown is the truth".into());
                self.presence_settled = true;
                for v in 0..self.viewers.len() {
                    self.counts_true(v)?;
                }
            }
            Ev::ViewerTick => {
                self.viewers_read()?;
                self.at(self.now + VIEWER_TICK_MS, Ev::ViewerTick);
            }
            Ev::Thaw => {
                if self.now < self.redis.frozen_until {
                    let t = self.redis.frozen_until;
                    self.at(t, Ev::Thaw);
                } else {
                    for (conn, cmd) in std::mem::take(&mut self.held) {
                        self.at_redis(conn, cmd)?;
                    }
                }
            }
            Ev::Quiet => {
                self.log(|| "QUIET: faults over, every viewer reads".into());
                for v in &mut self.viewers {
                    v.stalled = false;
                }
            }
            Ev::CheckHash => {
                if !self.lossy {
                    let truth = self.hash_truth();
                    let none = |_: usize, _: &str, _: u32| false;
                    self.converged(&truth, "every open board equals the state hashes", none)?;
                }
            }
            Ev::CheckDatabase => {
                let truth = self.database_truth();
                if self.hash_truth() != truth {
                    return Err(self.fail(
                        "the reconciler brings Redis to the database",
                        self.hash_differs(&truth),
                    ));
                }
                let lost = |n: usize, c: &str, s: u32| self.missed.lost(n, c, s);
                self.converged(&truth, "every open board equals the database", lost)?;
            }
            Ev::ReconcileCheck => {
                let now = self.now;
                let Some(r) = self.reconciler.as_mut() else {
                    return Ok(None);
                };
                let cands = r.plan(&self.db, now);
                if cands.is_empty() {
                    self.next_check();
                } else {
                    self.log(|| format!("reconciler looks up {} sections", cands.len()));
                    self.on_reconciler_link(Ev::AtRedis(Conn::Reconciler, Cmd::Lookup(cands)));
                }
            }
            Ev::Looked(None) | Ev::Repaired(None) => self.next_check(),
            Ev::Looked(Some(looked)) => {
                let now = self.now;
                let Some(r) = self.reconciler.as_mut() else {
                    return Ok(None);
                };
                let out = r.judge(looked, now);
                let write: Vec<Snapshot> = out.write.into_iter().map(|(s, _)| s).collect();
                if write.is_empty() && out.replace.is_empty() {
                    self.next_check();
                } else {
                    let replace = out.replace;
                    self.on_reconciler_link(Ev::AtRedis(
                        Conn::Reconciler,
                        Cmd::Repair { write, replace },
                    ));
                }
            }
            Ev::Repaired(Some(done)) => {
                if let Some(r) = self.reconciler.as_mut() {
                    r.written(&done);
                }
                self.next_check();
            }
            Ev::FinalRound => self.final_round(),
            Ev::CheckFinal => {
                let truth = std::mem::take(&mut self.final_truth);
                let none = |_: usize, _: &str, _: u32| false;
                self.converged(&truth, "every open board equals the last publishes", none)?;
                return Ok(Some(()));
            }
        }
        Ok(None)
    }

    fn step(&mut self, op: Op) {
        let now = self.now;
        if op.loses_writes() {
            self.lost_writes += 1;
        }
        match op {
            Op::Publish {
                publisher,
                course,
                section,
                version,
            } => {
                // The selection API commits, then publishes.
                let code = COURSES[course % COURSES.len()];
                self.db.commit(now, code, section, version);
                self.publish(publisher, course, section, version);
            }
            Op::Forge {
                publisher,
                course,
                section,
            } => {
                if self.published_sections.contains(&(course, section)) {
                    self.publish(publisher, course, section, FORGED_VERSION);
                }
            }
            Op::Watch { viewer, course } => {
                let c = COURSES[course % COURSES.len()].to_owned();
                let v = &mut self.viewers[viewer];
                v.watching.insert(c.clone());
                if let Some(at) = v.at {
                    let text = format!(r#"{{"op":"watch","course":"{c}"}}"#);
                    self.slots[at.node].node.shards[at.shard].handle_text(at.conn, &text, now);
                }
            }
            Op::Unwatch { viewer, course } => {
                let c = COURSES[course % COURSES.len()].to_owned();
                let v = &mut self.viewers[viewer];
                if v.watching.remove(&c) {
                    let queued = v.at.map_or(0, |at| {
                        self.slots[at.node].node.shards[at.shard].queued_bytes(at.conn)
                    });
                    v.forget(&c, queued);
                    if let Some(at) = v.at {
                        let text = format!(r#"{{"op":"unwatch","course":"{c}"}}"#);
                        self.slots[at.node].node.shards[at.shard].handle_text(at.conn, &text, now);
                    }
                }
            }
            Op::Hop {
                viewer,
                node,
                shard,
            } => {
                self.drop_viewer(viewer);
                self.viewers[viewer].next = (node, shard);
            }
            Op::Stall { viewer } => self.viewers[viewer].stalled = true,
            Op::Unstall { viewer } => self.viewers[viewer].stalled = false,
            Op::SlowPublisher { publisher, ms } => {
                let p = &mut self.publishers[publisher];
                p.slow_until = now + ms;
                p.slow_ms = ms;
            }
            Op::SlowLink { node, ms } => {
                let s = &mut self.slots[node];
                s.slow_until = now + ms;
                s.slow_ms = ms;
            }
            Op::LosePublish { publisher } => self.publishers[publisher].lose_next = true,
            Op::ResetPubsub { node } => self.reset_link(node),
            Op::Freeze { ms } => self.redis.frozen_until = self.redis.frozen_until.max(now + ms),
            Op::Restart { ms } => {
                self.redis.lose_keyspace();
                self.missed.all_overwritten();
                self.down_until = self.down_until.max(now + ms);
                for n in 0..self.slots.len() {
                    self.reset_link(n);
                }
            }
            Op::Failover { lag_ms } => {
                self.redis.failover(now, lag_ms);
                self.missed.all_overwritten();
                for n in 0..self.slots.len() {
                    self.reset_link(n);
                }
            }
            Op::AdminJoin { node, shard } => {
                if self.admins[node].is_none() {
                    let s = &mut self.slots[node];
                    let conn = s.node.shards[shard].connect(
                        Arc::from("admin"),
                        Role::Admin,
                        WsOptions::ADMIN_FEED,
                        now,
                    );
                    self.admins[node] = Some((shard, conn, s.gen, now));
                }
            }
            Op::AdminLeave { node } => {
                if let Some((shard, conn, gen, _)) = self.admins[node].take() {
                    if gen == self.slots[node].gen {
                        self.slots[node].node.shards[shard].disconnect(conn);
                    }
                }
            }
            Op::NodeRestart { node } => {
                self.admins[node] = None;
                self.missed.restarted(node);
                for v in 0..self.viewers.len() {
                    if self.viewers[v].at.is_some_and(|a| a.node == node) {
                        self.viewers[v].at = None;
                        self.viewers[v].fresh();
                    }
                }
                let s = &mut self.slots[node];
                s.gen += 1;
                s.node = Node::new(node, self.shape.shards, s.gen, now, &self.redis.presence);
                self.redis.subs[node].gen += 1;
                self.redis.subs[node].channels.clear();
                self.redis.subs[node].pattern = false;
                if now < self.down_until {
                    adapter::reset(&self.slots[node].node.link);
                    let gen = self.redis.subs[node].gen;
                    self.at(self.down_until, Ev::Reconnect { node, gen });
                }
            }
        }
    }

    fn reset_link(&mut self, node: usize) {
        let sub = &mut self.redis.subs[node];
        sub.gen += 1;
        sub.channels.clear();
        sub.pattern = false;
        let gen = sub.gen;
        adapter::reset(&self.slots[node].node.link);
        let t = self.now + self.rng.range(10, MAX_BACKOFF_MS);
        self.at(t, Ev::Reconnect { node, gen });
    }

    fn publish(&mut self, publisher: usize, course: usize, section: u32, version: u64) {
        let code = COURSES[course % COURSES.len()];
        let snap = row_snapshot(code, section, version);
        let d = self.delay();
        let now = self.now;
        let p = &mut self.publishers[publisher];
        if std::mem::take(&mut p.lose_next) {
            self.log(|| format!("publish lost: {code}/{section} v{version}"));
            return;
        }
        let extra = if now < p.slow_until { p.slow_ms } else { 0 };
        p.last = p.last.max(now + d + extra);
        let t = p.last;
        self.at(
            t,
            Ev::AtRedis(Conn::Publisher, Cmd::Publish(Arc::new(snap))),
        );
    }

    fn at_redis(&mut self, conn: Conn, cmd: Cmd) -> Result<(), Failure> {
        if self.now < self.redis.frozen_until || !self.held.is_empty() {
            // Held in arrival order (each connection stays in order) until it thaws.
            if self.held.is_empty() {
                let t = self.redis.frozen_until;
                self.at(t, Ev::Thaw);
            }
            self.held.push((conn, cmd));
            return Ok(());
        }
        let down = self.now < self.down_until;
        match (conn, cmd) {
            (Conn::Publisher, Cmd::Publish(snap)) => {
                if down {
                    self.log(|| format!("publish refused, Redis down: {}", snap.to_payload()));
                    return Ok(());
                }
                let payload: Arc<str> = snap.to_payload().into();
                let wrote = self.redis.cas(self.now, &snap, &payload);
                self.log(|| format!("redis PUBLISH {payload} (cas wrote: {wrote})"));
                if wrote {
                    self.missed.overwritten(&snap.course, snap.section);
                }
                self.deliver(&snap, payload);
            }
            (Conn::Sub { node, gen }, Cmd::Sub(c)) => {
                self.inflight[node] = self.inflight[node].saturating_sub(1);
                if down || gen != self.redis.subs[node].gen {
                    return Ok(());
                }
                let sub = &mut self.redis.subs[node];
                let (course, subscribe) = match c {
                    SubCmd::Subscribe(c) => {
                        sub.channels.insert(c.clone());
                        (Some(c), true)
                    }
                    SubCmd::Unsubscribe(c) => {
                        sub.channels.remove(&c);
                        (Some(c), false)
                    }
                    SubCmd::Pattern(on) => {
                        sub.pattern = on;
                        (None, on)
                    }
                };
                let d = self.delay();
                let s = &mut self.slots[node];
                s.down = s.down.max(self.now + d);
                let t = s.down;
                self.at(
                    t,
                    Ev::Ack {
                        node,
                        gen,
                        course,
                        subscribe,
                    },
                );
            }
            (Conn::Reader { node, node_gen }, cmd) => {
                let answer = match cmd {
                    Cmd::Read { courses, epoch } => {
                        if !down {
                            for c in &courses {
                                self.missed.read(node, c);
                            }
                        }
                        let hashes =
                            (!down).then(|| courses.iter().map(|c| self.redis.read(c)).collect());
                        IngestCmd::States {
                            courses,
                            hashes,
                            epoch,
                        }
                    }
                    Cmd::Discover => IngestCmd::Discovered((!down).then(|| Discovery {
                        courses: self.redis.hashes.keys().cloned().collect(),
                        states: Vec::new(),
                    })),
                    _ => return Ok(()),
                };
                let s = &self.slots[node];
                let slow = if self.now < s.slow_until {
                    s.slow_ms
                } else {
                    0
                };
                let d = self.delay() + slow;
                let s = &mut self.slots[node];
                s.reader = s.reader.max(self.now + d);
                let t = s.reader;
                self.at(
                    t,
                    Ev::Answer {
                        node,
                        node_gen,
                        cmd: answer,
                    },
                );
            }
            (Conn::Reconciler, Cmd::Lookup(cands)) => {
                let looked = (!down).then(|| {
                    cands
                        .into_iter()
                        .map(|c| {
                            let field = self.redis.field(&c.snap.course, c.snap.section);
                            let field = Field::read(field.map(str::as_bytes));
                            (c, field)
                        })
                        .collect()
                });
                self.on_reconciler_link(Ev::Looked(looked));
            }
            (Conn::Reconciler, Cmd::Repair { write, replace }) => {
                if down {
                    self.log(|| "reconciler's repair refused, Redis down".into());
                    self.on_reconciler_link(Ev::Repaired(None));
                    return Ok(());
                }
                for snap in &write {
                    let payload: Arc<str> = snap.to_payload().into();
                    let wrote = self.redis.cas(self.now, snap, &payload);
                    self.log(|| format!("reconciler writes {payload} (cas wrote: {wrote})"));
                    if wrote {
                        self.missed.overwritten(&snap.course, snap.section);
                    }
                    self.deliver(snap, payload);
                }
                for snap in &replace {
                    self.rewind(snap)?;
                    let mut loud = snap.clone();
                    loud.replace = true;
                    let payload: Arc<str> = loud.to_payload().into();
                    self.redis.set(self.now, &loud, &payload);
                    if let Some(v) = loud.version {
                        let key = (loud.course.to_string(), loud.section, v);
                        self.replacements.insert(key);
                    }
                    self.log(|| format!("reconciler replaces with {payload}"));
                    self.deliver(&loud, payload);
                }
                let done = write.into_iter().chain(replace).collect();
                self.on_reconciler_link(Ev::Repaired(Some(done)));
            }
            _ => {}
        }
        Ok(())
    }

    /// A publish of `snap` (its `payload`) recorded and sent to every node
    /// whose connection receives its channel.
    fn deliver(&mut self, snap: &Snapshot, payload: Arc<str>) {
        if let (Some(v), Ok(json)) = (snap.version, serde_json::from_str(&snap.json)) {
            self.published
                .insert((snap.course.to_string(), snap.section, v), json);
        }
        let receivers = self.redis.receivers(&snap.course);
        if snap.replace {
            for node in 0..self.slots.len() {
                if !receivers.iter().any(|(n, _)| *n == node) {
                    self.missed.missed(node, &snap.course, snap.section);
                }
            }
        }
        for (node, gen) in receivers {
            let d = self.delay();
            let s = &mut self.slots[node];
            s.down = s.down.max(self.now + d);
            let t = s.down;
            let ev = Ev::Message {
                node,
                gen,
                course: snap.course.to_string(),
                publish: (snap.section, snap.version, snap.replace),
                payload: Arc::clone(&payload),
            };
            self.at(t, ev);
        }
    }

    /// A replacement about to be set: it may take a section back only from
    /// a version the database never held (then a node's board may follow).
    fn rewind(&mut self, snap: &Snapshot) -> Result<(), Failure> {
        let field = self.redis.field(&snap.course, snap.section);
        let (Some(held), Some(to)) = (
            Field::read(field.map(str::as_bytes)).version(),
            snap.version,
        ) else {
            return Ok(());
        };
        let to = i128::from(to);
        if held <= to {
            return Ok(());
        }
        if self.db.held(self.now, &snap.course, snap.section, held) {
            return Err(self.fail(
                "the reconciler replaces only a version the database never held",
                format!(
                    "{}/{}: Redis held v{held}, committed, replaced with v{to}",
                    snap.course, snap.section
                ),
            ));
        }
        Ok(())
    }

    /// An event on the reconciler's connection to Redis or back, in order
    /// (it waits for each answer before its next command).
    fn on_reconciler_link(&mut self, ev: Ev) {
        let Some(r) = self.reconciler.as_mut() else {
            return;
        };
        let d = r.rng.range(0, MAX_DELAY_MS);
        r.link = r.link.max(self.now + d);
        let t = r.link;
        self.at(t, ev);
    }

    /// The reconciler's next check, one interval from now.
    fn next_check(&mut self) {
        self.at(self.now + reconciler::INTERVAL_MS, Ev::ReconcileCheck);
    }

    fn drop_viewer(&mut self, v: usize) {
        if let Some(at) = self.viewers[v].at.take() {
            if at.node_gen == self.slots[at.node].gen {
                self.slots[at.node].node.shards[at.shard].disconnect(at.conn);
            }
        }
        self.viewers[v].fresh();
    }

    fn viewers_read(&mut self) -> Result<(), Failure> {
        let now = self.now;
        // Admins read everything they are sent.
        for n in 0..self.admins.len() {
            if let Some((shard, conn, gen, since)) = self.admins[n] {
                if gen == self.slots[n].gen {
                    let s = &mut self.slots[n].node.shards[shard];
                    let mut frames = Vec::new();
                    while let Some(b) = s.poll_frame(conn) {
                        frames.push(b);
                    }
                    // Until the firehose's first tick, a rate shown may be
                    // one of an earlier admin's (the last tick then).
                    if now >= since + ADMIN_WINDOW_MS {
                        for b in frames {
                            self.admin_counts_once(n, &b)?;
                        }
                    }
                }
            }
        }
        for v in 0..self.viewers.len() {
            if self.viewers[v].at.is_none() {
                // (Re)connect where it was sent, and watch again.
                let (node, shard) = self.viewers[v].next;
                let node_gen = self.slots[node].gen;
                let s = &mut self.slots[node].node.shards[shard];
                let user = Arc::clone(&self.viewers[v].user);
                let conn = s.connect(user, Role::Student, WsOptions::VIEWER, now);
                for c in &self.viewers[v].watching {
                    s.handle_text(conn, &format!(r#"{{"op":"watch","course":"{c}"}}"#), now);
                }
                self.viewers[v].at = Some(At {
                    node,
                    node_gen,
                    shard,
                    conn,
                });
                self.log(|| format!("viewer {v} connects to node {node} shard {shard}"));
            }
            if self.viewers[v].stalled {
                continue;
            }
            let Some(at) = self.viewers[v].at else {
                continue;
            };
            let shown = self.trace.then(|| self.viewers[v].presence.clone());
            let shard = &mut self.slots[at.node].node.shards[at.shard];
            let published = &self.published;
            let lookup =
                |c: &str, s: u32, ver: u64| published.get(&(c.to_owned(), s, ver)).cloned();
            let (db, replacements) = (&self.db, &self.replacements);
            let replaced = |c: &str, s: u32, from: u64, to: u64| {
                rewind_allowed(db, replacements, now, (c, s), from, to)
            };
            while let Some(b) = shard.poll_frame(at.conn) {
                match self.viewers[v].merge(&b, lookup, replaced) {
                    Read::Ok => {}
                    Read::Closed => {
                        shard.disconnect(at.conn);
                        self.viewers[v].at = None;
                        self.viewers[v].fresh();
                        break;
                    }
                    Read::Broke(inv, detail) => {
                        return Err(Failure {
                            invariant: inv,
                            detail: format!("viewer {v} on node {}: {detail}", at.node),
                            at: now - T0,
                        })
                    }
                }
            }
            if shown.is_some_and(|s| s != self.viewers[v].presence) {
                let now = &self.viewers[v].presence;
                self.log(|| format!("viewer {v} is shown counts {now:?}"));
            }
            if self.presence_settled {
                self.counts_true(v)?;
            }
        }
        Ok(())
    }

    /// The distinct users watching `course` on any node (viewers connected).
    fn watchers(&self, course: &str) -> BTreeSet<&str> {
        self.viewers
            .iter()
            .filter(|v| v.at.is_some() && v.watching.contains(course))
            .map(|v| &*v.user)
            .collect()
    }

    /// Past the presence bound, the count viewer `v` is shown for each course
    /// it watches equals the distinct users watching that course on any node.
    fn counts_true(&self, v: usize) -> Result<(), Failure> {
        let viewer = &self.viewers[v];
        let Some(at) = viewer.at else {
            return Ok(());
        };
        for c in &viewer.watching {
            let users = self.watchers(c);
            let shown = viewer.presence.get(c).copied();
            if shown != Some(users.len() as u64) {
                let users: Vec<&str> = users.into_iter().collect();
                return Err(self.fail(
                    "presence counts converge to distinct users",
                    format!(
                        "viewer {v} on node {} course {c}: shown {} viewers, {} users watch it ({})",
                        at.node,
                        shown.map_or("no count".into(), |n| n.to_string()),
                        users.len(),
                        users.join(",")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// An admin message's rates count each publish once, whatever the
    /// subscriptions (a connection on a channel and the pattern receives it
    /// twice): a course's updates in a tick (its rate times the tick) are at
    /// most the distinct publishes of it the node was delivered in that tick
    /// (looked for over the tick and the admin's read: once the firehose's
    /// first tick is past, every message is made at a tick, with that
    /// tick's rates).
    fn admin_counts_once(&self, node: usize, frame: &[u8]) -> Result<(), Failure> {
        let Ok(Some(f)) = shards::read_server_frame(frame) else {
            return Ok(());
        };
        let Ok(v) = serde_json::from_slice::<Value>(f.payload) else {
            return Ok(());
        };
        if v["type"] != "admin" {
            return Ok(());
        }
        self.log(|| format!("admin on node {node} reads {v}"));
        let from = self.now.saturating_sub(ADMIN_WINDOW_MS);
        for c in v["courses"].as_array().into_iter().flatten() {
            let (Some(course), Some(rate)) = (c["course"].as_str(), c["updates_per_s"].as_f64())
            else {
                continue;
            };
            let updates = (rate * ADMIN_TICK_MS as f64 / 1000.0).round() as usize;
            if updates == 0 {
                continue;
            }
            let distinct: BTreeSet<(u32, Option<u64>, bool)> = self.delivered[node]
                .iter()
                .filter(|(t, c, _)| *t >= from && c == course)
                .map(|(.., p)| *p)
                .collect();
            if updates > distinct.len() {
                return Err(self.fail(
                    "the admin aggregate counts each publish once",
                    format!(
                        "node {node} {course}: {rate}/s is {updates} updates in a tick, {} distinct publishes delivered",
                        distinct.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A node holds the pattern subscription only while an admin is connected
    /// to it, and then no per-course subscription (checked once the node's
    /// commands have reached Redis).
    fn pattern_alone(&self) -> Result<(), Failure> {
        for (n, sub) in self.redis.subs.iter().enumerate() {
            if self.inflight[n] > 0 || !sub.pattern {
                continue;
            }
            if let Some(c) = sub.channels.iter().next() {
                return Err(self.fail(
                    "the pattern only with an admin, and then no course channel",
                    format!(
                        "node {n} holds the pattern and {} course channels ({c}, …)",
                        sub.channels.len()
                    ),
                ));
            }
            if self.admins[n].is_none() {
                return Err(self.fail(
                    "the pattern only with an admin, and then no course channel",
                    format!("node {n} holds the pattern with no admin connected"),
                ));
            }
        }
        Ok(())
    }

    /// Every presence key carries a TTL that outlasts its members (the
    /// contract renews it with every re-score): a key without one outlives a
    /// dead node's viewers for ever, one shorter takes live members with it.
    fn presence_keys_keep_their_ttl(&self) -> Result<(), Failure> {
        let mut sets = presence::lock(&self.redis.presence);
        for (key, k) in sets.keys() {
            let last = k.members.values().max().copied().unwrap_or(0);
            let bad = match k.expires {
                None => Some("no TTL".to_owned()),
                Some(e) if e < last => Some(format!(
                    "expires at t={} before its member's expiry t={}",
                    e.saturating_sub(T0),
                    last.saturating_sub(T0)
                )),
                Some(_) => None,
            };
            if let Some(why) = bad {
                return Err(self.fail(
                    "a presence key's TTL outlasts its members",
                    format!("{key}: {why}"),
                ));
            }
        }
        Ok(())
    }

    fn hash_truth(&self) -> BTreeMap<String, BTreeMap<u32, Value>> {
        let mut truth = BTreeMap::new();
        for (course, h) in &self.redis.hashes {
            let mut board = BTreeMap::new();
            for (section, p) in h {
                if let Ok(s) = Snapshot::parse(p.as_bytes(), Some(course)) {
                    if let Ok(v) = serde_json::from_str(&s.json) {
                        board.insert(*section, v);
                    }
                }
            }
            truth.insert(course.clone(), board);
        }
        truth
    }

    /// Every section's row as the database holds it now.
    fn database_truth(&self) -> BTreeMap<String, BTreeMap<u32, Value>> {
        let mut truth: BTreeMap<String, BTreeMap<u32, Value>> = BTreeMap::new();
        for (course, section, row) in self.db.rows_as_of(self.now) {
            let snap = row_snapshot(course, section, row.version);
            if let Ok(v) = serde_json::from_str(&snap.json) {
                truth
                    .entry(course.to_owned())
                    .or_default()
                    .insert(section, v);
            }
        }
        truth
    }

    /// The first course whose state hash differs from `truth`, shown.
    fn hash_differs(&self, truth: &BTreeMap<String, BTreeMap<u32, Value>>) -> String {
        let hashes = self.hash_truth();
        let courses: BTreeSet<&String> = hashes.keys().chain(truth.keys()).collect();
        let first = courses
            .into_iter()
            .find(|c| hashes.get(*c) != truth.get(*c));
        match first {
            Some(c) => format!(
                "{c}: Redis holds {} the database {}",
                show(hashes.get(c)),
                show(truth.get(c))
            ),
            None => String::new(),
        }
    }

    fn final_round(&mut self) {
        self.log(|| "FINAL ROUND: every section published once more".into());
        for p in &mut self.publishers {
            p.lose_next = false;
        }
        for (c, code) in COURSES.iter().enumerate().take(self.shape.courses) {
            for s in 0..self.shape.sections {
                self.db.commit(self.now, code, s, FINAL_VERSION);
                self.publish(0, c, s, FINAL_VERSION);
                let snap = row_snapshot(code, s, FINAL_VERSION);
                if let Ok(v) = serde_json::from_str(&snap.json) {
                    let code = (*code).to_owned();
                    self.final_truth.entry(code).or_default().insert(s, v);
                }
            }
        }
    }

    /// Every open viewer's board equals `truth`, but the sections
    /// `left_out(node, course, section)`.
    fn converged(
        &self,
        truth: &BTreeMap<String, BTreeMap<u32, Value>>,
        invariant: &'static str,
        left_out: impl Fn(usize, &str, u32) -> bool,
    ) -> Result<(), Failure> {
        let empty = BTreeMap::new();
        for (i, v) in self.viewers.iter().enumerate() {
            let Some(at) = v.at else { continue };
            for c in &v.watching {
                let kept = |b: &BTreeMap<u32, Value>| -> BTreeMap<u32, Value> {
                    b.iter()
                        .filter(|(s, _)| !left_out(at.node, c, **s))
                        .map(|(s, v)| (*s, v.clone()))
                        .collect()
                };
                let want = truth.get(c).unwrap_or(&empty);
                let got = v.boards.get(c);
                if got.map(kept) != Some(kept(want)) {
                    return Err(self.fail(
                        invariant,
                        format!(
                            "viewer {i} on node {} shard {} course {c}: shows {} want {}",
                            at.node,
                            at.shard,
                            show(got),
                            show(Some(want))
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether a board may go from `from` to the lower `to` for a section: a
/// replacement takes it back from a version the database never held, or to
/// the row the replacement carries (read before a newer commit reached a
/// board that never took the forged version: the next repair brings that
/// back).
fn rewind_allowed(
    db: &Database,
    replacements: &BTreeSet<(String, u32, u64)>,
    now: u64,
    (course, section): (&str, u32),
    from: u64,
    to: u64,
) -> bool {
    !db.held(now, course, section, i128::from(from))
        || replacements.contains(&(course.to_owned(), section, to))
}

fn show(b: Option<&BTreeMap<u32, Value>>) -> String {
    match b {
        None => "nothing (no answer)".into(),
        Some(b) => b
            .iter()
            .map(|(s, v)| format!("{s}:v{}", v["version"]))
            .collect::<Vec<_>>()
            .join(","),
    }
}
