//! The selection API's half of the contract as a library type: `publish()` never
//! blocks and never fails the caller. Snapshots go through a bounded queue to a
//! background thread that writes the state hash (by the compare-and-set script
//! of `publish::script`, so it never goes backwards) and PUBLISHes in one pipeline
//! (in a cluster: the hashes first, then `SPUBLISH`, or `PUBLISH` with
//! `--pubsub classic`); when the queue is full, or Redis is down or
//! black-holed, snapshots are dropped and counted instead of holding up a seat
//! reservation. A snapshot the hub would reject (a version past 2^53, a payload
//! over 64 KiB: [`Snapshot::publishable`]) is refused before it reaches Redis,
//! counted by reason.

use crate::publish::script;
use crate::redis::commands::Commands;
use crate::redis::{Error, Mode, PubSubMode, Redis, RedisFlags};
use crate::supervisor::{self, Policy};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use shards::{Reject, Snapshot};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::publish::error::PublisherError;

/// Most snapshots written in one pipeline.
const BATCH: usize = 256;

/// Where snapshots go.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// Redis: URIs, mode, pub/sub flavour, CA (`RedisFlags::new(uri)` for the defaults).
    pub redis: RedisFlags,
    /// Channel prefix (`seats:`).
    pub channel_prefix: String,
    /// State hash prefix (`seatstate:`).
    pub state_prefix: String,
    /// Snapshots that may wait in the queue before new ones are dropped.
    pub queue: usize,
    /// When set, every state hash written is given this time to live
    /// (`PEXPIRE` after each write): a rehearsal's keys go away by themselves.
    pub state_ttl: Option<Duration>,
}

/// Counters shared with the background thread.
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    dropped: AtomicU64,
    /// Snapshots accepted by `publish()` and not yet published or dropped.
    pending: AtomicU64,
    /// Snapshots refused before Redis, indexed like [`Reject::ALL`].
    refused: [AtomicU64; Reject::ALL.len()],
}

/// A non-blocking snapshot publisher.
pub struct Publisher {
    tx: Option<Sender<Snapshot>>,
    counters: Arc<Counters>,
}

impl Publisher {
    /// Starts the background thread; fails only on a malformed URI (Redis
    /// being unreachable is not an error: snapshots are dropped until it is back).
    pub fn start(config: PublisherConfig) -> Result<Publisher, PublisherError> {
        let redis = Redis::from_flags(&config.redis)?;
        let link = Commands::new(&redis, "publisher");
        let (tx, rx) = bounded(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        supervisor::spawn("seatboard-publisher", Policy::Logged, move || {
            run(link, rx, c, config)
        })
        .map_err(PublisherError::Thread)?;
        Ok(Publisher {
            tx: Some(tx),
            counters,
        })
    }

    /// Queues a snapshot; returns at once. False when it was dropped (queue
    /// full) or refused (the hub would reject it: see [`Publisher::refused`]).
    pub fn publish(&self, snapshot: Snapshot) -> bool {
        if let Err(why) = snapshot.publishable() {
            self.counters.refused[reject_index(why)].fetch_add(1, Relaxed);
            tracing::debug!(reason = why.label(), course = %snapshot.course, "snapshot refused");
            return false;
        }
        let Some(tx) = &self.tx else { return false };
        self.counters.pending.fetch_add(1, Relaxed);
        match tx.try_send(snapshot) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.pending.fetch_sub(1, Relaxed);
                self.counters.dropped.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Snapshots written to Redis so far.
    pub fn published(&self) -> u64 {
        self.counters.published.load(Relaxed)
    }

    /// Snapshots dropped so far (queue full, Redis down or too slow).
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Relaxed)
    }

    /// Snapshots refused so far for `reason` (`Schema`: a version past 2^53
    /// and the like; `TooLarge`: a payload over 64 KiB), never sent to Redis.
    pub fn refused(&self, reason: Reject) -> u64 {
        self.counters.refused[reject_index(reason)].load(Relaxed)
    }

    /// Snapshots refused so far, every reason together.
    pub fn refused_total(&self) -> u64 {
        Reject::ALL.iter().map(|&r| self.refused(r)).sum()
    }

