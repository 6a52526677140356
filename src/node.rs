//! Node-wide state every shard reads: configuration, metrics, the accept and
//! per-user caps, health flags. Written rarely; nothing here is on the frame path.

use crate::auth::Auth;
use crate::cli::HubArgs;
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

/// Stripes of the per-user connection count.
const USER_STRIPES: usize = 64;

/// Connections per user on this node, striped so handshakes rarely contend.
pub struct UserCounts {
    stripes: Vec<Mutex<HashMap<String, u32>>>,
}

impl UserCounts {
    fn new() -> Self {
        UserCounts {
            stripes: (0..USER_STRIPES)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn stripe(&self, user: &str) -> &Mutex<HashMap<String, u32>> {
        let h = user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        &self.stripes[(h as usize) % USER_STRIPES]
    }

    /// Takes a slot for `user` unless it already holds `cap`.
    pub fn acquire(&self, user: &str, cap: u32) -> bool {
        let mut m = self.stripe(user).lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(user.to_owned()).or_insert(0);
        if *n >= cap {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives a slot back.
    pub fn release(&self, user: &str) {
        let mut m = self.stripe(user).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                m.remove(user);
            }
        }
    }
}

/// What all shards of a node share.
pub struct Node {
    /// The flags it runs with.
    pub args: HubArgs,
    /// Shard count.
    pub shards: usize,
    /// Node id sent in `hello`.
    pub id: String,
    /// Token verification.
    pub auth: Auth,
    /// The `--allowed-origins` rule.
    pub origins: shards::origin::OriginRule,
    /// Metrics (shared with the ingest thread, which needs nothing else of the node).
    pub metrics: Arc<Metrics>,
    /// Set on the first SIGTERM/SIGINT.
    pub draining: AtomicBool,
    /// Open WebSocket connections on the node (the `max-connections` cap).
    pub open: AtomicU64,
    /// Per-user connection counts.
    pub users: UserCounts,
    /// `/api/courses` body, refreshed by whoever knows the courses.
    pub courses_json: RwLock<String>,
    /// `/api/history` cache (filled by the history thread, or the demo).
    pub history: Arc<crate::history::History>,
    /// Redis mode and reachable primaries for `/healthz` (`serve` only).
    pub redis_health: RwLock<Option<Arc<crate::redis::Health>>>,
}

impl Node {
    /// A node for these flags.
    pub fn new(args: HubArgs, shards: usize, auth: Auth) -> Self {
        let origins = shards::origin::OriginRule::parse(&args.allowed_origins);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "seatboard".into());
        let history = Arc::new(crate::history::History::new(&args.session));
        let metrics = Arc::new(Metrics::new(shards));
        metrics.max_connections.store(args.max_connections, Relaxed);
        Node {
            id: format!("{host}-{}", std::process::id()),
            args,
            shards,
            auth,
            origins,
            metrics,
            draining: AtomicBool::new(false),
            open: AtomicU64::new(0),
            users: UserCounts::new(),
            courses_json: RwLock::new("[]".into()),
            history,
            redis_health: RwLock::new(None),
        }
    }

    /// True while a drain runs.
    pub fn draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    /// Whether the page that sent this upgrade may connect with its token
    /// (contract §4's origin row; a cookie token counts only with `--auth jwt`).
    pub fn origin_allowed(&self, head: &shards::http_head::RequestHead) -> bool {
        let cookie_token = matches!(self.auth, Auth::Jwt(..))
            && head.token_source() == Some(shards::http_head::TokenSource::Cookie);
        self.origins
            .allows(head.origin.as_deref(), head.host.as_deref(), cookie_token)
    }

    /// Replaces the `/api/courses` list.
    pub fn set_courses(&self, courses: &[String]) {
        let json = serde_json::to_string(courses).unwrap_or_else(|_| "[]".into());
        *self.courses_json.write().unwrap_or_else(|e| e.into_inner()) = json;
    }
}
