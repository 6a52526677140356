//! The Redis writer: one thread that takes what the pending map holds, a batch
//! at a time, and writes it the section 2 way through the `Publisher`'s write
//! path (the compare-and-set script by `EVALSHA`, `NOSCRIPT` loaded again,
//! hash before channel, `PUBLISH`, or `SPUBLISH` per slot owner in a sharded
//! cluster), pipelined. A batch that fails is held again; Redis is then
//! retried on the writer's own jittered backoff, each attempt at most
//! [`RETRY_GAP`] after the one before it started (so attempts are never
//! more than the contract's 2 s apart), whatever the command client's own
//! backoff says. Redis is pinged every second while
//! idle. Every call is bounded by the Redis layer's timeouts (a
//! pipeline fails at its first reply not read in time), and each call is
//! also marked in [`Shared`], which shows Redis down once a call has waited
//! [`super::metrics::STALL`], whatever it waits on; a batch is bounded in
//! bytes as well as in snapshots ([`BATCH_BYTES`]).

use super::metrics::Shared;
use crate::clock;
use crate::logging::LogBudget;
use crate::publisher::write;
use crate::redis::backoff::Backoff;
use crate::redis::commands::Commands;
use crate::redis::Error;
use shards::Snapshot;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
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
/// The longest time from the start of one attempt at a Redis that does not
/// answer to the start of the next: the contract's 2 s cap, less what the
/// writer's loop may take to get from the end of its wait to the attempt.
pub const RETRY_GAP: Duration = Duration::from_millis(1900);

/// Whether a failed call failed on the way to Redis, or Redis could not
/// serve it for now, rather than by Redis's own refusal: then the snapshots
/// are held, never dropped. Decided by kind: no connection (the client's
/// backoff, a failed connect), the driver's I/O failure (timeout, reset,
/// EOF), or a reply that says "not now" (`LOADING`, `CLUSTERDOWN`,
/// `TRYAGAIN`, `MASTERDOWN`, `READONLY` on a demoted primary).
pub fn held(e: &Error) -> bool {
    match e {
        Error::Command { source, .. } => unavailable(source),
        Error::NoSlotMap => false,
        e => e.is_unreachable(),
    }
}

/// Whether the driver's error means Redis could not be reached or could not
/// serve the command for now.
fn unavailable(e: &::redis::RedisError) -> bool {
    use ::redis::{ErrorKind, ServerErrorKind as S};
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    S::BusyLoading | S::ClusterDown | S::TryAgain | S::MasterDown | S::ReadOnly
                )
        )
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
    /// The refusals logged each second (a flood of them is summed up).
    pub refusal_log: LogBudget,
}

/// Refused snapshots logged each second, at most.
pub const REFUSAL_LOGS_PER_SEC: u32 = 5;

impl Writer {
    fn ping(&mut self) -> bool {
        self.shared.call_started();
        let up = self
            .link
            .query::<String>(&::redis::cmd("PING"))
            .is_ok_and(|r| r == "PONG");
        self.shared.call_ended();
        self.shared.redis_up.store(up, Relaxed);
        up
    }

    /// After a call failed other than "not now" (a refusal keeps the
    /// client's connection; a reply it could not read drops it and backs
    /// off): whether Redis answers at once.
    fn answers(&mut self) -> bool {
        self.link.retry_now();
        self.ping()
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
            Err(e) if !held(&e) && self.answers() => {
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
                            let allowed = self.refusal_log.take(clock::now_ms());
                            if let Some(suppressed) = allowed.suppressed {
                                tracing::warn!(suppressed, "snapshots Redis refused not logged");
                            }
                            if allowed.log {
                                tracing::warn!(error = %e, course = %s.course, section = s.section, "Redis refused a snapshot; dropped");
                            }
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

    /// Runs until `drain` is set and nothing is held, or the deadline it
    /// holds passes.
    pub fn run(&mut self, drain: &OnceLock<Instant>) {
        let mut last_contact = Instant::now() - IDLE_PING;
        let mut down = false;
        let mut retry = Backoff::capped(RETRY_GAP);
        let mut last_write = Instant::now() - LINGER;
        loop {
            let draining = drain.get().is_some();
            if drain.get().is_some_and(|d| Instant::now() >= *d) {
                return;
            }
            if down {
                // While Redis is down, the writer's schedule says when to try again.
                let due = retry.wait();
                if !due.is_zero() {
                    let wait = due.min(Duration::from_millis(100));
                    let p = self.shared.pending();
                    let _ = self.shared.work.wait_timeout(p, wait);
                    continue;
                }
                // Due now: the command client's own backoff does not delay it.
                self.link.retry_now();
            }
            let since = last_write.elapsed();
            if since < LINGER && !draining && !down && self.shared.pending().held() < BATCH {
                std::thread::sleep(LINGER - since);
            }
            let batch = {
                let mut p = self.shared.pending();
                // While Redis is down, an attempt due is made at once, with
                // or without anything to write.
                if p.held() == 0 && !down {
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
                if draining {
                    return;
                }
                if down || last_contact.elapsed() >= IDLE_PING {
                    let was = down;
                    let attempt = Instant::now();
                    down = !self.ping();
                    if down {
                        retry.failed_after(attempt);
                    } else {
                        retry.reset();
                        last_contact = Instant::now();
                    }
                    if down && !was {
                        tracing::warn!("Redis not answering");
                    }
                    if was && !down {
                        tracing::info!("Redis answers again");
                    }
                }
                continue;
            }
            last_write = Instant::now();
            if self.write_batch(batch) {
                if down {
                    tracing::info!("Redis answers again");
                }
                down = false;
                retry.reset();
                last_contact = Instant::now();
            } else {
                if !down {
                    tracing::warn!("Redis not answering or not taking writes; holding snapshots");
                }
                down = true;
                retry.failed_after(last_write);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::held;
    use crate::redis::{ConnectError, Error, NodeError};
    use std::io;

    fn command(source: ::redis::RedisError) -> Error {
        Error::Command {
            what: "relay",
            source,
        }
    }

    /// A reply as Redis sends it, parsed by the driver.
    fn reply(line: &str) -> Error {
        let wire = format!("-{line}\r\n");
        match ::redis::parse_redis_value(wire.as_bytes()).and_then(|v| v.extract_error()) {
            Err(e) => command(e),
            Ok(v) => panic!("{line}: no error: {v:?}"),
        }
    }

    #[test]
    fn held_on_the_way_dropped_on_a_refusal() {
        for kind in [
            io::ErrorKind::WouldBlock,
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            let e = command(io::Error::from(kind).into());
            assert!(held(&e), "{kind:?}: {e}");
        }
        let connect = Error::Connect {
            what: "relay",
            source: ConnectError::Standalone(NodeError::NoNode),
        };
        for e in [
            Error::Backoff { what: "relay" },
            connect,
            reply("CLUSTERDOWN The cluster is down"),
            reply("LOADING Redis is loading the dataset in memory"),
            reply("TRYAGAIN Multiple keys request during rehashing of slot"),
            reply("MASTERDOWN Link with MASTER is down"),
            reply("READONLY You can't write against a read only replica."),
        ] {
            assert!(held(&e), "{e}");
        }
        for e in [
            reply("OOM command not allowed when used memory > 'maxmemory'."),
            reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
            reply("ERR Error running script: payload refused"),
            // A refusal whose text reads like a connection problem is still a refusal.
            reply("ERR connect timeout reset eof loading"),
            Error::NoSlotMap,
        ] {
            assert!(!held(&e), "{e}");
        }
    }
}
