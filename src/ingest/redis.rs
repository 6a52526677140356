//! The Redis `Source` of `serve`: one pub/sub connection owned by the ingest
//! thread (SUBSCRIBE per watched course, or PSUBSCRIBE `<prefix>*` while admins
//! watch), plus a command connection for the state hashes. Redis going away is
//! routine: the source reports itself disconnected, reconnects with jittered
//! backoff capped at 2 s, restores exactly the subscriptions it should hold and
//! tells the router to reseed.

use super::resp::{Item, Reader};
use super::source::{Source, SourceEvent};
use crate::redis_link::{glob_escape, Backoff, Link, CONNECT_TIMEOUT, IO_TIMEOUT};
use shards::snapshot::MAX_PAYLOAD;
use std::collections::{BTreeSet, VecDeque};
use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Silence on the pub/sub connection after which a PING checks it is alive.
const PING_AFTER: Duration = Duration::from_secs(5);
/// How long a PING may go unanswered before the connection counts as dead.
const PING_DEADLINE: Duration = Duration::from_secs(3);
/// How long a (P)SUBSCRIBE confirmation may take.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
/// Channels per SUBSCRIBE command when resubscribing many.
const SUBSCRIBE_BATCH: usize = 512;

/// The live pub/sub connection.
struct Sub {
    stream: TcpStream,
    reader: Reader,
    read_timeout: Option<Duration>,
    last_rx: Instant,
    ping_sent: Option<Instant>,
    /// Whether this connection holds the pattern subscription.
    pattern: bool,
}

/// What one pub/sub frame is.
enum Frame {
    Message { channel: Vec<u8>, payload: Item },
    Confirm(Vec<u8>),
    Error(String),
    Other,
}

fn classify(items: Vec<Item>) -> Frame {
    let mut it = items.into_iter();
    let kind = match it.next() {
        Some(Item::Bulk(k)) => k,
        Some(Item::Error(e)) => return Frame::Error(String::from_utf8_lossy(&e).into_owned()),
        _ => return Frame::Other,
    };
    match kind.as_slice() {
        b"message" => match (it.next(), it.next()) {
            (Some(Item::Bulk(channel)), Some(payload)) => Frame::Message { channel, payload },
            _ => Frame::Other,
        },
        // The actual channel, not the pattern, names the course.
        b"pmessage" => match (it.next(), it.next(), it.next()) {
            (Some(_pattern), Some(Item::Bulk(channel)), Some(payload)) => {
                Frame::Message { channel, payload }
            }
            _ => Frame::Other,
        },
        b"subscribe" | b"unsubscribe" | b"psubscribe" | b"punsubscribe" => Frame::Confirm(kind),
        _ => Frame::Other,
    }
}

