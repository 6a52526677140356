//! Opening a viewer's connection, its upgrade request, and the page's
//! way back after it loses one.

use super::{Conn, Gen, Phase};
use crate::backoff::{delay_ms, Loss};
use crate::transport::{Tls, Transport};
use crate::{now_us, token, ws};
use mio::net::TcpStream;
use mio::{Interest, Token};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

impl Gen {
    /// The local address a user's connections bind to, if any.
    pub(crate) fn source(&self, user: u64) -> Option<IpAddr> {
        let n = self.cfg.source_addrs.len() as u64;
        if n > 0 {
            return Some(self.cfg.source_addrs[(user % n) as usize]);
        }
        let k = self.cfg.sources as u64;
        (k > 0).then(|| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (user % k) as u8)))
    }

    /// Starts a connection of `user` watching `courses` (its connect in flight).
    pub(crate) fn open(&mut self, user: u64, courses: Vec<u32>) {
        let dst = SocketAddr::new(self.cfg.host, self.cfg.port);
        let sock = match connect_from(self.source(user), dst, self.cfg.churn) {
            Ok(s) => s,
            Err(_) => {
                self.c.failed += 1;
                self.retry(user, Loss::default());
                return;
            }
        };
        let sock = TcpStream::from_std(sock);
        let mut io = match self.tls.as_ref().map(Tls::connection) {
            None => Transport::plain(sock),
            Some(Ok(conn)) => Transport::tls(sock, conn),
            Some(Err(e)) => {
                self.c.failed += 1;
                self.c.tls_failed += 1;
                self.tls_error.get_or_insert_with(|| e.to_string());
                self.retry(user, Loss::default());
                return;
            }
        };
        let idx = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if self
            .poll
            .registry()
            .register(
                &mut io.sock,
                Token(idx),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            self.c.failed += 1;
            self.free.push(idx);
            self.retry(user, Loss::default());
            return;
        }
        self.c.connecting += 1;
        self.conns[idx] = Some(Conn {
            io,
            phase: Phase::Connecting,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            boards: vec![Vec::new(); courses.len()],
            courses,
            user,
            started_at: Instant::now(),
            opened_at: None,
            had_board: false,
            hint_at: None,
        });
    }

    /// Schedules the next attempt of `user` the way the page does.
    pub(crate) fn retry(&mut self, user: u64, loss: Loss) {
        if self.cfg.churn {
            return;
        }
        let now = Instant::now();
        let Some(v) = self.viewers.get_mut(user as usize) else {
            return;
        };
        let delay = delay_ms(&mut v.attempt, &loss, now, &mut self.rng);
        self.pending
            .push((now + Duration::from_millis(delay), user));
    }

    /// A viewer's connection went away (closed, refused, failed).
    pub(crate) fn lost(&mut self, user: u64, was_open: bool) {
        if !self.armed || self.cfg.churn {
            return;
        }
        let need = self.refs.len();
        let Some(v) = self.viewers.get_mut(user as usize) else {
            return;
        };
        if was_open {
            v.moved = true;
            if v.blind_since.is_none() {
                v.blind_since = Some(now_us() / 1000);
                v.need = need;
                self.c.blind += 1;
            }
        }
    }

    /// An upgrade refused with `status`: counted, and retried the way the page does.
    pub(crate) fn refused(&mut self, idx: usize, status: u16, retry_after_s: Option<u64>) {
        self.c.refused += 1;
        if retry_after_s.is_some() {
            self.c.refused_retry_after += 1;
        }
        *self.refusals.entry(status).or_default() += 1;
        if self.first_refusal_ms.is_none() {
            self.first_refusal_ms = Some(self.started.elapsed().as_millis() as u64);
        }
        let Some(user) = self.conns[idx].as_ref().map(|c| c.user) else {
            return;
        };
        self.close(idx);
        self.retry(
            user,
            Loss {
                retry_after_s,
                ..Loss::default()
            },
        );
    }

    /// A connect that finished (or failed): queues the upgrade request;
    /// false when the connection is not (yet) usable.
    pub(crate) fn connected(&mut self, idx: usize) -> bool {
        let Some(conn) = self.conns[idx].as_mut() else {
            return false;
        };
        let user = conn.user;
        // A connect refused or failed (the node is down and nothing
        // proxies it) is retried like any lost connection.
        let failed = match conn.io.sock.take_error() {
            Ok(None) => match conn.io.sock.peer_addr() {
                Ok(_) => false,
                Err(e) if e.kind() == ErrorKind::NotConnected => return false,
                Err(_) => true,
            },
            _ => true,
        };
        if failed {
            self.c.failed += 1;
            self.close(idx);
            self.retry(user, Loss::default());
            return false;
        }
        conn.phase = Phase::Handshake;
        let courses = std::mem::take(&mut conn.courses);
        let req = self.upgrade_request(user, &courses);
        if self.cfg.watch && self.cfg.upgrade_courses && !self.cfg.sse {
            // The watches ride in the request.
            let now = now_us();
            for &c in &courses {
                self.seeding.watched(c, now);
            }
        }
        if let Some(conn) = self.conns[idx].as_mut() {
            conn.courses = courses;
            conn.wbuf.extend_from_slice(req.as_bytes());
        }
        true
    }

    /// The request head of viewer `user` watching `courses`: a WebSocket
    /// upgrade, or `GET /sse?course=...`, with its token or `?user=`.
    pub(crate) fn upgrade_request(&self, user: u64, courses: &[u32]) -> String {
        let name = format!("{}{}-{}", self.cfg.user_prefix, self.cfg.child, user);
        let (auth, query_user) = if self.cfg.auth_none {
            (String::new(), format!("user={name}"))
        } else {
            let token = match self.tokens.len() {
                0 => token::mint(self.cfg.secret.as_bytes(), &name, self.exp),
                n => self.tokens[user as usize % n].clone(),
            };
            (format!("Authorization: Bearer {token}\r\n"), String::new())
        };
        let host = self
            .cfg
            .host_header
            .clone()
            .unwrap_or_else(|| format!("127.0.0.1:{}", self.cfg.port));
        let base = &self.cfg.base_path;
        if self.cfg.sse {
            let mut q: Vec<String> = courses
                .iter()
                .map(|&c| format!("course={}", self.cfg.courses[c as usize]))
                .collect();
            if !query_user.is_empty() {
                q.push(query_user);
            }
            return format!(
                "GET {base}/sse?{} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n{auth}\r\n",
                q.join("&")
            );
        }
        let offer = if self.cfg.deflate {
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        } else {
            ""
        };
        let mut q: Vec<String> = Vec::new();
        if self.cfg.watch && self.cfg.upgrade_courses {
            q.extend(
                courses
                    .iter()
                    .map(|&c| format!("course={}", self.cfg.courses[c as usize])),
            );
        }
        if !query_user.is_empty() {
            q.push(query_user);
        }
        let q = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        };
        let origin = self
            .cfg
            .origin
            .as_ref()
            .map_or_else(String::new, |o| format!("Origin: {o}\r\n"));
        // A fresh key, as a browser makes for every upgrade.
        let key = websocket_key(fastrand::u128(..));
        format!(
            "GET {base}/ws{q} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{origin}{auth}{offer}\r\n"
        )
    }
}

