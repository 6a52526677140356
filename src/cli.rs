//! The command line: subcommands and flags, each flag with its environment twin.

use crate::node::{Compression, Driver};
use crate::redis::RedisTarget;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;

/// The release and the commit this binary was built from (`build.rs`; `unknown`
/// outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("SEATBOARD_COMMIT"),
    ")"
);

/// seatboard: a realtime seat board for university section selection.
#[derive(Parser, Debug)]
#[command(name = "seatboard", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The refusals that span flags (exit 2, the first line naming them, as
    /// clap's own).
    pub fn check(&self) -> Result<(), clap::Error> {
        match &self.command {
            Command::Serve(a) => keys_apart(&a.state_prefix, &a.presence_prefix),
            Command::Analytics(a) => keys_apart(&a.state_prefix, &a.presence_prefix),
            Command::Rehearse(a) => keys_apart(&a.redis.state_prefix, &a.presence_prefix),
            _ => Ok(()),
        }
    }
}

/// The text of a missing-flag refusal whose first line names every flag
/// missing (clap's puts them on the lines after it), with the subcommand's
/// usage (clap's shows the flags given as if they were required too). None
/// for any other refusal.
pub fn missing_flags(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::MissingRequiredArgument {
        return None;
    }
    let missing = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::Strings(v)) if !v.is_empty() => v.join(", "),
        _ => return None,
    };
    let usage = match e.get(ContextKind::Usage) {
        Some(ContextValue::StyledStr(u)) => usage_of(&u.to_string()),
        _ => None,
    };
    let mut text =
        format!("error: the following required arguments were not provided: {missing}\n");
    if let Some(u) = usage {
        text.push('\n');
        text.push_str(u.trim_end());
        text.push('\n');
    }
    text.push_str("\nFor more information, try '--help'.\n");
    Some(text)
}

/// The usage of the (sub)command a usage line of clap's is about: its
/// words up to the first flag (`Usage: seatboard analytics report ...`).
fn usage_of(line: &str) -> Option<String> {
    use clap::CommandFactory;
    let mut words = line
        .trim()
        .strip_prefix("Usage: ")?
        .split_whitespace()
        .take_while(|w| !w.starts_with(['-', '<', '[']));
    let mut cmd = Cli::command();
    if words.next()? != cmd.get_name() {
        return None;
    }
    cmd.build();
    for w in words {
        cmd = cmd.find_subcommand(w)?.clone();
    }
    Some(cmd.render_usage().to_string())
}

/// The subcommands. A negative number is taken as its flag's value, so it
/// is refused naming that flag (`--viewers -3`), not as an unknown argument.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// The realtime hub: WebSocket + HTTP on one port, Redis for pub/sub and presence.
    #[command(allow_negative_numbers = true)]
    Serve(HubArgs),
    /// The hub on an embedded in-process bus fed by the selection-window simulator (no Redis, no sign-on).
    #[command(allow_negative_numbers = true, mut_args = hidden_in_demo)]
    Demo(HubArgs),
    /// Publish one snapshot the way the selection API should (state hash compare-and-set, then PUBLISH).
    #[command(disable_version_flag = true, allow_negative_numbers = true)]
    Publish(PublishArgs),
    /// Publish a synthetic selection window into Redis (R snapshots/s over N courses, Zipf-skewed).
    #[command(allow_negative_numbers = true)]
    Simulate(SimulateArgs),
    /// Print the state hash's compare-and-set Lua script (its SHA1 on stderr), to run with EVALSHA.
    PublishScript,
    /// The analytics worker: per-bucket history of updates and viewers into a Redis stream.
    #[command(allow_negative_numbers = true)]
    Analytics(AnalyticsArgs),
    /// Print an HS256 token signed with --jwt-secret (for trials and load tests).
    #[command(allow_negative_numbers = true)]
    Token(TokenArgs),
    /// Rehearse a selection window against a running deployment before it opens.
    #[command(allow_negative_numbers = true)]
    Rehearse(RehearseArgs),
    /// The local publish relay: snapshots in as datagrams (Unix socket, loopback UDP), out to Redis.
    #[command(allow_negative_numbers = true)]
    Relay(RelayArgs),
    /// The reconciler: reads the selection database (read only) and repairs what Redis lost.
    #[command(allow_negative_numbers = true)]
    Reconcile(crate::reconcile::flags::ReconcileArgs),
    /// One share of a rehearsal's viewers in a process of its own (`rehearse` starts it).
    #[command(name = "__rehearse-viewers", hide = true)]
    RehearseViewers,
}

