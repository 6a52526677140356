//! The classic Redis `Source` of `serve`: one pub/sub connection owned by the
//! ingest thread (SUBSCRIBE per watched course, or PSUBSCRIBE `<prefix>*` while
//! admins watch), plus the command client for the state hashes. Used for a
//! standalone Redis and for `--pubsub classic` in a cluster (any one node
//! hears every PUBLISH there; on failure it moves to another node). Redis going
//! away is routine: the source reports itself disconnected, reconnects with
//! jittered backoff capped at 2 s, restores exactly the subscriptions it should
//! hold and tells the router to reseed.

use super::source::{Source, SourceEvent};
use crate::redis::backoff::Backoff;
use crate::redis::commands::Commands;
use crate::redis::conn::{classify, packed, Fill, Frame, PubConn};
use crate::redis::resp::Item;
use crate::redis::{glob_escape, Mode, Redis};
use shards::snapshot::MAX_PAYLOAD;
use std::collections::{BTreeSet, VecDeque};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Silence on the pub/sub connection after which a PING checks it is alive.
pub const PING_AFTER: Duration = Duration::from_secs(5);
/// How long a PING may go unanswered before the connection counts as dead.
pub const PING_DEADLINE: Duration = Duration::from_secs(3);
/// How long a (P)SUBSCRIBE confirmation may take.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest wait between reconnect attempts of the pub/sub connection
/// (under the contract's 2 s cap): a Redis that answers again after a freeze
/// or a partition is found within it.
pub const RECONNECT_CAP: Duration = Duration::from_millis(500);
/// Channels per SUBSCRIBE command when resubscribing many.
const SUBSCRIBE_BATCH: usize = 512;

/// The live pub/sub connection.
struct Sub {
    conn: PubConn,
    /// Whether this connection holds the pattern subscription.
    pattern: bool,
}

/// A payload frame turned into a source event (`None`: not one of ours).
pub fn message_event(channel_prefix: &str, channel: Vec<u8>, payload: Item) -> Option<SourceEvent> {
    let course = channel.strip_prefix(channel_prefix.as_bytes())?;
    let course = String::from_utf8_lossy(course).into_owned();
    match payload {
        Item::Bulk(payload) => Some(SourceEvent::Message { course, payload }),
        // Skipped unread by the reader: refused as too large without a copy.
        Item::Oversize(_) => Some(SourceEvent::Oversize { course }),
        _ => Some(SourceEvent::Message {
            course,
            payload: Vec::new(),
        }),
    }
}

/// The course's current state (HGETALL of its state hash), one payload per section.
pub fn read_state(cmds: &mut Commands, state_prefix: &str, course: &str) -> Option<Vec<Vec<u8>>> {
    let key = format!("{state_prefix}{course}");
    match cmds.query::<Vec<Vec<u8>>>(::redis::cmd("HGETALL").arg(&key)) {
        Ok(flat) => Some(flat.into_iter().skip(1).step_by(2).collect()),
        Err(e) => {
            tracing::debug!(error = %e, course, "state hash read failed");
            None
        }
    }
}

/// A `Source` on classic Redis pub/sub.
pub struct RedisSource {
    redis: Arc<Redis>,
    link: Commands,
    /// Index into the candidate nodes of the one used now.
    node: usize,
    channel_prefix: String,
    pattern: String,
    state_prefix: String,
    sub: Option<Sub>,
    /// Per-course subscriptions wanted; always empty while the firehose is on.
    courses: BTreeSet<String>,
    firehose: bool,
    pending: VecDeque<SourceEvent>,
    backoff: Backoff,
    ever_connected: bool,
}

