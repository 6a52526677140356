//! Classic placement: one pub/sub connection to one node (SUBSCRIBE per
//! watched course, or PSUBSCRIBE `<prefix>*` while admins watch). Used for a
//! standalone Redis and for `--pubsub classic` in a cluster (any one node
//! hears every PUBLISH there; on failure it moves to another node). Nothing
//! here waits on Redis: connections are opened by the source's [`Dialer`],
//! the (un)subscriptions of one turn of the ingest loop are written as one
//! command at its end
//! ([`Source::flush`]), and each confirmation comes back as
//! [`SourceEvent::Subscribed`]. Redis going away is routine: the source
//! reports itself disconnected, reconnects with jittered backoff capped at
//! 2 s, restores exactly the subscriptions it should hold and tells the
//! router to reseed as they are confirmed.

use super::classic_subs::ClassicSubs;
use super::conn::{classify, packed, Fill, Frame, PubConn};
use super::dialer::{Dialed, Dialer};
use super::resp::Item;
use super::source::{Source, SourceEvent};
use crate::redis::backoff::Backoff;
use crate::redis::{glob_escape, Mode, Redis};
use crate::slots::Addr;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// Silence on the pub/sub connection after which a PING checks it is alive.
pub const PING_AFTER: Duration = Duration::from_secs(5);
/// How long a PING may go unanswered before the connection counts as dead.
pub const PING_DEADLINE: Duration = Duration::from_secs(3);
/// The longest wait between reconnect attempts of the pub/sub connection
/// (under the contract's 2 s cap): a Redis that answers again after a freeze
/// or a partition is found within it.
pub const RECONNECT_CAP: Duration = Duration::from_millis(500);
/// Channels per (UN)SUBSCRIBE command when many go at once.
pub const SUBSCRIBE_BATCH: usize = 512;

/// The live pub/sub connection (what it holds is in [`ClassicSubs`]).
struct Sub {
    conn: PubConn,
    /// Redis answered on it: a connection to a frozen Redis (which the
    /// kernel still accepts) does not count as connected.
    alive: bool,
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

/// (UN)SUBSCRIBE commands for `channels`, [`SUBSCRIBE_BATCH`] channels each.
pub fn batched(cmd: &str, channels: &[String], out: &mut Vec<u8>) {
    for batch in channels.chunks(SUBSCRIBE_BATCH) {
        out.extend(packed(cmd, batch));
    }
}

/// A `Source` on classic Redis pub/sub.
pub struct Classic {
    redis: Arc<Redis>,
    /// Opens connections and reads the slot map of a cluster in classic mode
    /// (which node to use next) off the ingest thread.
    dialer: Dialer,
    /// Index into the candidate nodes of the one used now.
    node: usize,
    channel_prefix: String,
    pattern: String,
    sub: Option<Sub>,
    /// The subscriptions wanted, this turn's writes, and what the live
    /// connection holds.
    subs: ClassicSubs,
    pending: VecDeque<SourceEvent>,
    backoff: Backoff,
    ever_connected: bool,
    /// A dial failed before the first connection: Redis is down, not on its way.
    failed_at_start: bool,
}

impl Classic {
    /// A source on `redis` with this channel prefix; starts connecting at
    /// once but an unreachable Redis is not an error (it keeps retrying).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str, dialer: Dialer) -> Self {
        let mut s = Classic {
            redis: Arc::clone(redis),
            dialer,
            node: 0,
            channel_prefix: channel_prefix.to_owned(),
            pattern: format!("{}*", glob_escape(channel_prefix)),
            sub: None,
            subs: ClassicSubs::default(),
            pending: VecDeque::new(),
            backoff: Backoff::capped(RECONNECT_CAP),
            ever_connected: false,
            failed_at_start: false,
        };
        s.connect();
        s
    }

    fn channel(&self, course: &str) -> String {
        format!("{}{course}", self.channel_prefix)
    }

    fn drop_sub(&mut self, why: &str) {
        if let Some(s) = self.sub.take() {
            tracing::warn!(reason = why, node = %format!("{}:{}", s.conn.addr.0, s.conn.addr.1), "Redis pub/sub connection lost; reconnecting");
        }
        self.subs.dropped();
        // Next attempt on the next node (a cluster in classic mode: any node
        // hears every PUBLISH; standalone: the same one again).
        self.node = self.node.wrapping_add(1);
        if self.redis.mode() == Some(Mode::Cluster) {
            let _ = self.dialer.read_map();
        }
        self.backoff.failed();
    }

