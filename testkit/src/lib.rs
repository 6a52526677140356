//! What seatboard's integration tests (`tests/it`) and its bench suite
//! (`benches/suite`) share: `redis-server`, `seatboard` and HAProxy
//! processes on free ports and killed on drop (`proc`), a plain-HTTP client
//! (`http`), the product's metrics scraper (`scrape`, the `loadgen` crate's), the WebSocket client and
//! board (`common`), Redis Cluster (`cluster_util`), latency between a process
//! and Redis (`delay_proxy`), HAProxy on the shipped
//! configuration (`lb`), tokens and a JWKS server (`jwt_util`), certificates
//! (`tls_util`), a listener that resets every connection (`resetting`), and the
//! selection-API stand-in that publishes and remembers (`publish`).

pub mod cluster_util;
pub mod common;
pub mod delay_proxy;
pub mod http;
pub mod jwt_util;
pub mod lb;
pub mod proc;
pub mod publish;
pub mod relay;
pub mod resetting;
pub mod tls_util;
pub use loadgen::scrape;
pub mod wait;
