//! The courses with a state hash, for the admin firehose on standalone Redis
//! (contract §5, Admin: read when the firehose turns on, rescanned every 5 s);
//! a cluster's sharded source scans every primary itself.

use crate::redis::commands::Commands;

/// Every valid course code with a state hash (`SCAN MATCH <state-prefix>*`);
/// empty, logged, when the scan fails (the next rescan tries again).
pub fn state_courses(link: &mut Commands, state_prefix: &str) -> Vec<String> {
    match crate::cmd::serve::scan_courses(link, state_prefix) {
        Ok(courses) => courses,
        Err(e) => {
            tracing::debug!(error = %e, "course scan failed");
            Vec::new()
        }
    }
}