fn packed(cmd: &str, args: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Vec<u8> {
    let mut c = ::redis::cmd(cmd);
    for a in args {
        c.arg(a.as_ref());
    }
    c.get_packed_command()
}

/// A `Source` on Redis pub/sub.
pub struct RedisSource {
    link: Link,
    host: String,
    port: u16,
    auth: Option<(Option<String>, String)>,
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
    /// A source on `uri` with these prefixes; connects at once but an
    /// unreachable Redis is not an error (it keeps retrying). Fails only on a
    /// URI it cannot use.
    pub fn new(uri: &str, channel_prefix: &str, state_prefix: &str) -> Result<Self, String> {
        let link = Link::new(uri, "state reads")?;
        let info = link.client().get_connection_info();
        let (host, port) = match info.addr() {
            ::redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
            other => {
                return Err(format!(
                    "unsupported Redis address {other:?} (use redis://)"
                ))
            }
        };
        let r = info.redis_settings();
        let auth = r
            .password()
            .map(|p| (r.username().map(str::to_owned), p.to_owned()));
        let mut s = RedisSource {
            link,
            host,
            port,
            auth,
            channel_prefix: channel_prefix.to_owned(),
            pattern: format!("{}*", glob_escape(channel_prefix)),
            state_prefix: state_prefix.to_owned(),
            sub: None,
            courses: BTreeSet::new(),
            firehose: false,
            pending: VecDeque::new(),
            backoff: Backoff::default(),
            ever_connected: false,
        };
        if !s.connect() {
            tracing::warn!(
                redis = uri,
                "Redis unreachable at start; serving degraded and retrying"
            );
        }
        Ok(s)
    }

    fn channel(&self, course: &str) -> String {
        format!("{}{course}", self.channel_prefix)
    }

    fn drop_sub(&mut self, why: &str) {
        if self.sub.take().is_some() {
            tracing::warn!(reason = why, "Redis pub/sub connection lost; reconnecting");
        }
        self.backoff.failed();
    }

    fn open_stream(&self) -> io::Result<TcpStream> {
        let mut last = io::Error::other("no address");
        for addr in (self.host.as_str(), self.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_write_timeout(Some(IO_TIMEOUT))?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Connects, authenticates and restores every current subscription; on
    /// success queues `Reconnected` so the router rereads the state hashes.
    fn connect(&mut self) -> bool {
        let stream = match self.open_stream() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "Redis pub/sub connect failed");
                self.backoff.failed();
                return false;
            }
        };
        self.sub = Some(Sub {
            stream,
            reader: Reader::new(MAX_PAYLOAD),
            read_timeout: None,
            last_rx: Instant::now(),
            ping_sent: None,
            pattern: false,
        });
        if let Some((user, pass)) = self.auth.clone() {
            let cmd = match &user {
                Some(u) => packed("AUTH", [u.as_str(), pass.as_str()]),
                None => packed("AUTH", [pass.as_str()]),
            };
            if !self.send(&cmd) || !self.await_reply(b"", 1) {
                self.drop_sub("AUTH failed");
                return false;
            }
        }
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
            self.pending.push_back(SourceEvent::Reconnected);
        }
        self.ever_connected = true;
        true
    }

    fn send(&mut self, bytes: &[u8]) -> bool {
        let Some(sub) = &mut self.sub else {
            return false;
        };
        match sub.stream.write_all(bytes) {
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
        let t = Some(timeout.max(Duration::from_millis(1)));
        if sub.read_timeout != t {
            if let Err(e) = sub.stream.set_read_timeout(t) {
                self.drop_sub(&format!("set timeout: {e}"));
                return false;
            }
            sub.read_timeout = t;
        }
        match sub.reader.read_from(&mut sub.stream) {
            Ok(0) => {
                self.drop_sub("closed by Redis");
                false
            }
            Ok(_) => {
                sub.last_rx = Instant::now();
                sub.ping_sent = None;
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
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
        match sub.reader.next_frame() {
            Ok(Some(items)) => Ok(Some(classify(items))),
            Ok(None) => Ok(None),
            Err(e) => {
                self.drop_sub(&format!("protocol: {e}"));
                Err(())
            }
        }
    }

    fn message(&self, channel: Vec<u8>, payload: Item) -> Option<SourceEvent> {
        let course = channel.strip_prefix(self.channel_prefix.as_bytes())?;
        let course = String::from_utf8_lossy(course).into_owned();
        let payload = match payload {
            Item::Bulk(p) => p,
            // Skipped unread; a payload just over the limit makes the parser
            // count it as `too_large` like any other oversized snapshot.
            Item::Oversize(_) => vec![b' '; MAX_PAYLOAD + 1],
            _ => Vec::new(),
        };
        Some(SourceEvent::Message { course, payload })
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
                Ok(Some(Frame::Confirm(k))) if k == kind => {
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
        match sub.ping_sent {
            Some(t) if t.elapsed() > PING_DEADLINE => self.drop_sub("PING unanswered"),
            Some(_) => {}
            None if sub.last_rx.elapsed() > PING_AFTER => {
                sub.ping_sent = Some(Instant::now());
                self.send(b"*1\r\n$4\r\nPING\r\n");
            }
            None => {}
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
            if self.sub.as_ref().is_some_and(|s| s.reader.buffered() == 0) {
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
        let key = format!("{}{course}", self.state_prefix);
        let r = self
            .link
            .run(|c| ::redis::cmd("HGETALL").arg(&key).query::<Vec<Vec<u8>>>(c));
        match r {
            Ok(flat) => Some(flat.into_iter().skip(1).step_by(2).collect()),
            Err(e) => {
                tracing::debug!(error = %e, course, "state hash read failed");
                None
            }
        }
    }

    fn connected(&self) -> bool {
        self.sub.is_some()
    }
}
