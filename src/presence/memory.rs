//! The in-process presence store of `demo`: the same sorted-set semantics as Redis.

use super::{PresenceStore, StoreResult};
use std::collections::HashMap;
use std::sync::Arc;

/// Course -> user -> expiry (Unix ms).
#[derive(Default)]
pub struct MemoryPresence {
    sets: HashMap<String, HashMap<String, u64>>,
}

impl PresenceStore for MemoryPresence {
    fn add(&mut self, course: &str, user: &str, expiry_ms: u64) -> StoreResult<()> {
        self.sets
            .entry(course.to_owned())
            .or_default()
            .insert(user.to_owned(), expiry_ms);
        Ok(())
    }

    fn remove(&mut self, course: &str, user: &str) -> StoreResult<()> {
        if let Some(s) = self.sets.get_mut(course) {
            s.remove(user);
        }
        Ok(())
    }

    fn refresh(&mut self, members: &[(Arc<str>, Arc<str>)], expiry_ms: u64) -> StoreResult<()> {
        for (c, u) in members {
            self.add(c, u, expiry_ms)?;
        }
        Ok(())
    }

    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        Ok(courses
            .iter()
            .map(|c| match self.sets.get_mut(&**c) {
                Some(s) => {
                    s.retain(|_, exp| *exp > now_ms);
                    s.len() as u64
                }
                None => 0,
            })
            .collect())
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
