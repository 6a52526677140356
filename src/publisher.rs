//! The selection API's half of the contract as a library type: `publish()` never
//! blocks and never fails the caller. Snapshots go through a bounded queue to a
//! background thread that writes the state hash (by the compare-and-set script
//! of `publish::script`, so it never goes backwards) and PUBLISHes in one pipeline
//! (in a cluster: the hashes first, then `SPUBLISH`, or `PUBLISH` with
//! `--pubsub classic`); when the queue is full, or Redis is down or
//! black-holed, snapshots are dropped and counted instead of holding up a seat
//! reservation.

use crate::publish::script;
use crate::redis::commands::Commands;
use crate::redis::{Mode, PubSubMode, Redis, RedisFlags};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use shards::Snapshot;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

/// Counters shared with the background thread.
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    dropped: AtomicU64,
    /// Snapshots accepted by `publish()` and not yet published or dropped.
    pending: AtomicU64,
}

/// A non-blocking snapshot publisher.
pub struct Publisher {
    tx: Option<Sender<Snapshot>>,
    counters: Arc<Counters>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    /// Starts the background thread; fails only on a malformed URI (Redis
    /// being unreachable is not an error: snapshots are dropped until it is back).
    pub fn start(config: PublisherConfig) -> Result<Publisher, String> {
        let redis = Redis::from_flags(&config.redis)?;
        let link = Commands::new(&redis, "publisher");
        let (tx, rx) = bounded(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let c = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("seatboard-publisher".into())
            .spawn(move || run(link, rx, c, config))
            .map_err(|e| format!("cannot start the publisher thread: {e}"))?;
        Ok(Publisher {
            tx: Some(tx),
            counters,
            thread: Some(thread),
        })
    }

    /// Queues a snapshot; returns at once. False when it was dropped (queue full).
    pub fn publish(&self, snapshot: Snapshot) -> bool {
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
        drop(self.thread.take());
    }
}

/// Appends the state hash's compare-and-set + PUBLISH for one snapshot to a
/// pipeline (`full_text`: `EVAL` instead of `EVALSHA`, after a `NOSCRIPT`).
pub fn add_to_pipeline(
    p: &mut ::redis::Pipeline,
    channel_prefix: &str,
    state_prefix: &str,
    s: &Snapshot,
    full_text: bool,
) {
    let payload = s.to_payload();
    p.add_command(script::cmd(state_prefix, s, &payload, full_text))
        .ignore();
    p.cmd("PUBLISH")
        .arg(format!("{channel_prefix}{}", s.course))
        .arg(payload)
        .ignore();
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
) -> Result<(), String> {
    match write_once(link, channel_prefix, state_prefix, batch, false) {
        Err(e) if script::is_noscript(&e) => {
            tracing::debug!("state script not loaded on the server: loading it");
            link.retry_now();
            write_once(link, channel_prefix, state_prefix, batch, true)
        }
        r => r,
    }
}

/// One try of [`write`]: standalone, script and PUBLISH in one pipeline; in a
/// cluster, every script call first (pipelined per primary, on the hash's slot
/// owner), then `SPUBLISH` (or `PUBLISH` with `--pubsub classic`), so a node
/// that subscribes and then reads the hash can never miss a snapshot.
fn write_once(
    link: &mut Commands,
    channel_prefix: &str,
    state_prefix: &str,
    batch: &[Snapshot],
    full_text: bool,
) -> Result<(), String> {
    if link.mode()? == Mode::Standalone {
        let mut p = ::redis::pipe();
        for s in batch {
            add_to_pipeline(&mut p, channel_prefix, state_prefix, s, full_text);
        }
        return link.raw_pipeline::<()>(&p);
    }
    let publish = match link.redis().pubsub {
        PubSubMode::Sharded => "SPUBLISH",
        PubSubMode::Classic => "PUBLISH",
    };
    let payloads: Vec<String> = batch.iter().map(Snapshot::to_payload).collect();
    let hashes: Vec<::redis::Cmd> = batch
        .iter()
        .zip(&payloads)
        .map(|(s, p)| script::cmd(state_prefix, s, p, full_text))
        .collect();
    link.exec(&hashes)?;
    let pubs: Vec<::redis::Cmd> = batch
        .iter()
        .zip(payloads)
        .map(|(s, p)| {
            let mut c = ::redis::cmd(publish);
            c.arg(format!("{channel_prefix}{}", s.course)).arg(p);
            c
        })
        .collect();
    match link.redis().pubsub {
        PubSubMode::Sharded => link.exec(&pubs),
        // PUBLISH has no key to route by: any node takes it (and the cluster
        // broadcasts it), one at a time.
        PubSubMode::Classic => pubs.iter().try_for_each(|c| link.query::<()>(c)),
    }
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
        match write(&mut link, &cfg.channel_prefix, &cfg.state_prefix, &batch) {
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
