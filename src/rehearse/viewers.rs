//! The viewers: one mio (epoll) loop on one thread driving thousands of
//! hand-rolled WebSocket (or SSE) clients, each watching one to
//! `max_courses` courses. `seatboard rehearse` runs several of them (threads,
//! and child processes past one process's open files); the bench suite runs
//! the same loop (its binary re-executed as `__loadgen <json>`). Each is
//! driven by command lines and answers with JSON values (stdin/stdout for a
//! child process):
//!
//! - every 500 ms: `{"p":{counters},"r":[[status,n]],"l":{histogram}}`
//!   (progress: counters, refusals by status so far, latency since the last);
//! - stdin `mark`: answers `{"mark":{counters}}` at once (window boundaries);
//! - stdin `report`: answers `{"report":{...}}` and exits.
//!
//! - stdin `ref <json>`: a reference board (per course, per section, the
//!   version the publisher had written; see "Recovery" below);
//! - stdin `arm`: from now on a lost connection starts a blind interval;
//! - stdin `blind`: every viewer is blind from now until it holds the next
//!   reference (Redis went away: boards are frozen though sockets stay open);
//! - stdin `lat <phase>`: later latency samples go to the histogram `<phase>`;
//! - stdin `drop`: arms, resets (RST) every open connection at once, as when a
//!   node dies and its viewers are sent on, and forgets the refusals counted so
//!   far (the report's `refusals` are then those of the reconnection).
//!
//! It also stops by itself after `max_secs` (printing its report), and when
//! stdin closes.
//!
//! With `tls` (an `https://` target) each connection is TLS over the same
//! non-blocking socket (`transport.rs`): the handshake runs in the loop, the
//! WebSocket upgrade or SSE request goes out once it is done. A failed
//! handshake counts in `tls_failed` and the report's `tls_error` says why.
//!
//! Reconnects, like the board page (`src/web/index.html`): a viewer whose
//! connection closes, or whose upgrade is refused or fails, opens again after
//! the server's `reconnect` hint (`after_ms`) if it got one, 250-1500 ms after
//! a close 1012 or 4001, else a full-jitter exponential backoff (500 ms
//! doubling to a 30 s cap, reset by a connection that stayed open 10 s);
//! a refused upgrade's `Retry-After` is a floor (plus up to 1 s of jitter).
//! It then watches its course again.
//!
//! Recovery: after `arm`, a viewer that loses its connection is blind until
//! its board (merged from the watch answer and later frames) holds, for every
//! section, at least the version of the reference that was current when it
//! lost it; after `blind`, until it holds the next reference. Each blind
//! interval is reported as (start, end) in Unix ms. Clients bind before connect
//! to one of `source_addrs` (else `127.0.0.<2..2+sources>`, else nothing) with
//! `IP_BIND_ADDRESS_NO_PORT`, so ports are picked per destination 4-tuple and
//! far more than 28k connections fit.
//!
//! Latency: the bench publisher writes its publish time (µs since the Unix
//! epoch) into each snapshot's `seat_info.t` (passed through untouched by the
//! server); a client takes `now - t` for every section of a non-`full` frame
//! whose version is newer than what it holds. Both ends read the same
//! `CLOCK_REALTIME` on one machine. With `version_ts` (the rehearsal), a
//! section without `seat_info.t` takes its publish time from its version,
//! `ts * 1000 + k` (ms since the epoch, then a counter).

