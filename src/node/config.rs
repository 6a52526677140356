//! What a node runs with, built once from the flags (in `cmd/`) and handed
//! down: nothing below `cmd/` reads a flag.

use clap::ValueEnum;
use shards::origin::OriginRule;
use std::net::SocketAddr;

/// Which io driver a shard runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Driver {
    /// io_uring.
    Uring,
    /// epoll (monoio's legacy driver).
    Epoll,
    /// io_uring where the kernel allows, else epoll.
    Auto,
    /// A tokio current-thread runtime per shard (built with the `tokio-shell` feature).
    #[cfg(feature = "tokio-shell")]
    Tokio,
}

/// Whether permessage-deflate is accepted (section 4a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Compression {
    /// Accept permessage-deflate when a client offers it.
    On,
    /// Never negotiate it.
    Off,
}

/// A node's settings: listener, shards, clocks, caps and the front door.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Address the shards listen on (WebSocket and HTTP).
    pub listen: SocketAddr,
    /// Shard threads.
    pub shards: usize,
    /// io driver of the shards.
    pub driver: Driver,
    /// Whether permessage-deflate is negotiated.
    pub compression: Compression,
    /// Student frame interval (ms).
    pub tick_ms: u64,
    /// Admin aggregate interval (ms).
    pub admin_tick_ms: u64,
    /// Presence count interval (ms).
    pub presence_tick_ms: u64,
    /// Presence TTL (ms).
    pub presence_ttl_ms: u64,
    /// New WebSocket connections per second per node.
    pub accept_rate: u32,
    /// Accept bucket size.
    pub accept_burst: u32,
    /// WebSocket connections per node.
    pub max_connections: u64,
    /// WebSocket connections per user per node.
    pub max_conns_per_user: u32,
    /// Drain window (ms).
    pub drain_ms: u64,
    /// Which pages may open a connection (the `--allowed-origins` rule).
    pub origins: OriginRule,
    /// Selection window id (`/api/history`'s default session).
    pub session: String,
}
