//! HAProxy processes owned by a test or bench, running the shipped
//! `systemd/haproxy/seatboard.cfg` with only its `bind` and `server` lines,
//! `maxconn` and the root-only lines replaced. Used by `tests/it/fleet.rs`,
//! `tests/it/browser.rs` and the `fleet` and `soak` benches.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The shipped configuration.
pub fn shipped() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .join("systemd/haproxy/seatboard.cfg");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// How the frontend listens.
pub enum Bind<'a> {
    /// Plain HTTP on 127.0.0.1:port.
    Plain(u16),
    /// TLS on 127.0.0.1:port with this PEM (certificate + key).
    Tls(u16, &'a Path),
}

/// The shipped file with `bind` lines replaced by `bind`, `server` lines by
/// `nodes` (127.0.0.1 ports), `maxconn` set, and the lines that need root
/// (user, group, chroot, daemon, stats socket, log) or a second bind dropped,
/// and the per-source limits too: every client of a test comes from 127.0.0.1.
pub fn render(shipped: &str, bind: &Bind, nodes: &[u16], maxconn: u32) -> String {
    render_as(shipped, bind, nodes, maxconn, false)
}

/// [`render`] keeping the per-source limits (stick table, tracking, deny).
pub fn render_with_source_limits(
    shipped: &str,
    bind: &Bind,
    nodes: &[u16],
    maxconn: u32,
) -> String {
    render_as(shipped, bind, nodes, maxconn, true)
}

/// Whether a line is part of the per-source limits.
fn source_limit(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("stick-table")
        || t.starts_with("tcp-request connection track-sc0")
        || t.contains("sc0_conn")
}