use super::hist::Hist;
use super::seeding::Seeding;
use super::transport::{tls_error, Tls, Transport};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};
use shards::opcode;
use shards::read_server_frame;
use shards::ws_codec::client_frame;
use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What one load-generator process does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Server port.
    pub port: u16,
    /// Server address (127.0.0.1 unless given).
    #[serde(default = "loopback")]
    pub host: IpAddr,
    /// The `Host` header (default `127.0.0.1:<port>`).
    #[serde(default)]
    pub host_header: Option<String>,
    /// Path before `/ws` and `/sse` (empty, or `/seats` without the slash after).
    #[serde(default)]
    pub base_path: String,
    /// Local addresses to bind before connect, in turn (overrides `sources`).
    #[serde(default)]
    pub source_addrs: Vec<IpAddr>,
    /// The deployment runs `--auth none`: the user goes in `?user=`, no token.
    #[serde(default)]
    pub auth_none: bool,
    /// Each viewer watches 1..=max_courses distinct courses.
    #[serde(default = "one")]
    pub max_courses: u32,
    /// Latency from a section's version (`ts * 1000 + k`) when it has no `seat_info.t`.
    #[serde(default)]
    pub version_ts: bool,
    /// User ids are `<user_prefix><child>-<n>`.
    #[serde(default = "lg")]
    pub user_prefix: String,
    /// On the report, every open WebSocket says goodbye (close 1000 and a FIN).
    #[serde(default)]
    pub goodbye: bool,
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
    /// Handshake mode: leave right after the 101 (two of three with a close
    /// frame, the third by dropping the socket) and keep opening.
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
    /// Offer permessage-deflate (as browsers do) and inflate compressed
    /// messages, each with a fresh raw inflater (no context takeover).
    #[serde(default)]
    pub deflate: bool,
    /// Pre-minted tokens, one a line, used in turn (else HS256 minted with `secret`).
    #[serde(default)]
    pub tokens_file: Option<String>,
    /// Open `GET /sse?course=...` streams (Server-Sent Events) instead of
    /// WebSockets: the course is in the query, events are read instead of frames.
    #[serde(default)]
    pub sse: bool,
    /// An `https://` target: TLS with this server name (SNI and the name its
    /// certificate must hold); `None`, plain TCP.
    #[serde(default)]
    pub tls: Option<String>,
}

/// The page's reconnect timing (`src/web/index.html`).
mod page {
    /// First backoff ceiling.
    pub const BACKOFF_BASE_MS: u64 = 500;
    /// Backoff cap.
    pub const BACKOFF_CAP_MS: u64 = 30_000;
    /// A connection open this long resets the backoff.
    pub const STABLE_MS: u64 = 10_000;
    /// Prompt reconnect after close 1012 / 4001.
    pub const PROMPT_MS: (u64, u64) = (250, 1500);
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn lg() -> String {
    "lg".into()
}

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

impl Default for Config {
    fn default() -> Config {
        Config {
            port: 0,
            host: loopback(),
            host_header: None,
            base_path: String::new(),
            source_addrs: Vec::new(),
            auth_none: false,
            max_courses: 1,
            version_ts: false,
            user_prefix: lg(),
            goodbye: false,
            child: 0,
            clients: 0,
            courses: Vec::new(),
            skew: 0.0,
            connect_rate: 1.0,
            inflight: 256,
            churn: false,
            secret: String::new(),
            seed: 1,
            max_secs: 60,
            sources: 0,
            watch: true,
            deflate: false,
            tokens_file: None,
            sse: false,
            tls: None,
        }
    }
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
    #[serde(default)]
    after_ms: Option<u64>,
    #[serde(default)]
    tick_ms: Option<u64>,
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
    io: Transport,
    phase: Phase,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// The courses watched (indices into `Config::courses`).
    courses: Vec<u32>,
    user: u64,
    /// When the connect started.
    started_at: Instant,
    /// When the upgrade succeeded.
    opened_at: Option<Instant>,
    /// A `reconnect` hint: come back at this moment.
    hint_at: Option<Instant>,
    /// Per watched course, the merged state: (section, version,
    /// seats_taken), sorted by section.
    boards: Vec<Vec<(u32, u64, u32)>>,
}

/// One simulated browser tab, across its connections.
struct Viewer {
    courses: Vec<u32>,
    /// Backoff exponent, as the page's `attempt`.
    attempt: u32,
    /// Blind since (Unix ms), after `arm` or `blind`.
    blind_since: Option<u64>,
    /// The reference (1-based; 0: none) its board must reach to see again.
    need: usize,
    /// Lost a connection since `arm`.
    moved: bool,
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
    /// Messages that came compressed (RSV1).
    compressed: u64,
    /// Refused upgrades that carried `Retry-After`.
    refused_retry_after: u64,
    /// `reconnect` hints received.
    hints: u64,
    /// Connections opened again after a loss.
    reconnects: u64,
    /// Viewers blind right now (after `arm`/`blind`).
    blind: u64,
    /// Blind intervals that ended (board true again).
    recovered: u64,
    /// The largest `tick_ms` a `hello` named.
    tick_ms: u64,
    /// Connections whose TLS handshake (or a later record) failed.
    tls_failed: u64,
    /// Milliseconds spent outside `epoll_wait` (working, or runnable and
    /// waiting for a core): near the wall time, the process is not keeping up.
    busy_ms: u64,
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
    /// Latency since the last progress value.
    lat_iv: Hist,
    /// Connect to upgrade (or SSE head), µs.
    connect: Hist,
    rng: fastrand::Rng,
    cdf: Vec<f64>,
    /// Clients still to open (retries included) and when each may start.
    pending: Vec<(Instant, u64)>,
    /// Per user (not in churn mode).
    viewers: Vec<Viewer>,
    /// Reference boards: per course, per section, the version to reach.
    refs: Vec<Vec<Vec<u64>>>,
    armed: bool,
    /// Ended blind intervals, (start, end) in Unix ms.
    intervals: Vec<(u64, u64)>,
    /// Latency per phase (`lat <phase>`), survivors only in `during`.
    phase: String,
    phases: HashMap<String, Hist>,
    close_codes: HashMap<u16, u64>,
    next_user: u64,
    started: Instant,
    opened: f64,
    refusals: HashMap<u16, u64>,
    first_refusal_ms: Option<u64>,
    per_second: Vec<u64>,
    /// First watch and first full frame per course, frames per second.
    seeding: Seeding,
    scratch: Vec<u8>,
    /// The last inflated message (its buffer reused).
    inflated: Vec<u8>,
    /// One raw inflater, reset before each message (no context takeover):
    /// a fresh one per message would allocate and clear its 32 KiB window.
    inflater: flate2::Decompress,
    exp: u64,
    /// The lines of `tokens_file`.
    tokens: Vec<String>,
    /// TLS to an `https://` target.
    tls: Option<Tls>,
    /// The first TLS failure, in words.
    tls_error: Option<String>,
}

const SCRATCH: usize = 256 * 1024;

impl Gen {
    fn new(cfg: Config) -> std::io::Result<Gen> {
        let rng = fastrand::Rng::with_seed(cfg.seed);
        let cdf = zipf_cdf(cfg.courses.len().max(1), cfg.skew);
        let tls = match cfg.tls.as_deref().map(Tls::new) {
            Some(Err(e)) => return Err(std::io::Error::other(e)),
            Some(Ok(t)) => Some(t),
            None => None,
        };
        Ok(Gen {
            tls,
            tls_error: None,
            poll: Poll::new()?,
            conns: Vec::new(),
            free: Vec::new(),
            c: Counters::default(),
            lat: Hist::default(),
            lat_iv: Hist::default(),
            connect: Hist::default(),
            rng,
            cdf,
            pending: Vec::new(),
            viewers: Vec::new(),
            refs: Vec::new(),
            armed: false,
            intervals: Vec::new(),
            phase: "warmup".into(),
            phases: HashMap::new(),
            close_codes: HashMap::new(),
            next_user: 0,
            started: Instant::now(),
            opened: 0.0,
            refusals: HashMap::new(),
            first_refusal_ms: None,
            per_second: Vec::new(),
            seeding: Seeding::default(),
            scratch: vec![0; SCRATCH],
            inflated: Vec::new(),
            inflater: flate2::Decompress::new(false),
            exp: now_us() / 1_000_000 + 3600,
            tokens: cfg
                .tokens_file
                .as_deref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .map(|t| {
                    t.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            cfg,
        })
    }

    /// The local address a user's connections bind to, if any.
    fn source(&self, user: u64) -> Option<IpAddr> {
        let n = self.cfg.source_addrs.len() as u64;
        if n > 0 {
            return Some(self.cfg.source_addrs[(user % n) as usize]);
        }
        let k = self.cfg.sources as u64;
        (k > 0).then(|| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (user % k) as u8)))
    }

