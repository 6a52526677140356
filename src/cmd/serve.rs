//! `seatboard serve`: the hub on Redis pub/sub and Redis presence, plus the
//! thread that keeps `/api/courses` in step with the state hashes.

use crate::hub::{self as runtime, Hub};
use crate::ingest::any::AnySource;
use crate::ingest::states::RedisStates;
use crate::node::Node;
use crate::presence::redis::RedisPresence;
use crate::redis::commands::Commands;
use crate::redis::Redis;
use std::sync::Arc;
use std::time::Duration;

/// How often the course list is rebuilt from the state hashes (the contract's cache bound).
const COURSES_EVERY: Duration = Duration::from_secs(10);

/// Starts the hub with Redis pub/sub and presence.
pub fn start(node: Arc<Node>) -> std::io::Result<Hub> {
    let args = &node.args;
    let redis = Redis::from_flags(&args.redis).map_err(std::io::Error::other)?;
    *node.redis_health.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&redis.health));
    let source = AnySource::new(&redis, &args.channel_prefix);
    let states = RedisStates::new(&redis, &args.state_prefix);
    let store = RedisPresence::new(&redis, &args.presence_prefix);
    let link = Commands::new(&redis, "course list");
    let prefix = args.state_prefix.clone();
    let hub = runtime::start(Arc::clone(&node), source, states, store)?;
    let n = Arc::clone(&node);
    std::thread::Builder::new()
        .name("seatboard-courses".into())
        .spawn(move || courses_loop(n, link, prefix))?;
    Ok(hub)
}

/// Every 10 s: SCAN `<state-prefix>*` (on every primary), publish the sorted course codes.
fn courses_loop(node: Arc<Node>, mut link: Commands, prefix: String) {
    loop {
        match crate::ingest::scan::scan_courses(&mut link, &prefix) {
            Ok(courses) => node.set_courses(&courses),
            Err(e) => tracing::debug!(error = %e, "course list not refreshed"),
        }
        std::thread::sleep(COURSES_EVERY);
    }
}
