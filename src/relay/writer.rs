//! The Redis writer: one thread that takes what the pending map holds, a batch
//! at a time, and writes it the section 2 way through the `Publisher`'s write
//! path (the compare-and-set script by `EVALSHA`, `NOSCRIPT` loaded again,
//! hash before channel, `PUBLISH`, or `SPUBLISH` per slot owner in a sharded
//! cluster), pipelined. A batch that fails is held again; Redis is then
//! retried with jittered backoff capped at 2 s. Redis is pinged every second
//! while idle. Every call is bounded by the Redis layer's timeouts (a
//! pipeline fails at its first reply not read in time), and each call is
//! also marked in [`Shared`], which shows Redis down once a call has waited
//! [`super::metrics::STALL`], whatever it waits on; a batch is bounded in
//! bytes as well as in snapshots ([`BATCH_BYTES`]).

use super::metrics::Shared;
use crate::publisher::write;
use crate::redis::backoff::Backoff;
use crate::redis::commands::Commands;
use crate::redis::Error;
use shards::Snapshot;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most snapshots written in one pipeline.
pub const BATCH: usize = 256;
/// About the most bytes of snapshots written in one pipeline (at least one
/// snapshot): what a write holds beyond the pending map stays small.
pub const BATCH_BYTES: usize = 1 << 20;
/// How long Redis may go without a command before the writer pings it.
const IDLE_PING: Duration = Duration::from_secs(1);
/// Pipelines start at most this often while less than a batch is held: at
/// 15,000 snapshots/s that is ~30 to a round trip instead of one, a fraction
/// of Redis's and the relay's CPU per snapshot, and a hot section coalesces
/// into one write per interval. (Boards render every 200 ms.)
pub const LINGER: Duration = Duration::from_millis(2);

/// Whether a failed call failed on the way to Redis (connect, timeout,
/// reset, backoff) rather than by Redis's own error reply: then the
/// snapshots are held, never dropped.
pub fn is_io(error: &str) -> bool {
    let e = error.to_ascii_lowercase();
    [
        "os error",
        "timed out",
        "timeout",
        "connect",
        "broken pipe",
        "reset",
        "eof",
        "redis down",
        "not connected",
        "io error",
        "clusterdown",
        "tryagain",
        "loading",
        "masterdown",
        "readonly",
    ]
    .iter()
    .any(|m| e.contains(m))
}

/// [`is_io`] for a typed error: no connection (backoff, connect) or the
/// driver's I/O failure.
fn held(e: &Error) -> bool {
    e.is_unreachable() || is_io(&e.to_string())
}

/// Where the writer writes.
pub struct Writer {
    /// The command client.
    pub link: Commands,
    /// `--channel-prefix`.
    pub channel_prefix: String,
    /// `--state-prefix`.
    pub state_prefix: String,
    /// What the threads share.
    pub shared: Arc<Shared>,
}

/// What the writer is told to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Write what arrives.
    Run,
    /// Write what is held, then return.
    Drain,
}

impl Writer {
    fn ping(&mut self) -> bool {
        self.link.retry_now();
        self.shared.call_started();
        let up = self
            .link
            .query::<String>(&::redis::cmd("PING"))
            .is_ok_and(|r| r == "PONG");
        self.shared.call_ended();
        self.shared.redis_up.store(up, Relaxed);
        up
    }

    fn write(&mut self, batch: &[Snapshot]) -> Result<(), Error> {
        self.shared.call_started();
        let r = write(
            &mut self.link,
            &self.channel_prefix,
            &self.state_prefix,
            batch,
        );
        self.shared.call_ended();
        r
    }

