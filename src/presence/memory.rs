//! The in-process presence store of `demo`: the same sorted-set semantics as Redis.

use super::{Members, PresenceStore, StoreResult};
use std::collections::HashMap;
use std::sync::Arc;

/// Course -> user -> expiry (Unix ms); a course with no member left is
/// removed (a Redis key with a TTL to its members' expiry is gone then too).
#[derive(Default)]
pub struct MemoryPresence {
    sets: HashMap<String, HashMap<String, u64>>,
}

impl PresenceStore for MemoryPresence {
    fn add(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        for (course, user) in members {
            self.sets
                .entry(course.to_string())
                .or_default()
                .insert(user.to_string(), expiry_ms);
        }
        Ok(())
    }

    fn remove(&mut self, members: &Members) -> StoreResult<()> {
        for (course, user) in members {
            if let Some(s) = self.sets.get_mut(&**course) {
                s.remove(&**user);
                // As a Redis key with no member left: gone.
                if s.is_empty() {
                    self.sets.remove(&**course);
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        let counts = courses
            .iter()
            .map(|c| match self.sets.get_mut(&**c) {
                Some(s) => {
                    s.retain(|_, exp| *exp > now_ms);
                    s.len() as u64
                }
                None => 0,
            })
            .collect();
        // A set whose members all expired is gone, as its Redis key would be.
        self.sets.retain(|_, s| !s.is_empty());
        Ok(counts)
    }

    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)> {
        let Some(s) = self.sets.get(course) else {
            return Ok((0, Vec::new()));
        };
        let mut ids: Vec<String> = s
            .iter()
            .filter(|(_, e)| **e > now_ms)
            .map(|(u, _)| u.clone())
            .collect();
        ids.sort();
        let total = ids.len() as u64;
        ids.truncate(limit);
        Ok((total, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_course_with_no_member_left_is_gone() {
        let mut m = MemoryPresence::default();
        m.add(&[("A".into(), "u1".into()), ("B".into(), "u2".into())], 100)
            .ok();
        m.remove(&[("A".into(), "u1".into())]).ok();
        assert!(!m.sets.contains_key("A"));
        assert_eq!(m.count(&["B".into()], 100).ok(), Some(vec![0]));
        assert!(m.sets.is_empty(), "an expired course is gone");
    }
}
