//! The analytics worker's I/O loop: one pub/sub connection (PSUBSCRIBE), one
//! command connection (SCAN + ZCOUNT, XADD), reconnects with capped jittered
//! backoff. A Redis blip loses at most the bucket in flight, and says so.

use super::worker::{Buckets, Closed, Entry};
use super::{stream_key, AnalyticsArgs};
use crate::clock;
use redis::{Client, Connection, RedisError};
use shards::snapshot::valid_course;
use shards::Snapshot;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long a blocked pub/sub read waits before the loop looks at the clock.
const POLL: Duration = Duration::from_millis(50);
/// Reconnect backoff: first ceiling and cap.
const BACKOFF_BASE_MS: u64 = 100;
const BACKOFF_CAP_MS: u64 = 2_000;
/// Command timeouts on the command connection.
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys per SCAN page.
const SCAN_COUNT: u64 = 1000;
/// At most one "rejected payload" log line this often.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Escapes glob metacharacters so a prefix matches itself in `SCAN MATCH`/`PSUBSCRIBE`.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Viewer counts per course: `ZCOUNT key <now> +inf` over `SCAN MATCH <prefix>*`.
/// Read only: nothing here writes, trims or expires a presence key.
pub fn read_viewers(
    con: &mut Connection,
    prefix: &str,
    now_ms: u64,
) -> Result<HashMap<String, u64>, RedisError> {
    let pattern = format!("{}*", glob_escape(prefix));
    let mut out = HashMap::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg("zset")
            .query(con)?;
        let keys: Vec<(Vec<u8>, String)> = keys
            .into_iter()
            .filter_map(|k| {
                let course = std::str::from_utf8(&k)
                    .ok()?
                    .strip_prefix(prefix)
                    .filter(|c| valid_course(c))?
                    .to_owned();
                Some((k, course))
            })
            .collect();
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for (k, _) in &keys {
                pipe.cmd("ZCOUNT").arg(k).arg(now_ms).arg("+inf");
            }
            let counts: Vec<u64> = match pipe.query(con) {
                Ok(c) => c,
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => return Err(e),
                // A key changed type between SCAN and ZCOUNT: count the rest one by one.
                Err(_) => keys
                    .iter()
                    .map(|(k, _)| {
                        redis::cmd("ZCOUNT")
                            .arg(k)
                            .arg(now_ms)
                            .arg("+inf")
                            .query(con)
                            .unwrap_or(0)
                    })
                    .collect(),
            };
            for ((_, course), n) in keys.into_iter().zip(counts) {
                out.insert(course, n);
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(out);
        }
    }
}

/// Appends one entry: `XADD <key> MAXLEN ~ <max_len> * bucket_start_ms .. bucket_ms .. courses ..`.
pub fn append(
    con: &mut Connection,
    key: &str,
    max_len: u64,
    e: &Entry,
) -> Result<String, RedisError> {
    redis::cmd("XADD")
        .arg(key)
        .arg("MAXLEN")
        .arg("~")
        .arg(max_len)
        .arg("*")
        .arg("bucket_start_ms")
        .arg(e.bucket_start_ms)
        .arg("bucket_ms")
        .arg(e.bucket_ms)
        .arg("courses")
        .arg(e.courses_json())
        .query(con)
}

/// Capped, fully jittered exponential backoff.
struct Backoff {
    attempt: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let ceiling = BACKOFF_CAP_MS.min(BACKOFF_BASE_MS << self.attempt.min(10));
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(fastrand::u64(ceiling / 2..=ceiling))
    }
}

/// Sleeps up to `d`, returning early once `stop` is set.
fn nap(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

struct Loop<'a> {
    args: &'a AnalyticsArgs,
    key: String,
    buckets: Buckets,
    /// An entry whose XADD failed, written first after the reconnect.
    pending: Option<Entry>,
    rejected: u64,
    last_reject_log: Option<Instant>,
    /// Set while Redis is unreachable, for the "reconnected" line.
    down_since: Option<Instant>,
}

/// How a connected session ended.
enum End {
    Stopped,
    Failed(RedisError),
}

