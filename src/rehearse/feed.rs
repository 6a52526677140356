//! The rehearsal's publisher: Zipf-skewed snapshots of the rehearsal courses
//! through the product's `Publisher` (so it writes exactly as the selection
//! API must), each with `ts` and a version `ts * 1000 + k` that only grows,
//! and the last state queued per section for the board check.

use crate::publisher::Publisher;
use loadgen::{digest, zipf_cdf, zipf_pick};
use shards::Snapshot;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sections per rehearsal course.
pub const SECTIONS: u32 = 6;

/// What was published, per course, per section: (version, seats_taken).
pub struct Feed {
    names: Vec<Arc<str>>,
    cdf: Vec<f64>,
    rng: fastrand::Rng,
    last: Vec<BTreeMap<u32, (u64, u32)>>,
    /// Snapshots queued.
    pub sent: u64,
}

impl Feed {
    /// A feed over `names` with Zipf skew `skew`.
    pub fn new(names: &[String], skew: f64) -> Feed {
        Feed {
            names: names.iter().map(|n| Arc::from(n.as_str())).collect(),
            cdf: zipf_cdf(names.len().max(1), skew),
            rng: fastrand::Rng::new(),
            last: vec![BTreeMap::new(); names.len()],
            sent: 0,
        }
    }

    /// Queues one snapshot of a Zipf-drawn course.
    pub fn publish_one(&mut self, publisher: &Publisher, now_ms: u64) {
        let c = zipf_pick(&self.cdf, &mut self.rng);
        let section = self.rng.u32(0..SECTIONS);
        let total = 40 + section * 10;
        let prev = self.last[c].get(&section).copied();
        let version = prev.map_or(0, |p| p.0 + 1).max(now_ms * 1000);
        let taken = prev.map_or(0, |p| (p.1 + 1).min(total));
        let s = Snapshot::build(
            Arc::clone(&self.names[c]),
            section,
            total,
            taken,
            None,
            Some(version),
            Some(now_ms),
        );
        if publisher.publish(s) {
            self.last[c].insert(section, (version, taken));
            self.sent += 1;
        }
    }

    /// The digest a true board of course `c` has.
    pub fn expected(&self, c: usize) -> u64 {
        let board: Vec<(u32, u64, u32)> =
            self.last[c].iter().map(|(&s, &(v, t))| (s, v, t)).collect();
        digest(&board)
    }
}
