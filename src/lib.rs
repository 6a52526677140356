//! seatboard's shell: the command line, the runtime and every piece of I/O
//! around the sans-IO core in the `shards` crate.
//!
//! - [`cmd`]: the subcommands' wiring (`serve`, `demo`, `publish`, `simulate`).
//! - [`hub`]: one hub process: its threads, listeners, signals and drain.
//! - [`node`]: the node-wide state every thread reads.
//! - [`shard`]: one shard thread's shell around `shards::Shard`.
//! - [`ingest`], [`presence`], [`history`]: the node's worker threads, talking
//!   to shards only through [`channels`].
//! - [`redis`], [`publisher`]: the Redis layer and the selection API's publisher.
//! - [`analytics`]: the `analytics` worker process and its report.
//! - [`analytics_stream`]: a session's analytics stream (its entries, the
//!   bucket machine that makes them, their reading), which the worker, the
//!   report and `/api/history` share.
//! - [`reconcile`]: the `reconcile` worker, the database's repairs of Redis.
//! - [`rehearse`]: `seatboard rehearse`, a load rehearsal against running
//!   nodes on the `loadgen` crate's viewers.
//! - [`supervisor`]: the one owner of a process's long-lived threads.
//! - [`allocator`], [`sys`], [`auth`], [`cli`], [`clock`], [`failure`], [`logging`], [`metrics`],
//!   [`exposition`] (the one table every `/metrics` renders from),
//!   [`process_stats`], [`shard_set`], [`slots`], [`worker_http`]: shared plumbing.
//! - [`planted`]: the simulator's planted bugs (feature `planted-bugs` only).

pub mod allocator;
pub mod analytics;
pub mod analytics_stream;
pub mod auth;
pub mod channels;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod exposition;
pub mod failure;
pub mod history;
pub mod hub;
pub mod ingest;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod planted;
pub mod presence;
pub mod process_stats;
pub mod publish;
pub mod publisher;
pub mod reconcile;
pub mod redis;
pub mod rehearse;
pub mod relay;
pub mod shard;
pub mod shard_set;
pub mod slots;
pub mod supervisor;
pub mod sys;
pub mod worker_http;
