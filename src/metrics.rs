//! Node metrics: plain atomics written by their one owner, summed on scrape and
//! rendered as one table of families ([`crate::exposition`]).

use crate::exposition::{Family, Histogram, Samples};
use shards::Reject;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Bucket bounds for tick durations.
pub const TICK_BOUNDS: &[f64] = &[0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1];
/// Bucket bounds for publish-to-send latency and Redis pipelines.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5,
];

/// One shard's numbers, written only by that shard's thread.
pub struct ShardMetrics {
    /// Open connections (WebSocket and Server-Sent Events).
    pub connections: AtomicU64,
    /// Of `connections`, the Server-Sent Events streams.
    pub sse_connections: AtomicU64,
    /// Frames queued to clients.
    pub frames_queued: AtomicU64,
    /// Frames dropped for full send queues.
    pub frames_dropped: AtomicU64,
    /// Full frames sent to heal a missed one.
    pub resyncs: AtomicU64,
    /// Course frames rendered.
    pub frames_rendered: AtomicU64,
    /// Bytes written to sockets.
    pub bytes_out: AtomicU64,
    /// Batches of sends submitted to the shard's io_uring (none on epoll and tokio).
    pub send_batches: AtomicU64,
    /// Payload bytes of the frames queued, before compression.
    pub ws_payload_bytes: AtomicU64,
    /// 4001 closes.
    pub slow_consumer_closes: AtomicU64,
    /// Closes for silence.
    pub idle_closes: AtomicU64,
    /// Error replies to client mistakes.
    pub client_errors: AtomicU64,
    /// Courses watched on this shard.
    pub courses: AtomicU64,
    /// Time spent in one render pass.
    pub tick: Histogram,
    /// When the shard's loop last ran (process ms), for the watchdog.
    pub heartbeat_ms: AtomicU64,
    /// The core the shard's thread is pinned to; -1 when not pinned.
    pub core: AtomicI64,
}

impl ShardMetrics {
    fn new() -> Self {
        ShardMetrics {
            connections: AtomicU64::new(0),
            sse_connections: AtomicU64::new(0),
            frames_queued: AtomicU64::new(0),
            frames_dropped: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            frames_rendered: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            send_batches: AtomicU64::new(0),
            ws_payload_bytes: AtomicU64::new(0),
            slow_consumer_closes: AtomicU64::new(0),
            idle_closes: AtomicU64::new(0),
            client_errors: AtomicU64::new(0),
            courses: AtomicU64::new(0),
            tick: Histogram::new(TICK_BOUNDS),
            heartbeat_ms: AtomicU64::new(0),
            core: AtomicI64::new(-1),
        }
    }
}

/// Why a request was refused before the upgrade; one label value each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Accept bucket empty (503).
    RateLimited,
    /// Not a WebSocket upgrade (400).
    BadUpgrade,
    /// Wrong WebSocket version (426).
    BadVersion,
    /// Origin not allowed (403).
    Origin,
    /// Token missing or invalid (401).
    Unauthorized,
    /// Student on the admin feed (403).
    Forbidden,
    /// Node full (503).
    NodeFull,
    /// Draining (503).
    Draining,
    /// Per-user cap (429).
    UserCap,
    /// Head over 8 KiB (431).
    HeadTooLarge,
    /// Head not complete in time.
    HeadTimeout,
    /// Not HTTP (400).
    BadRequest,
    /// More than one `Origin` header on an upgrade or `/sse` (400).
    RepeatedOrigin,
}

impl Refusal {
    /// Every refusal, in `/metrics` order.
    pub const ALL: [Refusal; 13] = [
        Refusal::RateLimited,
        Refusal::BadUpgrade,
        Refusal::BadVersion,
        Refusal::Origin,
        Refusal::Unauthorized,
        Refusal::Forbidden,
        Refusal::NodeFull,
        Refusal::Draining,
        Refusal::UserCap,
        Refusal::HeadTooLarge,
        Refusal::HeadTimeout,
        Refusal::BadRequest,
        Refusal::RepeatedOrigin,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::RateLimited => "rate_limited",
            Refusal::BadUpgrade => "bad_upgrade",
            Refusal::BadVersion => "bad_version",
            Refusal::Origin => "origin",
            Refusal::Unauthorized => "unauthorized",
            Refusal::Forbidden => "forbidden",
            Refusal::NodeFull => "node_full",
            Refusal::Draining => "draining",
            Refusal::UserCap => "user_cap",
            Refusal::HeadTooLarge => "head_too_large",
            Refusal::HeadTimeout => "head_timeout",
            Refusal::BadRequest => "bad_request",
            Refusal::RepeatedOrigin => "repeated_origin",
        }
    }
}

