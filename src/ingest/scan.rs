//! The courses with a state hash (`SCAN` on every primary: for the admin
//! firehose, `/api/courses` and the analytics worker), and their state hashes
//! read in pipelines rather than one round trip each.

use crate::redis::commands::Commands;

/// The sorted, valid course codes that have a state hash.
pub fn scan_courses(link: &mut Commands, prefix: &str) -> Result<Vec<String>, String> {
    let keys = link.scan(prefix, None)?;
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

/// The state hashes of `courses` (one payload per section each), in order,
/// read as one pipeline (one per primary in a cluster); `None` when it failed.
pub fn read_states(
    link: &mut Commands,
    state_prefix: &str,
    courses: &[&str],
) -> Option<Vec<Vec<Vec<u8>>>> {
    let cmds: Vec<::redis::Cmd> = courses
        .iter()
        .map(|c| {
            let mut cmd = ::redis::cmd("HGETALL");
            cmd.arg(format!("{state_prefix}{c}"));
            cmd
        })
        .collect();
    match link.pipeline::<Vec<Vec<Vec<u8>>>>(&cmds) {
        Ok(hashes) if hashes.len() == courses.len() => Some(
            hashes
                .into_iter()
                .map(|flat| flat.into_iter().skip(1).step_by(2).collect())
                .collect(),
        ),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "state hash batch read failed");
            None
        }
    }
}
