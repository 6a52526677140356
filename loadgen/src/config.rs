//! What one viewer loop does: its target, its viewers and how they behave.
//! The rehearsal fills it from its flags; the bench suite sets the knobs
//! only it uses (`churn`, `sources`, `user_prefix`).

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

/// What one load-generator process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Server port.
    pub port: u16,
    /// Server address (127.0.0.1 unless given).
    #[serde(default = "loopback")]
    pub host: IpAddr,
    /// The `Host` header (default `127.0.0.1:<port>`).
    #[serde(default)]
    pub host_header: Option<String>,
    /// Path before `/ws` and `/sse` (empty, or `/seats` without the slash after).
    #[serde(default)]
    pub base_path: String,
    /// Local addresses to bind before connect, in turn (overrides `sources`).
    #[serde(default)]
    pub source_addrs: Vec<IpAddr>,
    /// The deployment runs `--auth none`: the user goes in `?user=`, no token.
    #[serde(default)]
    pub auth_none: bool,
    /// Each viewer watches 1..=max_courses distinct courses.
    #[serde(default = "one")]
    pub max_courses: u32,
    /// Latency from a section's version (`ts * 1000 + k`) when it has no `seat_info.t`.
    #[serde(default)]
    pub version_ts: bool,
    /// User ids are `<user_prefix><child>-<n>` (the bench suite's own prefix
    /// by default; the rehearsal sets its own).
    #[serde(default = "lg")]
    pub user_prefix: String,
    /// On the report, every open WebSocket says goodbye (close 1000 and a FIN).
    #[serde(default)]
    pub goodbye: bool,
    /// This process's index (user ids, seeds).
    pub child: u32,
    /// Connections to hold (ignored in churn mode).
    pub clients: usize,
    /// Course codes to pick from, in Zipf rank order.
    pub courses: Vec<String>,
    /// Zipf exponent for picking a course (0: uniform).
    pub skew: f64,
    /// New connections per second.
    pub connect_rate: f64,
    /// Handshakes in flight at most.
    pub inflight: usize,
    /// Handshake mode (the bench suite's `handshake` scenario only): leave right after the 101 (two of three with a close
    /// frame, the third by dropping the socket) and keep opening.
    pub churn: bool,
    /// HS256 secret for tokens.
    pub secret: String,
    /// RNG seed.
    pub seed: u64,
    /// Stop by itself after this many seconds.
    pub max_secs: u64,
    /// Number of 127.0.0.x source addresses (the bench suite's way past 28k
    /// connections to one port; the rehearsal gives `source_addrs`).
    pub sources: u8,
    /// Send a `watch` after the upgrade (false: connect and stay silent).
    #[serde(default = "yes")]
    pub watch: bool,
    /// Name the courses in the WebSocket upgrade (`/ws?course=C`, as the
    /// board page does) instead of sending `watch` messages after it.
    #[serde(default)]
    pub upgrade_courses: bool,
    /// Offer permessage-deflate (as browsers do) and inflate compressed
    /// messages, each with a fresh raw inflater (no context takeover).
    #[serde(default)]
    pub deflate: bool,
    /// Pre-minted tokens, one a line, used in turn (else HS256 minted with `secret`).
    #[serde(default)]
    pub tokens_file: Option<String>,
    /// Open `GET /sse?course=...` streams (Server-Sent Events) instead of
    /// WebSockets: the course is in the query, events are read instead of frames.
    #[serde(default)]
    pub sse: bool,
    /// An `https://` target: TLS with this server name (SNI and the name its
    /// certificate must hold); `None`, plain TCP.
    #[serde(default)]
    pub tls: Option<String>,
    /// The `Origin` a browser on the deployment's own page sends with its
    /// WebSocket upgrade (`https://seats.example.edu`); none when `None`.
    #[serde(default)]
    pub origin: Option<String>,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn lg() -> String {
    "lg".into()
}

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

impl Default for Config {
    fn default() -> Config {
        Config {
            port: 0,
            host: loopback(),
            host_header: None,
            base_path: String::new(),
            source_addrs: Vec::new(),
            auth_none: false,
            max_courses: 1,
            version_ts: false,
            user_prefix: lg(),
            goodbye: false,
            child: 0,
            clients: 0,
            courses: Vec::new(),
            skew: 0.0,
            connect_rate: 1.0,
            inflight: 256,
            churn: false,
            secret: String::new(),
            seed: 1,
            max_secs: 60,
            sources: 0,
            watch: true,
            upgrade_courses: false,
            deflate: false,
            tokens_file: None,
            sse: false,
            tls: None,
            origin: None,
        }
    }
}
