//! Shrinking: drops schedule steps while the run still breaks the same
//! invariant, until no single step can go (chunks first, then one by one).

use crate::schedule::{Shape, Step};
use crate::{run, Failure};

/// The indices (into the seed's schedule) of a shortest failing schedule
/// found, and its failure. `budget`: most runs to spend.
pub fn shrink(
    seed: u64,
    shape: Shape,
    steps: &[Step],
    failure: &Failure,
    budget: usize,
) -> (Vec<usize>, Failure) {
    let mut keep: Vec<usize> = (0..steps.len()).collect();
    let mut best = failure.clone();
    let mut runs = 0;
    let mut chunk = keep.len() / 2;
    while chunk >= 1 && runs < budget {
        let mut i = 0;
        let mut progressed = false;
        while i < keep.len() && runs < budget {
            let end = (i + chunk).min(keep.len());
            let trial: Vec<usize> = keep[..i].iter().chain(&keep[end..]).copied().collect();
            let sub: Vec<Step> = trial.iter().map(|&k| steps[k].clone()).collect();
            runs += 1;
            match run(seed, shape, sub, false).failure {
                Some(f) if f.invariant == failure.invariant => {
                    keep = trial;
                    best = f;
                    progressed = true;
                }
                _ => i += chunk,
            }
        }
        if !progressed {
            chunk /= 2;
        }
    }
    (keep, best)
}
