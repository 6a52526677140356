//! The floor: the least any sender can spend to fan a frame out on this box.
//! A child process (the bench binary re-executed as `__floor <json>`) accepts
//! the load generator's connections (answering each upgrade with a canned
//! `101`), then, with no event loop, every interval writes one pre-built
//! WebSocket frame to every connection with a plain non-blocking `write(2)`.
//! Its CPU per delivered frame is what the kernel's loopback TCP path costs;
//! `fanout` and `compare` report the server's CPU per frame as a ratio to it.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What the floor child does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    /// Port to listen on (127.0.0.1).
    pub port: u16,
    /// Connections to accept before sending.
    pub clients: usize,
    /// One frame to every connection this often.
    pub interval_ms: u64,
    /// The whole frame, header included.
    pub frame: Vec<u8>,
    /// Stop by itself after this many seconds.
    pub max_secs: u64,
}

/// A course frame for course `HOT` of exactly `wire_bytes` on the wire (at
/// least a minimal frame), padded inside `seat_info` so clients parse it.
pub fn frame_of_size(wire_bytes: usize) -> Vec<u8> {
    let head = r#"{"type":"frame","course":"HOT","full":false,"sections":[{"section":0,"total_seats":50,"seats_taken":1,"seat_info":{"pad":""#;
    let tail = r#""},"version":1}]}"#;
    let bare = head.len() + tail.len();
    // Payload length for that wire size: a 2-byte header up to 125 B, else 4.
    let payload = if wire_bytes <= 127 {
        wire_bytes.saturating_sub(2)
    } else {
        wire_bytes - 4
    };
    let text = format!("{head}{}{tail}", "x".repeat(payload.saturating_sub(bare)));
    shards::ws_codec::text_frame(&text).to_vec()
}

/// Runs the floor child: accept, then write until killed or `max_secs`.
pub fn run(cfg: Config) {
    let listener = TcpListener::bind(("127.0.0.1", cfg.port)).expect("floor: bind");
    println!("{{\"listening\":true}}");
    let _ = std::io::stdout().flush();
    let started = Instant::now();
    let end = started + Duration::from_secs(cfg.max_secs);
    let mut socks = Vec::with_capacity(cfg.clients);
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while socks.len() < cfg.clients && Instant::now() < end {
        let Ok((mut s, _)) = listener.accept() else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        head.clear();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let ok = s
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
            .is_ok();
        if ok && s.set_nonblocking(true).is_ok() {
            socks.push(s);
        }
    }
    let fds: Vec<i32> = socks.iter().map(|s| s.as_raw_fd()).collect();
    let frame = cfg.frame;
    let interval = Duration::from_millis(cfg.interval_ms.max(1));
    let mut next = Instant::now();
    while Instant::now() < end {
        for &fd in &fds {
            // SAFETY: `fd` belongs to a socket in `socks`, open for the whole
            // loop; the buffer is a live slice of the given length.
            unsafe { libc::write(fd, frame.as_ptr().cast(), frame.len()) };
        }
        next += interval;
        match next.checked_duration_since(Instant::now()) {
            Some(d) => std::thread::sleep(d),
            None => next = Instant::now(),
        }
    }
    drop(socks);
}
