//! When the reconciler's loop does what, as a pure rule with no clock and
//! no I/O (instants are passed in): an incremental check every interval, a
//! sweep at its own deadline (the loop wakes at the earlier of the two, and
//! a sweep stands for the incremental check it falls on), the retry of a
//! failed check after its backoff (a sweep falling due meanwhile waits for
//! it: the database is never asked sooner), and a `PING` when Redis has not
//! been asked anything for [`PING_AFTER`], so an unreachable Redis shows on
//! `/healthz` while the database is quiet.

use std::time::{Duration, Instant};

/// How long Redis may go unasked before the loop sends it a `PING`. The
/// contract's "a quiet database costs Redis nothing" is about state reads
/// (no `HGET` of a row already found at its version); one `PING` every 5 s
/// is what lets `redis` on `/healthz` say, within 10 s, that Redis is gone.
pub const PING_AFTER: Duration = Duration::from_secs(5);

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A check now (`sweep`: a full one).
    Check {
        /// Every row, not only those changed lately.
        sweep: bool,
    },
    /// A `PING` to Redis now.
    Ping,
    /// Nothing is due before this instant.
    Sleep(Instant),
}

/// The loop's deadlines.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The next incremental check (or the retry of a failed check).
    next_check: Instant,
    /// The next sweep.
    next_sweep: Instant,
    /// The last check failed: the next waits for `next_check`, its backoff.
    retrying: bool,
    /// When Redis was last asked anything, answered or not (None: never).
    redis_at: Option<Instant>,
}

impl Schedule {
    /// The schedule at start (`now`): the first check, a sweep, is due at once.
    pub fn new(now: Instant) -> Schedule {
        Schedule {
            next_check: now,
            next_sweep: now,
            retrying: false,
            redis_at: None,
        }
    }

    /// What is due at `now`: a check once the incremental's or the sweep's
    /// time has come (after a failure, the retry's time alone), a sweep when
    /// the sweep's has; else a `PING` once Redis has gone [`PING_AFTER`]
    /// unasked; else a sleep until the earliest of those.
    pub fn step(&self, now: Instant) -> Step {
        let check_at = if self.retrying {
            self.next_check
        } else {
            self.next_check.min(self.next_sweep)
        };
        if now >= check_at {
            return Step::Check {
                sweep: now >= self.next_sweep,
            };
        }
        let ping_at = self.redis_at.map_or(now, |t| t + PING_AFTER);
        if now >= ping_at {
            return Step::Ping;
        }
        Step::Sleep(check_at.min(ping_at))
    }

    /// A check that began at `started` and succeeded at `ended`: the next
    /// incremental check `interval` after its end; after a sweep, the next
    /// sweep `sweep_every` after its start (so the time between two sweeps
    /// is never longer than the wait), yet never before the next incremental
    /// check would run, or the sweep's own wait if shorter (a sweep longer
    /// than its wait does not start the next one back to back). `want_sweep`: the next check is a sweep. The
    /// waits come jittered.
    pub fn checked(
        &mut self,
        started: Instant,
        ended: Instant,
        sweep: bool,
        want_sweep: bool,
        interval: Duration,
        sweep_every: Duration,
    ) {
        self.retrying = false;
        self.next_check = ended + interval;
        if sweep {
            let floor = ended + interval.min(sweep_every);
            self.next_sweep = (started + sweep_every).max(floor);
        }
        if want_sweep {
            self.next_sweep = self.next_sweep.min(self.next_check);
        }
    }

    /// A check failed at `now`: the next is tried `wait` later (its backoff).
    pub fn failed(&mut self, now: Instant, wait: Duration) {
        self.retrying = true;
        self.next_check = now + wait;
    }

    /// Redis was asked something at `now` (a check's reads or writes, or a `PING`).
    pub fn asked_redis(&mut self, now: Instant) {
        self.redis_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs the schedule from `t0` for `until`, every check taking `took`
    /// and asking Redis; the instants (ms from `t0`) of the sweeps, of the
    /// incremental checks, and of the pings.
    fn simulate(
        interval: Duration,
        sweep_every: Duration,
        took: Duration,
        until: Duration,
    ) -> (Vec<u128>, Vec<u128>, Vec<u128>) {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0);
        let (mut sweeps, mut checks, mut pings) = (vec![], vec![], vec![]);
        let mut now = t0;
        while now < t0 + until {
            let at = (now - t0).as_millis();
            match s.step(now) {
                Step::Sleep(next) => {
                    assert!(next > now, "a sleep into the past at {at}");
                    now = next;
                }
                Step::Check { sweep } => {
                    let list = if sweep { &mut sweeps } else { &mut checks };
                    list.push(at);
                    let started = now;
                    now += took;
                    s.asked_redis(now);
                    s.checked(started, now, sweep, false, interval, sweep_every);
                }
                Step::Ping => {
                    pings.push(at);
                    s.asked_redis(now);
                }
            }
        }
        (sweeps, checks, pings)
    }