/// The flags of `serve` that `demo` takes but ignores (it has no Redis and
/// always runs with `--auth none`): left out of its help.
const IGNORED_BY_DEMO: &[&str] = &[
    "redis",
    "redis_mode",
    "pubsub",
    "redis_ca",
    "channel_prefix",
    "state_prefix",
    "presence_prefix",
    "analytics_prefix",
    "jwt_secret",
    "jwks_url",
    "jwks_ca",
    "jwt_public_key",
    "jwt_issuer",
    "jwt_audience",
    "jwt_role_claim",
    "auth",
];

/// `arg`, hidden from `demo --help` when `demo` ignores it.
fn hidden_in_demo(arg: clap::Arg) -> clap::Arg {
    if IGNORED_BY_DEMO.contains(&arg.get_id().as_str()) {
        arg.hide(true)
    } else {
        arg
    }
}

/// `seatboard rehearse` (contract section 9).
#[derive(Args, Debug, Clone)]
pub struct RehearseArgs {
    /// The deployment as browsers reach it (`http://seats.example.edu`, or one node).
    #[arg(long, env = "SEATBOARD_REHEARSE_TARGET")]
    pub target: String,
    /// Redis and prefixes, as for `serve`.
    #[command(flatten)]
    pub redis: RedisTarget,
    /// Log level (error, warn, info, debug, trace); `warn` for a command
    /// that runs once.
    #[arg(long, env = "SEATBOARD_LOG", default_value = "warn")]
    pub log_level: String,
    /// Presence sorted-set prefix (the rehearsal's presence keys are deleted at the end).
    #[arg(long, env = "SEATBOARD_PRESENCE_PREFIX", default_value = "presence:", value_parser = crate::redis::config::prefix)]
    pub presence_prefix: String,
    /// Viewers to connect.
    #[arg(long, env = "SEATBOARD_REHEARSE_VIEWERS", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub viewers: u32,
    /// New viewers per second while ramping.
    #[arg(long, env = "SEATBOARD_REHEARSE_CONNECT_RATE", default_value_t = 500.0, value_parser = rate_per_s)]
    pub connect_rate: f64,
    /// Share of viewers on /sse instead of WebSocket (0..1).
    #[arg(long, env = "SEATBOARD_REHEARSE_SSE_SHARE", default_value_t = 0.0, value_parser = share)]
    pub sse_share: f64,
    /// Rehearsal courses.
    #[arg(long, env = "SEATBOARD_REHEARSE_COURSES", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub courses: u32,
    /// Zipf skew of viewers and publishes over the courses.
    #[arg(long, env = "SEATBOARD_REHEARSE_HOT_SKEW", default_value_t = 1.1, value_parser = non_negative_f64)]
    pub hot_skew: f64,
    /// Snapshots per second published through Redis after the ramp.
    #[arg(long, env = "SEATBOARD_REHEARSE_PUBLISH_RATE", default_value_t = 2000.0, value_parser = rate_per_s)]
    pub publish_rate: f64,
    /// Seconds of publishing after the ramp.
    #[arg(long, env = "SEATBOARD_REHEARSE_DURATION", default_value_t = 60.0, value_parser = run_seconds)]
    pub duration: f64,
    /// Course code prefix of the rehearsal's courses.
    #[arg(long, env = "SEATBOARD_REHEARSAL_PREFIX", default_value = "REHEARSAL-", value_parser = crate::redis::config::prefix)]
    pub rehearsal_prefix: String,
    /// HS256 secret to mint the viewers' tokens with.
    #[arg(long, env = "SEATBOARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Tokens, one per line, used in turn.
    #[arg(long, env = "SEATBOARD_REHEARSE_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Local addresses to spread viewers over (comma-separated).
    #[arg(long, env = "SEATBOARD_REHEARSE_SOURCE_ADDRS", value_delimiter = ',')]
    pub source_addrs: Vec<std::net::IpAddr>,
    /// Nodes whose `/metrics` to watch over the run (CPU, RSS, Redis), as
    /// http:// or https:// URLs (comma-separated; default: what answers at --target).
    #[arg(long, env = "SEATBOARD_REHEARSE_NODES", value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Target: publish-to-screen p99 in ms.
    #[arg(long, env = "SEATBOARD_REHEARSE_P99_MS", default_value_t = 1000.0, value_parser = positive_f64)]
    pub p99_ms: f64,
    /// Target: share of refused upgrades (0..1).
    #[arg(long, env = "SEATBOARD_REHEARSE_MAX_REFUSED", default_value_t = 0.01, value_parser = share)]
    pub max_refused: f64,
    /// Viewers one process holds at most (default: its open-file limit less
    /// a reserve); past it, viewers run in child processes.
    #[arg(long, env = "SEATBOARD_REHEARSE_VIEWERS_PER_PROCESS", hide = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub viewers_per_process: Option<u32>,
    /// The figures as JSON.
    #[arg(long, env = "SEATBOARD_REHEARSE_JSON")]
    pub json: Option<std::path::PathBuf>,
    /// A self-contained HTML report.
    #[arg(long, env = "SEATBOARD_REHEARSE_REPORT")]
    pub report: Option<std::path::PathBuf>,
}