impl RedisSource {
    /// A source on `redis` with these prefixes; connects at once but an
    /// unreachable Redis is not an error (it keeps retrying).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str, state_prefix: &str) -> Self {
        let mut s = RedisSource {
            redis: Arc::clone(redis),
            link: Commands::new(redis, "state reads"),
            node: 0,
            channel_prefix: channel_prefix.to_owned(),
            pattern: format!("{}*", glob_escape(channel_prefix)),
            state_prefix: state_prefix.to_owned(),
            sub: None,
            courses: BTreeSet::new(),
            firehose: false,
            pending: VecDeque::new(),
            backoff: Backoff::capped(RECONNECT_CAP),
            ever_connected: false,
        };
        if !s.connect() {
            tracing::warn!("Redis unreachable at start; serving degraded and retrying");
        }
        s
    }

    fn channel(&self, course: &str) -> String {
        format!("{}{course}", self.channel_prefix)
    }

    fn drop_sub(&mut self, why: &str) {
        if let Some(s) = self.sub.take() {
            tracing::warn!(reason = why, node = %format!("{}:{}", s.conn.addr.0, s.conn.addr.1), "Redis pub/sub connection lost; reconnecting");
        }
        // Next attempt on the next node (a cluster in classic mode: any node
        // hears every PUBLISH; standalone: the same one again).
        self.node = self.node.wrapping_add(1);
        if self.redis.mode() == Some(Mode::Cluster) {
            let _ = self.link.slot_map();
        }
        self.backoff.failed();
    }

    /// Connects, authenticates and restores every current subscription; on
    /// success queues `Reconnected` so the router rereads the state hashes.
    fn connect(&mut self) -> bool {
        let nodes = self.redis.candidates();
        let Some(addr) = nodes.get(self.node % nodes.len().max(1)).cloned() else {
            return false;
        };
        let conn = match PubConn::open(&self.redis, &addr, MAX_PAYLOAD) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, node = %format!("{}:{}", addr.0, addr.1), "Redis pub/sub connect failed");
                self.node = self.node.wrapping_add(1);
                self.backoff.failed();
                return false;
            }
        };
        self.sub = Some(Sub {
            conn,
            pattern: false,
        });
        let ok = if self.firehose {
            let cmd = packed("PSUBSCRIBE", [self.pattern.as_str()]);
            let ok = self.send(&cmd) && self.await_reply(b"psubscribe", 1);
            if let Some(s) = &mut self.sub {
                s.pattern = ok;
            }
            ok
        } else {
            let channels: Vec<String> = self.courses.iter().map(|c| self.channel(c)).collect();
            channels.chunks(SUBSCRIBE_BATCH).all(|batch| {
                let cmd = packed("SUBSCRIBE", batch);
                self.send(&cmd) && self.await_reply(b"subscribe", batch.len())
            })
        };
        if !ok {
            self.drop_sub("resubscribe failed");
            return false;
        }
        self.backoff.reset();
        if self.ever_connected || self.firehose || !self.courses.is_empty() {
            tracing::info!(
                courses = self.courses.len(),
                firehose = self.firehose,
                "Redis pub/sub connected; subscriptions restored"
            );
            // The rereads that follow go at once, not after the state
            // client's own backoff from the outage.
            self.link.retry_now();
            self.pending.push_back(SourceEvent::Reconnected);
        }
        self.ever_connected = true;
        true
    }

    fn send(&mut self, bytes: &[u8]) -> bool {
        let Some(sub) = &mut self.sub else {
            return false;
        };
        match sub.conn.send(bytes) {
            Ok(()) => true,
            Err(e) => {
                self.drop_sub(&format!("write: {e}"));
                false
            }
        }
    }

    /// Reads (bounded by `timeout`) into the buffer; false if the connection died.
    fn fill(&mut self, timeout: Duration) -> bool {
        let Some(sub) = &mut self.sub else {
            return false;
        };
        match sub.conn.fill(timeout) {
            Ok(Fill::Closed) => {
                self.drop_sub("closed by Redis");
                false
            }
            Ok(_) => true,
            Err(e) => {
                self.drop_sub(&format!("read: {e}"));
                false
            }
        }
    }

    /// The next frame already buffered; `Err` when the stream is corrupt.
    fn buffered_frame(&mut self) -> Result<Option<Frame>, ()> {
        let Some(sub) = &mut self.sub else {
            return Err(());
        };
        match sub.conn.next_frame() {
            Ok(Some(items)) => Ok(Some(classify(items))),
            Ok(None) => Ok(None),
            Err(e) => {
                self.drop_sub(&format!("protocol: {e}"));
                Err(())
            }
        }
    }

    fn message(&self, channel: Vec<u8>, payload: Item) -> Option<SourceEvent> {
        message_event(&self.channel_prefix, channel, payload)
    }

    /// Waits for `n` replies of `kind` (an empty kind: any non-error simple
    /// reply), queueing messages that arrive meanwhile.
    fn await_reply(&mut self, kind: &[u8], mut n: usize) -> bool {
        let deadline = Instant::now() + CONFIRM_TIMEOUT;
        while n > 0 {
            match self.buffered_frame() {
                Err(()) => return false,
                Ok(Some(Frame::Message { channel, payload })) => {
                    if let Some(ev) = self.message(channel, payload) {
                        self.pending.push_back(ev);
                    }
                    continue;
                }
                Ok(Some(Frame::Confirm(k, _))) if k == kind => {
                    n -= 1;
                    continue;
                }
                Ok(Some(Frame::Error(e))) => {
                    tracing::error!(error = %e, "Redis refused a pub/sub command");
                    return false;
                }
                Ok(Some(Frame::Other)) if kind.is_empty() => {
                    n -= 1;
                    continue;
                }
                Ok(Some(_)) => continue,
                Ok(None) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                self.drop_sub("no confirmation from Redis");
                return false;
            }
            if !self.fill(deadline - now) {
                return false;
            }
        }
        true
    }

    /// Pings a silent connection and gives up on one that stays silent.
    fn keepalive(&mut self) {
        let Some(sub) = &mut self.sub else { return };
        if let Err(e) = sub.conn.keepalive(PING_AFTER, PING_DEADLINE) {
            self.drop_sub(&e.to_string());
        }
    }
}

