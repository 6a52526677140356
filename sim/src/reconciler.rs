//! The simulated reconciler (contract §11): the product's own decision book
//! (`seatboard::reconcile::decide::Book`) fed the simulated database's rows,
//! read through a replica that lags, on the reconciler's schedule (an
//! incremental check every interval, a sweep every few); its lookups and
//! repairs travel to the simulated Redis on a connection of their own.

use crate::database::{row_snapshot, Database};
use crate::rng::Rng;
use seatboard::reconcile::decide::{Book, Candidate, Field, Outcome};
use shards::Snapshot;

/// Between the end of one check and the start of the next (virtual ms).
pub const INTERVAL_MS: u64 = 500;
/// Missing or behind this long before a section is written.
pub const GRACE_MS: u64 = 1_000;
/// Ahead this long, with the same field, before a section is replaced.
pub const AHEAD_MS: u64 = 2_500;
/// An incremental check reads the rows changed since this long before the
/// newest it saw.
pub const OVERLAP_MS: u64 = 1_000;
/// Every this many checks is a sweep.
pub const SWEEP_EVERY: u64 = 8;
/// The replica's longest lag behind the primary.
pub const MAX_LAG_MS: u64 = 300;

/// Whether a seed runs a reconciler, and its replica's lag: drawn from a
/// stream of its own, so the rest of a seed's schedule is the same either way.
pub fn drawn(seed: u64) -> Option<u64> {
    let mut rng = Rng::new(seed ^ 0x0db0_7e55_0db0_7e55);
    rng.chance(500).then(|| rng.below(MAX_LAG_MS + 1))
}

/// The reconciler's state between events.
#[derive(Debug)]
pub struct Reconciler {
    book: Book,
    /// The replica's lag behind the primary (ms).
    pub lag_ms: u64,
    checks: u64,
    /// The newest `updated_at` an incremental check has read.
    newest: Option<u64>,
    want_sweep: bool,
    /// FIFO arrival of the last command on its Redis connection.
    pub link: u64,
    /// Delays on its connection, from a stream of its own (a run without a
    /// reconciler draws exactly what it drew before one existed).
    pub rng: Rng,
}

impl Reconciler {
    /// A reconciler whose replica lags `lag_ms`, its delays drawn from `seed`.
    pub fn new(seed: u64, lag_ms: u64) -> Reconciler {
        Reconciler {
            book: Book::new(GRACE_MS, AHEAD_MS),
            lag_ms,
            checks: 0,
            newest: None,
            want_sweep: false,
            link: 0,
            rng: Rng::new(seed.rotate_left(29) ^ 0x2ec0),
        }
    }

    /// One check's rows (read from the replica at `now`) and what to look up.
    pub fn plan(&mut self, db: &Database, now: u64) -> Vec<Candidate> {
        let sweep = self.checks % SWEEP_EVERY == 0 || std::mem::take(&mut self.want_sweep);
        self.checks += 1;
        let bound = if sweep {
            None
        } else {
            self.newest.map(|n| n.saturating_sub(OVERLAP_MS))
        };
        let mut rows: Vec<Snapshot> = Vec::new();
        for (course, section, row) in db.rows_as_of(now.saturating_sub(self.lag_ms)) {
            if bound.is_none_or(|b| row.at > b) {
                self.newest = Some(self.newest.map_or(row.at, |n| n.max(row.at)));
                rows.push(row_snapshot(course, section, row.version));
            }
        }
        self.book.plan(rows, sweep)
    }

    /// The candidates with the fields Redis held for them, judged at `now`.
    pub fn judge(&mut self, looked: Vec<(Candidate, Field)>, now: u64) -> Outcome {
        let out = self.book.judge(looked, now);
        self.want_sweep |= out.want_sweep;
        out
    }

    /// Sections written or replaced: Redis holds their rows now.
    pub fn written(&mut self, snaps: &[Snapshot]) {
        self.book.written(snaps);
    }
}
