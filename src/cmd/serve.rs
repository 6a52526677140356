//! `seatboard serve`: the hub on Redis pub/sub, state hashes read by the
//! state reader (which also keeps `/api/courses` in step), Redis presence.

use crate::hub::{self as runtime, Hub};
use crate::ingest::any::AnySource;
use crate::ingest::states::RedisStates;
use crate::node::Node;
use crate::presence::redis::RedisPresence;
use crate::redis::Redis;
use std::sync::Arc;

/// Starts the hub with Redis pub/sub and presence.
pub fn start(node: Arc<Node>) -> std::io::Result<Hub> {
    let args = &node.args;
    let redis = Redis::from_flags(&args.redis).map_err(std::io::Error::other)?;
    *node.redis_health.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&redis.health));
    let source = AnySource::new(&redis, &args.channel_prefix);
    let states = RedisStates::new(&redis, &args.state_prefix);
    let store = RedisPresence::new(&redis, &args.presence_prefix);
    runtime::start(Arc::clone(&node), source, states, store)
}
