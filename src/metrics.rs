//! Node metrics: plain atomics written by their one owner, summed on scrape and
//! rendered in the Prometheus text format.

use shards::Reject;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// A fixed-bucket histogram of seconds, lock-free.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (seconds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Records one observation in microseconds.
    pub fn observe_us(&self, us: u64) {
        let secs = us as f64 / 1e6;
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let lb = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{lb} {}",
            self.sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{lb} {cum}");
    }
}

/// Bucket bounds for tick durations.
pub const TICK_BOUNDS: &[f64] = &[0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1];
/// Bucket bounds for publish-to-send latency and Redis pipelines.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.5,
];

/// One shard's numbers, written only by that shard's thread.
pub struct ShardMetrics {
    /// Open WebSocket connections.
    pub connections: AtomicU64,
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
}

impl Refusal {
    /// Every refusal, in `/metrics` order.
    pub const ALL: [Refusal; 12] = [
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
        }
    }
}

/// Close codes counted in `/metrics`.
pub const CLOSE_CODES: [u16; 11] = [
    1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011, 1012, 4001, 0,
];

/// The I/O drivers a shard can run on, in `/metrics` order.
pub const DRIVERS: [&str; 3] = ["io_uring", "epoll", "tokio"];

/// Picks one counter out of a shard's metrics.
type ShardField = fn(&ShardMetrics) -> &AtomicU64;

/// Everything `/metrics` shows.
pub struct Metrics {
    /// Per-shard numbers.
    pub shards: Vec<ShardMetrics>,
    /// Upgrades accepted.
    pub handshakes_accepted: AtomicU64,
    /// Requests refused, indexed like [`Refusal::ALL`].
    pub refused: [AtomicU64; 12],
    /// Closes sent, indexed like [`CLOSE_CODES`] (last: other).
    pub closes: [AtomicU64; 11],
    /// Valid snapshots received from the source.
    pub ingest_messages: AtomicU64,
    /// Payloads dropped, indexed like [`Reject::ALL`].
    pub ingest_rejected: [AtomicU64; 4],
    /// Duplicates dropped (same section and version seen twice).
    pub ingest_duplicates: AtomicU64,
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
            redis_connected: AtomicU64::new(0),
            redis_reconnects: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
            firehose: AtomicU64::new(0),
            ingest_courses: AtomicU64::new(0),
            update_latency: Histogram::new(LATENCY_BOUNDS),
            presence_pipeline: Histogram::new(LATENCY_BOUNDS),
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

    /// Counts a refusal.
    pub fn refuse(&self, r: Refusal) {
        let i = Refusal::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.refused[i].fetch_add(1, Relaxed);
    }