/// A `Sec-WebSocket-Key`: 16 bytes in base64 (24 characters, `==` last).
fn websocket_key(bits: u128) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = bits.to_be_bytes();
    let mut out = String::with_capacity(24);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out.push_str("==");
    out
}

/// Sends what `conn` has queued, as far as the socket takes it.
pub(crate) fn flush(conn: &mut Conn) {
    if conn.wbuf.is_empty() || conn.phase == Phase::Connecting {
        return;
    }
    let _ = conn.io.send(&mut conn.wbuf);
}

/// A client close frame (1000) and a FIN instead of the churn socket's RST.
pub(crate) fn say_goodbye(conn: &mut Conn) {
    conn.wbuf.extend_from_slice(&ws::goodbye());
    flush(conn);
    let off = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    // SAFETY: setsockopt on the connection's own socket, with a linger value.
    unsafe {
        libc::setsockopt(
            conn.io.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &off as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    conn.io.shutdown();
}

/// A nonblocking socket bound to `src` (port chosen at connect), connecting to
/// 127.0.0.1:`port`. `rst`: close with RST (SO_LINGER 0) so no TIME_WAIT piles up.
fn connect_from(
    src: Option<IpAddr>,
    dst: SocketAddr,
    rst: bool,
) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a c_int option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    s.set_tcp_nodelay(true)?;
    if rst {
        s.set_linger(Some(Duration::ZERO))?;
    }
    if let Some(src) = src {
        s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
    }
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(dst)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn gen(upgrade_courses: bool, watch: bool) -> Gen {
        let cfg = Config {
            port: 8080,
            auth_none: true,
            courses: vec!["CS101".into(), "MATH101".into()],
            watch,
            upgrade_courses,
            ..Config::default()
        };
        Gen::new(cfg).expect("a loop")
    }

    fn target(req: &str) -> &str {
        req.split(' ').nth(1).unwrap_or("")
    }

    #[test]
    fn keys_are_16_bytes_of_base64_fresh_for_each_upgrade_and_origin_is_sent_when_set() {
        use base64::Engine;
        for bits in [0, u128::MAX, 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10] {
            let key = websocket_key(bits);
            let raw = base64::engine::general_purpose::STANDARD
                .decode(&key)
                .expect("base64");
            assert_eq!((key.len(), raw.as_slice()), (24, &bits.to_be_bytes()[..]));
        }
        let key = |req: &str| {
            req.lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .map(str::to_owned)
        };
        let mut g = gen(true, true);
        let (a, b) = (g.upgrade_request(1, &[0]), g.upgrade_request(1, &[0]));
        assert_ne!(key(&a), key(&b));
        assert!(!a.contains("Origin:"), "{a}");
        g.cfg.origin = Some("https://seats.example.edu".into());
        assert!(g
            .upgrade_request(1, &[0])
            .contains("\r\nOrigin: https://seats.example.edu\r\n"));
    }

    #[test]
    fn courses_ride_in_the_upgrade_only_when_asked() {
        let g = gen(true, true);
        assert_eq!(
            target(&g.upgrade_request(7, &[0, 1])),
            "/ws?course=CS101&course=MATH101&user=lg0-7"
        );
        assert_eq!(
            target(&gen(false, true).upgrade_request(7, &[0])),
            "/ws?user=lg0-7"
        );
        assert_eq!(
            target(&gen(true, false).upgrade_request(7, &[0])),
            "/ws?user=lg0-7"
        );
    }
}
