//! The analytics worker's I/O loop on the shared Redis layer: the pattern
//! subscription (classic pub/sub), or in a sharded cluster every course with a
//! state hash shard-subscribed (rescanned every 5 s, `crate::redis::state_keys`),
//! plus the command client (SCAN + ZCOUNT on every primary, XADD). A Redis blip loses at most the
//! bucket in flight, and says so.

use super::metrics::{Lost, Rejected, Shared};
use super::AnalyticsArgs;
use crate::analytics_stream::{stream_key, Buckets, Closed, Entry};
use crate::channels::poll::wait_readable;
use crate::clock;
use crate::redis::commands::Commands;
use crate::redis::pubsub::{PubSub, Source, SourceEvent};
use crate::redis::Redis;
use shards::snapshot::valid_course;
use shards::Snapshot;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest sleep between looks at the stop flag (set by SIGTERM/SIGINT); the
/// loop otherwise sleeps until a message, the bucket's end or the source's
/// next timed work (keepalive, reconnect), whichever comes first.
const STOP_CHECK: Duration = Duration::from_millis(500);
/// How often the courses with a state hash are rescanned (sharded pub/sub).
const RESCAN: Duration = Duration::from_secs(5);
/// Keys counted per ZCOUNT pipeline.
const COUNT_BATCH: usize = 1000;
/// At most one "rejected payload" log line this often.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Viewer counts per course: `ZCOUNT key <now> +inf` over `SCAN MATCH <prefix>*`
/// (every primary in a cluster). Read only: nothing here writes, trims or
/// expires a presence key.
pub fn read_viewers(
    con: &mut Commands,
    prefix: &str,
    now_ms: u64,
) -> Result<HashMap<String, u64>, crate::redis::Error> {
    let keys: Vec<(Vec<u8>, String)> = con
        .scan(prefix, Some("zset"))?
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
    let mut out = HashMap::new();
    for chunk in keys.chunks(COUNT_BATCH) {
        let zcount = |k: &[u8]| {
            let mut c = redis::cmd("ZCOUNT");
            c.arg(k).arg(now_ms).arg("+inf");
            c
        };
        let cmds: Vec<redis::Cmd> = chunk.iter().map(|(k, _)| zcount(k)).collect();
        let counts: Vec<u64> = match con.pipeline(&cmds) {
            Ok(c) => c,
            // A key changed type between SCAN and ZCOUNT (or the connection
            // failed): count the rest one by one, failing on a dead connection.
            Err(_) => {
                let mut v = Vec::with_capacity(chunk.len());
                for (k, _) in chunk {
                    match con.query::<u64>(&zcount(k)) {
                        Ok(n) => v.push(n),
                        Err(_) if con.is_connected() => v.push(0),
                        Err(e) => return Err(e),
                    }
                }
                v
            }
        };
        for ((_, course), n) in chunk.iter().zip(counts) {
            out.insert(course.clone(), n);
        }
    }
    Ok(out)
}

/// Appends one entry: `XADD <key> MAXLEN ~ <max_len> * bucket_start_ms .. bucket_ms .. courses ..`.
pub fn append(
    con: &mut Commands,
    key: &str,
    max_len: u64,
    e: &Entry,
) -> Result<String, crate::redis::Error> {
    let mut xadd = redis::cmd("XADD");
    xadd.arg(key).arg("MAXLEN").arg("~").arg(max_len).arg("*");
    for (field, value) in e.fields() {
        xadd.arg(field).arg(value);
    }
    con.query(&xadd)
}

/// The worker's loop state: the buckets, the entry held back by a failed
/// `XADD`, the link as last seen, and the figures `/metrics` shows.
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
    /// Whether the pub/sub connection was up at the end of the last turn.
    was_up: bool,
    /// The "subscribed" line was logged (once, at the first connection).
    announced: bool,
    figures: Arc<Shared>,
}