/// The state hashes' and the presence keys' prefixes keep their keys apart:
/// where one begins with the other, a course's presence key may be another
/// course's state hash, and a `SCAN` of one finds the other's keys.
pub fn keys_apart(state: &str, presence: &str) -> Result<(), clap::Error> {
    if state.starts_with(presence) || presence.starts_with(state) {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "'--presence-prefix {presence}' and '--state-prefix {state}' overlap: one begins with the other, so presence keys and state hashes could share names\n"
            ),
        ));
    }
    Ok(())
}

/// A selection window id: the rule `/api/history` reads a session by.
fn session(s: &str) -> Result<String, String> {
    if crate::history::valid_session(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a session id: 1-128 of [A-Za-z0-9_.:-]"
        ))
    }
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// How upgrades are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Signed JWTs (HS256 secret, PEM public key, JWKS).
    Jwt,
    /// User from `?user=`, role from `?role=` (tests and demo only).
    None,
}

/// Flags shared by `serve` and `demo`.
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// Address to listen on (WebSocket and HTTP).
    #[arg(long, env = "SEATBOARD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Redis: URIs, mode, pub/sub flavour, CA.
    #[command(flatten)]
    pub redis: crate::redis::RedisFlags,
    /// Shard threads (default: usable cores, at most 128).
    #[arg(long, env = "SEATBOARD_SHARDS", value_parser = clap::value_parser!(u16).range(1..=crate::shard_set::ShardSet::MAX as i64))]
    pub shards: Option<u16>,
    /// io driver.
    #[arg(long, env = "SEATBOARD_DRIVER", value_enum, default_value = "auto")]
    pub driver: Driver,
    /// permessage-deflate: accepted when a client offers it (`on`), or never.
    #[arg(long, env = "SEATBOARD_COMPRESSION", value_enum, default_value = "on")]
    pub compression: Compression,
    /// Pub/sub channel prefix.
    #[arg(long, env = "SEATBOARD_CHANNEL_PREFIX", default_value = "seats:", value_parser = crate::redis::config::prefix)]
    pub channel_prefix: String,
    /// State hash prefix.
    #[arg(long, env = "SEATBOARD_STATE_PREFIX", default_value = "seatstate:", value_parser = crate::redis::config::prefix)]
    pub state_prefix: String,
    /// Presence sorted-set prefix.
    #[arg(long, env = "SEATBOARD_PRESENCE_PREFIX", default_value = "presence:", value_parser = crate::redis::config::prefix)]
    pub presence_prefix: String,
    /// Student frame interval (ms).
    #[arg(long, env = "SEATBOARD_TICK_MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub tick_ms: u64,
    /// Admin aggregate interval (ms).
    #[arg(long, env = "SEATBOARD_ADMIN_TICK_MS", default_value_t = 750, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub admin_tick_ms: u64,
    /// Presence count interval (ms).
    #[arg(long, env = "SEATBOARD_PRESENCE_TICK_MS", default_value_t = 3000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub presence_tick_ms: u64,
    /// Presence TTL (ms), refreshed every TTL/2.
    #[arg(long, env = "SEATBOARD_PRESENCE_TTL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub presence_ttl_ms: u64,
    /// New WebSocket connections per second per node (token bucket).
    #[arg(long, env = "SEATBOARD_ACCEPT_RATE", default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pub accept_rate: u32,
    /// Accept bucket size.
    #[arg(long, env = "SEATBOARD_ACCEPT_BURST", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub accept_burst: u32,
    /// WebSocket connections per node.
    #[arg(long, env = "SEATBOARD_MAX_CONNECTIONS", default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// WebSocket connections per user per node.
    #[arg(long, env = "SEATBOARD_MAX_CONNS_PER_USER", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_conns_per_user: u32,
    /// Drain window (ms).
    #[arg(long, env = "SEATBOARD_DRAIN_MS", default_value_t = 45_000)]
    pub drain_ms: u64,
    /// HS256 secret for tokens, at least 32 bytes (`openssl rand -base64 48`).
    #[arg(long, env = "SEATBOARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// The identity provider: JWKS, PEM public key, issuer, audience, role claim.
    #[command(flatten)]
    pub idp: crate::auth::flags::IdpFlags,
    /// Authentication mode.
    #[arg(long, env = "SEATBOARD_AUTH", value_enum, default_value = "jwt")]
    pub auth: AuthMode,
    /// Comma-separated exact origins allowed, `http(s)://host[:port]` (empty: any for Authorization/?token=, the page's own for the cookie).
    #[arg(long, env = "SEATBOARD_ALLOWED_ORIGINS", default_value = "", value_parser = shards::origin::OriginRule::parse)]
    pub allowed_origins: shards::origin::OriginRule,
    /// Selection window id (for analytics), 1-128 of [A-Za-z0-9_.:-].
    #[arg(long, env = "SEATBOARD_SESSION", default_value = "default", value_parser = session)]
    pub session: String,
    /// Analytics stream key prefix (`/api/history` reads `<prefix><session>`).
    #[arg(long, env = "SEATBOARD_ANALYTICS_PREFIX", default_value = "analytics:")]
    pub analytics_prefix: String,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "SEATBOARD_LOG", default_value = "info")]
    pub log_level: String,
}

