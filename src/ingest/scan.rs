//! Courses' state hashes read in pipelines rather than one round trip each,
//! in `HSCAN` steps of about [`STEP_FIELDS`] fields: a hash up to that many
//! fields (and every small hash, which Redis keeps whole in one listpack)
//! comes in one step, a larger one in several, each step of every course
//! of a batch in one pipeline. So a hash at the cap holds up the courses
//! read beside it by one step, not by its whole length, and each course is
//! answered as soon as its last step is in. Each read stops at a course's
//! most sections; how many fields it held past them is asked afterwards
//! (`HLEN`). Which courses have a state hash is `crate::redis::state_keys`'s
//! `SCAN`.

use crate::redis::commands::Commands;
use foldhash::{HashMap, HashMapExt};
use shards::MAX_SECTIONS;

/// The fields one `HSCAN` step asks for (its `COUNT`).
pub const STEP_FIELDS: usize = 512;

/// One course's state hash as read: at most [`MAX_SECTIONS`] payloads.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// One payload per section.
    pub payloads: Vec<Vec<u8>>,
    /// Whether the hash holds fields past them (its count is asked later,
    /// [`lengths`], so that no other course's read waits on it).
    pub more: bool,
}

/// A course's state hash being read, step by step.
#[derive(Debug)]
pub struct Reading {
    /// Where the next step starts (`None` once the scan is through).
    cursor: Option<Vec<u8>>,
    /// The payloads read so far, by field (a scan may return a field twice).
    fields: HashMap<Vec<u8>, Vec<u8>>,
}

impl Default for Reading {
    fn default() -> Self {
        Reading {
            cursor: Some(b"0".to_vec()),
            fields: HashMap::new(),
        }
    }
}

impl Reading {
    /// A course whose state key cannot be read as a hash: read, and empty.
    fn unreadable() -> Self {
        Reading {
            cursor: None,
            fields: HashMap::new(),
        }
    }

    /// Whether it is read: the scan is through, or the cap is reached.
    pub fn done(&self) -> bool {
        self.cursor.is_none() || self.fields.len() >= MAX_SECTIONS
    }

    /// One step's reply (`[cursor, [field, value, ...]]`) taken in; false
    /// when it is not one.
    fn take(&mut self, reply: ::redis::Value) -> bool {
        use ::redis::FromRedisValue;
        let Ok((cursor, flat)) = <(Vec<u8>, Vec<Vec<u8>>)>::from_redis_value(reply) else {
            return false;
        };
        let mut pairs = flat.into_iter();
        while let (Some(field), Some(value)) = (pairs.next(), pairs.next()) {
            self.fields.insert(field, value);
        }
        self.cursor = (cursor != b"0").then_some(cursor);
        true
    }

    /// What was read, capped at [`MAX_SECTIONS`].
    pub fn finish(self) -> Read {
        let more = self.cursor.is_some() || self.fields.len() > MAX_SECTIONS;
        let mut payloads: Vec<Vec<u8>> = self.fields.into_values().collect();
        payloads.truncate(MAX_SECTIONS);
        Read { payloads, more }
    }
}

/// One `HSCAN` step of every course of `open` not read yet, as one pipeline
/// (one per primary in a cluster); false when it failed.
pub fn read_step(
    link: &mut Commands,
    state_prefix: &str,
    open: &mut [(std::sync::Arc<str>, Reading)],
) -> bool {
    let stepping: Vec<&mut (std::sync::Arc<str>, Reading)> =
        open.iter_mut().filter(|(_, r)| !r.done()).collect();
    let cmds: Vec<::redis::Cmd> = stepping
        .iter()
        .map(|(course, r)| {
            let mut scan = ::redis::cmd("HSCAN");
            scan.arg(format!("{state_prefix}{course}"))
                .arg(r.cursor.as_deref().unwrap_or(b"0"))
                .arg("COUNT")
                .arg(STEP_FIELDS);
            scan
        })
        .collect();
    match link.pipeline_each(&cmds) {
        Ok(replies) if replies.len() == stepping.len() => stepping.into_iter().zip(replies).all(
            |((course, r), reply)| match reply {
                // Not a hash (a stray key under the state prefix): the
                // course has no board, and the courses beside it are read.
                ::redis::Value::ServerError(e) if e.code() == "WRONGTYPE" => {
                    tracing::warn!(%course, error = %e, "a state key is not a hash: read as empty");
                    *r = Reading::unreadable();
                    true
                }
                // Redis cannot serve it now (`CLUSTERDOWN`, `LOADING`,
                // `TRYAGAIN`...): the read failed, and is asked again.
                ::redis::Value::ServerError(e) => {
                    tracing::debug!(%course, error = %e, "state hash not read");
                    false
                }
                reply => r.take(reply),
            },
        ),
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(error = %e, "state hash batch read failed");
            false
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
