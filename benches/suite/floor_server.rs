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

/// Starts this bench binary again as a floor child (`mode`: `__floor` or
/// `__connect_floor`, see `main`) with `cfg`, and returns once it listens.
pub fn spawn(mode: &str, cfg: &impl Serialize) -> std::process::Child {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .arg(mode)
        .arg(serde_json::to_string(cfg).expect("json"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn floor");
    let mut line = String::new();
    if let Some(so) = child.stdout.take() {
        let _ = std::io::BufReader::new(so).read_line(&mut line);
    }
    child
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

/// What the connect floor does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectConfig {
    /// Port to listen on (127.0.0.1).
    pub port: u16,
    /// Stop by itself after this many seconds.
    pub max_secs: u64,
}

/// One connection of the connect floor: its request head so far, then its
/// frames through the core's client-frame decoder (as the server reads them).
#[derive(Default)]
struct FloorConn {
    buf: Vec<u8>,
    upgraded: bool,
    frames: shards::ws_codec::Decoder,
}

/// Runs the connect floor: the least a server can do for the load
/// generator's connect sequence, on one epoll loop with no runtime, no
/// presence and no Redis. It accepts, answers a request head with a canned
/// `101` and the `hello` in one `write(2)`, and a watch with the course's
/// (empty) full frame and its count in another: the two writes, two reads
/// and one accept a connection cannot do without. Its CPU per connection is
/// what `idle` reports the server's connect phase against.
pub fn run_connect(cfg: ConnectConfig) {
    let listener = TcpListener::bind(("127.0.0.1", cfg.port)).expect("connect floor: bind");
    listener
        .set_nonblocking(true)
        .expect("connect floor: nonblocking");
    let lfd = listener.as_raw_fd();
    // SAFETY: epoll_create1 has no preconditions; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "connect floor: epoll_create1");
    watch_fd(ep, lfd);
    println!("{{\"listening\":true}}");
    let _ = std::io::stdout().flush();
    let hello = shards::server_msg::hello("u0", shards::Role::Student, 200, "floor");
    let mut first = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n".to_vec();
    first.extend_from_slice(&hello);
    let end = Instant::now() + Duration::from_secs(cfg.max_secs);
    let mut conns: Vec<Option<FloorConn>> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 512];
    let mut chunk = [0u8; 4096];
    while Instant::now() < end {
        // SAFETY: `events` is a live buffer of `events.len()` entries.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, 100) };
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as i32;
            if fd == lfd {
                accept_all(ep, lfd, &mut conns);
                continue;
            }
            // SAFETY: `fd` is a socket this loop accepted and has not closed;
            // the buffer is a live slice of its length.
            let got = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
            let Some(Some(conn)) = conns.get_mut(fd as usize) else {
                continue;
            };
            // Nothing there yet, or a signal cut the read short: the
            // level-triggered set reports the socket again.
            let again = got < 0
                && matches!(
                    std::io::Error::last_os_error().kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                );
            if again {
                continue;
            }
            if got <= 0 {
                // The peer closed or reset: forget it (level-triggered epoll
                // would report an errored socket forever).
                conns[fd as usize] = None;
                // SAFETY: closing a socket this loop owns, once.
                unsafe { libc::close(fd) };
                continue;
            }
            if conn.upgraded {
                conn.frames.feed(&chunk[..got as usize]);
            } else {
                conn.buf.extend_from_slice(&chunk[..got as usize]);
                let Some(end) = conn.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                conn.frames.feed(&conn.buf[end + 4..]);
                conn.buf = Vec::new();
                conn.upgraded = true;
                write_fd(fd, &first);
            }
            while let Ok(Some(event)) = conn.frames.next_event() {
                let shards::ws_codec::WsEvent::Text(text) = event else {
                    continue;
                };
                if let Some(course) = watched_course(text.as_bytes()) {
                    let mut answer = shards::server_msg::frame(
                        &course,
                        true,
                        std::iter::empty::<&std::sync::Arc<shards::Snapshot>>(),
                    )
                    .to_vec();
                    answer.extend_from_slice(&shards::server_msg::presence(&course, 1));
                    write_fd(fd, &answer);
                }
            }
        }
    }
}

/// Accepts every connection waiting on `lfd` into the epoll set and `conns`.
fn accept_all(ep: i32, lfd: i32, conns: &mut Vec<Option<FloorConn>>) {
    loop {
        // SAFETY: accepting on a listening socket we own; null address
        // pointers are allowed.
        let c = unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            return;
        }
        watch_fd(ep, c);
        let i = c as usize;
        if conns.len() <= i {
            conns.resize_with(i + 1, || None);
        }
        conns[i] = Some(FloorConn::default());
    }
}

/// Adds `fd` to the epoll set, readable, level-triggered.
fn watch_fd(ep: i32, fd: i32) {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: both descriptors are open; `ev` is a live event.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
}

/// One non-blocking `write(2)` of `bytes` (a few hundred bytes to an empty
/// socket buffer: it does not come back short).
fn write_fd(fd: i32, bytes: &[u8]) {
    // SAFETY: `fd` is an open socket; the buffer is a live slice of its length.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// The course of a `{"op":"watch","course":"…"}` message.
fn watched_course(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    (v["op"] == "watch").then(|| v["course"].as_str().map(str::to_owned))?
}
