//! The Redis presence store of `serve`: sorted sets `<presence-prefix><course>`
//! of user -> expiry (Unix ms), through the shared command client (in a
//! cluster each set lives on its own slot and pipelines go out per primary),
//! whose every call is bounded by timeouts, so the presence worker never hangs.
//! Every add and re-score also gives the key a TTL to its members' expiry
//! (`PEXPIRE`), so a course's key is gone one presence TTL after the last
//! node that held its viewers stopped refreshing it (a node killed).

use super::{PresenceStore, StoreResult};
use crate::redis::commands::Commands;
use crate::redis::{Error, Redis};
use redis::{Cmd, FromRedisValue};
use std::sync::Arc;

/// Where the store's commands go and the clock its key TTLs are read from:
/// the shared command client and the wall clock in `serve`, a simulated
/// Redis on a virtual clock in the simulator (`sim/`).
pub trait PresenceLink: Send {
    /// One command and its reply.
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error>;
    /// Commands sent at once, every reply in order.
    fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error>;
    /// Now, Unix ms (the clock of the scores).
    fn unix_ms(&self) -> u64;
}

impl PresenceLink for Commands {
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        Commands::query(self, cmd)
    }
    fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error> {
        Commands::pipeline(self, cmds)
    }
    fn unix_ms(&self) -> u64 {
        crate::clock::unix_ms()
    }
}

/// Presence in Redis sorted sets.
pub struct RedisPresence<L: PresenceLink = Commands> {
    link: L,
    prefix: String,
}

impl RedisPresence {
    /// A store on `redis` with keys `<prefix><course>`; connects lazily.
    pub fn new(redis: &Arc<Redis>, prefix: &str) -> Self {
        RedisPresence::on(Commands::new(redis, "presence"), prefix)
    }
}

impl<L: PresenceLink> RedisPresence<L> {
    /// A store whose commands go over `link`, with keys `<prefix><course>`.
    pub fn on(link: L, prefix: &str) -> Self {
        RedisPresence {
            link,
            prefix: prefix.to_owned(),
        }
    }

    /// `<prefix><course>`, built without the formatting machinery: every
    /// command of a batch names its key.
    fn key(&self, course: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + course.len());
        key.push_str(&self.prefix);
        key.push_str(course);
        key
    }

    /// The key TTL that lasts until `expiry_ms` (Unix ms), at least 1 ms.
    fn key_ttl_ms(&self, expiry_ms: u64) -> u64 {
        expiry_ms.saturating_sub(self.link.unix_ms()).max(1)
    }
}

fn pexpire(key: &str, ttl_ms: u64) -> Cmd {
    let mut c = redis::cmd("PEXPIRE");
    c.arg(key).arg(ttl_ms);
    c
}

fn trim(key: &str, now_ms: u64) -> Cmd {
    let mut c = redis::cmd("ZREMRANGEBYSCORE");
    c.arg(key).arg(0).arg(now_ms);
    c
}

impl<L: PresenceLink> PresenceStore for RedisPresence<L> {
    fn add(&mut self, course: &str, user: &str, expiry_ms: u64) -> StoreResult<()> {
        let key = self.key(course);
        let mut add = redis::cmd("ZADD");
        add.arg(&key).arg(expiry_ms).arg(user);
        Ok(self
            .link
            .pipeline::<()>(&[add, pexpire(&key, self.key_ttl_ms(expiry_ms))])?)
    }

    fn remove(&mut self, course: &str, user: &str) -> StoreResult<()> {
        let key = self.key(course);
        Ok(self.link.query(redis::cmd("ZREM").arg(&key).arg(user))?)
    }

    fn remove_all(&mut self, members: &[(Arc<str>, Arc<str>)]) -> StoreResult<()> {
        let cmds: Vec<Cmd> = members
            .iter()
            .map(|(course, user)| {
                let mut c = redis::cmd("ZREM");
                c.arg(self.key(course)).arg(&**user);
                c
            })
            .collect();
        if cmds.is_empty() {
            return Ok(());
        }
        Ok(self.link.pipeline::<()>(&cmds)?)
    }

    fn refresh(&mut self, members: &[(Arc<str>, Arc<str>)], expiry_ms: u64) -> StoreResult<()> {
        let mut cmds: Vec<Cmd> = members
            .iter()
            .map(|(course, user)| {
                let mut c = redis::cmd("ZADD");
                c.arg(self.key(course)).arg(expiry_ms).arg(&**user);
                c
            })
            .collect();
        if cmds.is_empty() {
            return Ok(());
        }
        // Each course's key once, after its members.
        let ttl = self.key_ttl_ms(expiry_ms);
        let mut courses: Vec<&str> = members.iter().map(|(c, _)| &**c).collect();
        courses.sort_unstable();
        courses.dedup();
        if !crate::planted::active(crate::planted::Bug::RefreshWithoutTtl) {
            cmds.extend(courses.into_iter().map(|c| pexpire(&self.key(c), ttl)));
        }
        Ok(self.link.pipeline::<()>(&cmds)?)
    }

    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        let mut cmds = Vec::with_capacity(courses.len() * 2);
        for course in courses {
            let key = self.key(course);
            cmds.push(trim(&key, now_ms));
            let mut c = redis::cmd("ZCARD");
            c.arg(&key);
            cmds.push(c);
        }
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let replies: Vec<u64> = self.link.pipeline(&cmds)?;
        Ok(replies.into_iter().skip(1).step_by(2).collect())
    }

    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)> {
        let key = self.key(course);
        let mut card = redis::cmd("ZCARD");
        card.arg(&key);
        let mut range = redis::cmd("ZRANGE");
        range.arg(&key).arg(0).arg(limit.saturating_sub(1));
        let (_, total, ids): (u64, u64, Vec<String>) =
            self.link.pipeline(&[trim(&key, now_ms), card, range])?;
        Ok((total, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::{PubSubMode, RedisFlags, RedisMode};

    #[test]
    fn a_failed_call_never_shows_the_password() {
        // Port 1 refuses at once: the connect fails, and the error says so.
        let flags = RedisFlags {
            redis_mode: RedisMode::Standalone,
            pubsub: PubSubMode::Sharded,
            ..RedisFlags::new("redis://svc:Pw%2FS3cret@127.0.0.1:1/2")
        };
        let redis = Redis::from_flags(&flags).expect("valid flags");
        let mut store = RedisPresence::new(&redis, "presence:");
        let e = store.add("CS101", "u1", 1).expect_err("nothing listens");
        let text = e.to_string();
        assert!(text.starts_with("presence: connect: "), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(!text.contains("S3cret"), "{text}");
        assert!(!format!("{e:?}").contains("S3cret"), "{e:?}");
    }
}