    /// Asks the dialer for a connection to the next node (after the slot map
    /// it may have been asked for: one job at a time, in order).
    fn connect(&mut self) {
        let nodes = self.redis.candidates();
        if let Some(addr) = nodes.get(self.node % nodes.len().max(1)) {
            self.dialer.dial(addr, Duration::ZERO);
        }
    }

    /// Takes the dialer's answers: a connection (or why not); a slot map
    /// (already learned by the deployment, which is all a classic source needs).
    fn answers(&mut self) {
        while let Some(a) = self.dialer.answer() {
            if let Dialed::Conn(addr, conn) = a {
                self.dialed(&addr, conn);
            }
        }
    }

    /// A connection came, or did not: on one, writes every current
    /// subscription (their confirmations come later); the router rereads each
    /// course once it is confirmed again (`answered`).
    fn dialed(&mut self, addr: &Addr, conn: std::io::Result<PubConn>) {
        let conn = match conn {
            Ok(c) if self.sub.is_none() => c,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, node = %format!("{}:{}", addr.0, addr.1), "Redis pub/sub connect failed");
                if !self.ever_connected && !std::mem::replace(&mut self.failed_at_start, true) {
                    tracing::warn!("Redis unreachable at start; serving degraded and retrying");
                }
                self.node = self.node.wrapping_add(1);
                self.backoff.failed();
                return;
            }
        };
        self.sub = Some(Sub { conn, alive: false });
        self.subs.connected();
        self.write_pending();
        // A PING after the subscriptions: the first answer proves the
        // connection alive, and none within PING_DEADLINE gives it up.
        if let Some(Err(e)) = self.sub.as_mut().map(|sub| sub.conn.ping()) {
            self.drop_sub(&format!("write: {e}"));
        }
    }

    /// Redis answered on a fresh connection for the first time: now it counts
    /// as a reconnect (the router rereads every course as it is confirmed).
    fn answered(&mut self) -> Option<SourceEvent> {
        self.backoff.reset();
        let first = !self.ever_connected;
        self.ever_connected = true;
        if first && !self.subs.firehose() && self.subs.courses() == 0 {
            return None;
        }
        tracing::info!(
            courses = self.subs.courses(),
            firehose = self.subs.firehose(),
            "Redis pub/sub connected; subscriptions restored"
        );
        Some(SourceEvent::Reconnected)
    }

    /// Writes this turn's (un)subscriptions as a few commands, in the order
    /// [`ClassicSubs::take_writes`] gives them.
    fn write_pending(&mut self) {
        let w = self.subs.take_writes();
        let sub_channels: Vec<String> = w.subscribe.iter().map(|c| self.channel(c)).collect();
        let unsub_channels: Vec<String> = w.unsubscribe.iter().map(|c| self.channel(c)).collect();
        let Some(sub) = &mut self.sub else {
            return;
        };
        let mut out = Vec::new();
        if w.psubscribe {
            out.extend(packed("PSUBSCRIBE", [self.pattern.as_str()]));
        }
        batched("SUBSCRIBE", &sub_channels, &mut out);
        batched("UNSUBSCRIBE", &unsub_channels, &mut out);
        if w.punsubscribe {
            out.extend(packed("PUNSUBSCRIBE", [self.pattern.as_str()]));
        }
        if out.is_empty() {
            return;
        }
        if let Err(e) = sub.conn.send(&out) {
            self.drop_sub(&format!("write: {e}"));
        }
    }

    /// Reads what a readable socket holds into the buffer; false if nothing
    /// came (not readable, or the connection died).
    fn fill(&mut self) -> bool {
        let Some(sub) = &mut self.sub else {
            return false;
        };
        match sub.conn.fill_ready() {
            Ok(Fill::Closed) => {
                self.drop_sub("closed by Redis");
                false
            }
            Ok(f) => f == Fill::Data,
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
            Ok(Some(items)) => {
                if !sub.alive {
                    sub.alive = true;
                    // Reported before this frame's own event.
                    if let Some(ev) = self.answered() {
                        self.pending.push_back(ev);
                    }
                }
                Ok(Some(classify(items)))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.drop_sub(&format!("protocol: {e}"));
                Err(())
            }
        }
    }

    /// A frame as the router's event, if it is one.
    fn frame_event(&mut self, f: Frame) -> Option<SourceEvent> {
        match f {
            Frame::Message { channel, payload } => {
                message_event(&self.channel_prefix, channel, payload)
            }
            Frame::Confirm(kind, channel) => self.confirmed(&kind, &channel),
            Frame::Error(e) => {
                tracing::error!(error = %e, "Redis refused a pub/sub command");
                None
            }
            Frame::Other => None,
        }
    }

    /// A (P)SUBSCRIBE confirmation: the course (or every course) may be read now.
    fn confirmed(&mut self, kind: &[u8], channel: &[u8]) -> Option<SourceEvent> {
        self.sub.as_ref()?;
        match kind {
            b"psubscribe" => self.subs.pattern_confirmed(),
            b"subscribe" => {
                let course = std::str::from_utf8(channel)
                    .ok()?
                    .strip_prefix(self.channel_prefix.as_str())?;
                self.subs.course_confirmed(course)
            }
            _ => None,
        }
    }

    /// Pings a silent connection and gives up on one that stays silent.
    fn keepalive(&mut self) {
        let Some(sub) = &mut self.sub else { return };
        if let Err(e) = sub.conn.keepalive(PING_AFTER, PING_DEADLINE) {
            self.drop_sub(&e.to_string());
        }
    }
}