    /// Waits up to `timeout` until everything queued was published or dropped.
    pub fn flush(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if self.counters.pending.load(Relaxed) == 0 {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Closing the queue ends the thread after what it holds; a black-holed
        // Redis delays that by at most one timeout, and nobody waits for it.
        self.tx = None;
    }
}

/// Where [`Reject::ALL`] lists `r`.
fn reject_index(r: Reject) -> usize {
    Reject::ALL.iter().position(|&x| x == r).unwrap_or(0)
}

/// `PEXPIRE` of `s`'s state hash, when its keys are to expire.
fn expire(state_prefix: &str, ttl: Option<Duration>, s: &Snapshot) -> Option<::redis::Cmd> {
    let ttl = ttl?;
    let mut c = ::redis::cmd("PEXPIRE");
    c.arg(format!("{state_prefix}{}", s.course))
        .arg(ttl.as_millis().max(1) as u64);
    Some(c)
}

/// Writes snapshots the way the contract asks: the state hash by the
/// compare-and-set script, then the channel. A batch that failed because the
/// server lost the script (restart, failover, `SCRIPT FLUSH`) is written again
/// with the script's full text, which loads it; the compare-and-set makes the
/// second write of a snapshot harmless.
pub fn write(
    link: &mut Commands,
    channel_prefix: &str,
    state_prefix: &str,
    batch: &[Snapshot],
) -> Result<(), Error> {
    write_expiring(link, channel_prefix, state_prefix, None, batch)
}

/// [`write`], and every state hash written given `state_ttl` to live when set.
pub fn write_expiring(
    link: &mut Commands,
    channel_prefix: &str,
    state_prefix: &str,
    state_ttl: Option<Duration>,
    batch: &[Snapshot],
) -> Result<(), Error> {
    let to = (channel_prefix, state_prefix, state_ttl);
    match write_once(link, to, batch, false) {
        Err(e) if e.is_noscript() => {
            // (A refusal keeps the connection: the full text goes on it at once.)
            tracing::debug!("state script not loaded on the server: loading it");
            write_once(link, to, batch, true)
        }
        r => r,
    }
}

/// One try of [`write`]: every script call first, pipelined (per primary in
/// a cluster, on the hash's slot owner), and only once they all succeeded
/// the channel (`PUBLISH`, or `SPUBLISH` with sharded pub/sub in a cluster):
/// so a node that subscribes and then reads the hash can never miss a
/// snapshot, and a script call that fails (`NOSCRIPT`, a key of another type)
/// publishes nothing.
fn write_once(
    link: &mut Commands,
    (channel_prefix, state_prefix, ttl): (&str, &str, Option<Duration>),
    batch: &[Snapshot],
    full_text: bool,
) -> Result<(), Error> {
    let payloads: Vec<String> = batch.iter().map(Snapshot::to_payload).collect();
    let hashes: Vec<::redis::Cmd> = batch
        .iter()
        .zip(&payloads)
        .flat_map(|(s, p)| {
            let set = script::cmd(state_prefix, s, p, full_text);
            std::iter::once(set).chain(expire(state_prefix, ttl, s))
        })
        .collect();
    link.pipeline::<()>(&hashes)?;
    let standalone = link.mode()? == Mode::Standalone;
    let publish = match link.redis().pubsub {
        PubSubMode::Sharded if !standalone => "SPUBLISH",
        _ => "PUBLISH",
    };
    let pubs: Vec<::redis::Cmd> = batch
        .iter()
        .zip(payloads)
        .map(|(s, p)| {
            let mut c = ::redis::cmd(publish);
            c.arg(format!("{channel_prefix}{}", s.course)).arg(p);
            c
        })
        .collect();
    if standalone || link.redis().pubsub == PubSubMode::Sharded {
        return link.pipeline::<()>(&pubs);
    }
    // PUBLISH in a cluster has no key to route by: any node takes it (and
    // the cluster broadcasts it), one at a time.
    pubs.iter().try_for_each(|c| link.query::<()>(c))
}

fn run(mut link: Commands, rx: Receiver<Snapshot>, c: Arc<Counters>, cfg: PublisherConfig) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(s) => batch.push(s),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let (channel, state) = (&cfg.channel_prefix, &cfg.state_prefix);
        match write_expiring(&mut link, channel, state, cfg.state_ttl, &batch) {
            Ok(()) => c.published.fetch_add(n, Relaxed),
            Err(e) => {
                tracing::debug!(error = %e, dropped = n, "publish failed");
                c.dropped.fetch_add(n, Relaxed)
            }
        };
        batch.clear();
        c.pending.fetch_sub(n, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(redis: &str) -> PublisherConfig {
        PublisherConfig {
            redis: RedisFlags::new(redis),
            channel_prefix: "seats:".into(),
            state_prefix: "seatstate:".into(),
            queue: 4,
            state_ttl: None,
        }
    }

    #[test]
    fn a_refused_uri_never_shows_its_password() {
        for uri in [
            "redis://svc:Pw%2FS3cret@127.0.0.1:70000",
            "rediss://svc:PwS3cret@127.0.0.1:6380/#insecure",
            "redis://:Pw/S3cret@127.0.0.1:6379",
            "redis://:PwS3cret@a:1,redis://:other@b:2",
        ] {
            let Err(e) = Publisher::start(config(uri)) else {
                panic!("{uri} accepted");
            };
            assert!(matches!(e, PublisherError::Config(_)), "{e:?}");
            let text = e.to_string();
            assert!(text.contains("'--redis'"), "{text}");
            assert!(!text.contains("S3cret"), "{uri}: {text}");
            assert!(!format!("{e:?}").contains("S3cret"), "{uri}: {e:?}");
        }
    }
}
