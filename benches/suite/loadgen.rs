//! The load-generator process: one mio (epoll) loop on one thread driving
//! thousands of hand-rolled WebSocket clients. The runner starts several of
//! these (the bench binary re-executed as `__loadgen <json>`), each under the
//! per-process open-file limit, and talks to them over stdin/stdout:
//!
//! - stdout, every 500 ms: `{"p":{counters}}` (progress);
//! - stdin `mark`: answers `{"mark":{counters}}` at once (window boundaries);
//! - stdin `report`: answers `{"report":{...}}` and exits.
//!
//! It also stops by itself after `max_secs` (printing its report), and when
//! stdin closes. Clients bind before connect to `127.0.0.<2..2+sources>` with
//! `IP_BIND_ADDRESS_NO_PORT`, so ports are picked per destination 4-tuple and
//! far more than 28k connections fit.
//!
//! Latency: the bench publisher writes its publish time (µs since the Unix
//! epoch) into each snapshot's `seat_info.t` (passed through untouched by the
//! server); a client takes `now - t` for every section of a non-`full` frame
//! whose version is newer than what it holds. Both ends read the same
//! `CLOCK_REALTIME` on one machine.

use crate::hist::Hist;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What one load-generator process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Server port on 127.0.0.1.
    pub port: u16,
    /// This process's index (user ids, seeds).
    pub child: u32,
    /// Connections to hold (ignored in churn mode).
    pub clients: usize,
    /// Course codes to pick from, in Zipf rank order.
    pub courses: Vec<String>,
    /// Zipf exponent for picking a course (0: uniform).
    pub skew: f64,
    /// New connections per second.
    pub connect_rate: f64,
    /// Handshakes in flight at most.
    pub inflight: usize,
    /// Handshake mode: close (RST) right after the 101 and keep opening.
    pub churn: bool,
    /// HS256 secret for tokens.
    pub secret: String,
    /// RNG seed.
    pub seed: u64,
    /// Stop by itself after this many seconds.
    pub max_secs: u64,
    /// Number of 127.0.0.x source addresses.
    pub sources: u8,
    /// Send a `watch` after the upgrade (false: connect and stay silent).
    #[serde(default = "yes")]
    pub watch: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(rename = "type", borrow)]
    ty: &'a str,
    #[serde(default, borrow)]
    course: Option<&'a str>,
    #[serde(default)]
    full: bool,
    #[serde(default)]
    sections: Vec<Sec>,
}

#[derive(Deserialize)]
struct Sec {
    section: u32,
    seats_taken: u32,
    #[serde(default)]
    version: Option<u64>,
    #[serde(default)]
    seat_info: Option<Info>,
}

