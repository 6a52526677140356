//! `seatboard rehearse`: a selection window rehearsed against a running
//! deployment (contract section 9). The viewers themselves are the
//! `loadgen` crate (one copy, shared with the bench suite); this module
//! holds the flags' run, the feed, the verdict and the report.
//!
//! - `run.rs` (flags to verdict, its refusals in `error.rs`), `feed.rs` (the publisher), `verdict.rs`
//!   (figures, targets, JSON), `report.rs` (the HTML report), `cleanup.rs`
//!   (Redis), `workers.rs` (viewer loops on threads, or child processes past
//!   one process's open files, started by `loadgen::ChildLoop`; `children.rs`
//!   is the child's side), `nodes.rs` (each node's `/metrics` scraped once a
//!   second by `loadgen::scrape`: CPU, RSS, its Redis connection), `progress.rs`
//!   (the status line on a terminal).

mod children;
mod cleanup;
mod error;
mod feed;
mod nodes;
mod progress;
mod report;
mod run;
mod verdict;
mod workers;

pub use children::main as child_main;
pub use run::run;
