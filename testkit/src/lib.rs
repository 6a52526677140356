//! What seatboard's integration tests (`tests/it`) and its bench suite
//! (`benches/suite`) share: processes on free ports and killed on drop
//! (`common`), Redis Cluster (`cluster_util`), latency between a process
//! and Redis (`delay_proxy`), HAProxy on the shipped
//! configuration (`lb`), tokens and a JWKS server (`jwt_util`), and the
//! selection-API stand-in that publishes and remembers (`publish`).

pub mod cluster_util;
pub mod common;
pub mod delay_proxy;
pub mod jwt_util;
pub mod lb;
pub mod publish;
pub mod relay;
