//! The courses with a state hash (`SCAN` on every primary: for the admin
//! firehose, `/api/courses` and the analytics worker), and their state hashes
//! read in pipelines rather than one round trip each, each read capped at a
//! course's most sections (one `HSCAN` step and an `HLEN`), so one giant
//! hash costs its batch no more than a course at the cap.

use crate::redis::commands::Commands;
use shards::MAX_SECTIONS;

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

/// One course's state hash as read: at most [`MAX_SECTIONS`] payloads, and
/// how many fields the hash held past them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// One payload per section.
    pub payloads: Vec<Vec<u8>>,
    /// Fields left unread: past the course's most sections.
    pub over: u64,
}

/// One `HSCAN` step (`COUNT` the cap: a hash up to the cap comes whole, a
/// larger one gives about the cap) and the `HLEN`, as read into a [`Read`].
fn capped(scan: ::redis::Value, len: ::redis::Value) -> Option<Read> {
    use ::redis::FromRedisValue;
    let (_cursor, flat) = <(Vec<u8>, Vec<Vec<u8>>)>::from_redis_value(scan).ok()?;
    let len = u64::from_redis_value(len).ok()?;
    let payloads: Vec<Vec<u8>> = flat
        .into_iter()
        .skip(1)
        .step_by(2)
        .take(MAX_SECTIONS)
        .collect();
    let over = len.saturating_sub(payloads.len() as u64);
    Some(Read { payloads, over })
}

/// The state hashes of `courses`, in order, each capped at [`MAX_SECTIONS`],
/// read as one pipeline (one per primary in a cluster); `None` when it failed.
pub fn read_states(link: &mut Commands, state_prefix: &str, courses: &[&str]) -> Option<Vec<Read>> {
    let cmds: Vec<::redis::Cmd> = courses
        .iter()
        .flat_map(|c| {
            let key = format!("{state_prefix}{c}");
            let mut scan = ::redis::cmd("HSCAN");
            scan.arg(&key).arg(0).arg("COUNT").arg(MAX_SECTIONS);
            let mut len = ::redis::cmd("HLEN");
            len.arg(&key);
            [scan, len]
        })
        .collect();
    match link.pipeline::<Vec<::redis::Value>>(&cmds) {
        Ok(replies) if replies.len() == 2 * courses.len() => {
            let mut it = replies.into_iter();
            let mut out = Vec::with_capacity(courses.len());
            while let (Some(scan), Some(len)) = (it.next(), it.next()) {
                out.push(capped(scan, len)?);
            }
            Some(out)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "state hash batch read failed");
            None
        }
    }
}
