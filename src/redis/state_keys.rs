//! The courses with a state hash: `SCAN` of the state keys on every primary,
//! for the admin firehose, `/api/courses` and the analytics worker's sharded
//! subscriptions.

use super::commands::Commands;
use super::Error;

/// The sorted, valid course codes that have a state hash (`<prefix><course>`).
pub fn scan_courses(link: &mut Commands, prefix: &str) -> Result<Vec<String>, Error> {
    let keys = link.scan(prefix, Some("hash"))?;
    let mut courses: Vec<String> = keys
        .iter()
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| k.strip_prefix(prefix))
        .filter(|c| shards::snapshot::valid_course(c))
        .map(str::to_owned)
        .collect();
    courses.sort();
    courses.dedup();
    Ok(courses)
}