    fn open(&mut self, user: u64, courses: Vec<u32>) {
        let dst = SocketAddr::new(self.cfg.host, self.cfg.port);
        let sock = match connect_from(self.source(user), dst, self.cfg.churn) {
            Ok(s) => s,
            Err(_) => {
                self.c.failed += 1;
                self.retry(user, None, None, None, None);
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
                self.retry(user, None, None, None, None);
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
            self.retry(user, None, None, None, None);
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
            hint_at: None,
        });
    }

    /// Schedules the next attempt of `user` the way the page does; `opened`:
    /// the lost connection had been upgraded.
    fn retry(
        &mut self,
        user: u64,
        opened: Option<Instant>,
        code: Option<u16>,
        hint_at: Option<Instant>,
        retry_after_s: Option<u64>,
    ) {
        if self.cfg.churn {
            return;
        }
        let now = Instant::now();
        let rng = &mut self.rng;
        let Some(v) = self.viewers.get_mut(user as usize) else {
            return;
        };
        if let Some(at) = opened {
            if now.duration_since(at) >= Duration::from_millis(page::STABLE_MS) {
                v.attempt = 0;
            }
        }
        let mut backoff = || {
            let ceiling = page::BACKOFF_CAP_MS.min(page::BACKOFF_BASE_MS << v.attempt.min(16));
            v.attempt = (v.attempt + 1).min(20);
            rng.u64(0..ceiling.max(1))
        };
        let delay = if let Some(at) = hint_at {
            at.saturating_duration_since(now).as_millis() as u64
        } else if matches!(code, Some(1012 | 4001)) {
            rng.u64(page::PROMPT_MS.0..page::PROMPT_MS.1)
        } else {
            let d = backoff();
            match retry_after_s {
                Some(s) if opened.is_none() => d.max(s * 1000 + rng.u64(0..1000)),
                _ => d,
            }
        };
        self.pending
            .push((now + Duration::from_millis(delay), user));
    }