/// `seatboard publish`: one snapshot.
#[derive(Args, Debug, Clone)]
pub struct PublishArgs {
    /// Course code (1-64 of [A-Za-z0-9_.-]).
    #[arg(long, env = "SEATBOARD_PUBLISH_COURSE")]
    pub course: String,
    /// Section id.
    #[arg(long, env = "SEATBOARD_PUBLISH_SECTION", value_parser = clap::value_parser!(u32).range(0..=2_147_483_647))]
    pub section: u32,
    /// Seats in the section.
    #[arg(long, env = "SEATBOARD_PUBLISH_TOTAL", value_parser = clap::value_parser!(u32).range(0..=2_147_483_647))]
    pub total: u32,
    /// Seats taken.
    #[arg(long, env = "SEATBOARD_PUBLISH_TAKEN", value_parser = clap::value_parser!(u32).range(0..=2_147_483_647))]
    pub taken: u32,
    /// Snapshot version, 0..2^53 (omitted: no version, the snapshot replaces whatever is held).
    #[arg(long, env = "SEATBOARD_PUBLISH_VERSION", allow_negative_numbers = true, value_parser = version)]
    pub version: Option<u64>,
    /// Extra section data, a JSON object passed through untouched.
    #[arg(long, env = "SEATBOARD_PUBLISH_SEAT_INFO")]
    pub seat_info: Option<String>,
    /// Redis and prefixes.
    #[command(flatten)]
    pub target: RedisTarget,
    /// Log level (error, warn, info, debug, trace); `warn` for a command
    /// that runs once.
    #[arg(long, env = "SEATBOARD_LOG", default_value = "warn")]
    pub log_level: String,
}

