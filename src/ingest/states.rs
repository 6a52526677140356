//! Where the state hashes are read: Redis for `serve` (pipelined, one
//! pipeline per primary in a cluster), the bus's table for `demo`. Only the
//! state reader thread (`reader.rs`) calls a store, so a read that takes a
//! round trip (or a frozen Redis's timeout) never holds up a snapshot.

use crate::redis::commands::Commands;
use crate::redis::Redis;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// One round trip as measured: the node it was measured to (`None` for a
/// standalone Redis), and its seconds (`None`: no answer).
pub type RoundTrip = (Option<String>, Option<f64>);

/// The state hashes and what else the state reader asks of Redis.
pub trait StateStore: Send {
    /// The state hashes of `courses` (one payload per section each), in order,
    /// read as one pipeline; `None` when the read failed.
    fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>>;
    /// Every valid course code with a state hash; `None` when the scan failed.
    fn scan(&mut self) -> Option<Vec<String>>;
    /// The round trip to each node that holds state, measured now.
    fn ping(&mut self) -> Vec<RoundTrip>;
    /// Forgets any backoff from an outage: Redis is known to answer again.
    fn retry_now(&mut self) {}
}

/// The state hashes in Redis, through the bounded command client.
pub struct RedisStates {
    link: Commands,
    /// The round-trip probe's own connection: a node that does not answer
    /// it never costs the reads their connection.
    probe: Commands,
    prefix: String,
}

impl RedisStates {
    /// A store on `redis` with keys `<state_prefix><course>`; connects lazily.
    pub fn new(redis: &Arc<Redis>, state_prefix: &str) -> Self {
        RedisStates {
            link: Commands::new(redis, "state reads"),
            probe: Commands::new(redis, "round-trip probe"),
            prefix: state_prefix.to_owned(),
        }
    }
}

impl StateStore for RedisStates {
    fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>> {
        let names: Vec<&str> = courses.iter().map(|c| &**c).collect();
        super::scan::read_states(&mut self.link, &self.prefix, &names)
    }

    fn retry_now(&mut self) {
        self.link.retry_now();
    }

    fn scan(&mut self) -> Option<Vec<String>> {
        match super::scan::scan_courses(&mut self.link, &self.prefix) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "course scan failed");
                None
            }
        }
    }

    fn ping(&mut self) -> Vec<RoundTrip> {
        let ping = ::redis::cmd("PING");
        let nodes = match self.probe.slot_map() {
            Ok(Some(map)) => map.primaries(),
            Ok(None) => {
                let t = Instant::now();
                let ok = self.probe.query::<String>(&ping).is_ok();
                return vec![(None, ok.then(|| t.elapsed().as_secs_f64()))];
            }
            Err(_) => {
                if self.probe.redis().mode() == Some(crate::redis::Mode::Cluster) {
                    self.probe.redis().health.nodes_up.store(0, Relaxed);
                }
                return Vec::new();
            }
        };
        let rtt: Vec<RoundTrip> = nodes
            .iter()
            .map(|node| {
                let t = Instant::now();
                let ok = self.probe.query_on::<String>(node, &ping).is_ok();
                (
                    Some(format!("{}:{}", node.0, node.1)),
                    ok.then(|| t.elapsed().as_secs_f64()),
                )
            })
            .collect();
        let up = rtt.iter().filter(|(_, t)| t.is_some()).count();
        self.probe.redis().health.nodes_up.store(up as u64, Relaxed);
        rtt
    }
}
