//! One viewer loop's state: its connections, its viewers, what they saw.
//! Its methods are spread by role: `connect.rs` (opening, reconnecting),
//! `read.rs` (bytes in), `frames.rs` (messages in), `commands.rs` (the
//! rehearsal's commands, new viewers), `outputs.rs` (progress and report).

mod commands;
mod connect;
mod frames;
mod outputs;
mod read;

use crate::config::Config;
use crate::counters::Counters;
use crate::hist::Hist;
use crate::recovery::Viewer;
use crate::seeding::Seeding;
use crate::transport::{Tls, Transport};
use crate::{board::zipf_cdf, now_us, ws};
use mio::Poll;
use std::collections::HashMap;
use std::time::Instant;

#[derive(PartialEq, Eq, Clone, Copy)]
pub(crate) enum Phase {
    Connecting,
    Handshake,
    Open,
}

pub(crate) struct Conn {
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
    /// Its first full frame came (timed into `Gen::first_board` once).
    had_board: bool,
    /// A `reconnect` hint: come back at this moment.
    hint_at: Option<Instant>,
    /// Per watched course, the merged state: (section, version,
    /// seats_taken), sorted by section.
    boards: Vec<Vec<(u32, u64, u32)>>,
}

/// One viewer loop: thousands of viewers on one `epoll`.
pub(crate) struct Gen {
    pub(crate) cfg: Config,
    pub(crate) poll: Poll,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    pub(crate) c: Counters,
    lat: Hist,
    /// Latency since the last progress value.
    lat_iv: Hist,
    /// Connect to upgrade (or SSE head), µs.
    connect: Hist,
    /// Connect to the connection's first full frame, µs.
    first_board: Hist,
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
    /// Reads the server frames (taken out while a buffer is read).
    ws: Option<ws::Reader>,
    exp: u64,
    /// The lines of `tokens_file`.
    tokens: Vec<String>,
    /// TLS to an `https://` target.
    tls: Option<Tls>,
    /// The first TLS failure, in words.
    tls_error: Option<String>,
}

/// Bytes one read takes at most.
const SCRATCH: usize = 256 * 1024;

impl Gen {
    /// A loop on `cfg`, nothing opened yet.
    pub(crate) fn new(cfg: Config) -> std::io::Result<Gen> {
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
            first_board: Hist::default(),
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
            ws: Some(ws::Reader::default()),
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

    /// Forgets connection `idx` (its socket closes when dropped).
    pub(crate) fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns[idx].take() {
            let _ = self.poll.registry().deregister(&mut c.io.sock);
            match c.phase {
                Phase::Open => self.c.open -= 1,
                _ => self.c.connecting -= 1,
            }
            self.free.push(idx);
        }
    }
}
