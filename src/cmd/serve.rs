//! `seatboard serve`: the hub on Redis pub/sub, state hashes read by the
//! state reader (which also keeps `/api/courses` in step), Redis presence,
//! and the `/api/history` refresher: every thread of a Redis-fed node.

use crate::cli::HubArgs;
use crate::history;
use crate::hub::{self, Hub};
use crate::ingest::states::RedisStates;
use crate::node::Node;
use crate::presence::redis::RedisPresence;
use crate::redis::pubsub::PubSub;
use crate::redis::Redis;
use std::sync::Arc;

/// Starts the hub with Redis pub/sub and presence, then the history refresher.
pub fn start(node: Arc<Node>, redis: Arc<Redis>, args: &HubArgs) -> std::io::Result<Hub> {
    let _ = node.redis.set(Arc::clone(&redis));
    let source = PubSub::new(&redis, &args.channel_prefix)?;
    let states = RedisStates::new(&redis, &args.state_prefix);
    let store = RedisPresence::new(&redis, &args.presence_prefix);
    let hub = hub::start(Arc::clone(&node), source, states, store)?;
    let stop = {
        let node = Arc::clone(&node);
        move || node.draining()
    };
    let prefix = args.analytics_prefix.clone();
    if let Err(e) = history::start(Arc::clone(&node.history), redis, prefix, stop) {
        tracing::warn!(error = %e, "history thread did not start; /api/history stays empty");
    }
    Ok(hub)
}
