//! A raw Redis connection (TCP, or TLS over rustls) with AUTH done, read by
//! the bounded streaming RESP reader (`resp.rs`): what the pub/sub source
//! runs on, many of them polled from one thread without blocking.

use super::resp::{Item, Reader};
use crate::redis::{Redis, CONNECT_TIMEOUT, IO_TIMEOUT};
use crate::slots::Addr;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// A TCP or TLS byte stream.
pub enum Stream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS (rustls) over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// Decrypted bytes already held by TLS that a poll on the socket would not show.
    pub fn tls_pending(&mut self) -> bool {
        match self {
            Stream::Tcp(_) => false,
            Stream::Tls(s) => s
                .conn
                .process_new_packets()
                .is_ok_and(|st| st.plaintext_bytes_to_read() > 0),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A plain socket read as one `recv(2)` that does not wait (`WouldBlock`
/// when nothing is there): no readiness check before it.
struct DontWait<'a>(&'a TcpStream);

impl Read for DontWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        crate::sys::recv_now(self.0.as_raw_fd(), buf)
    }
}

/// The RESP encoding of one command.
pub fn packed(cmd: &str, args: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Vec<u8> {
    let mut c = ::redis::cmd(cmd);
    for a in args {
        c.arg(a.as_ref());
    }
    c.get_packed_command()
}

/// A connected, authenticated stream with its bounded RESP reader.
pub struct PubConn {
    /// The node it is connected to.
    pub addr: Addr,
    stream: Stream,
    reader: Reader,
    read_timeout: Option<Duration>,
    /// Bytes came since a read last found nothing ready: a whole frame may be
    /// buffered.
    unread: bool,
    /// Last time anything arrived.
    pub last_rx: Instant,
    /// When a keepalive PING went out unanswered.
    pub ping_sent: Option<Instant>,
}

impl PubConn {
    /// Connects to `addr` (TLS if configured), then AUTHs if the URI carries
    /// credentials. Bulk strings over `cap` bytes are skipped as they stream in.
    pub fn open(redis: &Redis, addr: &Addr, cap: usize) -> io::Result<PubConn> {
        let mut last = io::Error::other("no address");
        let mut tcp = None;
        for a in (addr.0.as_str(), addr.1).to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = tcp.ok_or(last)?;
        tcp.set_nodelay(true)?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))?;
        let stream = match redis.tls() {
            None => Stream::Tcp(tcp),
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::try_from(addr.0.clone())
                    .map_err(io::Error::other)?;
                let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
                let mut s = rustls::StreamOwned::new(conn, tcp);
                s.sock.set_read_timeout(Some(CONNECT_TIMEOUT))?;
                while s.conn.is_handshaking() {
                    s.conn.complete_io(&mut s.sock)?;
                }
                Stream::Tls(Box::new(s))
            }
        };
        let mut c = PubConn {
            addr: addr.clone(),
            stream,
            reader: Reader::new(cap),
            read_timeout: None,
            unread: true,
            last_rx: Instant::now(),
            ping_sent: None,
        };
        if let Some((user, pass)) = redis.auth() {
            let cmd = match &user {
                Some(u) => packed("AUTH", [u.as_str(), pass.as_str()]),
                None => packed("AUTH", [pass.as_str()]),
            };
            c.send(&cmd)?;
            match c.reply(CONNECT_TIMEOUT)? {
                Some(Item::Error(e)) => {
                    return Err(io::Error::other(format!(
                        "AUTH refused: {}",
                        String::from_utf8_lossy(&e)
                    )))
                }
                Some(_) => {}
                None => return Err(io::Error::other("AUTH unanswered")),
            }
        }
        Ok(c)
    }

    /// Waits (up to `timeout`) for one single-element reply.
    fn reply(&mut self, timeout: Duration) -> io::Result<Option<Item>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(mut f) = self.next_frame()? {
                return Ok(f.pop());
            }
            let now = Instant::now();
            if now >= end {
                return Ok(None);
            }
            if self.fill(end - now)? == Fill::Closed {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Writes a whole command.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Reads what arrives within `timeout` into the buffer.
    pub fn fill(&mut self, timeout: Duration) -> io::Result<Fill> {
        let t = Some(timeout.max(Duration::from_millis(1)));
        if self.read_timeout != t {
            self.stream.tcp().set_read_timeout(t)?;
            self.read_timeout = t;
        }
        let read = self.reader.read_from(&mut self.stream);
        self.took(read)
    }

    /// What one read brought, as a [`Fill`].
    fn took(&mut self, read: io::Result<usize>) -> io::Result<Fill> {
        match read {
            Ok(0) => Ok(Fill::Closed),
            Ok(_) => {
                self.last_rx = Instant::now();
                self.ping_sent = None;
                self.unread = true;
                Ok(Fill::Data)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(Fill::Nothing)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads what is there without waiting for more: bytes TLS holds
    /// decrypted, or what a readable socket has ([`Fill::Nothing`] otherwise).
    pub fn fill_ready(&mut self) -> io::Result<Fill> {
        let fill = match &self.stream {
            // One recv(2) that does not wait.
            Stream::Tcp(s) => {
                let read = self.reader.read_from(&mut DontWait(s));
                self.took(read)?
            }
            // TLS reads through rustls, which may hold decrypted bytes: read
            // only when it does or the socket is readable.
            Stream::Tls(_) => {
                let readable = self.stream.tls_pending()
                    || crate::channels::poll::wait_readable(&[self.fd()], Duration::ZERO)
                        .first()
                        .copied()
                        .unwrap_or(false);
                if readable {
                    self.fill(Duration::from_millis(1))?
                } else {
                    Fill::Nothing
                }
            }
        };
        if fill == Fill::Nothing {
            self.unread = false;
        }
        Ok(fill)
    }

    /// The next complete frame already buffered.
    pub fn next_frame(&mut self) -> io::Result<Option<Vec<Item>>> {
        self.reader
            .next_frame()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Whether a frame may be buffered (or held decrypted by TLS): bytes
    /// came since [`PubConn::fill_ready`] last found nothing to read, which
    /// its callers ask only once every whole frame is taken (a part of one
    /// waits for the socket).
    pub fn buffered(&mut self) -> bool {
        self.unread || self.stream.tls_pending()
    }

    /// Pings a silent connection; an error when a ping went unanswered too long.
    pub fn keepalive(&mut self, after: Duration, deadline: Duration) -> io::Result<()> {
        if !self.keepalive_due(after, deadline).is_zero() {
            return Ok(());
        }
        match self.ping_sent {
            Some(_) => Err(io::Error::other("PING unanswered")),
            None => self.ping(),
        }
    }

    /// Sends a PING now; any answer clears it, none within the keepalive
    /// deadline gives the connection up.
    pub fn ping(&mut self) -> io::Result<()> {
        self.ping_sent = Some(Instant::now());
        self.send(b"*1\r\n$4\r\nPING\r\n")
    }

    /// How long until [`PubConn::keepalive`] has something to do, so a
    /// sleeping reader wakes for it and not before.
    pub fn keepalive_due(&self, after: Duration, deadline: Duration) -> Duration {
        keepalive_in(
            self.last_rx,
            self.ping_sent,
            Instant::now(),
            after,
            deadline,
        )
    }

    /// The socket, for polling several connections at once.
    pub fn fd(&self) -> RawFd {
        self.stream.tcp().as_raw_fd()
    }
}

/// Time left at `now` before a connection silent since `last_rx` is pinged
/// (`after`), or, with a PING unanswered since `ping_sent`, given up (`deadline`).
fn keepalive_in(
    last_rx: Instant,
    ping_sent: Option<Instant>,
    now: Instant,
    after: Duration,
    deadline: Duration,
) -> Duration {
    match ping_sent {
        Some(t) => (t + deadline).saturating_duration_since(now),
        None => (last_rx + after).saturating_duration_since(now),
    }
}

/// What one read brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    /// Bytes arrived.
    Data,
    /// The timeout passed.
    Nothing,
    /// The peer closed the connection.
    Closed,
}

/// What one pub/sub frame is.
#[derive(Debug)]
pub enum Frame {
    /// A published message (`message`, `pmessage`, `smessage`).
    Message {
        /// The channel it was published on (not the pattern).
        channel: Vec<u8>,
        /// The payload (or its length when over the cap).
        payload: Item,
    },
    /// A (un)subscribe confirmation of this kind, for this channel.
    Confirm(Vec<u8>, Vec<u8>),
    /// An error reply.
    Error(String),
    /// Anything else (a PONG, an AUTH reply).
    Other,
}

/// Classifies one pub/sub frame.
pub fn classify(items: Vec<Item>) -> Frame {
    let mut it = items.into_iter();
    let kind = match it.next() {
        Some(Item::Bulk(k)) => k,
        Some(Item::Error(e)) => return Frame::Error(String::from_utf8_lossy(&e).into_owned()),
        _ => return Frame::Other,
    };
    match kind.as_slice() {
        b"message" | b"smessage" => match (it.next(), it.next()) {
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
        b"subscribe" | b"unsubscribe" | b"psubscribe" | b"punsubscribe" | b"ssubscribe"
        | b"sunsubscribe" => {
            let channel = match it.next() {
                Some(Item::Bulk(c)) => c,
                _ => Vec::new(),
            };
            Frame::Confirm(kind, channel)
        }
        _ => Frame::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_is_due_after_silence_then_after_an_unanswered_ping() {
        let (after, deadline) = (Duration::from_secs(5), Duration::from_secs(3));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        // Silent since t0: the PING is due at 5 s, not before.
        assert_eq!(
            keepalive_in(t0, None, at(1_000), after, deadline),
            Duration::from_secs(4)
        );
        assert!(keepalive_in(t0, None, at(5_000), after, deadline).is_zero());
        assert!(keepalive_in(t0, None, at(9_000), after, deadline).is_zero());
        // Sent at 5 s and unanswered: the connection is given up at 8 s.
        let sent = Some(at(5_000));
        assert_eq!(
            keepalive_in(t0, sent, at(6_500), after, deadline),
            Duration::from_millis(1_500)
        );
        assert!(keepalive_in(t0, sent, at(8_000), after, deadline).is_zero());
        // Anything received restarts the silence.
        assert_eq!(
            keepalive_in(at(7_000), None, at(7_000), after, deadline),
            after
        );
    }
}
