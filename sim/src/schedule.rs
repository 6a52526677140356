//! A run's schedule: every operation and fault at its virtual moment, drawn
//! from the seed up front, so that shrinking can drop events and a replay
//! runs exactly the events kept.

use crate::rng::Rng;
use std::fmt;

/// The deployment's size and the schedule's length.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Nodes.
    pub nodes: usize,
    /// Shard cores per node.
    pub shards: usize,
    /// Courses.
    pub courses: usize,
    /// Sections per course.
    pub sections: u32,
    /// Viewers.
    pub viewers: usize,
    /// Selection API instances publishing.
    pub publishers: usize,
    /// Schedule events.
    pub events: usize,
    /// The busy phase's length (virtual ms).
    pub busy_ms: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            nodes: 2,
            shards: 2,
            courses: 3,
            sections: 4,
            viewers: 6,
            publishers: 3,
            events: 120,
            busy_ms: 8_000,
        }
    }
}

/// Course codes by index.
pub const COURSES: [&str; 4] = ["CS101", "MA-2", "PH.3", "EE4"];

/// One thing that happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A selection API instance publishes a section's state with this version
    /// (compare-and-set, then PUBLISH, pipelined on its own connection).
    Publish {
        publisher: usize,
        course: usize,
        section: u32,
        version: u64,
    },
    /// Fault: a publish of a version the database never holds (a forged or
    /// poisoned snapshot), which only the reconciler takes back.
    Forge {
        publisher: usize,
        course: usize,
        section: u32,
    },
    /// A viewer watches a course.
    Watch { viewer: usize, course: usize },
    /// A viewer unwatches a course.
    Unwatch { viewer: usize, course: usize },
    /// A viewer's socket drops; it connects again to this node and shard.
    Hop {
        viewer: usize,
        node: usize,
        shard: usize,
    },
    /// A viewer stops reading (fault: a viewer that never reads).
    Stall { viewer: usize },
    /// A viewer reads again.
    Unstall { viewer: usize },
    /// Fault: a publisher's next commands take this long to reach Redis
    /// (a message delayed past later ones on another connection).
    SlowPublisher { publisher: usize, ms: u64 },
    /// Fault: a node's links to Redis slow for `ms` (its subscriptions and
    /// its state reads' answers each take `ms` longer).
    SlowLink { node: usize, ms: u64 },
    /// Fault: a publish lost before it reached Redis.
    LosePublish { publisher: usize },
    /// Fault: a node's pub/sub connection reset (in-flight lost).
    ResetPubsub { node: usize },
    /// Fault: Redis answers nothing for this long.
    Freeze { ms: u64 },
    /// Fault: Redis restarts without its keyspace (down this long).
    Restart { ms: u64 },
    /// Fault: a failover to a replica missing the last `lag_ms` of writes.
    Failover { lag_ms: u64 },
    /// Fault: a node killed and started again.
    NodeRestart { node: usize },
    /// An admin opens `/ws/admin` on a node (its firehose turns on), if none is there.
    AdminJoin { node: usize, shard: usize },
    /// The node's admin leaves (its firehose turns off).
    AdminLeave { node: usize },
}

impl Op {
    /// Whether this op is a fault (the convergence bound runs from the last one).
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Op::SlowPublisher { .. }
                | Op::Forge { .. }
                | Op::SlowLink { .. }
                | Op::LosePublish { .. }
                | Op::ResetPubsub { .. }
                | Op::Freeze { .. }
                | Op::Restart { .. }
                | Op::Failover { .. }
                | Op::NodeRestart { .. }
        )
    }

    /// Whether this fault loses writes the state hashes held.
    pub fn loses_writes(&self) -> bool {
        matches!(self, Op::Restart { .. } | Op::Failover { .. })
    }

    /// How long after it starts the fault is over (virtual ms).
    pub fn lasts_ms(&self) -> u64 {
        match self {
            Op::Freeze { ms }
            | Op::Restart { ms }
            | Op::SlowPublisher { ms, .. }
            | Op::SlowLink { ms, .. } => *ms,
            _ => 0,
        }
    }
}

/// An op at its moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Virtual ms from the start.
    pub at: u64,
    /// What happens.
    pub op: Op,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:>6} {:?}", self.at, self.op)
    }
}

/// Which faults a schedule may draw (each its own switch).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Publisher connections slowed (reordering across connections).
    pub slow_publisher: bool,
    /// A node's links slowed (subscriptions and read answers).
    pub slow_link: bool,
    /// Publishes lost.
    pub lose_publish: bool,
    /// Pub/sub connection resets.
    pub reset: bool,
    /// Redis frozen.
    pub freeze: bool,
    /// Restart without the keyspace.
    pub restart: bool,
    /// Failover losing the last writes.
    pub failover: bool,
    /// Node killed and restarted.
    pub node_restart: bool,
    /// Viewers that stop reading.
    pub stall: bool,
    /// Admins that come and go (not a fault: the firehose's subscriptions).
    pub admin: bool,
}