    fn gaps(at: &[u128]) -> Vec<u128> {
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn a_sweep_starts_at_its_own_deadline_not_at_the_next_incremental_check() {
        // --sweep-s 3 --interval-ms 2000 (the audit's run: gaps of 3.7-3.9 s).
        let (sweeps, checks, _) = simulate(ms(2000), ms(3000), ms(50), ms(20_000));
        assert_eq!(sweeps[0], 0, "the first check is a sweep");
        assert!(sweeps.len() >= 6, "{sweeps:?}");
        assert!(gaps(&sweeps).iter().all(|g| *g == 3000), "{sweeps:?}");
        // Incremental checks still come an interval after the check before.
        let mut all: Vec<u128> = sweeps.iter().chain(&checks).copied().collect();
        all.sort();
        assert!(gaps(&all).iter().all(|g| *g <= 2050), "{all:?}");
        assert!(!checks.is_empty());
        // A sweep stands for the incremental check it falls on.
        let (sweeps, checks, _) = simulate(ms(1000), ms(2000), ms(0), ms(10_000));
        assert_eq!(sweeps, [0, 2000, 4000, 6000, 8000]);
        assert_eq!(checks, [1000, 3000, 5000, 7000, 9000]);
    }

    #[test]
    fn a_sweep_longer_than_its_wait_is_not_followed_back_to_back() {
        let (sweeps, checks, _) = simulate(ms(1000), ms(2000), ms(2500), ms(12_000));
        let all = {
            let mut a: Vec<u128> = sweeps.iter().chain(&checks).copied().collect();
            a.sort();
            a
        };
        assert!(gaps(&all).iter().all(|g| *g >= 3500), "{all:?}");
        assert!(
            checks.is_empty(),
            "every check is an overdue sweep: {checks:?}"
        );
    }

    #[test]
    fn a_failed_check_waits_for_its_backoff_even_when_a_sweep_falls_due() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0);
        assert_eq!(s.step(t0), Step::Check { sweep: true });
        s.asked_redis(t0);
        s.checked(t0, t0, true, false, ms(2000), ms(3000));
        assert_eq!(s.step(t0 + ms(2000)), Step::Check { sweep: false });
        s.asked_redis(t0 + ms(2000));
        s.failed(t0 + ms(2000), ms(8000));
        // The sweep's deadline (3 s) passes inside the backoff: no check yet.
        assert_eq!(s.step(t0 + ms(3000)), Step::Sleep(t0 + ms(7000)));
        assert_eq!(s.step(t0 + ms(7000)), Step::Ping);
        s.asked_redis(t0 + ms(7000));
        assert_eq!(s.step(t0 + ms(7001)), Step::Sleep(t0 + ms(10_000)));
        // The retry is the overdue sweep.
        assert_eq!(s.step(t0 + ms(10_000)), Step::Check { sweep: true });
        // want_sweep: the next check, at the interval, is a sweep.
        s.checked(
            t0 + ms(10_000),
            t0 + ms(10_000),
            true,
            true,
            ms(2000),
            ms(3000),
        );
        assert_eq!(s.step(t0 + ms(11_999)), Step::Sleep(t0 + ms(12_000)));
        assert_eq!(s.step(t0 + ms(12_000)), Step::Check { sweep: true });
    }

    #[test]
    fn redis_unasked_for_5_s_is_pinged_even_when_checks_are_rarer() {
        // A quiet database: checks every 2 s ask Redis nothing.
        let t0 = Instant::now();
        let mut s = Schedule::new(t0);
        let mut pings = vec![];
        let mut now = t0;
        while now < t0 + ms(20_000) {
            match s.step(now) {
                Step::Sleep(next) => now = next,
                Step::Check { sweep } => {
                    // Only the first sweep reads Redis.
                    if now == t0 {
                        s.asked_redis(now);
                    }
                    s.checked(now, now, sweep, false, ms(2000), ms(300_000));
                }
                Step::Ping => {
                    pings.push((now - t0).as_millis());
                    s.asked_redis(now);
                }
            }
        }
        assert_eq!(pings, [5000, 10_000, 15_000]);
        // Never asked at all (an empty table): pinged after the first check.
        let mut s = Schedule::new(t0);
        s.checked(t0, t0, true, false, ms(2000), ms(300_000));
        assert_eq!(s.step(t0), Step::Ping);
        // An interval longer than the ping's: the loop wakes for the ping.
        let (_, _, pings) = simulate(ms(60_000), ms(300_000), ms(0), ms(30_000));
        assert_eq!(pings, [5000, 10_000, 15_000, 20_000, 25_000]);
    }
}