    /// A viewer's connection went away (closed, refused, failed).
    fn lost(&mut self, user: u64, was_open: bool) {
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

    /// Ends `user`'s blind interval if its board holds the reference it needs.
    fn check_recovered(&mut self, idx: usize) {
        let Some(conn) = self.conns[idx].as_ref() else {
            return;
        };
        let Some(v) = self.viewers.get_mut(conn.user as usize) else {
            return;
        };
        let Some(since) = v.blind_since else {
            return;
        };
        if v.need > self.refs.len() || conn.boards.iter().all(Vec::is_empty) {
            return;
        }
        if v.need > 0 {
            let refs = &self.refs[v.need - 1];
            let ok = conn.courses.iter().zip(&conn.boards).all(|(&c, board)| {
                let want = refs.get(c as usize).map_or(&[][..], Vec::as_slice);
                want.iter().enumerate().all(|(s, &ver)| {
                    ver == 0
                        || board
                            .binary_search_by_key(&(s as u32), |e| e.0)
                            .is_ok_and(|i| board[i].1 >= ver)
                })
            });
            if !ok {
                return;
            }
        }
        v.blind_since = None;
        self.intervals.push((since, now_us() / 1000));
        self.c.blind -= 1;
        self.c.recovered += 1;
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns[idx].take() {
            let _ = self.poll.registry().deregister(&mut c.io.sock);
            match c.phase {
                Phase::Open => self.c.open -= 1,
                _ => self.c.connecting -= 1,
            }
            self.free.push(idx);
        }
    }

    fn refused(&mut self, idx: usize, status: u16, retry_after_s: Option<u64>) {
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
        self.retry(user, None, None, None, retry_after_s);
    }

    /// A readiness event for connection `idx`; `closed`: the peer hung up
    /// (or the socket failed), so read until the end shows.
    fn handle(&mut self, idx: usize, closed: bool) {
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if conn.phase == Phase::Connecting && !self.connected(idx) {
            return;
        }
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if conn.io.wants_write(&conn.wbuf) && conn.io.send(&mut conn.wbuf).is_err() {
            self.fail_io(idx, None);
            return;
        }
        self.read(idx, closed);
    }

    /// A connect that finished (or failed): queues the upgrade request;
    /// false when the connection is not (yet) usable.
    fn connected(&mut self, idx: usize) -> bool {
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
            self.retry(user, None, None, None, None);
            return false;
        }
        conn.phase = Phase::Handshake;
        let courses = std::mem::take(&mut conn.courses);
        let req = self.upgrade_request(user, &courses);
        if let Some(conn) = self.conns[idx].as_mut() {
            conn.courses = courses;
            conn.wbuf.extend_from_slice(req.as_bytes());
        }
        true
    }