    /// Counts a payload rejected by the ingest parser.
    pub fn reject(&self, r: Reject) {
        let i = Reject::ALL.iter().position(|x| *x == r).unwrap_or(0);
        self.ingest_rejected[i].fetch_add(1, Relaxed);
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(8192);
        let sum = |f: ShardField| -> u64 { self.shards.iter().map(|s| f(s).load(Relaxed)).sum() };
        let family = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            &mut o,
            "seatboard_connections",
            "gauge",
            "Open WebSocket connections per shard.",
        );
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_connections{{shard=\"{i}\"}} {}",
                s.connections.load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_courses_watched",
            "gauge",
            "Courses with a viewer, per shard.",
        );
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_courses_watched{{shard=\"{i}\"}} {}",
                s.courses.load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_shard_core",
            "gauge",
            "The CPU core each shard is pinned to (-1: not pinned).",
        );
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_shard_core{{shard=\"{i}\"}} {}",
                s.core.load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_shard_heartbeat_age_seconds",
            "gauge",
            "Time since each shard's event loop last ran (probed every few seconds).",
        );
        let now_ms = crate::clock::now_ms();
        for (i, s) in self.shards.iter().enumerate() {
            let age_ms = now_ms.saturating_sub(s.heartbeat_ms.load(Relaxed));
            let _ = writeln!(
                o,
                "seatboard_shard_heartbeat_age_seconds{{shard=\"{i}\"}} {}",
                age_ms as f64 / 1e3
            );
        }
        family(
            &mut o,
            "seatboard_driver_shards",
            "gauge",
            "Shards running on each I/O driver.",
        );
        for (i, d) in DRIVERS.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_driver_shards{{driver=\"{d}\"}} {}",
                self.driver_shards[i].load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_pin_failures_total",
            "counter",
            "Shards whose thread could not be pinned to a core.",
        );
        let _ = writeln!(
            o,
            "seatboard_pin_failures_total {}",
            self.pin_failures.load(Relaxed)
        );
        family(
            &mut o,
            "seatboard_max_connections",
            "gauge",
            "The node's connection cap (--max-connections).",
        );
        let _ = writeln!(
            o,
            "seatboard_max_connections {}",
            self.max_connections.load(Relaxed)
        );
        family(
            &mut o,
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch, in seconds.",
        );
        let _ = writeln!(o, "process_start_time_seconds {}", self.started_unix_s);
        family(
            &mut o,
            "seatboard_handshakes_accepted_total",
            "counter",
            "WebSocket upgrades accepted.",
        );
        let _ = writeln!(
            o,
            "seatboard_handshakes_accepted_total {}",
            self.handshakes_accepted.load(Relaxed)
        );
        family(
            &mut o,
            "seatboard_handshakes_refused_total",
            "counter",
            "Requests refused before the upgrade, by reason.",
        );
        for (i, r) in Refusal::ALL.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_handshakes_refused_total{{reason=\"{}\"}} {}",
                r.label(),
                self.refused[i].load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_ws_closes_total",
            "counter",
            "Close frames sent, by code.",
        );
        for (i, c) in CLOSE_CODES.iter().enumerate() {
            let code = if *c == 0 {
                "other".to_string()
            } else {
                c.to_string()
            };
            let _ = writeln!(
                o,
                "seatboard_ws_closes_total{{code=\"{code}\"}} {}",
                self.closes[i].load(Relaxed)
            );
        }
        let counters: [(&str, &str, ShardField); 11] = [
            (
                "seatboard_frames_sent_total",
                "Frames queued to clients.",
                |s| &s.frames_queued,
            ),
            (
                "seatboard_frames_dropped_total",
                "Frames dropped because a send queue was full.",
                |s| &s.frames_dropped,
            ),
            (
                "seatboard_resyncs_total",
                "Full frames sent to heal a client that missed one.",
                |s| &s.resyncs,
            ),
            (
                "seatboard_frames_rendered_total",
                "Course frames encoded (once per course per tick).",
                |s| &s.frames_rendered,
            ),
            (
                "seatboard_bytes_out_total",
                "Bytes written to WebSocket clients.",
                |s| &s.bytes_out,
            ),
            (
                "seatboard_send_batches_total",
                "Batches of frames an io_uring shard sent with one submission (epoll and tokio shards send each frame with its own send(2)).",
                |s| &s.send_batches,
            ),
            (
                "seatboard_ws_bytes_sent_total",
                "WebSocket bytes written to clients, as on the wire (compressed or not).",
                |s| &s.bytes_out,
            ),
            (
                "seatboard_ws_payload_bytes_total",
                "WebSocket payload bytes queued to clients, before compression.",
                |s| &s.ws_payload_bytes,
            ),
            (
                "seatboard_slow_consumer_closes_total",
                "Connections closed 4001.",
                |s| &s.slow_consumer_closes,
            ),
            (
                "seatboard_idle_closes_total",
                "Connections closed for 75 s of silence.",
                |s| &s.idle_closes,
            ),
            (
                "seatboard_client_errors_total",
                "Client mistakes answered with an error message.",
                |s| &s.client_errors,
            ),
        ];
        for (name, help, f) in counters {
            family(&mut o, name, "counter", help);
            let _ = writeln!(o, "{name} {}", sum(f));
        }
        family(
            &mut o,
            "seatboard_ingest_messages_total",
            "counter",
            "Valid snapshots received.",
        );
        let _ = writeln!(
            o,
            "seatboard_ingest_messages_total {}",
            self.ingest_messages.load(Relaxed)
        );
        family(
            &mut o,
            "seatboard_ingest_rejected_total",
            "counter",
            "Payloads dropped, by reason.",
        );
        for (i, r) in Reject::ALL.iter().enumerate() {
            let _ = writeln!(
                o,
                "seatboard_ingest_rejected_total{{reason=\"{}\"}} {}",
                r.label(),
                self.ingest_rejected[i].load(Relaxed)
            );
        }
        family(
            &mut o,
            "seatboard_ingest_duplicates_total",
            "counter",
            "Snapshots seen twice (overlapping subscriptions) or stale.",
        );
        let _ = writeln!(
            o,
            "seatboard_ingest_duplicates_total {}",
            self.ingest_duplicates.load(Relaxed)
        );
        let gauges: [(&str, &str, &AtomicU64); 6] = [
            (
                "seatboard_redis_connected",
                "1 while the pub/sub source is connected.",
                &self.redis_connected,
            ),
            (
                "seatboard_subscriptions",
                "Per-course channel subscriptions held.",
                &self.subscriptions,
            ),
            (
                "seatboard_firehose",
                "1 while the pattern subscription is held.",
                &self.firehose,
            ),
            (
                "seatboard_ingest_courses",
                "Courses the node holds a board of (watched, or known while an admin is connected).",
                &self.ingest_courses,
            ),
            ("seatboard_draining", "1 while draining.", &self.draining),
            (
                "seatboard_connections_total_open",
                "Open WebSocket connections on the node.",
                &AtomicU64::new(self.connections()),
            ),
        ];
        for (name, help, v) in gauges {
            family(&mut o, name, "gauge", help);
            let _ = writeln!(o, "{name} {}", v.load(Relaxed));
        }
        family(
            &mut o,
            "seatboard_redis_reconnects_total",
            "counter",
            "Reconnects to Redis.",
        );
        let _ = writeln!(
            o,
            "seatboard_redis_reconnects_total {}",
            self.redis_reconnects.load(Relaxed)
        );
        family(
            &mut o,
            "seatboard_presence_errors_total",
            "counter",
            "Presence pipelines that failed.",
        );
        let _ = writeln!(
            o,
            "seatboard_presence_errors_total {}",
            self.presence_errors.load(Relaxed)
        );
        family(
            &mut o,
            "seatboard_tick_duration_seconds",
            "histogram",
            "Time of one render pass, per shard.",
        );
        for (i, s) in self.shards.iter().enumerate() {
            s.tick.render(
                &mut o,
                "seatboard_tick_duration_seconds",
                &format!("shard=\"{i}\""),
            );
        }
        family(
            &mut o,
            "seatboard_update_latency_seconds",
            "histogram",
            "From a snapshot's ts to its arrival at the hub.",
        );
        self.update_latency
            .render(&mut o, "seatboard_update_latency_seconds", "");
        family(
            &mut o,
            "seatboard_presence_pipeline_seconds",
            "histogram",
            "Presence pipeline round trip.",
        );
        self.presence_pipeline
            .render(&mut o, "seatboard_presence_pipeline_seconds", "");
        o
    }
}
