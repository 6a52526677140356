//! The Redis presence store of `serve`: sorted sets `<presence-prefix><course>`
//! of user -> expiry (Unix ms), through the shared command client (in a
//! cluster each set lives on its own slot and pipelines go out per primary),
//! whose every call is bounded by timeouts, so the presence worker never hangs.
//! A write goes course by course: one `ZADD` of all its members (at most
//! [`MEMBERS_PER_COMMAND`] a command), then one `PEXPIRE` giving the key a
//! TTL to its members' expiry, so a course's key is gone one presence TTL
//! after the last node that held its viewers stopped refreshing it (a node
//! killed); removals are one `ZREM` per course.

use super::{Members, PresenceStore, StoreResult};
use crate::redis::commands::Commands;
use crate::redis::{Error, Redis};
use redis::{Cmd, FromRedisValue, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the store's commands go and the clock its key TTLs are read from:
/// the shared command client and the wall clock in `serve`, a simulated
/// Redis on a virtual clock in the simulator (`sim/`).
pub trait PresenceLink: Send {
    /// One command and its reply.
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error>;
    /// Commands sent at once, every reply in order.
    fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error>;
    /// Commands sent at once, every reply in order, a command's own failure
    /// (a key that is no sorted set: `WRONGTYPE`) a `Value::ServerError` in
    /// its place rather than the whole pipeline's: one stray key under the
    /// prefix must not stop the writes and counts of every other course.
    fn pipeline_each(&mut self, cmds: &[Cmd]) -> Result<Vec<Value>, Error> {
        self.pipeline(cmds)
    }
    /// Now, Unix ms (the clock of the scores).
    fn unix_ms(&self) -> u64;
    /// How long until the link's next attempt after a call failed (see
    /// [`PresenceStore::retry_in`]); `None` for a link that keeps no backoff.
    fn retry_in(&self) -> Option<Duration> {
        None
    }
}

impl PresenceLink for Commands {
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        Commands::query(self, cmd)
    }
    fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error> {
        Commands::pipeline(self, cmds)
    }
    fn pipeline_each(&mut self, cmds: &[Cmd]) -> Result<Vec<Value>, Error> {
        Commands::pipeline_each(self, cmds)
    }
    fn unix_ms(&self) -> u64 {
        crate::clock::unix_ms()
    }
    fn retry_in(&self) -> Option<Duration> {
        Some(Commands::retry_in(self))
    }
}

/// The most members one `ZADD` or `ZREM` names: a course's larger group
/// goes in several commands of the same pipeline, so no one command holds
/// Redis long.
pub const MEMBERS_PER_COMMAND: usize = 1000;

/// Presence in Redis sorted sets.
pub struct RedisPresence<L: PresenceLink = Commands> {
    link: L,
    prefix: String,
    /// The key being written (`<prefix><course>`), its capacity kept.
    key: Vec<u8>,
    /// Writes refused by a key of another type since they were last taken.
    refused: u64,
    /// When such a refusal was last logged.
    warned: Option<Instant>,
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
            key: Vec::new(),
            refused: 0,
            warned: None,
        }
    }

    /// Sets `self.key` to `<prefix><course>` (no allocation once its
    /// capacity has grown: every command of a write names a key).
    fn set_key(&mut self, course: &str) {
        self.key.clear();
        self.key.extend_from_slice(self.prefix.as_bytes());
        self.key.extend_from_slice(course.as_bytes());
    }

    /// The writes' replies looked over: a key that refused one (it is no
    /// sorted set) is counted and logged (at most once a minute); the others
    /// were written.
    fn refused_in(&mut self, replies: &[Value]) {
        let mut first = None;
        for r in replies {
            if let Value::ServerError(e) = r {
                self.refused += 1;
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            if self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                self.warned = Some(Instant::now());
                tracing::warn!(error = %e, "a presence key is not a sorted set: its members are not written");
            }
        }
    }

    /// The key TTL that lasts until `expiry_ms` (Unix ms), at least 1 ms.
    fn key_ttl_ms(&self, expiry_ms: u64) -> u64 {
        expiry_ms.saturating_sub(self.link.unix_ms()).max(1)
    }

    /// `name key [score] member [score] member ...` for `members` of the
    /// course whose key is `self.key`, the buffers sized once.
    fn members_cmd(&self, name: &str, score: Option<&[u8]>, members: &Members) -> Cmd {
        let per = score.map_or(0, <[u8]>::len);
        let bytes: usize = members.iter().map(|(_, u)| u.len() + per).sum();
        let args = 2 + members.len() * (1 + usize::from(score.is_some()));
        let mut c = Cmd::with_capacity(args, name.len() + self.key.len() + bytes);
        c.arg(name).arg(&self.key[..]);
        for (_, user) in members {
            if let Some(score) = score {
                c.arg(score);
            }
            c.arg(user.as_bytes());
        }
        c
    }

    /// The commands that write `members` (each course's together): per course, its
    /// members in `ZADD`s at `expiry_ms` and its key's TTL (`PEXPIRE`) when
    /// `renew`; or its members in `ZREM`s when `expiry_ms` is `None`.
    fn grouped(&mut self, members: &Members, expiry_ms: Option<u64>, renew: bool) -> Vec<Cmd> {
        let score = expiry_ms.map(|e| e.to_string());
        let ttl = expiry_ms.map(|e| self.key_ttl_ms(e));
        let name = if score.is_some() { "ZADD" } else { "ZREM" };
        let mut cmds = Vec::new();
        for course in members.chunk_by(|a, b| a.0 == b.0) {
            let Some((name_of_course, _)) = course.first() else {
                continue;
            };
            self.set_key(name_of_course);
            for part in course.chunks(MEMBERS_PER_COMMAND) {
                cmds.push(self.members_cmd(name, score.as_deref().map(str::as_bytes), part));
            }
            if let (Some(ttl), true) = (ttl, renew) {
                cmds.push(pexpire(&self.key, ttl));
            }
        }
        cmds
    }
}