/// `seatboard relay` (contract §10).
#[derive(Args, Debug, Clone)]
pub struct RelayArgs {
    /// Unix datagram socket to receive on (its folder is made, a stale socket
    /// replaced, mode 0660); '' turns it off.
    #[arg(
        long,
        env = "SEATBOARD_RELAY_SOCKET",
        default_value = "/run/seatboard/relay.sock"
    )]
    pub socket: String,
    /// Loopback UDP address to receive on, IP:PORT with an IPv6 address in
    /// brackets (127.0.0.1, ::1, or the IPv4-mapped ::ffff:127.0.0.1; off by
    /// default: every local user can send to a loopback port); '' turns it off.
    #[arg(long, env = "SEATBOARD_RELAY_UDP", default_value = "")]
    pub udp: String,
    /// Address of GET /metrics and GET /healthz; '' turns it off.
    #[arg(
        long,
        env = "SEATBOARD_RELAY_METRICS",
        default_value = "127.0.0.1:7441"
    )]
    pub metrics: String,
    /// Sections held for Redis at most (past that a new section is dropped, counted).
    #[arg(long, env = "SEATBOARD_RELAY_MAX_PENDING", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_pending: u64,
    /// Bytes of snapshots held for Redis at most (past that a new section is dropped, counted;
    /// a newer snapshot of a held section may pass it by 64 KiB).
    #[arg(long, env = "SEATBOARD_RELAY_MAX_PENDING_BYTES", default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(65_536..=(1 << 40)))]
    pub max_pending_bytes: u64,
    /// Redis and prefixes, as for `serve`.
    #[command(flatten)]
    pub target: RedisTarget,
    /// Log level (error, warn, info, debug, trace), as for `serve`.
    #[arg(long, env = "SEATBOARD_LOG", default_value = "info")]
    pub log_level: String,
}

/// `seatboard simulate`: a synthetic selection window.
#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Snapshots per second.
    #[arg(long, env = "SEATBOARD_SIMULATE_RATE", default_value_t = 100.0, value_parser = rate_per_s)]
    pub rate: f64,
    /// Number of courses (COURSE0000, COURSE0001, ...).
    #[arg(long, env = "SEATBOARD_SIMULATE_COURSES", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub courses: u32,
    /// How long to run, in seconds.
    #[arg(long, env = "SEATBOARD_SIMULATE_DURATION", default_value_t = 60.0, value_parser = run_seconds)]
    pub duration: f64,
    /// Zipf exponent of course popularity.
    #[arg(long, env = "SEATBOARD_SIMULATE_HOT_SKEW", default_value_t = 1.1, value_parser = non_negative_f64)]
    pub hot_skew: f64,
    /// Redis and prefixes.
    #[command(flatten)]
    pub target: RedisTarget,
    /// Log level (error, warn, info, debug, trace); `warn` for a command
    /// that runs once.
    #[arg(long, env = "SEATBOARD_LOG", default_value = "warn")]
    pub log_level: String,
}

/// A snapshot version: an integer 0..=2^53, the hub's rule (contract §2).
fn version(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if shards::snapshot::valid_version(v) => Ok(v),
        _ => Err(format!(
            "{s:?} is not a version: an integer 0..={}",
            shards::snapshot::MAX_VERSION
        )),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// Slowest rate a run takes (per second): one event every 1,000 s.
const MIN_RATE_PER_S: f64 = 0.001;

/// Longest run (seconds): a year.
const MAX_RUN_S: f64 = 365.0 * 86_400.0;

/// A rate of a timed run, so slow that its interval would not fit a clock refused.
fn rate_per_s(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= MIN_RATE_PER_S => Ok(v),
        _ => Err(format!(
            "{s:?} is not a rate of at least {MIN_RATE_PER_S} per second"
        )),
    }
}

/// The length of a timed run in seconds: positive, at most a year.
fn run_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_RUN_S => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds above 0 and at most {MAX_RUN_S} (a year)"
        )),
    }
}

fn non_negative_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number")),
    }
}