    /// The request head of viewer `user` watching `courses`: a WebSocket
    /// upgrade, or `GET /sse?course=...`, with its token or `?user=`.
    fn upgrade_request(&self, user: u64, courses: &[u32]) -> String {
        let name = format!("{}{}-{}", self.cfg.user_prefix, self.cfg.child, user);
        let (auth, query_user) = if self.cfg.auth_none {
            (String::new(), format!("user={name}"))
        } else {
            let token = match self.tokens.len() {
                0 => crate::auth::mint(
                    self.cfg.secret.as_bytes(),
                    &name,
                    shards::Role::Student,
                    self.exp,
                ),
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
        let q = if query_user.is_empty() {
            String::new()
        } else {
            format!("?{query_user}")
        };
        format!(
            "GET {base}/ws{q} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}{offer}\r\n"
        )
    }

    /// Reads what connection `idx` has (to its end when `closed`).
    fn read(&mut self, idx: usize, closed: bool) {
        loop {
            let Some(conn) = self.conns[idx].as_mut() else {
                return;
            };
            let n = match conn.io.read(&mut self.scratch) {
                Ok(0) => {
                    self.fail_io(idx, None);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if let Some(why) = tls_error(&e) {
                        self.c.tls_failed += 1;
                        self.tls_error.get_or_insert_with(|| why.to_string());
                    }
                    self.fail_io(idx, None);
                    return;
                }
            };
            self.c.bytes += n as u64;
            conn.rbuf.extend_from_slice(&self.scratch[..n]);
            if !self.process(idx) {
                return;
            }
            // A short read emptied the socket: epoll (edge-triggered) reports
            // the next bytes as a new event, so no second read just to see
            // EAGAIN (one syscall per frame less). A hang-up is read to the end.
            if n < self.scratch.len() && !closed {
                return;
            }
        }
    }

    /// The connection ended (EOF, error, or a close frame with `code`).
    fn fail_io(&mut self, idx: usize, code: Option<u16>) {
        let Some(conn) = self.conns[idx].as_ref() else {
            return;
        };
        let (user, phase, opened, hint) = (conn.user, conn.phase, conn.opened_at, conn.hint_at);
        if phase == Phase::Open {
            self.c.closed_by_server += 1;
            *self.close_codes.entry(code.unwrap_or(1006)).or_default() += 1;
        } else {
            self.c.failed += 1;
        }
        self.close(idx);
        self.lost(user, phase == Phase::Open);
        self.retry(user, opened, code, hint, None);
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
                pos = end;
                if !self.on_head(idx, &rbuf[..end]) {
                    break 'outer false;
                }
            }
            if self.cfg.sse {
                pos += self.sse_events(idx, &rbuf[pos..]);
                break 'outer true;
            }
            let (used, alive) = self.ws_frames(idx, &rbuf[pos..]);
            pos += used;
            alive
        };
        if alive {
            rbuf.drain(..pos);
            if let Some(c) = self.conns[idx].as_mut() {
                c.rbuf = rbuf;
            }
        }
        alive
    }

    /// The answer's head to the upgrade (or SSE request): refused, a churn
    /// viewer leaving, or open and watching; false if the connection went away.
    fn on_head(&mut self, idx: usize, head: &[u8]) -> bool {
        let status = parse_status(head);
        if status != if self.cfg.sse { 200 } else { 101 } {
            self.refused(idx, status, retry_after(head));
            return false;
        }
        self.c.upgrades += 1;
        if let Some(c) = self.conns[idx].as_ref() {
            self.connect
                .record(c.started_at.elapsed().as_micros() as u64);
        }
        let sec = self.started.elapsed().as_secs() as usize;
        if self.per_second.len() <= sec {
            self.per_second.resize(sec + 1, 0);
        }
        self.per_second[sec] += 1;
        if self.cfg.churn {
            // Two of three leave with a close frame and a FIN, the
            // third drops the socket (RST, SO_LINGER 0).
            if self.c.upgrades % 3 != 0 {
                if let Some(conn) = self.conns[idx].as_mut() {
                    say_goodbye(conn);
                }
            }
            self.close(idx);
            return false;
        }
        self.c.connecting -= 1;
        self.c.open += 1;
        let Some(conn) = self.conns[idx].as_mut() else {
            return false;
        };
        conn.phase = Phase::Open;
        conn.opened_at = Some(Instant::now());
        if self.cfg.watch && !self.cfg.sse {
            let now = now_us();
            for &c in &conn.courses {
                self.seeding.watched(c, now);
                let course = &self.cfg.courses[c as usize];
                let watch = format!("{{\"op\":\"watch\",\"course\":\"{course}\"}}");
                let frame = client_frame(true, opcode::TEXT, watch.as_bytes(), mask());
                conn.wbuf.extend_from_slice(&frame);
            }
            flush(conn);
        }
        true
    }

