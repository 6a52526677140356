//! A per-second allowance of log lines for an event that can come in floods
//! (snapshots a hub rejects, snapshots Redis refuses): the first few of each
//! second are logged, the rest counted and summed up in one line when the
//! next second starts, so a flood costs a few lines a second, never one each.

/// The lines an event may log in one second, and what the last second kept back.
#[derive(Debug)]
pub struct LogBudget {
    per_sec: u32,
    /// Start (ms) of the current second, and the events seen in it.
    second: (u64, u32),
}

/// What [`LogBudget::take`] allows for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// Log this event.
    pub log: bool,
    /// The events of the second before that were not logged (to be said in
    /// one line now), if any.
    pub suppressed: Option<u32>,
}

impl LogBudget {
    /// `per_sec` lines a second, the first second starting at `now_ms`.
    pub fn new(per_sec: u32, now_ms: u64) -> LogBudget {
        LogBudget {
            per_sec,
            second: (now_ms, 0),
        }
    }

    /// One event at `now_ms` (monotonic ms).
    pub fn take(&mut self, now_ms: u64) -> Allowance {
        let mut suppressed = None;
        if now_ms.saturating_sub(self.second.0) >= 1_000 {
            suppressed = self.second.1.checked_sub(self.per_sec).filter(|n| *n > 0);
            self.second = (now_ms, 0);
        }
        self.second.1 = self.second.1.saturating_add(1);
        Allowance {
            log: self.second.1 <= self.per_sec,
            suppressed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_the_first_of_each_second_and_sums_up_the_rest() {
        let mut b = LogBudget::new(5, 1_000);
        let logged = (0..100).filter(|i| b.take(1_000 + i).log).count();
        assert_eq!(logged, 5);
        let next = b.take(2_000);
        assert_eq!(
            next,
            Allowance {
                log: true,
                suppressed: Some(95)
            }
        );
        // A quiet second after it has nothing to sum up.
        for i in 0..4 {
            assert!(b.take(2_001 + i).log);
        }
        assert_eq!(b.take(3_500).suppressed, None);
    }
}
