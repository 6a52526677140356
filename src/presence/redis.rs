//! The Redis presence store of `serve`: sorted sets `<presence-prefix><course>`
//! of user -> expiry (Unix ms), on a command connection of its own whose every
//! call is bounded by timeouts, so the presence worker never hangs on Redis.

use super::{PresenceStore, StoreResult};
use crate::redis_link::Link;
use std::sync::Arc;

/// Presence in Redis sorted sets.
pub struct RedisPresence {
    link: Link,
    prefix: String,
}

impl RedisPresence {
    /// A store on `uri` with keys `<prefix><course>`; connects lazily.
    pub fn new(uri: &str, prefix: &str) -> Result<Self, String> {
        Ok(RedisPresence {
            link: Link::new(uri, "presence")?,
            prefix: prefix.to_owned(),
        })
    }

    fn key(&self, course: &str) -> String {
        format!("{}{course}", self.prefix)
    }
}

impl PresenceStore for RedisPresence {
    fn add(&mut self, course: &str, user: &str, expiry_ms: u64) -> StoreResult<()> {
        let key = self.key(course);
        self.link.run(|c| {
            ::redis::cmd("ZADD")
                .arg(&key)
                .arg(expiry_ms)
                .arg(user)
                .query::<()>(c)
        })
    }

    fn remove(&mut self, course: &str, user: &str) -> StoreResult<()> {
        let key = self.key(course);
        self.link
            .run(|c| ::redis::cmd("ZREM").arg(&key).arg(user).query::<()>(c))
    }

    fn refresh(&mut self, members: &[(Arc<str>, Arc<str>)], expiry_ms: u64) -> StoreResult<()> {
        let mut p = ::redis::pipe();
        for (course, user) in members {
            p.cmd("ZADD")
                .arg(self.key(course))
                .arg(expiry_ms)
                .arg(&**user)
                .ignore();
        }
        self.link.run(|c| p.query::<()>(c))
    }

    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        let mut p = ::redis::pipe();
        for course in courses {
            let key = self.key(course);
            p.cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg(0)
                .arg(now_ms)
                .ignore();
            p.cmd("ZCARD").arg(&key);
        }
        self.link.run(|c| p.query::<Vec<u64>>(c))
    }

    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)> {
        let key = self.key(course);
        let mut p = ::redis::pipe();
        p.cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg(0)
            .arg(now_ms)
            .ignore();
        p.cmd("ZCARD").arg(&key);
        p.cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(limit.saturating_sub(1));
        let (total, ids): (u64, Vec<String>) = self.link.run(|c| p.query(c))?;
        Ok((total, ids))
    }
}
