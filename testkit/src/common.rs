//! Test harness: free ports, `redis-server` and `seatboard` processes owned by
//! the test (killed on drop), a raw HTTP client and a WebSocket client.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The HS256 secret of tests that run `--auth jwt` (`serve` refuses one under 32 bytes).
pub const TEST_SECRET: &str = "seatboard-test-secret-0123456789abcdef";

/// Where [`free_port`] hands out ports: below Linux's ephemeral range
/// (32768-60999), so no test's outgoing connection takes a port as its
/// source while a node restarting on that port is between two binds.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port nobody listens on right now, and one no other caller in this
/// process was given (ports go round [`TEST_PORTS`], from a start that
/// differs between processes).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    if NEXT.load(Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(7919) % span;
        let _ = NEXT.compare_exchange(u32::MAX, seed, Relaxed, Relaxed);
    }
    for _ in 0..span {
        let p = TEST_PORTS.start + (NEXT.fetch_add(1, Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in {TEST_PORTS:?}")
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `redis-server` on `port` (no persistence) with `extra` flags and waits
/// until it accepts connections.
pub fn spawn_redis(port: u16, extra: &[&str]) -> Child {
    try_spawn_redis(port, extra)
        .unwrap_or_else(|| panic!("redis-server did not come up on port {port} (taken?)"))
}

/// Starts `redis-server` on `port` and waits until that very process listens
/// there; `None` if it exits first (the port is taken: a free port from
/// [`free_port`] can be bound by another test in between, and a bare connect
/// would then reach that test's server instead).
pub fn try_spawn_redis(port: u16, extra: &[&str]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (the README's test command installs it)");
    let up = wait_for(Duration::from_secs(10), || {
        if child.try_wait().ok().flatten().is_some() {
            return Some(false);
        }
        listens_on(child.id(), port).then_some(true)
    });
    if up == Some(true) {
        return Some(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Whether process `pid` holds the listening TCP socket on 127.0.0.1:`port`
/// (its inode in `/proc/net/tcp` is one of the process's descriptors).
fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: Vec<String> = loopback_tcp()
        .into_iter()
        .filter(|s| s.local_port == port && s.state == 0x0A) // LISTEN
        .map(|s| format!("socket:[{}]", s.inode))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|t| inodes.iter().any(|i| t.to_string_lossy() == *i))
    })
}

/// One IPv4 TCP socket on 127.0.0.1, as `/proc/net/tcp` lists it.
pub struct TcpRow {
    pub local_port: u16,
    pub remote_port: u16,
    /// `st`: 0x01 established, 0x0A listen, ...
    pub state: u8,
    /// Bytes the kernel holds to send (`tx_queue`).
    pub tx_queue: u64,
    pub inode: String,
}

/// The machine's TCP sockets whose local address is 127.0.0.1 (`/proc/net/tcp`).
pub fn loopback_tcp() -> Vec<TcpRow> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = |addr: &str| {
        let (_, p) = addr.split_once(':')?;
        u16::from_str_radix(p, 16).ok()
    };
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f.get(1)?.starts_with("0100007F:") {
                return None;
            }
            let (tx, _) = f.get(4)?.split_once(':')?;
            Some(TcpRow {
                local_port: port(f.get(1)?)?,
                remote_port: port(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                tx_queue: u64::from_str_radix(tx, 16).ok()?,
                inode: f.get(9)?.to_string(),
            })
        })
        .collect()
}

/// A `redis-server` on a free port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start() -> Redis {
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = try_spawn_redis(port, &[]) {
                return Redis {
                    port,
                    child: Some(child),
                };
            }
        }
        panic!("redis-server did not come up on 5 free ports");
    }

    pub fn uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port.
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Starts (again) on the same port with `extra` flags (`--dir D` loads
    /// the dump a `SAVE` wrote there: a restart that keeps the data).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.child = Some(spawn_redis(self.port, extra));
    }

    /// Whether the server runs (not killed since its last start).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs a command and returns redis-cli's raw output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `seatboard` process, killed on drop.
pub struct Seatboard {
    pub port: u16,
    pub child: Child,
}

/// The binary under test: `SEATBOARD_BIN` if set (e.g. a cross-built arm64
/// binary), else the one cargo built with the running test or bench binary
/// (`target/<profile>/seatboard`, beside its `deps/`).
pub fn bin() -> String {
    std::env::var("SEATBOARD_BIN").unwrap_or_else(|_| built_bin().display().to_string())
}

/// The `seatboard` cargo built in the profile of the running binary (a test
/// or bench in `target/<profile>/deps/`); what `CARGO_BIN_EXE_seatboard`
/// names in the tests themselves.
pub fn built_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary in target/<profile>/deps");
    profile.join(format!("seatboard{}", std::env::consts::EXE_SUFFIX))
}

/// `seatboard publish` of one section (`taken` of `total` seats) into the
/// Redis at `uri`, as the selection API would; panics unless it exits 0.
pub fn publish_section(uri: &str, course: &str, section: &str, total: &str, taken: &str) {
    let st = seatboard_command()
        .args(["publish", "--redis", uri, "--course", course])
        .args(["--section", section, "--total", total, "--taken", taken])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("seatboard publish");
    assert!(st.success(), "publish {course} {section} {taken}/{total}");
}

