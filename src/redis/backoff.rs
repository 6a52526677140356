//! Jittered exponential backoff between attempts: capped at 2 s (the
//! contract's cap) for every Redis client, and the one backoff of the
//! product's other retries (the reconciler's, from its interval to 30 s; the JWKS fetch's, 10 s to 30 s).

use std::time::{Duration, Instant};

/// The first retry delay after a failure.
const BACKOFF_START: Duration = Duration::from_millis(50);
/// The longest retry delay (the contract's cap).
pub const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// When the next attempt may be made.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    delay: Duration,
    cap: Duration,
    not_before: Instant,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::capped(BACKOFF_CAP)
    }
}

impl Backoff {
    /// A backoff whose delay never exceeds `cap` (at most the contract's 2 s):
    /// the pub/sub readers retry sooner, so a Redis that answers again after a
    /// freeze is found within the contract's 2 s with time left to reread.
    pub fn capped(cap: Duration) -> Self {
        Backoff::new(BACKOFF_START, cap.min(BACKOFF_CAP))
    }

    /// A backoff from `first` doubling up to `cap`, for retries that are not
    /// a Redis client's (no contract cap applies).
    pub fn new(first: Duration, cap: Duration) -> Self {
        Backoff {
            first: first.min(cap),
            delay: first.min(cap),
            cap,
            not_before: Instant::now(),
        }
    }

    /// Whether an attempt may be made now.
    pub fn ready(&self) -> bool {
        Instant::now() >= self.not_before
    }

    /// How long until the next attempt may be made.
    pub fn wait(&self) -> Duration {
        self.not_before.saturating_duration_since(Instant::now())
    }

    /// Records a failure: the next attempt waits a jittered, doubled delay.
    pub fn failed(&mut self) {
        // Full delay in [delay/2, delay]: nodes that lost Redis together do not
        // all come back in the same millisecond.
        let half = self.delay / 2;
        let jitter = half.mul_f64(fastrand::f64());
        self.not_before = Instant::now() + half + jitter;
        self.delay = (self.delay * 2).min(self.cap);
    }

    /// Records a failure of an attempt that began at `started`: as
    /// [`Backoff::failed`], but the next attempt is never more than the cap
    /// after the start of this one, however long this one took (a connect
    /// or read timeout).
    pub fn failed_after(&mut self, started: Instant) {
        self.failed();
        self.not_before = self.not_before.min(started + self.cap);
    }

    /// Records a success: the next failure starts from the shortest delay.
    pub fn reset(&mut self) {
        self.delay = self.first;
        self.not_before = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let mut b = Backoff::default();
        for _ in 0..20 {
            b.failed();
        }
        assert_eq!(b.delay, BACKOFF_CAP);
        assert!(b.wait() <= BACKOFF_CAP, "{:?}", b.wait());
        b.reset();
        assert!(b.ready());
        let mut c = Backoff::capped(Duration::from_millis(500));
        for _ in 0..20 {
            c.failed();
        }
        assert_eq!(c.delay, Duration::from_millis(500));
        assert!(c.wait() <= Duration::from_millis(500), "{:?}", c.wait());
        let mut d = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        for _ in 0..20 {
            d.failed();
        }
        assert_eq!(d.delay, Duration::from_secs(30));
        d.reset();
        assert_eq!(d.delay, Duration::from_secs(1));
    }

    #[test]
    fn an_attempt_that_took_long_is_retried_within_the_cap_of_its_start() {
        let cap = Duration::from_millis(1900);
        let mut b = Backoff::capped(cap);
        for _ in 0..20 {
            b.failed();
        }
        assert!(b.wait() > Duration::from_millis(900), "{:?}", b.wait());
        // This attempt took 1.5 s: what is left of the cap since its start.
        b.failed_after(Instant::now() - Duration::from_millis(1500));
        assert!(
            b.wait() <= cap - Duration::from_millis(1500),
            "{:?}",
            b.wait()
        );
        // A quick one waits its jittered delay, within the cap.
        b.failed_after(Instant::now());
        assert!(b.wait() >= cap / 2 - Duration::from_millis(50) && b.wait() <= cap);
    }
}
