//! `seatboard serve`: the hub on Redis.

use crate::node::Node;
use crate::runtime::Hub;
use std::sync::Arc;

/// Starts the hub with Redis pub/sub and presence.
pub fn start(_node: Arc<Node>) -> std::io::Result<Hub> {
    Err(std::io::Error::other("the Redis source is not built yet"))
}
