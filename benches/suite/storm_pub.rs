//! The storm publisher of the long scenarios (fleet, soak): snapshots of
//! Zipf-picked courses and uniform sections at a rate that may change from
//! one pass to the next, never catching up after a stall (Redis down or
//! frozen: the storm moves on), into any [`Sink`].

use crate::publish::SelectionApi;
use loadgen::{now_us, zipf_cdf, zipf_pick};
use std::time::Instant;

/// What a storm publishes through: the bench's RESP publisher on one Redis,
/// or a cluster-aware one.
pub trait Sink: Send {
    /// Queues the next version of one section.
    fn queue(&mut self, course: usize, section: u32, t_us: u64);
    /// Writes what is queued, retrying until Redis takes it.
    fn flush(&mut self);
    /// Per course, per section: the last version published.
    fn versions(&self) -> Vec<Vec<u64>>;
    /// Courses published to.
    fn courses(&self) -> usize;
    /// Snapshots published.
    fn published(&self) -> u64;
    /// Version 1 of every section of every course.
    fn seed(&mut self, sections: u32) {
        for c in 0..self.courses() {
            for s in 0..sections {
                self.queue(c, s, now_us());
            }
            if c % 50 == 49 {
                self.flush();
            }
        }
        self.flush();
    }
}

impl Sink for SelectionApi {
    fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        SelectionApi::queue(self, course, section, t_us);
    }
    fn flush(&mut self) {
        SelectionApi::flush(self);
    }
    fn versions(&self) -> Vec<Vec<u64>> {
        SelectionApi::versions(self)
    }
    fn courses(&self) -> usize {
        self.courses.len()
    }
    fn published(&self) -> u64 {
        self.published
    }
    fn seed(&mut self, _sections: u32) {
        SelectionApi::seed(self);
    }
}

/// The storm's pace: which snapshots are due since the last pass.
pub struct StormPub {
    cdf: Vec<f64>,
    rng: fastrand::Rng,
    sections: u32,
    /// Snapshots due and not yet queued (fractions carry over).
    owed: f64,
    last: Instant,
}

impl StormPub {
    /// A storm over `courses` courses (Zipf `skew`) of `sections` sections
    /// each, its picks from `seed`.
    pub fn new(courses: usize, skew: f64, sections: u32, seed: u64) -> StormPub {
        StormPub {
            cdf: zipf_cdf(courses, skew),
            rng: fastrand::Rng::with_seed(seed),
            sections,
            owed: 0.0,
            last: Instant::now(),
        }
    }

    /// Queues what `rate` snapshots/s made due since the last pass (at most
    /// a quarter of a second's worth) and writes it.
    pub fn publish<S: Sink + ?Sized>(&mut self, sink: &mut S, rate: f64) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.owed = (self.owed + rate * dt).min(rate * 0.25);
        let t = now_us();
        while self.owed >= 1.0 {
            let course = zipf_pick(&self.cdf, &mut self.rng);
            sink.queue(course, self.rng.u32(0..self.sections), t);
            self.owed -= 1.0;
        }
        sink.flush();
    }

    /// A pass while paused: nothing becomes due.
    pub fn hold(&mut self) {
        self.owed = 0.0;
        self.last = Instant::now();
    }
}
