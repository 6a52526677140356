//! Node-wide state every shard reads: configuration, metrics, the accept and
//! per-user caps, health flags. Written rarely; nothing here is on the frame path.

mod config;
mod users;

pub use config::{Compression, Driver, NodeConfig};
pub use users::UserCounts;

use crate::auth::Auth;
use crate::metrics::Metrics;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};

/// What all shards of a node share.
pub struct Node {
    /// What it runs with.
    pub config: NodeConfig,
    /// Node id sent in `hello`.
    pub id: String,
    /// Token verification.
    pub auth: Auth,
    /// Metrics (shared with the ingest thread, which needs nothing else of the node).
    pub metrics: Arc<Metrics>,
    /// Open WebSocket connections on the node (the `max-connections` cap).
    pub open: AtomicU64,
    /// The node's accept bucket (`--accept-rate`, `--accept-burst`), one for
    /// every shard.
    pub accept_bucket: shards::rate::AcceptBucket,
    /// Per-user connection counts.
    pub users: UserCounts,
    /// `/api/courses` body, refreshed by whoever knows the courses.
    pub courses_json: RwLock<String>,
    /// `/api/history` cache (filled by the history thread, or the demo).
    pub history: Arc<crate::history::History>,
    /// The Redis deployment, for `/healthz`'s mode and reachable primaries (`serve` only).
    pub redis: OnceLock<Arc<crate::redis::Redis>>,
}

impl Node {
    /// A node for this configuration.
    pub fn new(config: NodeConfig, auth: Auth) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "seatboard".into());
        let history = Arc::new(crate::history::History::new(&config.session));
        let metrics = Arc::new(Metrics::new(config.shards));
        metrics
            .max_connections
            .store(config.max_connections, Relaxed);
        let accept_bucket = shards::rate::AcceptBucket::new(
            config.accept_rate as f64,
            config.accept_burst as f64,
            crate::clock::now_us(),
        );
        Node {
            id: format!("{host}-{}", std::process::id()),
            config,
            auth,
            metrics,
            open: AtomicU64::new(0),
            accept_bucket,
            users: UserCounts::new(),
            courses_json: RwLock::new("[]".into()),
            history,
            redis: OnceLock::new(),
        }
    }

    /// True while a drain runs (the one drain state, `seatboard_draining`,
    /// set on the first SIGTERM/SIGINT), or once a thread failed the node.
    pub fn draining(&self) -> bool {
        self.metrics.draining.load(Relaxed) != 0 || crate::failure::failed().is_some()
    }

    /// Whether the page that sent this upgrade may connect with its token
    /// (contract §4's origin row; a cookie token counts only with `--auth jwt`).
    pub fn origin_allowed(&self, head: &shards::http_head::RequestHead<'_>) -> bool {
        let cookie_token = matches!(self.auth, Auth::Jwt(..))
            && head.token_source() == Some(shards::http_head::TokenSource::Cookie);
        self.config
            .origins
            .allows(head.origin, head.host, cookie_token)
    }

    /// Replaces the `/api/courses` list.
    pub fn set_courses(&self, courses: &[String]) {
        let json = serde_json::to_string(courses).unwrap_or_else(|_| "[]".into());
        *self.courses_json.write().unwrap_or_else(|e| e.into_inner()) = json;
    }
}
