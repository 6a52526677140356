//! Courses' state hashes read in pipelines rather than one round trip each,
//! each read capped at a course's most sections (one `HSCAN` step), so one
//! giant hash costs its batch no more than a course at the cap; how many
//! fields it held past the cap is asked afterwards (`HLEN`). Which courses
//! have a state hash is `crate::redis::state_keys`'s `SCAN`.

use crate::redis::commands::Commands;
use shards::MAX_SECTIONS;

/// One course's state hash as read: at most [`MAX_SECTIONS`] payloads.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// One payload per section.
    pub payloads: Vec<Vec<u8>>,
    /// Whether the hash holds fields past them (its count is asked later,
    /// [`lengths`], so that no other course's read waits on it).
    pub more: bool,
}

/// One `HSCAN` step (`COUNT` the cap: a hash up to the cap comes whole, a
/// larger one about the cap and a cursor to go on) as a [`Read`].
fn capped(scan: ::redis::Value) -> Option<Read> {
    use ::redis::FromRedisValue;
    let (cursor, flat) = <(Vec<u8>, Vec<Vec<u8>>)>::from_redis_value(scan).ok()?;
    let mut payloads: Vec<Vec<u8>> = flat.into_iter().skip(1).step_by(2).collect();
    let more = cursor != b"0" || payloads.len() > MAX_SECTIONS;
    payloads.truncate(MAX_SECTIONS);
    Some(Read { payloads, more })
}

/// The state hashes of `courses`, in order, each capped at [`MAX_SECTIONS`]
/// (one `HSCAN` step each, never the whole hash), read as one pipeline (one
/// per primary in a cluster); `None` when it failed.
pub fn read_states(link: &mut Commands, state_prefix: &str, courses: &[&str]) -> Option<Vec<Read>> {
    let cmds: Vec<::redis::Cmd> = courses
        .iter()
        .map(|c| {
            let mut scan = ::redis::cmd("HSCAN");
            scan.arg(format!("{state_prefix}{c}"))
                .arg(0)
                .arg("COUNT")
                .arg(MAX_SECTIONS);
            scan
        })
        .collect();
    match link.pipeline::<Vec<::redis::Value>>(&cmds) {
        Ok(replies) if replies.len() == courses.len() => replies
            .into_iter()
            .map(capped)
            .collect::<Option<Vec<Read>>>(),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "state hash batch read failed");
            None
        }
    }
}

/// The number of fields of each of `courses`' state hashes (`HLEN`), in
/// order, as one pipeline; `None` when it failed.
pub fn lengths(link: &mut Commands, state_prefix: &str, courses: &[&str]) -> Option<Vec<u64>> {
    let cmds: Vec<::redis::Cmd> = courses
        .iter()
        .map(|c| {
            let mut len = ::redis::cmd("HLEN");
            len.arg(format!("{state_prefix}{c}"));
            len
        })
        .collect();
    link.pipeline::<Vec<u64>>(&cmds)
        .ok()
        .filter(|l| l.len() == courses.len())
}