impl Loop<'_> {
    fn on_message(&mut self, channel: &str, payload: &[u8]) {
        let Some(course) = channel.strip_prefix(self.args.channel_prefix.as_str()) else {
            return;
        };
        match Snapshot::parse(payload, Some(course)) {
            Ok(s) => self.buckets.on_snapshot(&s),
            Err(why) => {
                self.rejected += 1;
                let due = self
                    .last_reject_log
                    .is_none_or(|t| t.elapsed() >= REJECT_LOG_EVERY);
                if due {
                    tracing::warn!(
                        channel,
                        reason = why.label(),
                        rejected_total = self.rejected,
                        "dropping a malformed snapshot (not counted)"
                    );
                    self.last_reject_log = Some(Instant::now());
                }
            }
        }
    }

    fn flush_pending(&mut self, cmd: &mut Connection) -> Result<(), RedisError> {
        if let Some(e) = self.pending.take() {
            match append(cmd, &self.key, self.args.max_len, &e) {
                Ok(id) => tracing::info!(
                    bucket_start_ms = e.bucket_start_ms,
                    id,
                    "appended a bucket held back by the outage"
                ),
                Err(err) => {
                    self.pending = Some(e);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Closes the bucket in flight if it is over.
    fn close_due(&mut self, cmd: &mut Connection) -> Result<(), RedisError> {
        let now = clock::unix_ms();
        if !self.buckets.due(now) {
            return Ok(());
        }
        let start = self.buckets.start_ms();
        let viewers = if self.buckets.is_lost() {
            HashMap::new()
        } else {
            match read_viewers(cmd, &self.args.presence_prefix, now) {
                Ok(v) => v,
                Err(e) => {
                    // Without its viewer counts the bucket cannot be written.
                    self.buckets.lose();
                    self.buckets.close(now, &HashMap::new());
                    tracing::warn!(
                        bucket_start_ms = start,
                        error = %e,
                        "bucket lost: cannot read presence"
                    );
                    return Err(e);
                }
            }
        };
        match self.buckets.close(now, &viewers) {
            (Closed::Write, Some(e)) => match append(cmd, &self.key, self.args.max_len, &e) {
                Ok(id) => tracing::debug!(
                    bucket_start_ms = start,
                    courses = e.courses.len(),
                    id,
                    "bucket appended"
                ),
                Err(err) => {
                    tracing::warn!(bucket_start_ms = start, error = %err, "XADD failed; holding the entry for the reconnect");
                    self.pending = Some(e);
                    return Err(err);
                }
            },
            (Closed::Lost, _) => tracing::warn!(
                bucket_start_ms = start,
                bucket_ms = self.buckets.bucket_ms(),
                "bucket lost: the Redis connection dropped during it (nothing written for it)"
            ),
            _ => tracing::trace!(bucket_start_ms = start, "idle bucket, nothing written"),
        }
        Ok(())
    }

    /// One connected stretch: subscribe, then count and close buckets until
    /// stopped or Redis fails. `connected` turns true once subscribed.
    fn session(&mut self, client: &Client, stop: &AtomicBool, connected: &mut bool) -> End {
        let mut cmd = match client.get_connection_with_timeout(CMD_TIMEOUT) {
            Ok(c) => c,
            Err(e) => return End::Failed(e),
        };
        let mut sub = match client.get_connection_with_timeout(CMD_TIMEOUT) {
            Ok(c) => c,
            Err(e) => return End::Failed(e),
        };
        for r in [
            cmd.set_read_timeout(Some(CMD_TIMEOUT)),
            cmd.set_write_timeout(Some(CMD_TIMEOUT)),
            sub.set_write_timeout(Some(CMD_TIMEOUT)),
        ] {
            if let Err(e) = r {
                return End::Failed(e);
            }
        }
        let mut ps = sub.as_pubsub();
        let pattern = format!("{}*", glob_escape(&self.args.channel_prefix));
        if let Err(e) = ps.psubscribe(&pattern) {
            return End::Failed(e);
        }
        if let Err(e) = ps.set_read_timeout(Some(POLL)) {
            return End::Failed(e);
        }
        *connected = true;
        match self.down_since.take() {
            Some(t) => tracing::info!(
                pattern,
                down_ms = t.elapsed().as_millis() as u64,
                "reconnected to Redis, counting again"
            ),
            None => tracing::info!(pattern, stream = self.key, "analytics worker subscribed"),
        }
        if let Err(e) = self.flush_pending(&mut cmd) {
            return End::Failed(e);
        }
        loop {
            if stop.load(Relaxed) {
                return End::Stopped;
            }
            // The clock is looked at before every message is counted, so a
            // message read after a boundary never lands in the closed bucket.
            let msg = ps.get_message();
            if let Err(e) = self.close_due(&mut cmd) {
                return End::Failed(e);
            }
            match msg {
                Ok(msg) => self.on_message(msg.get_channel_name(), msg.get_payload_bytes()),
                Err(e) if e.is_timeout() => {}
                // SIGTERM/SIGINT interrupted the read: the loop head stops.
                Err(_) if stop.load(Relaxed) => {}
                Err(e) => {
                    if !self.buckets.is_lost() {
                        self.buckets.lose();
                    }
                    return End::Failed(e);
                }
            }
        }
    }
}

/// Runs the worker until `stop` is set (SIGTERM/SIGINT). A bucket in flight at
/// the stop is dropped, never flushed partial.
pub fn run(client: &Client, args: &AnalyticsArgs, stop: &AtomicBool) {
    let key = stream_key(&args.analytics_prefix, &args.session);
    tracing::info!(
        stream = key,
        bucket_ms = args.bucket_ms,
        max_len = args.max_len,
        "seatboard analytics starting"
    );
    let mut lp = Loop {
        args,
        key,
        buckets: Buckets::new(args.bucket_ms, clock::unix_ms()),
        pending: None,
        rejected: 0,
        last_reject_log: None,
        down_since: None,
    };
    let mut backoff = Backoff { attempt: 0 };
    while !stop.load(Relaxed) {
        let mut connected = false;
        match lp.session(client, stop, &mut connected) {
            End::Stopped => break,
            End::Failed(e) => {
                if connected {
                    backoff.attempt = 0;
                    tracing::warn!(
                        error = %e,
                        bucket_start_ms = lp.buckets.start_ms(),
                        "Redis connection lost; reconnecting (the bucket in flight is lost)"
                    );
                    lp.down_since = Some(Instant::now());
                } else if lp.down_since.is_none() {
                    tracing::warn!(error = %e, "Redis unavailable; retrying");
                    lp.down_since = Some(Instant::now());
                } else {
                    tracing::debug!(error = %e, "reconnect failed");
                }
            }
        }
        nap(backoff.next(), stop);
    }
    if lp.pending.is_some() {
        tracing::warn!("stopping with one bucket unwritten (Redis was down)");
    }
    tracing::info!("seatboard analytics stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("seats:"), "seats:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn backoff_is_jittered_and_capped() {
        let mut b = Backoff { attempt: 0 };
        let first = b.next();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..40 {
            let d = b.next();
            assert!(d <= Duration::from_millis(BACKOFF_CAP_MS), "{d:?}");
        }
        assert!(b.next() >= Duration::from_millis(BACKOFF_CAP_MS / 2));
    }
}
