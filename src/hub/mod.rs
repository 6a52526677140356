//! Starting a node: the listeners, the ingest and presence threads, one pinned
//! monoio runtime per shard (each started by the supervisor), and the signal
//! loop that drains, stops the threads in order, joins them and exits.

pub mod listener;
pub mod sd_notify;

pub use crate::shard_set::ShardSet;

use crate::channels::signals::Stop;
use crate::channels::{Control, Inbox, IngestCmd, Outlet, PresenceCmd};
use crate::clock;
use crate::failure;
use crate::ingest::states::StateStore;
use crate::ingest::{self, reader, Ingest};
use crate::node::Node;
use crate::presence::{self, PresenceStore, PresenceTiming, Worker};
use crate::redis::pubsub::Source;
use crate::shard;
use crate::supervisor::{self, Policy};
use crossbeam_channel::unbounded;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often shards are probed when systemd's watchdog is off.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long a node whose drain ran past its window waits for its
/// connections to go once it has closed them all.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a node closing everything on a second signal waits: long enough
/// for its close frames to go out, not for peers to answer them (section 8:
/// it exits at once).
const HURRY_GRACE: Duration = Duration::from_millis(250);

/// How long a failed node waits for its connections to close before it exits.
const FAIL_GRACE: Duration = Duration::from_secs(5);

/// The exit code of a node that failed (EX_SOFTWARE): systemd restarts it.
pub const EXIT_FAILED: i32 = 70;

/// How long the threads have, all told, to end once told to stop.
const JOIN_LIMIT: Duration = Duration::from_secs(3);

/// The node's threads, in the order they are stopped and joined (a prefix of
/// their names each); what tells each to stop is in [`Hub::stop_threads`].
const STOP_ORDER: [&str; 7] = [
    "seatboard-shard-",
    "seatboard-ingest",
    "seatboard-states",
    "seatboard-presence",
    "seatboard-history",
    "seatboard-jwks",
    "seatboard-",
];

/// A started node: what `main` needs to wait on it.
pub struct Hub {
    /// The shared node state.
    pub node: Arc<Node>,
    inboxes: Vec<Arc<Inbox>>,
    ingest: crate::channels::wake::IngestTx,
    presence: crossbeam_channel::Sender<PresenceCmd>,
    /// SIGTERM/SIGINT, caught from before the port opens: a signal that arrives
    /// as soon as the node listens is a drain, not the default death. Its
    /// wake-up is written by a failure too, so the main thread sleeps in
    /// `poll(2)` instead of looking every few milliseconds.
    stop: Arc<Stop>,
}