/// Close codes counted in `/metrics`.
pub const CLOSE_CODES: [u16; 11] = [
    1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011, 1012, 4001, 0,
];

/// The I/O drivers a shard can run on, in `/metrics` order.
pub const DRIVERS: [&str; 3] = ["io_uring", "epoll", "tokio"];

/// Bucket bounds for a course's time to seed (a few round trips to Redis).
pub const SEED_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Everything `/metrics` shows.
pub struct Metrics {
    /// Per-shard numbers.
    pub shards: Vec<ShardMetrics>,
    /// Upgrades accepted.
    pub handshakes_accepted: AtomicU64,
    /// Requests refused, indexed like [`Refusal::ALL`].
    pub refused: [AtomicU64; 13],
    /// Closes sent, indexed like [`CLOSE_CODES`] (last: other).
    pub closes: [AtomicU64; 11],
    /// Valid snapshots received from the source.
    pub ingest_messages: AtomicU64,
    /// Payloads dropped, indexed like [`Reject::ALL`].
    pub ingest_rejected: [AtomicU64; Reject::ALL.len()],
    /// Duplicates dropped (same section and version seen twice).
    pub ingest_duplicates: AtomicU64,
    /// State hash entries read older than the version held (an out-of-order publisher).
    pub state_stale: AtomicU64,
    /// 1 while the source (Redis or the embedded bus) is connected.
    pub redis_connected: AtomicU64,
    /// Reconnects to Redis.
    pub redis_reconnects: AtomicU64,
    /// Channel subscriptions held.
    pub subscriptions: AtomicU64,
    /// 1 while the pattern subscription is held.
    pub firehose: AtomicU64,
    /// Courses the ingest thread holds a board of (watched, or named while an
    /// admin is connected): what a flood of made-up names would grow.
    pub ingest_courses: AtomicU64,
    /// Publish (`ts`) to ingest latency.
    pub update_latency: Histogram,
    /// Presence pipeline round trips.
    pub presence_pipeline: Histogram,
    /// A course's first watch to its state seeded.
    pub seed: Histogram,
    /// The round trip to Redis as last measured, per node (`None`: standalone;
    /// a `None` time: no answer).
    pub redis_rtt: std::sync::Mutex<Vec<(Option<String>, Option<f64>)>>,
    /// Presence pipeline errors.
    pub presence_errors: AtomicU64,
    /// 1 while draining.
    pub draining: AtomicU64,
    /// Shards that could not pin their thread to a core.
    pub pin_failures: AtomicU64,
    /// Shards running on each driver, indexed like [`DRIVERS`].
    pub driver_shards: [AtomicU64; 3],
    /// The node's connection cap (`--max-connections`).
    pub max_connections: AtomicU64,
    /// When the process started (Unix seconds), so restarts show on a graph.
    pub started_unix_s: f64,
}

