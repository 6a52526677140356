//! seatboard's deterministic simulator: a whole deployment (simulated Redis,
//! nodes running the product's real ingest router, classic subscription
//! bookkeeping, shard cores and presence worker, selection API instances
//! committing to a database and publishing out of order, the reconciler's
//! real decision book on half the seeds, viewers, admins) in one thread on a virtual
//! clock, driven by a seed. A failure names the invariant it broke, and is
//! shrunk to the shortest schedule that still breaks it and replayed from
//! its seed.

pub mod adapter;
pub mod database;
pub mod missed;
pub mod node;
pub mod presence;
pub mod reconciler;
pub mod redis;
pub mod rng;
pub mod schedule;
pub mod shrink;
pub mod viewer;
pub mod world;

use rng::Rng;
use schedule::{Faults, Shape, Step};
use std::panic::{catch_unwind, AssertUnwindSafe};
pub use world::Failure;

/// One seed's schedule: its shape, faults and steps, all drawn from the seed.
pub fn schedule(seed: u64) -> (Shape, Vec<Step>) {
    let mut rng = Rng::new(seed);
    let shape = Shape::default();
    let faults = Faults::drawn(&mut rng);
    let mut steps = schedule::draw(&mut rng, &shape, faults);
    // A forged version that Redis then loses (a restart, a failover) before
    // the reconciler replaced it stays on the boards that took it: nothing
    // holds it any more for the reconciler to find (the database never did).
    let lossy = steps.iter().any(|s| s.op.loses_writes());
    if reconciler::drawn(seed).is_some() && !lossy {
        schedule::forge(seed, &shape, &mut steps);
    }
    (shape, steps)
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Events the world handled.
    pub events: u64,
    /// The invariant broken, if any.
    pub failure: Option<Failure>,
}

/// Runs `steps` under `seed` (`trace`: print every event); a panic anywhere
/// in the product is a failure too.
pub fn run(seed: u64, shape: Shape, steps: Vec<Step>, trace: bool) -> Outcome {
    let mut events = 0;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut w = world::World::new(seed, shape, steps, trace);
        let r = w.run();
        events = w.events;
        r
    }));
    let failure = match r {
        Ok(Ok(())) => None,
        Ok(Err(f)) => Some(f),
        Err(p) => Some(Failure {
            invariant: "no panic",
            detail: p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
            at: 0,
        }),
    };
    Outcome { events, failure }
}

/// Runs one seed's whole schedule.
pub fn run_seed(seed: u64, trace: bool) -> Outcome {
    let (shape, steps) = schedule(seed);
    run(seed, shape, steps, trace)
}
