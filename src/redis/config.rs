//! The Redis flags every subcommand that talks to Redis takes (contract §1),
//! each with its environment twin.

use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Which Redis deployment seatboard talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    /// One Redis (with or without replicas behind it).
    Standalone,
    /// A Redis Cluster: keys routed by slot, sharded or classic pub/sub.
    Cluster,
    /// Cluster when the first reachable node reports `cluster_enabled:1`.
    Auto,
}

/// How pub/sub is done in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PubSubMode {
    /// `SPUBLISH`/`SSUBSCRIBE` on the primary owning the channel's slot.
    Sharded,
    /// `PUBLISH`/`SUBSCRIBE`/`PSUBSCRIBE` on one node (broadcast by the cluster).
    Classic,
}

/// `--redis`, `--redis-mode`, `--pubsub`, `--redis-ca`.
#[derive(Args, Debug, Clone)]
pub struct RedisFlags {
    /// Redis URI (`redis://` or `rediss://` for TLS; user/password sent with AUTH);
    /// in cluster mode a comma-separated list of seed nodes.
    #[arg(
        long,
        env = "REALTIME_REDIS_URI",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub redis: String,
    /// standalone, cluster, or auto (cluster when the first reachable node has cluster_enabled:1).
    #[arg(
        long,
        env = "SEATBOARD_REDIS_MODE",
        value_enum,
        default_value = "auto",
        global = true
    )]
    pub redis_mode: RedisMode,
    /// Pub/sub in cluster mode: sharded (SPUBLISH/SSUBSCRIBE) or classic (PUBLISH/SUBSCRIBE).
    #[arg(
        long,
        env = "SEATBOARD_PUBSUB",
        value_enum,
        default_value = "sharded",
        global = true
    )]
    pub pubsub: PubSubMode,
    /// PEM bundle that verifies a `rediss://` server (default: the system roots).
    #[arg(long, env = "SEATBOARD_REDIS_CA", global = true)]
    pub redis_ca: Option<PathBuf>,
}

impl RedisFlags {
    /// The defaults (auto mode, sharded pub/sub, system roots) for one URI list.
    pub fn new(redis: &str) -> RedisFlags {
        RedisFlags {
            redis: redis.to_owned(),
            redis_mode: RedisMode::Auto,
            pubsub: PubSubMode::Sharded,
            redis_ca: None,
        }
    }
}
