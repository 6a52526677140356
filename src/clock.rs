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

/// Microseconds since the process started (the node's accept bucket).
pub fn now_us() -> u64 {
    start().elapsed().as_micros() as u64
}

/// The `Instant` of a monotonic millisecond, for timers.
pub fn instant_at(ms: u64) -> Instant {
    start() + Duration::from_millis(ms)
}

/// The grid a shard's timer wakes on (ms). A shard rounds every deadline (a
/// paced course's next token, a sweep, a drain step) up to it, so the tokens
/// of every course due within one round are served by one wake-up, not one
/// each. A snapshot batch wakes a shard only if a course in it may go out
/// (its [`shards::Gate`]) more than a round before the shard's timer reads
/// the inbox anyway. Under a storm a frame so leaves at most one round after
/// its token or its update; a quiet shard has no deadline that near, so an
/// update to it still wakes it at once.
pub const ROUND_MS: u64 = 4;

/// `ms` rounded up to the round grid.
pub fn on_round_grid(ms: u64) -> u64 {
    ms.div_ceil(ROUND_MS) * ROUND_MS
}

/// Wall-clock milliseconds since the Unix epoch (presence scores, `ts`).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
