//! Known bugs planted behind a test-only switch (cargo feature
//! `planted-bugs`), so the simulator's meta-test can show that it catches
//! each; without the feature every check is a constant `false`.

/// A planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A state read takes a section backwards (its version rule ignored).
    ReadBackwards = 1,
    /// A state read asked before the course's subscription is confirmed.
    ReadBeforeConfirmed = 2,
    /// No reread of the boards after the pub/sub connection came back.
    NoRereadAfterReconnect = 3,
    /// Presence re-scored without renewing its key's TTL (`PEXPIRE`).
    RefreshWithoutTtl = 4,
    /// The firehose's pattern subscribed without dropping the per-course ones.
    FirehoseKeepsNarrow = 5,
    /// A live snapshot dropped as stale or a duplicate still counted for admins.
    AdminCountsDuplicates = 6,
    /// A field the reconciler replaced, read at a reread, taken only if newer.
    ReadIgnoresReplace = 7,
}

#[cfg(feature = "planted-bugs")]
thread_local! {
    static ACTIVE: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Plants `bug` (or none) in this thread's product code.
#[cfg(feature = "planted-bugs")]
pub fn plant(bug: Option<Bug>) {
    ACTIVE.with(|a| a.set(bug.map_or(0, |b| b as u8)));
}

/// Whether `bug` is planted in this thread.
#[inline]
pub fn active(bug: Bug) -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        ACTIVE.with(|a| a.get() == bug as u8)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = bug;
        false
    }
}