    /// Handles the whole WebSocket frames in `buf`: the bytes consumed, and
    /// false if the connection went away (a close frame).
    fn ws_frames(&mut self, idx: usize, buf: &[u8]) -> (usize, bool) {
        let mut pos = 0;
        loop {
            let frame = match read_server_frame(&buf[pos..]) {
                Ok(Some(frame)) => frame,
                Ok(None) => return (pos, true),
                Err(_) => {
                    self.c.errors += 1;
                    self.fail_io(idx, None);
                    return (pos, false);
                }
            };
            let payload = frame.payload;
            match frame.opcode {
                opcode::TEXT | opcode::CONT if frame.rsv1 => {
                    self.c.compressed += 1;
                    match inflate(&mut self.inflater, payload, &mut self.inflated) {
                        Some(()) => {
                            let text = std::mem::take(&mut self.inflated);
                            self.on_text(idx, &text);
                            self.inflated = text;
                        }
                        None => self.c.errors += 1,
                    }
                }
                opcode::TEXT | opcode::CONT => self.on_text(idx, payload),
                opcode::PING => {
                    let pong = client_frame(true, opcode::PONG, payload, mask());
                    if let Some(c) = self.conns[idx].as_mut() {
                        c.wbuf.extend_from_slice(&pong);
                        flush(c);
                    }
                }
                opcode::CLOSE => {
                    self.fail_io(idx, frame.close_code());
                    return (pos, false);
                }
                _ => {}
            }
            pos += frame.len;
        }
    }

    /// Handles the whole events in `buf` (`event: T\ndata: JSON\n\n`, and
    /// comments); returns the bytes consumed.
    fn sse_events(&mut self, idx: usize, buf: &[u8]) -> usize {
        let mut pos = 0;
        while let Some(end) = buf[pos..].windows(2).position(|w| w == b"\n\n") {
            let block = &buf[pos..pos + end];
            pos += end + 2;
            for line in block.split(|&b| b == b'\n') {
                if let Some(json) = line.strip_prefix(b"data: ") {
                    self.on_text(idx, json);
                }
            }
        }
        pos
    }

    fn on_text(&mut self, idx: usize, payload: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Msg>(payload) else {
            self.c.errors += 1;
            return;
        };
        match msg.ty {
            "frame" => {}
            "reconnect" => {
                self.c.hints += 1;
                if let Some(c) = self.conns[idx].as_mut() {
                    let after = msg.after_ms.unwrap_or(0);
                    c.hint_at = Some(Instant::now() + Duration::from_millis(after));
                }
                return;
            }
            "presence" => {
                self.c.presence += 1;
                return;
            }
            "error" => {
                self.c.errors += 1;
                return;
            }
            "hello" => {
                self.c.tick_ms = self.c.tick_ms.max(msg.tick_ms.unwrap_or(0));
                return;
            }
            _ => return,
        }
        self.on_frame(idx, &msg);
    }

    /// A `frame` merged into the viewer's board of its course, each newer
    /// section of a live (not `full`) frame timed from its publish time.
    fn on_frame(&mut self, idx: usize, msg: &Msg) {
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        let courses = &self.cfg.courses;
        let Some(k) = conn
            .courses
            .iter()
            .position(|&c| msg.course == Some(courses[c as usize].as_str()))
        else {
            self.c.errors += 1;
            return;
        };
        let board = &mut conn.boards[k];
        self.c.frames += 1;
        let now = now_us();
        self.seeding
            .frame(conn.courses[k], msg.full, now, self.c.open);
        if msg.full {
            self.c.full_frames += 1;
            board.clear();
        }
        let survivor = self
            .viewers
            .get(conn.user as usize)
            .is_none_or(|v| !v.moved);
        let mut phase = if self.phase == "during" && !survivor {
            None
        } else {
            // Not `entry(self.phase.clone())`: no String per frame.
            if !self.phases.contains_key(&self.phase) {
                self.phases.insert(self.phase.clone(), Hist::default());
            }
            self.phases.get_mut(&self.phase)
        };
        let lat_iv = &mut self.lat_iv;
        let version_ts = self.cfg.version_ts;
        let sent_at = |s: &Sec| {
            s.seat_info.as_ref().and_then(|i| i.t).or_else(|| {
                (version_ts && s.version.is_some()).then(|| s.version.unwrap_or(0) / 1000 * 1000)
            })
        };
        let mut record = |lat: &mut Hist, d: u64| {
            lat.record(d);
            lat_iv.record(d);
            if let Some(h) = phase.as_mut() {
                h.record(d);
            }
        };
        for s in &msg.sections {
            self.c.sections += 1;
            let v = s.version.unwrap_or(0);
            match board.binary_search_by_key(&s.section, |e| e.0) {
                Ok(i) => {
                    if v > board[i].1 || (v == 0 && board[i].1 == 0) {
                        if !msg.full {
                            if let Some(t) = sent_at(s) {
                                record(&mut self.lat, now.saturating_sub(t));
                            }
                        }
                        board[i] = (s.section, v, s.seats_taken);
                    }
                }
                Err(i) => {
                    if !msg.full {
                        if let Some(t) = sent_at(s) {
                            record(&mut self.lat, now.saturating_sub(t));
                        }
                    }
                    board.insert(i, (s.section, v, s.seats_taken));
                }
            }
        }
        self.check_recovered(idx);
    }

