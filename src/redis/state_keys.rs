//! The courses with a state hash: `SCAN` of the state keys on every primary,
//! for the admin firehose, `/api/courses` and the analytics worker's sharded
//! subscriptions.

use super::commands::{scan_step, Commands};
use super::{glob_escape, Error};

/// The sorted, valid course codes that have a state hash (`<prefix><course>`).
pub fn scan_courses(link: &mut Commands, prefix: &str) -> Result<Vec<String>, Error> {
    Ok(courses_of(&link.scan(prefix, Some("hash"))?, prefix))
}

/// The state keys (`<prefix>*`, hashes) on the one node `con` is connected to.
pub fn scan_node(con: &mut redis::Connection, prefix: &str) -> redis::RedisResult<Vec<Vec<u8>>> {
    let pattern = format!("{}*", glob_escape(prefix));
    let (mut keys, mut cursor) = (Vec::new(), 0);
    loop {
        let (next, page): (u64, Vec<Vec<u8>>) =
            scan_step(cursor, &pattern, Some("hash")).query(con)?;
        keys.extend(page);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The sorted, valid course codes of state keys `keys`.
pub fn courses_of(keys: &[Vec<u8>], prefix: &str) -> Vec<String> {
    let mut courses: Vec<String> = keys
        .iter()
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| k.strip_prefix(prefix))
        .filter(|c| shards::snapshot::valid_course(c))
        .map(str::to_owned)
        .collect();
    courses.sort();
    courses.dedup();
    courses
}