impl Source for RedisSource {
    fn poll(&mut self, timeout: Duration) -> Option<SourceEvent> {
        if let Some(ev) = self.pending.pop_front() {
            return Some(ev);
        }
        if self.sub.is_none() {
            if !self.backoff.ready() {
                std::thread::sleep(timeout);
                return None;
            }
            self.connect();
            return self.pending.pop_front();
        }
        // The last admin left: per-course subscriptions were restored (by the
        // router, right after `set_firehose(false)`), so the pattern can go
        // without a gap in between.
        if !self.firehose && self.sub.as_ref().is_some_and(|s| s.pattern) {
            let cmd = packed("PUNSUBSCRIBE", [self.pattern.as_str()]);
            if self.send(&cmd) {
                if let Some(s) = &mut self.sub {
                    s.pattern = false;
                }
            }
        }
        self.keepalive();
        let deadline = Instant::now() + timeout;
        loop {
            match self.buffered_frame() {
                Err(()) => return None,
                Ok(Some(Frame::Message { channel, payload })) => {
                    if let Some(ev) = self.message(channel, payload) {
                        return Some(ev);
                    }
                    continue;
                }
                Ok(Some(Frame::Error(e))) => {
                    tracing::warn!(error = %e, "Redis error on the pub/sub connection");
                    continue;
                }
                Ok(Some(_)) => continue,
                Ok(None) => {}
            }
            let now = Instant::now();
            // A zero timeout only drains what is already buffered.
            if now >= deadline || !self.fill(deadline - now) {
                return None;
            }
            if self.sub.as_mut().is_some_and(|s| !s.conn.buffered()) {
                return None;
            }
        }
    }

    fn subscribe(&mut self, course: &str) {
        // While the pattern is held no per-course subscription exists.
        if self.firehose || !self.courses.insert(course.to_owned()) {
            return;
        }
        let cmd = packed("SUBSCRIBE", [self.channel(course)]);
        // Confirmed before returning: the state hash read that follows cannot
        // miss a publish.
        if self.send(&cmd) {
            self.await_reply(b"subscribe", 1);
        }
    }

    fn unsubscribe(&mut self, course: &str) {
        if self.courses.remove(course) {
            let cmd = packed("UNSUBSCRIBE", [self.channel(course)]);
            self.send(&cmd);
        }
    }

    fn set_firehose(&mut self, on: bool) {
        if on == self.firehose {
            return;
        }
        self.firehose = on;
        if !on {
            // PUNSUBSCRIBE waits for the next poll (see there).
            return;
        }
        if self.sub.as_ref().is_some_and(|s| !s.pattern) {
            let cmd = packed("PSUBSCRIBE", [self.pattern.as_str()]);
            if self.send(&cmd) {
                if let Some(s) = &mut self.sub {
                    s.pattern = true;
                }
            }
        }
        // The pattern covers every course: drop the per-course subscriptions
        // (after the PSUBSCRIBE on the same connection, so nothing falls between).
        let channels: Vec<String> = self.courses.iter().map(|c| self.channel(c)).collect();
        self.courses.clear();
        for batch in channels.chunks(SUBSCRIBE_BATCH) {
            let cmd = packed("UNSUBSCRIBE", batch);
            self.send(&cmd);
        }
    }

    fn load_state(&mut self, course: &str) -> Option<Vec<Vec<u8>>> {
        read_state(&mut self.link, &self.state_prefix, course)
    }

    fn known_courses(&mut self) -> Vec<String> {
        super::scan::state_courses(&mut self.link, &self.state_prefix)
    }

    fn load_states(&mut self, courses: &[&str]) -> Option<Vec<Vec<Vec<u8>>>> {
        super::scan::read_states(&mut self.link, &self.state_prefix, courses)
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        if !self.pending.is_empty() {
            return Some(Duration::ZERO);
        }
        let firehose = self.firehose;
        let Some(sub) = self.sub.as_mut() else {
            return Some(self.backoff.wait());
        };
        // A pattern to drop, or bytes already read: the next poll has work.
        if (!firehose && sub.pattern) || sub.conn.buffered() {
            return Some(Duration::ZERO);
        }
        Some(sub.conn.keepalive_due(PING_AFTER, PING_DEADLINE))
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.extend(self.sub.as_ref().map(|s| s.conn.fd()));
    }

    fn connected(&self) -> bool {
        self.sub.is_some()
    }
}