    /// A stdin command other than `mark`/`report`.
    fn command(&mut self, cmd: &str) {
        let (word, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
        match word {
            "arm" => self.armed = true,
            "lat" => self.phase = rest.trim().to_owned(),
            "ref" => {
                let Ok(r) = serde_json::from_str::<Vec<Vec<u64>>>(rest) else {
                    return;
                };
                self.refs.push(r);
                for idx in 0..self.conns.len() {
                    if self.conns[idx]
                        .as_ref()
                        .is_some_and(|c| c.phase == Phase::Open)
                    {
                        self.check_recovered(idx);
                    }
                }
            }
            "drop" => self.drop_all(),
            "blind" => {
                self.armed = true;
                let need = self.refs.len() + 1;
                let now = now_us() / 1000;
                for v in &mut self.viewers {
                    if v.blind_since.is_none() {
                        v.blind_since = Some(now);
                        self.c.blind += 1;
                    }
                    v.need = v.need.max(need);
                }
            }
            _ => {}
        }
    }

    /// Every open connection reset at once; each viewer is blind and comes
    /// back the way the page does after a lost connection.
    fn drop_all(&mut self) {
        self.armed = true;
        self.refusals.clear();
        for idx in 0..self.conns.len() {
            let Some(c) = self.conns[idx].as_ref() else {
                continue;
            };
            if c.phase != Phase::Open {
                continue;
            }
            let (user, opened) = (c.user, c.opened_at);
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: setsockopt on a socket we own, with a `linger` value.
            unsafe {
                libc::setsockopt(
                    c.io.sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    &linger as *const libc::linger as *const libc::c_void,
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
            self.close(idx);
            self.lost(user, true);
            self.retry(user, opened, None, None, None);
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
                let (_, user) = self.pending.swap_remove(i);
                let courses = self
                    .viewers
                    .get(user as usize)
                    .map(|v| v.courses.clone())
                    .unwrap_or_default();
                self.c.reconnects += 1;
                self.open(user, courses);
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
            let courses = self.pick_courses();
            let user = self.next_user;
            self.next_user += 1;
            self.opened += 1.0;
            if !self.cfg.churn {
                self.viewers.push(Viewer {
                    courses: courses.clone(),
                    attempt: 0,
                    blind_since: None,
                    need: 0,
                    moved: false,
                });
            }
            self.open(user, courses);
        }
    }

    /// 1..=max_courses distinct courses, each Zipf-drawn.
    fn pick_courses(&mut self) -> Vec<u32> {
        let want = self.rng.u32(1..=self.cfg.max_courses.max(1)) as usize;
        let want = want.min(self.cfg.courses.len().max(1));
        let mut out = Vec::with_capacity(want);
        for _ in 0..want * 8 {
            let c = zipf_pick(&self.cdf, &mut self.rng) as u32;
            if !out.contains(&c) {
                out.push(c);
            }
            if out.len() == want {
                break;
            }
        }
        out
    }

    fn counters_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.c).unwrap_or_default()
    }

    /// A progress value: counters, refusals so far, latency since the last one.
    fn progress(&mut self) -> serde_json::Value {
        let refusals: Vec<[u64; 2]> = self.refusals.iter().map(|(&s, &n)| [s as u64, n]).collect();
        let lat = std::mem::take(&mut self.lat_iv).to_json();
        serde_json::json!({ "p": self.counters_json(), "r": refusals, "l": lat })
    }

    /// Every open WebSocket sends a close 1000 and a FIN.
    fn goodbye(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            if c.phase == Phase::Open && !self.cfg.sse {
                say_goodbye(c);
            }
        }
    }

