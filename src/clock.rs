//! The process clock: monotonic milliseconds for the shards, Unix milliseconds for Redis.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

static START: OnceLock<Instant> = OnceLock::new();

fn start() -> Instant {
    *START.get_or_init(Instant::now)
}

/// Milliseconds since the process started (what shards are fed).
pub fn now_ms() -> u64 {
    start().elapsed().as_millis() as u64
}

/// The `Instant` of a monotonic millisecond, for timers.
pub fn instant_at(ms: u64) -> Instant {
    start() + Duration::from_millis(ms)
}

/// Wall-clock milliseconds since the Unix epoch (presence scores, `ts`).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
