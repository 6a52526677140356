//! `seatboard rehearse`: a selection window rehearsed against a running
//! deployment (contract section 9). The viewers' client lives here, one copy,
//! shared with the bench suite's load generator.
//!
//! - [`viewers`]: the WebSocket and SSE viewers (one epoll loop per thread),
//!   over `transport.rs` (plain TCP, or rustls for an `https://` target).
//! - `run.rs` (flags to verdict), `feed.rs` (the publisher), `verdict.rs`
//!   (figures, targets, JSON), `report.rs` (the HTML report), `cleanup.rs`
//!   (Redis), `workers.rs` (viewer loops on threads, or `children.rs`: child
//!   processes past one process's open files), `nodes.rs` (each node's `/metrics`
//!   scraped once a second: CPU, RSS, its Redis connection), `progress.rs`
//!   (the status line on a terminal).
//! - [`hist`]: the mergeable latency histogram their figures are kept in;
//!   [`seeding`]: each course's first full frame after its first watch, and
//!   frames per second (the report's `seeding`).

mod children;
mod cleanup;
mod feed;
pub mod hist;
mod nodes;
mod progress;
mod report;
mod run;
pub mod seeding;
mod transport;
mod verdict;
pub mod viewers;
mod workers;

pub use children::main as child_main;
pub use run::run;