    fn report(&self) -> serde_json::Value {
        let mut digests: HashMap<(u32, u64), u64> = HashMap::new();
        for c in self.conns.iter().flatten() {
            if c.phase == Phase::Open {
                for (&course, board) in c.courses.iter().zip(&c.boards) {
                    *digests.entry((course, digest(board))).or_default() += 1;
                }
            }
        }
        let digests: Vec<[u64; 3]> = digests
            .into_iter()
            .map(|((c, d), n)| [c as u64, d, n])
            .collect();
        let refusals: Vec<[u64; 2]> = self.refusals.iter().map(|(&s, &n)| [s as u64, n]).collect();
        let phases: serde_json::Map<String, serde_json::Value> = self
            .phases
            .iter()
            .map(|(k, h)| (k.clone(), h.to_json()))
            .collect();
        let still_blind: Vec<u64> = self.viewers.iter().filter_map(|v| v.blind_since).collect();
        let close_codes: Vec<[u64; 2]> = self
            .close_codes
            .iter()
            .map(|(&c, &n)| [c as u64, n])
            .collect();
        serde_json::json!({
            "intervals": self.intervals,
            "still_blind": still_blind,
            "phases": phases,
            "close_codes": close_codes,
            "counters": self.counters_json(),
            "latency": self.lat.to_json(),
            "connect": self.connect.to_json(),
            "digests": digests,
            "refusals": refusals,
            "first_refusal_ms": self.first_refusal_ms,
            "tls_error": self.tls_error,
            "per_second": self.per_second,
            "seeding": self.seeding.to_json(),
        })
    }
}

/// Raw inflate of one permessage-deflate message into `out`, with the
/// context reset first (the server keeps none between messages either).
fn inflate(d: &mut flate2::Decompress, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    d.reset(false);
    out.clear();
    out.reserve(payload.len() * 4 + 64);
    for input in [payload, &[0, 0, 0xff, 0xff][..]] {
        let mut pos = 0;
        while pos < input.len() {
            let before = (d.total_in(), d.total_out());
            d.decompress_vec(&input[pos..], out, flate2::FlushDecompress::Sync)
                .ok()?;
            pos += (d.total_in() - before.0) as usize;
            if (d.total_in(), d.total_out()) == before {
                if out.len() < out.capacity() {
                    return None; // stuck with room to spare: not a deflate message
                }
                out.reserve(out.capacity().max(256));
            }
        }
    }
    Some(())
}

fn mask() -> [u8; 4] {
    [0x12, 0x34, 0x56, 0x78]
}

fn flush(conn: &mut Conn) {
    if conn.wbuf.is_empty() || conn.phase == Phase::Connecting {
        return;
    }
    let _ = conn.io.send(&mut conn.wbuf);
}

/// A client close frame (1000) and a FIN instead of the churn socket's RST.
fn say_goodbye(conn: &mut Conn) {
    let frame = client_frame(true, opcode::CLOSE, &1000u16.to_be_bytes(), mask());
    conn.wbuf.extend_from_slice(&frame);
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

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// A response head's `Retry-After` in whole seconds.
fn retry_after(head: &[u8]) -> Option<u64> {
    std::str::from_utf8(head).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("retry-after")
            .then(|| v.trim().parse().ok())?
    })
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

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A child process's main: runs until `report`, stdin EOF or `max_secs`.
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
    run_with(cfg, rx, emit);
}

/// The load generator on this thread: commands from `rx` (as the stdin lines),
/// answers and progress to `out`; returns after the report.
pub fn run_with(cfg: Config, rx: mpsc::Receiver<String>, mut out: impl FnMut(serde_json::Value)) {
    let deadline = Instant::now() + Duration::from_secs(cfg.max_secs);
    let mut g = match Gen::new(cfg) {
        Ok(g) => g,
        Err(e) => {
            out(serde_json::json!({ "report": { "error": e.to_string() } }));
            return;
        }
    };
    let mut events = Events::with_capacity(4096);
    let mut next_progress = Instant::now();
    let mut busy_us = 0u128;
    let mut awake = Instant::now();
    loop {
        busy_us += awake.elapsed().as_micros();
        g.c.busy_ms = (busy_us / 1000) as u64;
        if let Err(e) = g.poll.poll(&mut events, Some(Duration::from_millis(10))) {
            if e.kind() != ErrorKind::Interrupted {
                out(serde_json::json!({ "report": { "error": e.to_string() } }));
                return;
            }
        }
        awake = Instant::now();
        let ready: Vec<(usize, bool)> = events
            .iter()
            .map(|e| (e.token().0, e.is_read_closed() || e.is_error()))
            .collect();
        for (idx, closed) in ready {
            g.handle(idx, closed);
        }
        g.start_new();
        let now = Instant::now();
        if now >= next_progress {
            next_progress = now + Duration::from_millis(500);
            out(g.progress());
        }
        let mut stop = now >= deadline;
        while let Ok(cmd) = rx.try_recv() {
            match cmd.as_str() {
                "mark" => out(serde_json::json!({ "mark": g.counters_json() })),
                "report" | "eof" => stop = true,
                other => g.command(other),
            }
        }
        if stop {
            out(serde_json::json!({ "report": g.report() }));
            if g.cfg.goodbye {
                g.goodbye();
            }
            return;
        }
    }
}