/// Binds, starts every thread, and returns once all shards listen.
pub fn start<S, T, P>(node: Arc<Node>, source: S, states: T, store: P) -> std::io::Result<Hub>
where
    S: Source + 'static,
    T: StateStore + 'static,
    P: PresenceStore + 'static,
{
    let config = &node.config;
    let n = config.shards;
    let stop = Stop::catch()?;
    failure::install(Arc::clone(stop.wake()));
    let listeners = listener::bind(config.listen, n)?;
    let inboxes: Vec<Arc<Inbox>> = (0..n).map(|_| Inbox::new()).collect();
    let (ingest_tx, ingest_rx) = crate::channels::wake::channel()?;
    let (presence_tx, presence_rx) = unbounded();

    let (read_tx, read_rx) = unbounded();
    let outlets = inboxes.iter().map(|i| Outlet::new(Arc::clone(i))).collect();
    let ingest = Ingest::new(
        source,
        outlets,
        Arc::clone(&node.metrics),
        Some(presence_tx.clone()),
        read_tx,
        config.admin_tick_ms,
        clock::now_ms(),
    );
    let (reader_ingest, reader_node) = (ingest_tx.clone(), Arc::clone(&node));
    supervisor::spawn("seatboard-states", Policy::FailsNode, move || {
        reader::run(states, read_rx, reader_ingest, reader_node)
    })?;
    supervisor::spawn("seatboard-ingest", Policy::FailsNode, move || {
        ingest::run(ingest, ingest_rx)
    })?;

    let worker = Worker::new(
        store,
        PresenceTiming {
            tick_ms: config.presence_tick_ms,
            ttl_ms: config.presence_ttl_ms,
        },
        inboxes.clone(),
        Some(ingest_tx.clone()),
        Arc::clone(&node.metrics),
        clock::unix_ms(),
    );
    supervisor::spawn("seatboard-presence", Policy::FailsNode, move || {
        presence::run(worker, presence_rx)
    })?;

    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (ready_tx, ready_rx) =
        crossbeam_channel::bounded::<Result<&'static str, shard::StartError>>(n);
    for (index, listener) in listeners.into_iter().enumerate() {
        let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
        let ctx_parts = (
            Arc::clone(&node),
            Arc::clone(&inboxes[index]),
            ingest_tx.clone(),
            presence_tx.clone(),
        );
        let ready = ready_tx.clone();
        supervisor::spawn(
            format!("seatboard-shard-{index}"),
            Policy::FailsNode,
            move || {
                let (node, inbox, ingest, presence) = ctx_parts;
                pin(&node, index, core);
                shard::run(index, node, inbox, ingest, presence, listener, ready);
            },
        )?;
    }
    drop(ready_tx);
    for _ in 0..n {
        match ready_rx.recv() {
            Ok(Ok(driver)) => node.metrics.shard_on_driver(driver),
            Ok(Err(e)) => return Err(std::io::Error::other(e)),
            Err(_) => return Err(std::io::Error::other("a shard thread died at start")),
        }
    }
    sd_notify::notify("READY=1\nSTATUS=serving");
    Ok(Hub {
        node,
        inboxes,
        ingest: ingest_tx,
        presence: presence_tx,
        stop,
    })
}

/// Pins the calling shard thread to `core`, logs the outcome, and records it in
/// `/metrics` (the core, or a counted failure): a unit that denies
/// `sched_setaffinity` must be visible, not only a log line.
fn pin(node: &Node, index: usize, core: Option<core_affinity::CoreId>) {
    let metrics = &node.metrics;
    match core {
        Some(core) if core_affinity::set_for_current(core) => {
            metrics.shards[index].core.store(core.id as i64, Relaxed);
            tracing::info!(shard = index, core = core.id, "shard pinned to core");
        }
        Some(core) => {
            metrics.pin_failures.fetch_add(1, Relaxed);
            tracing::warn!(
                shard = index,
                core = core.id,
                error = %std::io::Error::last_os_error(),
                "shard not pinned: sched_setaffinity failed"
            );
        }
        None => {
            metrics.pin_failures.fetch_add(1, Relaxed);
            tracing::warn!(shard = index, "shard not pinned: no usable core list");
        }
    }
}

impl Hub {
    /// Waits for SIGTERM/SIGINT, drains, and returns the exit code.
    pub fn wait(self) -> i32 {
        let mut drain_started: Option<Instant> = None;
        let watchdog = sd_notify::watchdog_interval();
        // Shards are probed at least every PROBE_EVERY, with or without
        // systemd's watchdog, so an idle shard's heartbeat stays fresh and
        // `/metrics` tells a stalled one apart.
        let every = watchdog.map_or(PROBE_EVERY, |w| w.min(PROBE_EVERY));
        let mut probe: Option<(Instant, u64)> = None;
        loop {
            if let Some(thread) = failure::failed() {
                return self.fail(thread);
            }
            let next_probe = self.watchdog(every, watchdog.is_some(), &mut probe);
            let (count, sig) = self.stop.take();
            for _ in 0..count {
                if drain_started.is_none() {
                    tracing::info!(
                        signal = sig,
                        drain_ms = self.node.config.drain_ms,
                        "draining"
                    );
                    self.node.metrics.draining.store(1, Relaxed);
                    sd_notify::notify("STOPPING=1\nSTATUS=draining");
                    for i in &self.inboxes {
                        i.control(Control::Drain);
                    }
                    drain_started = Some(Instant::now());
                } else {
                    tracing::info!(signal = sig, "second signal: closing everything now");
                    self.close_all(HURRY_GRACE);
                    return 0;
                }
            }
            if let Some(t) = drain_started {
                if self.node.open.load(Relaxed) == 0 {
                    tracing::info!("drained");
                    self.stop_threads();
                    return 0;
                }
                // The drain window plus the close grace: whatever is left goes now.
                if t.elapsed()
                    > Duration::from_millis(self.node.config.drain_ms) + Duration::from_secs(5)
                {
                    self.close_all(CLOSE_GRACE);
                    return 0;
                }
            }
            // Draining: watch the connection count closely; otherwise sleep
            // until a signal or the next probe.
            let wait = if drain_started.is_some() {
                Duration::from_millis(20)
            } else {
                next_probe
            };
            self.stop.wait(wait);
        }
    }