    /// Writes one batch taken from the map and reports it. False when Redis
    /// did not answer (the batch is held again).
    fn write_batch(&mut self, batch: Vec<Snapshot>) -> bool {
        match self.write(&batch) {
            Ok(()) => {
                self.shared.redis_up.store(true, Relaxed);
                self.shared.pending().done(&batch, Instant::now());
                true
            }
            Err(e) if !held(&e) && self.ping() => {
                // Redis answers but refused the batch: write one by one, and
                // drop (counted) what Redis refuses on its own. Should Redis
                // stop answering meanwhile, the rest is held again.
                tracing::debug!(error = %e, "batch refused; writing one by one");
                let mut rest = batch.into_iter();
                while let Some(s) = rest.next() {
                    self.link.retry_now();
                    match self.write(std::slice::from_ref(&s)) {
                        Ok(()) => self
                            .shared
                            .pending()
                            .done(std::slice::from_ref(&s), Instant::now()),
                        Err(e) if held(&e) => {
                            let mut back = vec![s];
                            back.extend(rest);
                            self.shared.pending().give_back(back);
                            self.shared.redis_up.store(false, Relaxed);
                            return false;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, course = %s.course, section = s.section, "Redis refused a snapshot; dropped");
                            self.shared.pending().refused(&s);
                        }
                    }
                }
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, held = batch.len(), "Redis write failed; holding");
                self.shared.redis_up.store(false, Relaxed);
                self.shared.pending().give_back(batch);
                false
            }
        }
    }

    /// Runs until `phase` says drain and nothing is held, or `deadline`
    /// passes while draining.
    pub fn run(&mut self, phase: impl Fn() -> Phase, deadline: impl Fn() -> Option<Instant>) {
        let mut backoff = Backoff::default();
        let mut last_contact = Instant::now() - IDLE_PING;
        let mut down = false;
        let mut last_write = Instant::now() - LINGER;
        loop {
            let draining = phase() == Phase::Drain;
            if draining && deadline().is_some_and(|d| Instant::now() >= d) {
                return;
            }
            if down && !backoff.ready() {
                let wait = backoff.wait().min(Duration::from_millis(100));
                let p = self.shared.pending();
                let _ = self.shared.work.wait_timeout(p, wait);
                continue;
            }
            let since = last_write.elapsed();
            if since < LINGER && !draining && self.shared.pending().held() < BATCH {
                std::thread::sleep(LINGER - since);
            }
            let batch = {
                let mut p = self.shared.pending();
                if !p.has_work() {
                    if draining {
                        return;
                    }
                    let (g, _) = self
                        .shared
                        .work
                        .wait_timeout(p, Duration::from_millis(200))
                        .unwrap_or_else(|e| e.into_inner());
                    p = g;
                }
                p.take(BATCH, BATCH_BYTES, Instant::now())
            };
            if batch.is_empty() {
                if (down || last_contact.elapsed() >= IDLE_PING) && !draining {
                    down = !self.ping();
                    if down {
                        backoff.failed();
                    } else {
                        backoff.reset();
                        last_contact = Instant::now();
                    }
                }
                continue;
            }
            last_write = Instant::now();
            if down {
                // This loop's backoff (jittered, capped at 2 s) decides when
                // to try again, not a second one inside the client.
                self.link.retry_now();
            }
            if self.write_batch(batch) {
                if down {
                    tracing::info!("Redis answers again");
                }
                down = false;
                backoff.reset();
                last_contact = Instant::now();
            } else {
                if !down {
                    tracing::warn!("Redis not answering; holding snapshots");
                }
                down = true;
                backoff.failed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_io;

    #[test]
    fn held_on_the_way_dropped_on_a_refusal() {
        for e in [
            "relay: Resource temporarily unavailable (os error 11)",
            "relay: connect: Connection refused (os error 111)",
            "relay: Redis down, waiting to reconnect",
            "relay: broken pipe",
            "relay: CLUSTERDOWN The cluster is down",
            "relay: LOADING Redis is loading the dataset in memory",
        ] {
            assert!(is_io(e), "{e}");
        }
        for e in [
            "relay: OOM command not allowed when used memory > 'maxmemory'.",
            "relay: WRONGTYPE: Operation against a key holding the wrong kind of value",
        ] {
            assert!(!is_io(e), "{e}");
        }
    }
}