impl Metrics {
    /// Zeroed metrics for `shards` shards.
    pub fn new(shards: usize) -> Self {
        Metrics {
            shards: (0..shards).map(|_| ShardMetrics::new()).collect(),
            handshakes_accepted: AtomicU64::new(0),
            refused: Default::default(),
            closes: Default::default(),
            ingest_messages: AtomicU64::new(0),
            ingest_rejected: Default::default(),
            ingest_duplicates: AtomicU64::new(0),
            state_stale: AtomicU64::new(0),
            redis_connected: AtomicU64::new(0),
            redis_reconnects: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
            firehose: AtomicU64::new(0),
            ingest_courses: AtomicU64::new(0),
            update_latency: Histogram::new(LATENCY_BOUNDS),
            presence_pipeline: Histogram::new(LATENCY_BOUNDS),
            seed: Histogram::new(SEED_BOUNDS),
            redis_rtt: std::sync::Mutex::new(vec![(None, None)]),
            presence_errors: AtomicU64::new(0),
            draining: AtomicU64::new(0),
            pin_failures: AtomicU64::new(0),
            driver_shards: Default::default(),
            max_connections: AtomicU64::new(0),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }

    /// Records the round trips the state reader just measured.
    /// (None measured at all: every node held so far shows no answer.)
    pub fn set_redis_rtt(&self, rtt: Vec<(Option<String>, Option<f64>)>) {
        let mut held = self.redis_rtt.lock().unwrap_or_else(|e| e.into_inner());
        if rtt.is_empty() {
            held.iter_mut().for_each(|r| r.1 = None);
        } else {
            *held = rtt;
        }
    }

    /// Counts a refusal.
    pub fn refuse(&self, r: Refusal) {
        let i = Refusal::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.refused[i].fetch_add(1, Relaxed);
    }

    /// Counts a payload rejected by the ingest parser.
    pub fn reject(&self, r: Reject) {
        self.reject_n(r, 1);
    }

    /// Counts `n` payloads rejected for `r` at once (a state hash's fields
    /// past a course's most sections).
    pub fn reject_n(&self, r: Reject, n: u64) {
        let i = Reject::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.ingest_rejected[i].fetch_add(n, Relaxed);
    }

    /// Counts a close frame sent.
    pub fn close(&self, code: u16) {
        let i = CLOSE_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(CLOSE_CODES.len() - 1);
        self.closes[i].fetch_add(1, Relaxed);
    }

    /// Counts a shard started on `driver` (one of [`DRIVERS`]).
    pub fn shard_on_driver(&self, driver: &str) {
        if let Some(i) = DRIVERS.iter().position(|d| *d == driver) {
            self.driver_shards[i].fetch_add(1, Relaxed);
        }
    }

    /// Total open connections.
    pub fn connections(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.connections.load(Relaxed))
            .sum()
    }

    /// The Prometheus text exposition: every family of [`FAMILIES`], in order.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(8192);
        crate::exposition::render(self, FAMILIES, &mut o);
        o
    }

    /// The sum of one counter over the shards.
    fn shard_sum(&self, field: fn(&ShardMetrics) -> &AtomicU64) -> u64 {
        self.shards.iter().map(|s| field(s).load(Relaxed)).sum()
    }
}

/// One sample per shard, labelled `shard`.
fn per_shard<V: std::fmt::Display>(
    m: &Metrics,
    s: &mut Samples<'_>,
    v: impl Fn(&ShardMetrics) -> V,
) {
    for (i, shard) in m.shards.iter().enumerate() {
        s.labelled("shard", i, v(shard));
    }
}

fn load(v: &AtomicU64) -> u64 {
    v.load(Relaxed)
}