    /// A long-lived thread panicked: refuse new viewers, close the ones left
    /// (they reconnect to a healthy node), and exit 70 for systemd to restart.
    fn fail(&self, thread: &str) -> i32 {
        tracing::error!(
            thread,
            "a long-lived thread panicked: the node reports itself failed, closes its connections and exits"
        );
        sd_notify::notify("STOPPING=1\nSTATUS=failed: a thread panicked");
        self.close_all(FAIL_GRACE);
        EXIT_FAILED
    }

    /// Probes every shard's loop; pets the systemd watchdog (when `pet`) only
    /// while all of them answer. Returns how long until it is due again.
    fn watchdog(&self, every: Duration, pet: bool, probe: &mut Option<(Instant, u64)>) -> Duration {
        if let Some((sent, _)) = *probe {
            if sent.elapsed() < every {
                return every - sent.elapsed();
            }
        }
        match *probe {
            Some((sent, at_ms)) if sent.elapsed() >= every => {
                let alive = self
                    .node
                    .metrics
                    .shards
                    .iter()
                    .all(|s| s.heartbeat_ms.load(Relaxed) >= at_ms);
                if alive {
                    if pet {
                        sd_notify::notify("WATCHDOG=1");
                    }
                } else {
                    tracing::error!("a shard did not answer the watchdog probe");
                }
            }
            Some(_) => return every,
            None => {}
        }
        // The next probe goes out at once, so a sleep of `every` spans one round.
        let at_ms = clock::now_ms();
        for i in &self.inboxes {
            i.control(Control::Probe);
        }
        *probe = Some((Instant::now(), at_ms));
        every
    }

    /// Closes every connection, waits up to `grace` for them to go, then
    /// stops the threads.
    fn close_all(&self, grace: Duration) {
        for i in &self.inboxes {
            i.control(Control::CloseAll);
        }
        let t = Instant::now();
        while self.node.open.load(Relaxed) > 0 && t.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop_threads();
    }

    /// Stops the node's threads in [`STOP_ORDER`] (the shards, then what
    /// feeds them), joining each, and logs which were joined and which are
    /// left (the log writer, which writes the last lines, always is).
    fn stop_threads(&self) {
        supervisor::stop();
        let by = Instant::now() + JOIN_LIMIT;
        let mut joined = Vec::new();
        for prefix in STOP_ORDER {
            match prefix {
                "seatboard-shard-" => {
                    for i in &self.inboxes {
                        i.control(Control::Stop);
                    }
                }
                "seatboard-ingest" => drop(self.ingest.send(IngestCmd::Shutdown)),
                "seatboard-presence" => drop(self.presence.send(PresenceCmd::Shutdown)),
                "seatboard-history" => self.node.history.stop(),
                "seatboard-jwks" => self.node.auth.stop(),
                // The states reader ends with the ingest thread, the rest
                // (the demo's simulator) on `supervisor::stopping`.
                _ => {}
            }
            joined.extend(supervisor::join(prefix, by));
        }
        tracing::info!(?joined, left = ?supervisor::running(), "threads joined");
    }
}
