//! The shard's connection deadlines by kind, in one table: each kind's next
//! deadline, set or stopped where its source changes, and the earliest of them
//! for [`crate::Shard::poll_timeout`]. (Course renders keep their own queue:
//! there is one deadline per course.)

/// A kind of deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The once-a-second sweep for pings, silence and slow consumers (while
    /// the shard has connections).
    Sweep = 0,
    /// The next drain moment of a connection (hint, then close 1012).
    Drain = 1,
    /// The next close grace to end (the socket is cut).
    Cut = 2,
    /// The next seeded course whose watch answers wait for a first count
    /// to give up waiting ([`crate::ShardConfig::count_patience_ms`]).
    Count = 3,
    /// The next held watch-answer count to go with the shard's estimate
    /// ([`crate::ShardConfig::count_hold_ms`]).
    Hold = 4,
}

/// The next deadline (ms) of each [`Timer`], if it is running.
#[derive(Debug, Default)]
pub(crate) struct TimerTable {
    data: [Option<u64>; 5],
}

impl TimerTable {
    /// Runs `timer` until `at`.
    pub fn set(&mut self, timer: Timer, at: u64) {
        self.data[timer as usize] = Some(at);
    }

    /// Stops `timer`.
    pub fn stop(&mut self, timer: Timer) {
        self.data[timer as usize] = None;
    }

    /// Runs `timer` until `at`, or stops it (`None`).
    pub fn set_or_stop(&mut self, timer: Timer, at: Option<u64>) {
        self.data[timer as usize] = at;
    }

    /// When `timer` fires, if it runs.
    pub fn get(&self, timer: Timer) -> Option<u64> {
        self.data[timer as usize]
    }

    /// Whether `timer` runs and its time has come at `now_ms`.
    pub fn is_expired(&self, timer: Timer, now_ms: u64) -> bool {
        self.get(timer).is_some_and(|at| now_ms >= at)
    }

    /// The earliest running deadline.
    pub fn next_timeout(&self) -> Option<u64> {
        self.data.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{Timer, TimerTable};

    #[test]
    fn the_earliest_running_timer_is_next() {
        let mut t = TimerTable::default();
        assert_eq!(t.next_timeout(), None);
        t.set(Timer::Sweep, 1_000);
        t.set(Timer::Cut, 700);
        assert_eq!(t.next_timeout(), Some(700));
        assert!(t.is_expired(Timer::Cut, 700) && !t.is_expired(Timer::Sweep, 999));
        t.stop(Timer::Cut);
        t.set_or_stop(Timer::Drain, Some(1_500));
        assert_eq!(t.next_timeout(), Some(1_000));
        t.set_or_stop(Timer::Sweep, None);
        assert_eq!(t.next_timeout(), Some(1_500));
        assert!(!t.is_expired(Timer::Sweep, u64::MAX));
    }
}