#[derive(Deserialize)]
struct Info {
    #[serde(default)]
    t: Option<u64>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Phase {
    Connecting,
    Handshake,
    Open,
}

struct Conn {
    sock: TcpStream,
    phase: Phase,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    course: u32,
    user: u64,
    attempt: u8,
    /// Merged state: (section, version, seats_taken), sorted by section.
    board: Vec<(u32, u64, u32)>,
}

/// Counters reported in progress lines and marks.
#[derive(Default, Clone, Serialize)]
struct Counters {
    open: u64,
    connecting: u64,
    upgrades: u64,
    refused: u64,
    failed: u64,
    closed_by_server: u64,
    frames: u64,
    full_frames: u64,
    sections: u64,
    presence: u64,
    errors: u64,
    bytes: u64,
}

/// Unix time in µs.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// FNV-1a over a board, the same digest the runner computes from what it published.
pub fn digest(board: &[(u32, u64, u32)]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &(s, v, t) in board {
        for x in [s as u64, v, t as u64] {
            for b in x.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

/// A cumulative Zipf table over `n` ranks.
pub fn zipf_cdf(n: usize, skew: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(skew);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// A rank drawn from `cdf`.
pub fn zipf_pick(cdf: &[f64], rng: &mut fastrand::Rng) -> usize {
    let x = rng.f64();
    cdf.partition_point(|&c| c < x).min(cdf.len() - 1)
}

struct Gen {
    cfg: Config,
    poll: Poll,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    c: Counters,
    lat: Hist,
    rng: fastrand::Rng,
    cdf: Vec<f64>,
    /// Clients still to open (retries included) and when each may start.
    pending: Vec<(Instant, u64, u32, u8)>,
    next_user: u64,
    started: Instant,
    opened: f64,
    refusals: HashMap<u16, u64>,
    first_refusal_ms: Option<u64>,
    per_second: Vec<u64>,
    scratch: Vec<u8>,
    exp: u64,
}

const SCRATCH: usize = 256 * 1024;

impl Gen {
    fn new(cfg: Config) -> Gen {
        let rng = fastrand::Rng::with_seed(cfg.seed);
        let cdf = zipf_cdf(cfg.courses.len().max(1), cfg.skew);
        Gen {
            poll: Poll::new().expect("epoll"),
            conns: Vec::new(),
            free: Vec::new(),
            c: Counters::default(),
            lat: Hist::default(),
            rng,
            cdf,
            pending: Vec::new(),
            next_user: 0,
            started: Instant::now(),
            opened: 0.0,
            refusals: HashMap::new(),
            first_refusal_ms: None,
            per_second: Vec::new(),
            scratch: vec![0; SCRATCH],
            exp: now_us() / 1_000_000 + 3600,
            cfg,
        }
    }

    fn open(&mut self, user: u64, course: u32, attempt: u8) {
        let src = Ipv4Addr::new(127, 0, 0, 2 + (user % self.cfg.sources.max(1) as u64) as u8);
        let sock = match connect_from(src, self.cfg.port, self.cfg.churn) {
            Ok(s) => s,
            Err(_) => {
                self.c.failed += 1;
                return;
            }
        };
        let mut sock = TcpStream::from_std(sock);
        let idx = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        if self
            .poll
            .registry()
            .register(
                &mut sock,
                Token(idx),
                Interest::READABLE | Interest::WRITABLE,
            )
            .is_err()
        {
            self.c.failed += 1;
            self.free.push(idx);
            return;
        }
        self.c.connecting += 1;
        self.conns[idx] = Some(Conn {
            sock,
            phase: Phase::Connecting,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            course,
            user,
            attempt,
            board: Vec::new(),
        });
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns[idx].take() {
            let _ = self.poll.registry().deregister(&mut c.sock);
            match c.phase {
                Phase::Open => self.c.open -= 1,
                _ => self.c.connecting -= 1,
            }
            self.free.push(idx);
        }
    }

    fn refused(&mut self, idx: usize, status: u16) {
        self.c.refused += 1;
        *self.refusals.entry(status).or_default() += 1;
        if self.first_refusal_ms.is_none() {
            self.first_refusal_ms = Some(self.started.elapsed().as_millis() as u64);
        }
        let (user, course, attempt) = match &self.conns[idx] {
            Some(c) => (c.user, c.course, c.attempt),
            None => return,
        };
        self.close(idx);
        if !self.cfg.churn && attempt < 20 {
            let at = Instant::now() + Duration::from_millis(200 + self.rng.u64(0..300));
            self.pending.push((at, user, course, attempt + 1));
        }
    }

    fn handle(&mut self, idx: usize) {
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if conn.phase == Phase::Connecting {
            match conn.sock.take_error() {
                Ok(None) => {}
                _ => {
                    self.c.failed += 1;
                    self.close(idx);
                    return;
                }
            }
            match conn.sock.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => return,
                Err(_) => {
                    self.c.failed += 1;
                    self.close(idx);
                    return;
                }
            }
            conn.phase = Phase::Handshake;
            let user = format!("lg{}-{}", self.cfg.child, conn.user);
            let token = seatboard::auth::mint(
                self.cfg.secret.as_bytes(),
                &user,
                shards::Role::Student,
                self.exp,
            );
            let req = format!(
                "GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n",
                self.cfg.port
            );
            conn.wbuf.extend_from_slice(req.as_bytes());
        }
        if !conn.wbuf.is_empty() {
            match conn.sock.write(&conn.wbuf) {
                Ok(n) => {
                    conn.wbuf.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.fail_io(idx);
                    return;
                }
            }
        }
        loop {
            let Some(conn) = self.conns[idx].as_mut() else {
                return;
            };
            let n = match conn.sock.read(&mut self.scratch) {
                Ok(0) => {
                    self.fail_io(idx);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.fail_io(idx);
                    return;
                }
            };
            self.c.bytes += n as u64;
            conn.rbuf.extend_from_slice(&self.scratch[..n]);
            if !self.process(idx) {
                return;
            }
        }
    }

    fn fail_io(&mut self, idx: usize) {
        match self.conns[idx].as_ref().map(|c| c.phase) {
            Some(Phase::Open) => self.c.closed_by_server += 1,
            Some(_) => self.c.failed += 1,
            None => {}
        }
        self.close(idx);
    }

    /// Consumes buffered bytes; false if the connection went away.
    fn process(&mut self, idx: usize) -> bool {
        let mut rbuf = match self.conns[idx].as_mut() {
            Some(c) => std::mem::take(&mut c.rbuf),
            None => return false,
        };
        let mut pos = 0;
        let alive = 'outer: {
            if self.conns[idx].as_ref().map(|c| c.phase) == Some(Phase::Handshake) {
                let Some(end) = find_head_end(&rbuf) else {
                    break 'outer true;
                };
                let status = parse_status(&rbuf[..end]);
                pos = end;
                if status != 101 {
                    self.refused(idx, status);
                    break 'outer false;
                }
                self.c.upgrades += 1;
                let sec = self.started.elapsed().as_secs() as usize;
                if self.per_second.len() <= sec {
                    self.per_second.resize(sec + 1, 0);
                }
                self.per_second[sec] += 1;
                if self.cfg.churn {
                    self.close(idx);
                    break 'outer false;
                }
                self.c.connecting -= 1;
                self.c.open += 1;
                let conn = self.conns[idx].as_mut().expect("conn");
                conn.phase = Phase::Open;
                if self.cfg.watch {
                    let course = &self.cfg.courses[conn.course as usize];
                    let watch = format!("{{\"op\":\"watch\",\"course\":\"{course}\"}}");
                    let frame = shards::ws_codec::client_frame(true, 1, watch.as_bytes(), mask());
                    conn.wbuf.extend_from_slice(&frame);
                    flush(conn);
                }
            }
            loop {
                let avail = &rbuf[pos..];
                if avail.len() < 2 {
                    break 'outer true;
                }
                let op = avail[0] & 0x0f;
                let (len, hdr) = match avail[1] & 0x7f {
                    126 if avail.len() >= 4 => {
                        (u16::from_be_bytes([avail[2], avail[3]]) as usize, 4)
                    }
                    127 if avail.len() >= 10 => {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&avail[2..10]);
                        (u64::from_be_bytes(b) as usize, 10)
                    }
                    126 | 127 => break 'outer true,
                    n => (n as usize, 2),
                };
                if avail.len() < hdr + len {
                    break 'outer true;
                }
                let payload = &avail[hdr..hdr + len];
                match op {
                    1 | 0 => self.on_text(idx, payload),
                    9 => {
                        let pong = shards::ws_codec::client_frame(true, 10, payload, mask());
                        if let Some(c) = self.conns[idx].as_mut() {
                            c.wbuf.extend_from_slice(&pong);
                            flush(c);
                        }
                    }
                    8 => {
                        self.c.closed_by_server += 1;
                        self.close(idx);
                        break 'outer false;
                    }
                    _ => {}
                }
                pos += hdr + len;
            }
        };
        if alive {
            rbuf.drain(..pos);
            if let Some(c) = self.conns[idx].as_mut() {
                c.rbuf = rbuf;
            }
        }
        alive
    }

    fn on_text(&mut self, idx: usize, payload: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Msg>(payload) else {
            self.c.errors += 1;
            return;
        };
        match msg.ty {
            "frame" => {}
            "presence" => {
                self.c.presence += 1;
                return;
            }
            "error" => {
                self.c.errors += 1;
                return;
            }
            _ => return,
        }
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if msg.course != Some(self.cfg.courses[conn.course as usize].as_str()) {
            self.c.errors += 1;
            return;
        }
        self.c.frames += 1;
        if msg.full {
            self.c.full_frames += 1;
            conn.board.clear();
        }
        let now = now_us();
        for s in &msg.sections {
            self.c.sections += 1;
            let v = s.version.unwrap_or(0);
            match conn.board.binary_search_by_key(&s.section, |e| e.0) {
                Ok(i) => {
                    if v > conn.board[i].1 || (v == 0 && conn.board[i].1 == 0) {
                        if !msg.full {
                            if let Some(t) = s.seat_info.as_ref().and_then(|i| i.t) {
                                self.lat.record(now.saturating_sub(t));
                            }
                        }
                        conn.board[i] = (s.section, v, s.seats_taken);
                    }
                }
                Err(i) => {
                    if !msg.full {
                        if let Some(t) = s.seat_info.as_ref().and_then(|i| i.t) {
                            self.lat.record(now.saturating_sub(t));
                        }
                    }
                    conn.board.insert(i, (s.section, v, s.seats_taken));
                }
            }
        }
    }

    fn start_new(&mut self) {
        let now = Instant::now();
        // Retries whose time has come.
        let mut i = 0;
        while i < self.pending.len() {
            if self.c.connecting as usize >= self.cfg.inflight {
                return;
            }
            if self.pending[i].0 <= now {
                let (_, user, course, attempt) = self.pending.swap_remove(i);
                self.open(user, course, attempt);
            } else {
                i += 1;
            }
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let allowed = (self.cfg.connect_rate * elapsed).max(1.0);
        while (self.cfg.churn || (self.next_user as usize) < self.cfg.clients)
            && self.opened < allowed
            && (self.c.connecting as usize) < self.cfg.inflight
        {
            let course = zipf_pick(&self.cdf, &mut self.rng) as u32;
            let user = self.next_user;
            self.next_user += 1;
            self.opened += 1.0;
            self.open(user, course, 0);
        }
    }

    fn counters_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.c).expect("counters")
    }

    fn report(&self) -> serde_json::Value {
        let mut digests: HashMap<(u32, u64), u64> = HashMap::new();
        for c in self.conns.iter().flatten() {
            if c.phase == Phase::Open {
                *digests.entry((c.course, digest(&c.board))).or_default() += 1;
            }
        }
        let digests: Vec<[u64; 3]> = digests
            .into_iter()
            .map(|((c, d), n)| [c as u64, d, n])
            .collect();
        let refusals: Vec<[u64; 2]> = self.refusals.iter().map(|(&s, &n)| [s as u64, n]).collect();
        serde_json::json!({
            "counters": self.counters_json(),
            "latency": self.lat.to_json(),
            "digests": digests,
            "refusals": refusals,
            "first_refusal_ms": self.first_refusal_ms,
            "per_second": self.per_second,
        })
    }
}

fn mask() -> [u8; 4] {
    [0x12, 0x34, 0x56, 0x78]
}

fn flush(conn: &mut Conn) {
    if conn.wbuf.is_empty() || conn.phase == Phase::Connecting {
        return;
    }
    if let Ok(n) = conn.sock.write(&conn.wbuf) {
        conn.wbuf.drain(..n);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn parse_status(head: &[u8]) -> u16 {
    std::str::from_utf8(head)
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A nonblocking socket bound to `src` (port chosen at connect), connecting to
/// 127.0.0.1:`port`. `rst`: close with RST (SO_LINGER 0) so no TIME_WAIT piles up.
fn connect_from(src: Ipv4Addr, port: u16, rst: bool) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
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
    s.bind(&SockAddr::from(SocketAddr::V4(SocketAddrV4::new(src, 0))))?;
    s.set_nonblocking(true)?;
    let dst = SockAddr::from(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)));
    match s.connect(&dst) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(s.into())
}

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// The child's main: runs until `report`, stdin EOF or `max_secs`.
pub fn run(cfg: Config) {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send("eof".into());
                    return;
                }
                Ok(_) => {
                    if tx.send(line.trim().to_owned()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(cfg.max_secs);
    let mut g = Gen::new(cfg);
    let mut events = Events::with_capacity(4096);
    let mut next_progress = Instant::now();
    loop {
        if let Err(e) = g.poll.poll(&mut events, Some(Duration::from_millis(10))) {
            if e.kind() != ErrorKind::Interrupted {
                panic!("epoll: {e}");
            }
        }
        let ready: Vec<usize> = events.iter().map(|e| e.token().0).collect();
        for idx in ready {
            g.handle(idx);
        }
        g.start_new();
        let now = Instant::now();
        if now >= next_progress {
            next_progress = now + Duration::from_millis(500);
            emit(serde_json::json!({ "p": g.counters_json() }));
        }
        let mut stop = now >= deadline;
        while let Ok(cmd) = rx.try_recv() {
            match cmd.as_str() {
                "mark" => emit(serde_json::json!({ "mark": g.counters_json() })),
                "report" | "eof" => stop = true,
                _ => {}
            }
        }
        if stop {
            emit(serde_json::json!({ "report": g.report() }));
            return;
        }
    }
}
