//! Replacements a node missed: its connection did not receive the
//! reconciler's replacement of a section (not subscribed then, or the
//! delivery lost with a reset). The node takes a missed replacement at its
//! next read of the course while the field still carries `replace`; once a
//! later write has overwritten the field first, nothing tells the node any
//! more that the version it holds was forged (a gap of the contract: the
//! database check leaves that section on that node out).

use std::collections::BTreeSet;

/// (node, course, section) keys.
type Key = (usize, String, u32);

/// Missed replacements, pending or lost for good.
#[derive(Debug, Default)]
pub struct Missed {
    pending: BTreeSet<Key>,
    lost: BTreeSet<Key>,
}

impl Missed {
    /// `node` did not receive the replacement of a section.
    pub fn missed(&mut self, node: usize, course: &str, section: u32) {
        self.pending.insert((node, course.to_owned(), section));
    }

    /// A write overwrote the section's field (its `replace` with it).
    pub fn overwritten(&mut self, course: &str, section: u32) {
        let gone: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, c, s)| c == course && *s == section)
            .cloned()
            .collect();
        for k in gone {
            self.pending.remove(&k);
            self.lost.insert(k);
        }
    }

    /// Every field lost or rolled back (a restart, a failover).
    pub fn all_overwritten(&mut self) {
        self.lost.append(&mut self.pending);
    }

    /// `node` read the course's state hash: what it missed is in the fields.
    pub fn read(&mut self, node: usize, course: &str) {
        self.pending
            .retain(|(n, c, _)| !(*n == node && c == course));
    }

    /// `node` restarted: it holds nothing it missed.
    pub fn restarted(&mut self, node: usize) {
        self.pending.retain(|(n, ..)| *n != node);
        self.lost.retain(|(n, ..)| *n != node);
    }

    /// Whether `node` can no longer learn that its version of the section was replaced.
    pub fn lost(&self, node: usize, course: &str, section: u32) -> bool {
        self.lost.contains(&(node, course.to_owned(), section))
    }
}
