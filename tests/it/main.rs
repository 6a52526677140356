//! Every integration test of the seatboard binary, one module per area (run
//! one area with `cargo test --test it front_door::`). One test binary links
//! the crate and its dependencies once. The fixtures it shares with the bench
//! suite are the `testkit` crate (`testkit/src/`); its own (`tests/raw`,
//! `tests/redis_util`) are modules of it.

use testkit::{cluster_util, common, jwt_util, lb, publish, tls_util};
#[path = "../raw/mod.rs"]
mod raw;
#[path = "../redis_util/mod.rs"]
mod redis_util;

mod admin_scale;
mod analytics;
mod arm64_smoke;
mod browser;
mod browser_failover;
mod client_delivery;
mod close_codes;
mod command_line;
mod compression;
mod conformance;
mod demo_board;
mod docs_links;
mod drain;
mod env_twins;
mod environments;
mod fleet;
mod front_door;
mod haproxy_limits;
mod harness;
mod image;
mod jwks;
mod layers;
mod listener;
mod log_colour;
mod log_reader_gone;
mod metrics;
mod monitoring;
mod package;
mod page_delivery;
mod pinning;
mod publishing_docs;
mod reconcile;
mod reconcile_tls;
mod redis_backoff;
mod redis_cluster;
mod redis_cluster_tls;
mod redis_dial;
mod redis_distance;
mod redis_freeze;
mod redis_ingest;
mod redis_presence;
mod redis_publisher;
mod redis_reconnect;
mod redis_tls;
mod rehearse;
mod relay;
mod relay_docs;
mod relay_harden;
mod secrets;
mod section_cap;
mod security;
mod slow_consumer;
mod sse;
mod state_cas;
mod storm;
mod syscall_filter;
mod systemd;
mod systemd_boot;
mod threads;
mod uring_denied;
mod version;
mod version_range;
mod write_path;
mod ws_courses;