fn pexpire(key: &[u8], ttl_ms: u64) -> Cmd {
    let mut c = Cmd::with_capacity(3, "PEXPIRE".len() + key.len() + 20);
    c.arg("PEXPIRE").arg(key).arg(ttl_ms);
    c
}

/// At most one warning per this long about keys that refuse writes.
const WARN_EVERY: Duration = Duration::from_secs(60);

fn trim(key: &[u8], now_ms: u64) -> Cmd {
    let mut c = redis::cmd("ZREMRANGEBYSCORE");
    c.arg(key).arg(0).arg(now_ms);
    c
}

impl<L: PresenceLink> PresenceStore for RedisPresence<L> {
    fn take_refused(&mut self) -> u64 {
        std::mem::take(&mut self.refused)
    }

    fn retry_in(&self) -> Option<Duration> {
        self.link.retry_in()
    }

    fn add(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        if members.is_empty() {
            return Ok(());
        }
        let cmds = self.grouped(members, Some(expiry_ms), true);
        let replies = self.link.pipeline_each(&cmds)?;
        self.refused_in(&replies);
        Ok(())
    }

    fn refresh(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        if members.is_empty() {
            return Ok(());
        }
        let renew = !crate::planted::active(crate::planted::Bug::RefreshWithoutTtl);
        let cmds = self.grouped(members, Some(expiry_ms), renew);
        let replies = self.link.pipeline_each(&cmds)?;
        self.refused_in(&replies);
        Ok(())
    }

    fn remove(&mut self, members: &Members) -> StoreResult<()> {
        if members.is_empty() {
            return Ok(());
        }
        let cmds = self.grouped(members, None, false);
        let replies = self.link.pipeline_each(&cmds)?;
        self.refused_in(&replies);
        Ok(())
    }

    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        self.add_and_count(&[], 0, courses, now_ms)
    }

    fn warm(&mut self) {
        let _ = self.link.query::<String>(&redis::cmd("PING"));
    }

    fn add_and_count(
        &mut self,
        members: &Members,
        expiry_ms: u64,
        courses: &[Arc<str>],
        now_ms: u64,
    ) -> StoreResult<Vec<u64>> {
        let mut cmds = if members.is_empty() {
            Vec::with_capacity(courses.len() * 2)
        } else {
            self.grouped(members, Some(expiry_ms), true)
        };
        let written = cmds.len();
        for course in courses {
            self.set_key(course);
            cmds.push(trim(&self.key, now_ms));
            let mut c = redis::cmd("ZCARD");
            c.arg(&self.key[..]);
            cmds.push(c);
        }
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        // Every reply is an integer, or the refusal of a key that is no
        // sorted set: that course counts nobody (its shards keep their own
        // viewers at least).
        let replies = self.link.pipeline_each(&cmds)?;
        self.refused_in(&replies[..written.min(replies.len())]);
        Ok(replies
            .into_iter()
            .skip(written + 1)
            .step_by(2)
            .map(|r| match r {
                Value::Int(n) => u64::try_from(n).unwrap_or(0),
                _ => 0,
            })
            .collect())
    }

    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)> {
        self.set_key(course);
        let mut card = redis::cmd("ZCARD");
        card.arg(&self.key[..]);
        let mut range = redis::cmd("ZRANGE");
        range.arg(&self.key[..]).arg(0).arg(limit.saturating_sub(1));
        let (_, total, ids): (u64, u64, Vec<String>) =
            self.link
                .pipeline(&[trim(&self.key, now_ms), card, range])?;
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
        let e = store
            .add(&[("CS101".into(), "u1".into())], 1)
            .expect_err("nothing listens");
        let text = e.to_string();
        assert!(text.starts_with("presence: connect: "), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(!text.contains("S3cret"), "{text}");
        assert!(!format!("{e:?}").contains("S3cret"), "{e:?}");
    }
}