fn render_as(shipped: &str, bind: &Bind, nodes: &[u16], maxconn: u32, limits: bool) -> String {
    let mut out = String::new();
    let mut bound = false;
    let mut servers_done = false;
    for line in shipped.lines() {
        let t = line.trim_start();
        let word = t.split_whitespace().next().unwrap_or("");
        let indent = &line[..line.len() - t.len()];
        if !limits && source_limit(line) {
            continue;
        }
        match word {
            "user" | "group" | "chroot" | "daemon" | "log" => continue,
            "stats" if t.starts_with("stats socket") => continue,
            "maxconn" => out.push_str(&format!("{indent}maxconn {maxconn}\n")),
            "bind" => {
                if !bound {
                    bound = true;
                    match bind {
                        Bind::Plain(p) => out.push_str(&format!("{indent}bind 127.0.0.1:{p}\n")),
                        Bind::Tls(p, pem) => out.push_str(&format!(
                            "{indent}bind 127.0.0.1:{p} ssl crt {} alpn http/1.1\n",
                            pem.display()
                        )),
                    }
                }
            }
            // One bind only: no plain-to-https redirect.
            "http-request" if t.contains("redirect scheme https") => continue,
            "server" => {
                if !servers_done {
                    servers_done = true;
                    for (i, p) in nodes.iter().enumerate() {
                        out.push_str(&format!("{indent}server node{} 127.0.0.1:{p}\n", i + 1));
                    }
                }
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    assert!(
        bound && servers_done,
        "shipped config lost its bind or server lines"
    );
    out
}

/// `config` with HAProxy's log of every request written to stdout (which
/// [`Haproxy`] sends to a file per process): status, termination state,
/// server, retries, connect and response times, date.
pub fn log_to_stdout(config: &str) -> String {
    let mut out = String::new();
    let mut in_defaults = false;
    for line in config.lines() {
        let word = line.split_whitespace().next().unwrap_or("");
        if ["frontend", "backend", "listen"].contains(&word) && in_defaults {
            // The end of `defaults`: override its log format here.
            out.push_str("    log global\n    log-format \"%ST %tsc %s %rc %Tc %Tr %tr\"\n");
            in_defaults = false;
        }
        out.push_str(line);
        out.push('\n');
        match word {
            "global" => out.push_str("    log stdout format raw local0\n"),
            "defaults" => in_defaults = true,
            _ => {}
        }
    }
    out
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A free port below the kernel's ephemeral range, for a process that is
/// restarted on its port: a port in the range may meanwhile be taken as the
/// source port of some outgoing connection.
pub fn stable_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(11000).max(1);
    let mut rng = fastrand::Rng::new();
    for _ in 0..1000 {
        let p = 10000 + rng.u16(0..span);
        if TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    free_port()
}

/// `procs` HAProxy processes sharing one port (HAProxy binds with
/// `SO_REUSEPORT` on Linux; each process holds two descriptors per viewer, so
/// several processes keep each under the open-file limit). Killed on drop.
pub struct Haproxy {
    /// Where the frontend listens.
    pub port: u16,
    children: Vec<Child>,
    /// The rendered configuration file.
    pub config: PathBuf,
}

impl Haproxy {
    /// Writes `config` into `dir`, checks it with `haproxy -c`, starts `procs`
    /// processes and waits until the port accepts.
    pub fn start(dir: &Path, port: u16, config: &str, procs: usize) -> Haproxy {
        std::fs::create_dir_all(dir).expect("haproxy dir");
        let path = dir.join(format!("haproxy-{port}.cfg"));
        std::fs::write(&path, config).expect("write haproxy.cfg");
        let check = Command::new("haproxy")
            .args(["-c", "-q", "-f"])
            .arg(&path)
            .output()
            .expect("haproxy must be installed (tests/run.sh installs it)");
        assert!(
            check.status.success(),
            "haproxy -c refused {}: {}",
            path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
        let mut h = Haproxy {
            port,
            children: Vec::new(),
            config: path,
        };
        for i in 0..procs.max(1) {
            let log = std::fs::File::create(h.log(i)).expect("haproxy log file");
            let child = Command::new("haproxy")
                .args(["-db", "-f"])
                .arg(&h.config)
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("spawn haproxy");
            h.children.push(child);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "haproxy did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        h
    }

    /// Process `i`'s output: warnings (a node going down or up), and each
    /// request when the configuration went through [`log_to_stdout`].
    pub fn log(&self, i: usize) -> PathBuf {
        self.config.with_extension(format!("{i}.log"))
    }

    /// Pids of the processes.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Waits until a plain-HTTP `GET path` through the proxy answers 200
    /// (every process's health checks have seen a node up).
    pub fn wait_ready(&self, path: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut streak = 0;
        while Instant::now() < end {
            if get_status(self.port, path) == Some(200) {
                streak += 1;
                // Several answers in a row: each process (and each check) saw it.
                if streak >= 8 {
                    return true;
                }
            } else {
                streak = 0;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The status of a plain-HTTP `GET path` to 127.0.0.1:port.
pub fn get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: seatboard\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let head = String::from_utf8_lossy(&buf);
    head.split_whitespace().nth(1)?.parse().ok()
}

/// The response head (status line and headers) to a plain-HTTP WebSocket
/// upgrade of `/ws` through 127.0.0.1:port, without a token.
pub fn upgrade_head(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: seatboard\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    Some(head.split("\r\n\r\n").next()?.to_string())
}

/// A header's value in a response head (names compared without case: HAProxy
/// sends them lower-cased).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// A self-signed certificate for `localhost`/127.0.0.1 made with openssl, as
/// one PEM (certificate + key) in `dir`, the form HAProxy's `crt` wants.
pub fn self_signed_pem(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("cert dir");
    let (key, cert, pem) = (
        dir.join("key.pem"),
        dir.join("cert.pem"),
        dir.join("seatboard.pem"),
    );
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl must be installed (tests/run.sh installs it)");
    assert!(
        out.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut both = std::fs::read(&cert).expect("cert");
    both.extend(std::fs::read(&key).expect("key"));
    std::fs::write(&pem, both).expect("pem");
    pem
}