impl Faults {
    /// Every fault on.
    pub const ALL: Faults = Faults {
        slow_publisher: true,
        slow_link: true,
        lose_publish: true,
        reset: true,
        freeze: true,
        restart: true,
        failover: true,
        node_restart: true,
        stall: true,
        admin: true,
    };

    /// Every fault off.
    pub const NONE: Faults = Faults {
        slow_publisher: false,
        slow_link: false,
        lose_publish: false,
        reset: false,
        freeze: false,
        restart: false,
        failover: false,
        node_restart: false,
        stall: false,
        admin: false,
    };

    /// A seed's own mix: each fault on with probability one half.
    pub fn drawn(rng: &mut Rng) -> Faults {
        let mut b = || rng.chance(500);
        Faults {
            slow_publisher: b(),
            slow_link: b(),
            lose_publish: b(),
            reset: b(),
            freeze: b(),
            restart: b(),
            failover: b(),
            node_restart: b(),
            stall: b(),
            admin: b(),
        }
    }
}

/// Draws a schedule from `rng`.
pub fn draw(rng: &mut Rng, shape: &Shape, faults: Faults) -> Vec<Step> {
    let mut versions = vec![vec![0u64; shape.sections as usize]; shape.courses];
    let mut steps = Vec::with_capacity(shape.events);
    // Everyone watches something early, so most events meet viewers.
    for v in 0..shape.viewers {
        steps.push(Step {
            at: rng.below(300),
            op: Op::Watch {
                viewer: v,
                course: rng.below(shape.courses as u64) as usize,
            },
        });
    }
    while steps.len() < shape.events {
        let at = rng.below(shape.busy_ms);
        let viewer = rng.below(shape.viewers as u64) as usize;
        let course = rng.below(shape.courses as u64) as usize;
        let publisher = rng.below(shape.publishers as u64) as usize;
        let node = rng.below(shape.nodes as u64) as usize;
        if faults.admin && rng.chance(40) {
            let op = if rng.chance(600) {
                Op::AdminJoin {
                    node,
                    shard: rng.below(shape.shards as u64) as usize,
                }
            } else {
                Op::AdminLeave { node }
            };
            steps.push(Step { at, op });
            continue;
        }
        let op = match rng.below(100) {
            0..=2 if faults.slow_link => Op::SlowLink {
                node,
                ms: rng.range(20, 400),
            },
            0..=44 => {
                let section = rng.below(u64::from(shape.sections)) as u32;
                let v = &mut versions[course][section as usize];
                // The database's version goes up; a publisher may skip some.
                *v += rng.range(1, 3);
                Op::Publish {
                    publisher,
                    course,
                    section,
                    version: *v,
                }
            }
            45..=59 => Op::Watch { viewer, course },
            60..=66 => Op::Unwatch { viewer, course },
            67..=72 => Op::Hop {
                viewer,
                node,
                shard: rng.below(shape.shards as u64) as usize,
            },
            73..=75 if faults.stall => Op::Stall { viewer },
            76..=78 if faults.stall => Op::Unstall { viewer },
            79..=82 if faults.slow_publisher => Op::SlowPublisher {
                publisher,
                ms: rng.range(50, 1_500),
            },
            83..=85 if faults.lose_publish => Op::LosePublish { publisher },
            86..=89 if faults.reset => Op::ResetPubsub { node },
            90..=92 if faults.freeze => Op::Freeze {
                ms: rng.range(100, 3_000),
            },
            93..=94 if faults.restart => Op::Restart {
                ms: rng.range(50, 1_500),
            },
            95..=96 if faults.failover => Op::Failover {
                lag_ms: rng.range(10, 1_000),
            },
            97..=99 if faults.node_restart => Op::NodeRestart { node },
            _ => continue,
        };
        steps.push(Step { at, op });
    }
    // Stable: equal moments keep their drawing order (versions rise in it).
    steps.sort_by_key(|s| s.at);
    steps
}

/// Adds to `steps` (drawn with a reconciler on) up to three forged
/// publishes, from a stream of their own so the steps drawn before stay as
/// they were.
pub fn forge(seed: u64, shape: &Shape, steps: &mut Vec<Step>) {
    let mut rng = Rng::new(seed ^ 0xf0_46ed);
    for _ in 0..rng.below(4) {
        steps.push(Step {
            at: rng.below(shape.busy_ms),
            op: Op::Forge {
                publisher: rng.below(shape.publishers as u64) as usize,
                course: rng.below(shape.courses as u64) as usize,
                section: rng.below(u64::from(shape.sections)) as u32,
            },
        });
    }
    steps.sort_by_key(|s| s.at);
}