impl Loop<'_> {
    /// Sleeps on the source's sockets until one is readable, the bucket in
    /// flight ends (while Redis is up), the source's timed work or the next
    /// look at the stop flag; then takes the event ready, if any, and writes
    /// what the source was asked for.
    fn next_event(&self, source: &mut PubSub, fds: &mut Vec<RawFd>) -> Option<SourceEvent> {
        // While Redis is away no bucket closes: only the source's own timing counts.
        let wait = match self.was_up {
            true => sleep_for(&self.buckets, source.poll_timeout(), clock::unix_ms()),
            false => source
                .poll_timeout()
                .map_or(STOP_CHECK, |s| s.min(STOP_CHECK)),
        };
        let mut ev = source.poll();
        if ev.is_none() && !wait.is_zero() {
            fds.clear();
            source.wait_fds(fds);
            wait_readable(fds, wait);
            ev = source.poll();
        }
        source.flush();
        ev
    }

    /// Follows the pub/sub link: a drop loses the bucket in flight; the
    /// reconnect gives that bucket up at once (logged and counted) and counts
    /// again from there, so no snapshot read after it is dropped.
    fn on_link(&mut self, up: bool, connecting: bool) {
        self.figures.redis_up.store(up, Relaxed);
        if up && !self.was_up {
            match self.down_since.take() {
                Some(t) => tracing::info!(
                    down_ms = t.elapsed().as_millis() as u64,
                    "reconnected to Redis, counting again"
                ),
                None if !self.announced => {
                    tracing::info!(stream = self.key, "analytics worker subscribed")
                }
                None => {}
            }
            self.announced = true;
            if let Some(start) = self.buckets.resume(clock::unix_ms()) {
                self.figures.lost(Lost::RedisDown);
                tracing::warn!(
                    bucket_start_ms = start,
                    bucket_ms = self.buckets.bucket_ms(),
                    "bucket lost: the Redis connection dropped during it (what it counted is dropped; counting resumes at the reconnect)"
                );
            }
        } else if !up && self.was_up {
            self.buckets.lose();
            tracing::warn!(
                bucket_start_ms = self.buckets.start_ms(),
                "Redis connection lost; reconnecting (the bucket in flight is lost)"
            );
            self.down_since = Some(Instant::now());
        } else if !up && self.down_since.is_none() && !connecting {
            // Only once a connection attempt failed: the first poll of a
            // clean start runs while the first connection is on its way.
            tracing::warn!("Redis unavailable; retrying");
            self.down_since = Some(Instant::now());
        }
        self.was_up = up;
    }

    /// Writes what is owed to the stream, in bucket order: the entry held
    /// back by a failed `XADD` first, then the bucket in flight if it ended.
    /// A bucket that ends while the held entry still cannot be written is
    /// given up (logged and counted) rather than written out of order.
    fn write_due(&mut self, cmd: &mut Commands) {
        let held = self.flush_pending(cmd).is_ok();
        let now = clock::unix_ms();
        if !self.buckets.due(now) {
            return;
        }
        if !held {
            let start = self.buckets.start_ms();
            self.buckets.lose();
            self.buckets.close(now, &HashMap::new());
            self.figures.lost(Lost::Unwritten);
            tracing::warn!(
                bucket_start_ms = start,
                "bucket lost: the entry before it is still unwritten (Redis refuses the XADD)"
            );
            return;
        }
        let _ = self.close_due(cmd, now);
    }

    /// Counts what the source delivered into the bucket in flight.
    fn on_event(&mut self, ev: Option<SourceEvent>) {
        match ev {
            Some(SourceEvent::Message { course, payload }) => self.on_message(&course, &payload),
            Some(SourceEvent::Oversize { course }) => {
                self.rejected += 1;
                self.figures.rejected(Rejected::Oversize);
                tracing::warn!(course, "dropping an oversized snapshot (not counted)");
            }
            _ => {}
        }
    }

    fn on_message(&mut self, course: &str, payload: &[u8]) {
        let channel = format!("{}{course}", self.args.channel_prefix);
        match Snapshot::parse(payload, Some(course)) {
            Ok(s) => {
                // A rehearsal's is not counted, in the stream or here.
                if self.buckets.on_snapshot(&s) {
                    self.figures.snapshots.fetch_add(1, Relaxed);
                }
            }
            Err(why) => {
                self.rejected += 1;
                self.figures.rejected(Rejected::Malformed);
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

    fn flush_pending(&mut self, cmd: &mut Commands) -> Result<(), crate::redis::Error> {
        if let Some(e) = self.pending.take() {
            match append(cmd, &self.key, self.args.max_len, &e) {
                Ok(id) => {
                    self.figures.entries.fetch_add(1, Relaxed);
                    self.figures.held.store(false, Relaxed);
                    tracing::info!(
                        bucket_start_ms = e.bucket_start_ms,
                        id,
                        "appended a bucket held back by the outage"
                    )
                }
                Err(err) => {
                    self.pending = Some(e);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Closes the bucket in flight, over at `now`: its viewer counts read,
    /// its entry appended (or held back for the reconnect).
    fn close_due(&mut self, cmd: &mut Commands, now: u64) -> Result<(), crate::redis::Error> {
        let start = self.buckets.start_ms();
        let viewers = match self.buckets.is_lost() {
            // Given up already: no viewer counts needed.
            true => Ok(HashMap::new()),
            false => read_viewers(cmd, &self.args.presence_prefix, now),
        };
        let viewers = match viewers {
            Ok(v) => v,
            Err(e) => {
                // Without its viewer counts the bucket cannot be written.
                self.buckets.lose();
                self.buckets.close(now, &HashMap::new());
                self.figures.lost(Lost::Presence);
                tracing::warn!(
                    bucket_start_ms = start,
                    error = %e,
                    "bucket lost: cannot read presence"
                );
                return Err(e);
            }
        };
        match self.buckets.close(now, &viewers) {
            (Closed::Write, Some(e)) => match append(cmd, &self.key, self.args.max_len, &e) {
                Ok(id) => {
                    self.figures.entries.fetch_add(1, Relaxed);
                    tracing::debug!(
                        bucket_start_ms = start,
                        courses = e.courses.len(),
                        id,
                        "bucket appended"
                    )
                }
                Err(err) => {
                    tracing::warn!(bucket_start_ms = start, error = %err, "XADD failed; holding the entry for the reconnect");
                    self.pending = Some(e);
                    self.figures.held.store(true, Relaxed);
                    return Err(err);
                }
            },
            (Closed::Lost, _) => {
                self.figures.lost(Lost::RedisDown);
                tracing::warn!(
                    bucket_start_ms = start,
                    bucket_ms = self.buckets.bucket_ms(),
                    "bucket lost: the Redis connection dropped during it (nothing written for it)"
                )
            }
            _ => tracing::trace!(bucket_start_ms = start, "idle bucket, nothing written"),
        }
        Ok(())
    }
}

/// How long the loop may sleep in the source at `now_ms`: until the bucket in
/// flight ends, the source's next timed work, or the next look at the stop flag.
fn sleep_for(buckets: &Buckets, source: Option<Duration>, now_ms: u64) -> Duration {
    let bucket = Duration::from_millis(buckets.end_ms().saturating_sub(now_ms));
    source.map_or(STOP_CHECK, |s| s.min(STOP_CHECK)).min(bucket)
}

/// Runs the worker until `stop` is set (SIGTERM/SIGINT), its figures in
/// `figures`. A bucket in flight at the stop is dropped, never flushed
/// partial. Fails only if a thread cannot start.
pub fn run(
    redis: &Arc<Redis>,
    args: &AnalyticsArgs,
    stop: &AtomicBool,
    figures: Arc<Shared>,
) -> std::io::Result<()> {
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
        buckets: Buckets::new(args.bucket_ms, clock::unix_ms())
            .with_rehearsal_prefix(args.rehearsal_prefix.clone()),
        pending: None,
        rejected: 0,
        last_reject_log: None,
        down_since: None,
        was_up: false,
        announced: false,
        figures,
    };
    let mut source = PubSub::new(redis, &args.channel_prefix)?;
    let mut fds = Vec::new();
    source.set_firehose(true);
    let mut cmd = Commands::new(redis, "analytics");
    // Sharded pub/sub has no pattern form: every course with a state hash is
    // subscribed, rescanned every few seconds.
    let mut next_scan = Instant::now();
    while !stop.load(Relaxed) {
        if redis.sharded() && Instant::now() >= next_scan {
            next_scan = Instant::now() + RESCAN;
            if let Ok(courses) =
                crate::redis::state_keys::scan_courses(&mut cmd, &args.state_prefix)
            {
                source.cover(&courses);
            }
        }
        let ev = lp.next_event(&mut source, &mut fds);
        lp.on_link(source.connected(), source.connecting());
        if lp.was_up {
            // The clock is looked at before every message is counted, so a
            // message read after a boundary never lands in the closed bucket.
            lp.write_due(&mut cmd);
        }
        lp.on_event(ev);
    }
    if lp.pending.is_some() {
        tracing::warn!("stopping with one bucket unwritten (Redis was down)");
    }
    tracing::info!("seatboard analytics stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_sleeps_until_the_bucket_ends_the_source_needs_it_or_the_stop_check() {
        // Buckets of 5 s aligned to the clock: the one in flight ends at 10,000.
        let b = Buckets::new(5_000, 7_000);
        assert_eq!(b.end_ms(), 10_000);
        // Nothing sooner: the stop flag is looked at every STOP_CHECK.
        assert_eq!(sleep_for(&b, None, 7_000), STOP_CHECK);
        // The bucket's end comes first.
        assert_eq!(sleep_for(&b, None, 9_800), Duration::from_millis(200));
        // Past the end: no sleep at all, the bucket closes now.
        assert_eq!(sleep_for(&b, None, 10_300), Duration::ZERO);
        // The source's keepalive or reconnect comes first.
        let soon = Duration::from_millis(30);
        assert_eq!(sleep_for(&b, Some(soon), 7_000), soon);
        // Something buffered in the source: poll it at once.
        assert_eq!(sleep_for(&b, Some(Duration::ZERO), 7_000), Duration::ZERO);
    }
}
