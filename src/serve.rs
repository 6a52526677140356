//! `seatboard serve`: the hub on Redis pub/sub and Redis presence, plus the
//! thread that keeps `/api/courses` in step with the state hashes.

use crate::ingest::redis::RedisSource;
use crate::node::Node;
use crate::presence::redis::RedisPresence;
use crate::redis_link::{glob_escape, Link};
use crate::runtime::{self, Hub};
use std::sync::Arc;
use std::time::Duration;

/// How often the course list is rebuilt from the state hashes (the contract's cache bound).
const COURSES_EVERY: Duration = Duration::from_secs(10);
/// Keys asked for per SCAN step.
const SCAN_COUNT: usize = 1000;

/// Starts the hub with Redis pub/sub and presence.
pub fn start(node: Arc<Node>) -> std::io::Result<Hub> {
    let args = &node.args;
    let source = RedisSource::new(&args.redis, &args.channel_prefix, &args.state_prefix)
        .map_err(std::io::Error::other)?;
    let store =
        RedisPresence::new(&args.redis, &args.presence_prefix).map_err(std::io::Error::other)?;
    let link = Link::new(&args.redis, "course list").map_err(std::io::Error::other)?;
    let prefix = args.state_prefix.clone();
    let hub = runtime::start(Arc::clone(&node), source, store)?;
    let n = Arc::clone(&node);
    std::thread::Builder::new()
        .name("seatboard-courses".into())
        .spawn(move || courses_loop(n, link, prefix))?;
    Ok(hub)
}

/// Every 10 s: SCAN `<state-prefix>*`, publish the sorted course codes.
fn courses_loop(node: Arc<Node>, mut link: Link, prefix: String) {
    loop {
        match scan_courses(&mut link, &prefix) {
            Ok(courses) => node.set_courses(&courses),
            Err(e) => tracing::debug!(error = %e, "course list not refreshed"),
        }
        std::thread::sleep(COURSES_EVERY);
    }
}

/// The sorted, valid course codes that have a state hash.
pub fn scan_courses(link: &mut Link, prefix: &str) -> Result<Vec<String>, String> {
    let pattern = format!("{}*", glob_escape(prefix));
    let mut cursor: u64 = 0;
    let mut courses = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = link.run(|c| {
            ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query(c)
        })?;
        courses.extend(
            keys.iter()
                .filter_map(|k| k.strip_prefix(prefix))
                .filter(|c| shards::snapshot::valid_course(c))
                .map(str::to_owned),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    courses.sort();
    courses.dedup();
    Ok(courses)
}
