//! seatboard's shell: the command line, the runtime and every piece of I/O
//! around the sans-IO core in the `shards` crate.

pub mod analytics;
pub mod auth;
pub mod channels;
pub mod cli;
pub mod clock;
pub mod demo;
pub mod history;
pub mod ingest;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod presence;
pub mod publish;
pub mod publisher;
pub mod redis;
pub mod runtime;
pub mod sd_notify;
pub mod serve;
pub mod shard;
pub mod simulate;
pub mod simulator;