impl Source for Classic {
    fn poll(&mut self) -> Option<SourceEvent> {
        if let Some(ev) = self.pending.pop_front() {
            return Some(ev);
        }
        self.answers();
        if self.sub.is_none() {
            // The owner sleeps until the backoff ends or the dialer answers.
            if self.backoff.ready() && !self.dialer.busy() {
                self.connect();
            }
            return self.pending.pop_front();
        }
        self.keepalive();
        loop {
            match self.buffered_frame() {
                Err(()) => return None,
                Ok(Some(f)) => {
                    if let Some(ev) = self.frame_event(f) {
                        self.pending.push_back(ev);
                    }
                    match self.pending.pop_front() {
                        Some(ev) => return Some(ev),
                        None => continue,
                    }
                }
                Ok(None) => {}
            }
            if !self.fill() {
                return self.pending.pop_front();
            }
        }
    }

    fn subscribe(&mut self, course: &str) {
        self.subs.subscribe(course);
    }

    fn unsubscribe(&mut self, course: &str) {
        self.subs.unsubscribe(course);
    }

    fn topology(&mut self, _moved: Option<&crate::slots::SlotMap>, down: &[Addr]) {
        if self
            .sub
            .as_ref()
            .is_some_and(|s| down.contains(&s.conn.addr))
        {
            self.drop_sub("its node stopped answering the probe");
        }
    }

    fn set_firehose(&mut self, on: bool) {
        self.subs.set_firehose(on);
    }

    fn flush(&mut self) {
        // Without a connection the writes are dropped: a new one writes everything.
        if self.subs.due() {
            self.write_pending();
        }
    }

    fn subscribed(&self, course: &str) -> bool {
        self.sub.is_some() && self.subs.subscribed(course)
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        if !self.pending.is_empty() {
            return Some(Duration::ZERO);
        }
        let Some(sub) = self.sub.as_mut() else {
            // A dial on its way wakes the thread through the dialer's eventfd.
            return (!self.dialer.busy()).then(|| self.backoff.wait());
        };
        if sub.conn.buffered() {
            return Some(Duration::ZERO);
        }
        Some(sub.conn.keepalive_due(PING_AFTER, PING_DEADLINE))
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.extend(self.sub.as_ref().map(|s| s.conn.fd()));
        fds.extend(self.dialer.wait_fd());
    }

    fn connected(&self) -> bool {
        self.sub.as_ref().is_some_and(|s| s.alive)
    }

    fn connecting(&self) -> bool {
        !self.ever_connected && !self.failed_at_start
    }
}