/// A command running the binary under test, through `SEATBOARD_BIN_WRAPPER`
/// (e.g. `qemu-aarch64-static -L /usr/aarch64-linux-gnu`) when set.
pub fn seatboard_command() -> Command {
    match std::env::var("SEATBOARD_BIN_WRAPPER") {
        Ok(w) if !w.trim().is_empty() => {
            let mut parts = w.split_whitespace();
            let mut c = Command::new(parts.next().unwrap_or("env"));
            c.args(parts).arg(bin());
            c
        }
        _ => Command::new(bin()),
    }
}

impl Seatboard {
    /// Starts `seatboard <args> --listen 127.0.0.1:<free port>` and waits for `/healthz`.
    pub fn start(args: &[&str]) -> Seatboard {
        Self::start_env(args, &[])
    }

    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Seatboard {
        let port = free_port();
        let child = seatboard_command()
            .args(args)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--log-level",
                "warn",
            ])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn seatboard");
        let sb = Seatboard { port, child };
        wait_for(Duration::from_secs(15), || {
            http_get(port, "/healthz").ok().filter(|r| r.status == 200)
        })
        .expect("seatboard did not answer /healthz");
        sb
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal (e.g. libc::SIGTERM).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for exit; None if still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        wait_for(timeout, || self.child.try_wait().ok().flatten())
    }

    pub fn metrics(&self) -> String {
        http_get(self.port, "/metrics")
            .map(|r| r.body)
            .unwrap_or_default()
    }

    /// The value of one metric line, e.g. `seatboard_frames_sent_total`.
    pub fn metric(&self, name_with_labels: &str) -> f64 {
        metric_value(&self.metrics(), name_with_labels)
    }
}

impl Drop for Seatboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sums the lines of `text` whose name-and-labels start with `prefix`.
pub fn metric_value(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == prefix || (k.starts_with(prefix) && prefix.ends_with('{')))
                .then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends raw bytes and reads the whole response (the server closes after it).
pub fn http_raw(port: u16, request: &[u8]) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<HttpResponse> {
    let text = String::from_utf8_lossy(buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response: {text:?}")))?;
    let headers = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_string(),
    })
}

pub fn http_get(port: u16, path: &str) -> std::io::Result<HttpResponse> {
    http_raw(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
}

pub type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// Opens a WebSocket to `path` (with its query) on `port`.
pub fn ws_connect(port: u16, path: &str) -> Result<Ws, tungstenite::Error> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(tungstenite::Error::Io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(tungstenite::Error::Io)?;
    let (ws, _) = tungstenite::client(
        format!("ws://127.0.0.1:{port}{path}"),
        MaybeTlsStream::Plain(stream),
    )
    .map_err(|e| match e {
        tungstenite::HandshakeError::Failure(e) => e,
        tungstenite::HandshakeError::Interrupted(_) => tungstenite::Error::ConnectionClosed,
    })?;
    Ok(ws)
}

/// Reads the next JSON text message (skipping pings), or None on close/timeout.
pub fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return serde_json::from_str(&t).ok(),
            Ok(Message::Ping(_)) | Ok(Message::Pong(_)) => continue,
            _ => return None,
        }
    }
}

/// Reads until a message with `"type": ty` arrives (within `timeout`).
pub fn next_of_type(ws: &mut Ws, ty: &str, timeout: Duration) -> Option<Value> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let v = next_json(ws)?;
        if v["type"] == ty {
            return Some(v);
        }
    }
    None
}

pub fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).expect("send");
}

/// A client's merged view of one course: section -> section object.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Board(pub BTreeMap<u64, Value>);

impl Board {
    /// Applies a frame: `full` replaces, otherwise upserts.
    pub fn apply(&mut self, frame: &Value) {
        if frame["full"] == true {
            self.0.clear();
        }
        for s in frame["sections"].as_array().into_iter().flatten() {
            if let Some(id) = s["section"].as_u64() {
                self.0.insert(id, s.clone());
            }
        }
    }

    pub fn version(&self, section: u64) -> u64 {
        self.0
            .get(&section)
            .and_then(|s| s["version"].as_u64())
            .unwrap_or(0)
    }
}

/// Wake-ups so far of the threads of `pid` whose name starts with `name`:
/// their voluntary context switches (`/proc/<pid>/task/*/status`), each a
/// sleep that something ended (preemptions are not counted).
pub fn thread_wakeups(pid: i32, name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(name))
        })
        .flat_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// `seats_taken` of `section` in a frame or an answer (its `sections` list).
pub fn seats_taken(frame: &Value, section: u64) -> Option<u64> {
    frame["sections"]
        .as_array()?
        .iter()
        .find(|s| s["section"] == section)?["seats_taken"]
        .as_u64()
}

/// The node's `/healthz` JSON.
pub fn healthz_json(port: u16) -> Value {
    serde_json::from_str(&http_get(port, "/healthz").expect("healthz").body).expect("healthz json")
}