/// Flags of `seatboard analytics` (the shared ones also apply to `report`).
#[derive(Args, Debug, Clone)]
pub struct AnalyticsArgs {
    /// Run something else than the worker.
    #[command(subcommand)]
    pub action: Option<AnalyticsCommand>,
    /// Redis: URIs, mode, pub/sub flavour, CA.
    #[command(flatten)]
    pub redis: crate::redis::RedisFlags,
    /// Pub/sub channel prefix (the worker subscribes to `<prefix>*`).
    #[arg(long, env = "SEATBOARD_CHANNEL_PREFIX", default_value = "seats:", value_parser = crate::redis::config::prefix)]
    pub channel_prefix: String,
    /// State hash prefix (sharded cluster: the courses to shard-subscribe are found by SCAN of it).
    #[arg(long, env = "SEATBOARD_STATE_PREFIX", default_value = "seatstate:", value_parser = crate::redis::config::prefix)]
    pub state_prefix: String,
    /// Presence sorted-set prefix (read only).
    #[arg(long, env = "SEATBOARD_PRESENCE_PREFIX", default_value = "presence:", value_parser = crate::redis::config::prefix)]
    pub presence_prefix: String,
    /// Selection window id, 1-128 of [A-Za-z0-9_.:-]: entries go to `<analytics-prefix><session>`.
    #[arg(
        long,
        env = "SEATBOARD_SESSION",
        default_value = "default",
        global = true,
        value_parser = session
    )]
    pub session: String,
    /// Stream key prefix.
    #[arg(
        long,
        env = "SEATBOARD_ANALYTICS_PREFIX",
        default_value = "analytics:",
        global = true
    )]
    pub analytics_prefix: String,
    /// Bucket length (ms); buckets are aligned to wall-clock multiples of it.
    #[arg(long, env = "SEATBOARD_BUCKET_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub bucket_ms: u64,
    /// Courses beginning with this are a rehearsal's (`seatboard rehearse`) and not counted.
    #[arg(long, env = "SEATBOARD_REHEARSAL_PREFIX", default_value = "REHEARSAL-", value_parser = crate::redis::config::prefix)]
    pub rehearsal_prefix: String,
    /// Approximate stream length cap (`XADD MAXLEN ~`).
    #[arg(long, env = "SEATBOARD_ANALYTICS_MAX_LEN", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_len: u64,
    /// Address of GET /metrics and GET /healthz (IP:PORT); '' (the default) turns it off.
    #[arg(long, env = "SEATBOARD_ANALYTICS_METRICS", default_value = "")]
    pub metrics: String,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "SEATBOARD_LOG", default_value = "info", global = true)]
    pub log_level: String,
}

/// Subcommands of `seatboard analytics`.
#[derive(Subcommand, Debug, Clone)]
pub enum AnalyticsCommand {
    /// Print the series of a session as a table (or CSV) and exit.
    Report(ReportArgs),
}

/// Flags of `seatboard analytics report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// CSV instead of a table.
    #[arg(long, env = "SEATBOARD_ANALYTICS_REPORT_CSV")]
    pub csv: bool,
    /// Only the last N entries (0: all).
    #[arg(long, env = "SEATBOARD_ANALYTICS_REPORT_LAST", default_value_t = 0)]
    pub last: usize,
}

/// The role a minted token carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenRole {
    /// A student (the `/ws` feed).
    Student,
    /// An admin (also `/ws/admin`).
    Admin,
}

/// Flags of `seatboard token`.
#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// User id (`sub`).
    #[arg(long, env = "SEATBOARD_TOKEN_USER")]
    pub user: String,
    /// Role claim.
    #[arg(
        long,
        env = "SEATBOARD_TOKEN_ROLE",
        value_enum,
        default_value = "student"
    )]
    pub role: TokenRole,
    /// Lifetime: seconds, or a number with s, m, h or d (`90s`, `30m`, `1h`, `7d`).
    #[arg(long, env = "SEATBOARD_TOKEN_TTL", default_value = "1h", value_parser = parse_ttl)]
    pub ttl: u64,
    /// HS256 secret, at least 32 bytes (the one `serve` verifies with).
    #[arg(long, env = "SEATBOARD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
}

/// Longest lifetime minted: a year.
const MAX_TTL_S: u64 = 366 * 86_400;

/// Seconds of a `--ttl` value.
pub fn parse_ttl(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: use seconds or s, m, h, d (`1h`)")),
    };
    match num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)) {
        Some(t) if (1..=MAX_TTL_S).contains(&t) => Ok(t),
        _ => Err(format!("{s:?}: between 1 s and 366 d")),
    }
}
