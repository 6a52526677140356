//! The simulated selection database, the truth the reconciler reads: every
//! commit of a section's version at its moment, read back as the primary
//! holds it or as a replica that lags behind it.

use shards::Snapshot;
use std::collections::BTreeMap;

/// A section's row: the highest version committed and when it was committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The row's version.
    pub version: u64,
    /// When that version was committed (virtual ms): the row's `updated_at`.
    pub at: u64,
}

/// Every commit, by course code and section, in commit order.
#[derive(Debug, Default)]
pub struct Database {
    commits: BTreeMap<(String, u32), Vec<Row>>,
}

/// The snapshot a section's version stands for (what the selection API
/// publishes and the database's row holds: the seats follow from the version).
pub fn row_snapshot(course: &str, section: u32, version: u64) -> Snapshot {
    let taken = ((version * 7 + u64::from(section) * 3) % 50) as u32;
    Snapshot::build(course.into(), section, 50, taken, None, Some(version), None)
}

impl Database {
    /// The selection API commits `version` of a section at `at`.
    pub fn commit(&mut self, at: u64, course: &str, section: u32, version: u64) {
        self.commits
            .entry((course.to_owned(), section))
            .or_default()
            .push(Row { version, at });
    }

    /// Each section's row as of `t` (a replica `lag` behind the primary reads
    /// as of `now - lag`): its highest version committed by then.
    pub fn rows_as_of(&self, t: u64) -> Vec<(&str, u32, Row)> {
        let mut out = Vec::new();
        for ((course, section), commits) in &self.commits {
            let row = commits
                .iter()
                .filter(|r| r.at <= t)
                .max_by_key(|r| (r.version, std::cmp::Reverse(r.at)));
            if let Some(r) = row {
                out.push((course.as_str(), *section, *r));
            }
        }
        out
    }

    /// Whether the database ever held this version of the section by `t`.
    pub fn held(&self, t: u64, course: &str, section: u32, version: i128) -> bool {
        self.commits
            .get(&(course.to_owned(), section))
            .is_some_and(|c| {
                c.iter()
                    .any(|r| r.at <= t && i128::from(r.version) == version)
            })
    }

    /// The highest version of the section committed by `t`.
    pub fn latest(&self, t: u64, course: &str, section: u32) -> Option<u64> {
        self.commits
            .get(&(course.to_owned(), section))
            .and_then(|c| c.iter().filter(|r| r.at <= t).map(|r| r.version).max())
    }
}
