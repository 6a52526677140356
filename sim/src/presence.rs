//! Presence in the simulated Redis: a sorted set per course (user -> expiry,
//! Unix ms) with its key TTL, run command by command from what the product's
//! own store (`RedisPresence`) sends, on the virtual clock; and the link that
//! store talks through.

use redis::{Arg, Cmd, FromRedisValue, Value};
use seatboard::presence::redis::PresenceLink;
use seatboard::redis::Error;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The name the product's errors carry for this client.
const WHAT: &str = "presence";

/// One presence key: its members and when the key itself expires.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Key {
    /// User -> score (expiry, Unix ms).
    pub members: BTreeMap<String, u64>,
    /// The key's own expiry (`PEXPIRE`), if it has one.
    pub expires: Option<u64>,
}

/// The presence keyspace, shared by the world and every node's store.
#[derive(Debug, Default)]
pub struct Sets {
    /// Virtual now (Unix ms), set by the world before every event.
    pub now: u64,
    /// Whether Redis answers (not frozen, not restarting).
    pub reachable: bool,
    keys: BTreeMap<String, Key>,
    /// Writes a replica may not have yet: (when, key, the key before).
    undo: Vec<(u64, String, Option<Key>)>,
}

/// Locks the keyspace; a poisoned lock (a panic elsewhere) is still read.
pub fn lock(s: &Mutex<Sets>) -> MutexGuard<'_, Sets> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn int(n: usize) -> Value {
    Value::Int(n as i64)
}

fn num(a: &[u8]) -> Result<u64, String> {
    let s = std::str::from_utf8(a).map_err(|e| e.to_string())?;
    s.parse::<u64>().map_err(|e| format!("{s}: {e}"))
}

fn text(a: &[u8]) -> Result<String, String> {
    String::from_utf8(a.to_vec()).map_err(|e| e.to_string())
}

impl Sets {
    /// The live keys (expired ones dropped, as Redis would on access).
    pub fn keys(&mut self) -> &BTreeMap<String, Key> {
        let now = self.now;
        self.keys.retain(|_, k| k.expires.is_none_or(|e| e > now));
        &self.keys
    }

    /// Restarted without its keyspace.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.undo.clear();
    }

    /// A failover to a replica that missed the writes of the last `lag_ms`.
    pub fn failover(&mut self, lag_ms: u64) {
        while let Some((t, ..)) = self.undo.last() {
            if *t + lag_ms < self.now {
                break;
            }
            let Some((_, key, old)) = self.undo.pop() else {
                break;
            };
            match old {
                Some(k) => self.keys.insert(key, k),
                None => self.keys.remove(&key),
            };
        }
        self.undo.clear();
    }

    /// Records `key` as it was before a write.
    fn before_write(&mut self, key: &str) {
        let old = self.keys.get(key).cloned();
        self.undo.push((self.now, key.to_owned(), old));
        let keep_from = self.now.saturating_sub(10_000);
        let cut = self.undo.partition_point(|(t, ..)| *t < keep_from);
        self.undo.drain(..cut);
    }

    /// Runs one command (the ones the presence store sends).
    pub fn exec(&mut self, cmd: &Cmd) -> Result<Value, String> {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                Arg::Simple(b) => Some(b),
                _ => None,
            })
            .collect();
        let (name, rest) = args.split_first().ok_or("empty command")?;
        let name = text(name)?.to_ascii_uppercase();
        let key = text(rest.first().ok_or("no key")?)?;
        let rest = &rest[1..];
        self.keys();
        let now = self.now;
        match name.as_str() {
            "ZADD" => {
                self.before_write(&key);
                let k = self.keys.entry(key).or_default();
                let mut added = 0;
                for pair in rest.chunks(2) {
                    let [score, member] = pair else {
                        return Err("ZADD: odd arguments".into());
                    };
                    if k.members.insert(text(member)?, num(score)?).is_none() {
                        added += 1;
                    }
                }
                Ok(int(added))
            }
            "PEXPIRE" => {
                let ms = num(rest.first().ok_or("PEXPIRE: no TTL")?)?;
                if !self.keys.contains_key(&key) {
                    return Ok(int(0));
                }
                self.before_write(&key);
                if let Some(k) = self.keys.get_mut(&key) {
                    k.expires = Some(now + ms);
                }
                Ok(int(1))
            }
            "ZREM" => {
                self.before_write(&key);
                let mut n = 0;
                if let Some(k) = self.keys.get_mut(&key) {
                    for m in rest {
                        n += usize::from(k.members.remove(&text(m)?).is_some());
                    }
                }
                self.drop_empty(&key);
                Ok(int(n))
            }
            "ZREMRANGEBYSCORE" => {
                let (Some(lo), Some(hi)) = (rest.first(), rest.get(1)) else {
                    return Err("ZREMRANGEBYSCORE: no range".into());
                };
                let (lo, hi) = (num(lo)?, num(hi)?);
                self.before_write(&key);
                let mut n = 0;
                if let Some(k) = self.keys.get_mut(&key) {
                    let before = k.members.len();
                    k.members.retain(|_, s| *s < lo || *s > hi);
                    n = before - k.members.len();
                }
                self.drop_empty(&key);
                Ok(int(n))
            }
            "ZCARD" => Ok(int(self.keys.get(&key).map_or(0, |k| k.members.len()))),
            "ZRANGE" => {
                let (Some(lo), Some(hi)) = (rest.first(), rest.get(1)) else {
                    return Err("ZRANGE: no range".into());
                };
                let (lo, hi) = (num(lo)? as usize, num(hi)? as usize);
                let mut by_score: Vec<(u64, &String)> = self
                    .keys
                    .get(&key)
                    .map(|k| k.members.iter().map(|(m, s)| (*s, m)).collect())
                    .unwrap_or_default();
                by_score.sort();
                let ids = by_score
                    .into_iter()
                    .skip(lo)
                    .take((hi + 1).saturating_sub(lo))
                    .map(|(_, m)| Value::BulkString(m.clone().into_bytes()))
                    .collect();
                Ok(Value::Array(ids))
            }
            other => Err(format!("the simulated Redis runs no {other}")),
        }
    }

    /// A sorted set with no member left is no key (its TTL goes with it).
    fn drop_empty(&mut self, key: &str) {
        if self.keys.get(key).is_some_and(|k| k.members.is_empty()) {
            self.keys.remove(key);
        }
    }
}

/// One node's presence connection to the simulated Redis: a call fails, as a
/// timed-out one does, while Redis is frozen or restarting.
pub struct SimLink(pub Arc<Mutex<Sets>>);

fn failed(e: String) -> Error {
    Error::Command {
        what: WHAT,
        source: redis::RedisError::from((redis::ErrorKind::Client, "simulated", e)),
    }
}

impl PresenceLink for SimLink {
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        let mut s = lock(&self.0);
        if !s.reachable {
            return Err(Error::Backoff { what: WHAT });
        }
        let v = s.exec(cmd).map_err(failed)?;
        T::from_redis_value(v).map_err(|e| failed(e.to_string()))
    }

    fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error> {
        let mut s = lock(&self.0);
        if !s.reachable {
            return Err(Error::Backoff { what: WHAT });
        }
        let replies = cmds
            .iter()
            .map(|c| s.exec(c))
            .collect::<Result<Vec<Value>, String>>()
            .map_err(failed)?;
        T::from_redis_value(Value::Array(replies)).map_err(|e| failed(e.to_string()))
    }

    fn unix_ms(&self) -> u64 {
        lock(&self.0).now
    }
}