/// Every metric family, in `/metrics` order.
const FAMILIES: &[Family<Metrics>] = &[
    Family::gauge(
        "seatboard_connections",
        "Open connections per shard (WebSocket and Server-Sent Events).",
        |m, s| per_shard(m, s, |sh| load(&sh.connections)),
    ),
    Family::gauge(
        "seatboard_courses_watched",
        "Courses with a viewer, per shard.",
        |m, s| per_shard(m, s, |sh| load(&sh.courses)),
    ),
    Family::gauge(
        "seatboard_shard_core",
        "The CPU core each shard is pinned to (-1: not pinned).",
        |m, s| per_shard(m, s, |sh| sh.core.load(Relaxed)),
    ),
    Family::gauge(
        "seatboard_shard_heartbeat_age_seconds",
        "Time since each shard's event loop last ran (probed every few seconds).",
        |m, s| {
            let now_ms = crate::clock::now_ms();
            per_shard(m, s, |sh| {
                now_ms.saturating_sub(sh.heartbeat_ms.load(Relaxed)) as f64 / 1e3
            })
        },
    ),
    Family::gauge(
        "seatboard_driver_shards",
        "Shards running on each I/O driver.",
        |m, s| s.each("driver", &DRIVERS, &m.driver_shards),
    ),
    Family::counter(
        "seatboard_log_dropped_total",
        "Log lines dropped because stderr stopped taking them (a closed or stalled log reader, a full disk).",
        |_, s| s.one(crate::logging::dropped()),
    ),
    Family::gauge(
        "seatboard_thread_failed",
        "1 once a long-lived thread of the node panicked: the node reports itself failed and exits.",
        |_, s| s.one(crate::failure::failed().is_some() as u64),
    ),
    Family::counter(
        "seatboard_pin_failures_total",
        "Shards whose thread could not be pinned to a core.",
        |m, s| s.one(load(&m.pin_failures)),
    ),
    Family::gauge(
        "seatboard_max_connections",
        "The node's connection cap (--max-connections).",
        |m, s| s.one(load(&m.max_connections)),
    ),
    Family::gauge(
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, in seconds.",
        |m, s| s.one(m.started_unix_s),
    ),
    Family::counter(
        "process_cpu_seconds_total",
        "Total user and system CPU time of the process, in seconds.",
        |_, s| s.one(crate::process_stats::cpu_seconds()),
    ),
    Family::gauge(
        "process_resident_memory_bytes",
        "Resident memory of the process, in bytes.",
        |_, s| s.one(crate::process_stats::resident_bytes()),
    ),
    Family::counter(
        "seatboard_handshakes_accepted_total",
        "WebSocket upgrades accepted.",
        |m, s| s.one(load(&m.handshakes_accepted)),
    ),
    Family::counter(
        "seatboard_handshakes_refused_total",
        "Requests refused before the upgrade, by reason.",
        |m, s| {
            for (r, n) in Refusal::ALL.iter().zip(&m.refused) {
                s.labelled("reason", r.label(), load(n));
            }
        },
    ),
    Family::counter(
        "seatboard_ws_closes_total",
        "Close frames sent, by code.",
        |m, s| {
            for (c, n) in CLOSE_CODES.iter().zip(&m.closes) {
                match c {
                    0 => s.labelled("code", "other", load(n)),
                    c => s.labelled("code", c, load(n)),
                }
            }
        },
    ),
    Family::counter(
        "seatboard_frames_sent_total",
        "Frames queued to clients.",
        |m, s| s.one(m.shard_sum(|sh| &sh.frames_queued)),
    ),
    Family::counter(
        "seatboard_frames_dropped_total",
        "Frames dropped because a send queue was full.",
        |m, s| s.one(m.shard_sum(|sh| &sh.frames_dropped)),
    ),
    Family::counter(
        "seatboard_resyncs_total",
        "Full frames sent to heal a client that missed one.",
        |m, s| s.one(m.shard_sum(|sh| &sh.resyncs)),
    ),
    Family::counter(
        "seatboard_frames_rendered_total",
        "Course frames encoded (once per course per tick).",
        |m, s| s.one(m.shard_sum(|sh| &sh.frames_rendered)),
    ),
    Family::counter(
        "seatboard_bytes_out_total",
        "Bytes written to WebSocket clients.",
        |m, s| s.one(m.shard_sum(|sh| &sh.bytes_out)),
    ),
    Family::counter(
        "seatboard_send_batches_total",
        "Batches of frames an io_uring shard sent with one submission (epoll and tokio shards send each frame with its own send(2)).",
        |m, s| s.one(m.shard_sum(|sh| &sh.send_batches)),
    ),
    Family::counter(
        "seatboard_ws_bytes_sent_total",
        "WebSocket bytes written to clients, as on the wire (compressed or not).",
        |m, s| s.one(m.shard_sum(|sh| &sh.bytes_out)),
    ),
    Family::counter(
        "seatboard_ws_payload_bytes_total",
        "WebSocket payload bytes queued to clients, before compression.",
        |m, s| s.one(m.shard_sum(|sh| &sh.ws_payload_bytes)),
    ),
    Family::counter(
        "seatboard_slow_consumer_closes_total",
        "Connections closed 4001.",
        |m, s| s.one(m.shard_sum(|sh| &sh.slow_consumer_closes)),
    ),
    Family::counter(
        "seatboard_idle_closes_total",
        "Connections closed for 75 s of silence.",
        |m, s| s.one(m.shard_sum(|sh| &sh.idle_closes)),
    ),
    Family::counter(
        "seatboard_client_errors_total",
        "Client mistakes answered with an error message.",
        |m, s| s.one(m.shard_sum(|sh| &sh.client_errors)),
    ),
    Family::counter(
        "seatboard_ingest_messages_total",
        "Valid snapshots received.",
        |m, s| s.one(load(&m.ingest_messages)),
    ),
    Family::counter(
        "seatboard_ingest_rejected_total",
        "Payloads dropped, by reason.",
        |m, s| {
            for (r, n) in Reject::ALL.iter().zip(&m.ingest_rejected) {
                s.labelled("reason", r.label(), load(n));
            }
        },
    ),
    Family::counter(
        "seatboard_ingest_duplicates_total",
        "Snapshots seen twice (overlapping subscriptions) or stale.",
        |m, s| s.one(load(&m.ingest_duplicates)),
    ),
    Family::counter(
        "seatboard_state_stale_total",
        "State hash entries read older than the version this node held (kept the newer, unless a repair wrote the entry): a publisher writing the hash out of order, or a write Redis lost.",
        |m, s| s.one(load(&m.state_stale)),
    ),
    Family::gauge(
        "seatboard_redis_connected",
        "1 while the pub/sub source is connected.",
        |m, s| s.one(load(&m.redis_connected)),
    ),
    Family::gauge(
        "seatboard_subscriptions",
        "Per-course channel subscriptions held.",
        |m, s| s.one(load(&m.subscriptions)),
    ),
    Family::gauge(
        "seatboard_firehose",
        "1 while the pattern subscription is held.",
        |m, s| s.one(load(&m.firehose)),
    ),
    Family::gauge(
        "seatboard_ingest_courses",
        "Courses the node holds a board of (watched, or known while an admin is connected).",
        |m, s| s.one(load(&m.ingest_courses)),
    ),
    Family::gauge(
        "seatboard_draining",
        "1 while draining.",
        |m, s| s.one(load(&m.draining)),
    ),
    Family::gauge(
        "seatboard_connections_total_open",
        "Open connections on the node (WebSocket and Server-Sent Events).",
        |m, s| s.one(m.connections()),
    ),
    Family::gauge(
        "seatboard_connections_by_transport",
        "Open connections on the node, by transport.",
        |m, s| {
            let sse = m.shard_sum(|sh| &sh.sse_connections);
            s.labelled("transport", "websocket", m.connections().saturating_sub(sse));
            s.labelled("transport", "sse", sse);
        },
    ),
    Family::counter(
        "seatboard_redis_reconnects_total",
        "Reconnects to Redis.",
        |m, s| s.one(load(&m.redis_reconnects)),
    ),
    Family::counter(
        "seatboard_presence_errors_total",
        "Presence pipelines that failed.",
        |m, s| s.one(load(&m.presence_errors)),
    ),
    Family::histogram(
        "seatboard_tick_duration_seconds",
        "Time of one render pass, per shard.",
        |m, s| {
            for (i, sh) in m.shards.iter().enumerate() {
                s.histogram(&sh.tick, &format!("shard=\"{i}\""));
            }
        },
    ),
    Family::histogram(
        "seatboard_update_latency_seconds",
        "From a snapshot's ts to its arrival at the hub.",
        |m, s| s.histogram(&m.update_latency, ""),
    ),
    Family::gauge(
        "seatboard_redis_rtt_seconds",
        "Round trip to Redis as the node last measured it (a PING every second), per node in a cluster; NaN while Redis does not answer.",
        |m, s| {
            let rtt = m.redis_rtt.lock().unwrap_or_else(|e| e.into_inner());
            for (node, secs) in rtt.iter() {
                let secs = secs.unwrap_or(f64::NAN);
                match node {
                    Some(node) => s.labelled("node", node, secs),
                    None => s.one(secs),
                }
            }
        },
    ),
    Family::histogram(
        "seatboard_seed_seconds",
        "From a course's first watch on this node to its state hash read and seeded.",
        |m, s| s.histogram(&m.seed, ""),
    ),
    Family::histogram(
        "seatboard_presence_pipeline_seconds",
        "Presence pipeline round trip.",
        |m, s| s.histogram(&m.presence_pipeline, ""),
    ),
];
