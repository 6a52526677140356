//! HAProxy for a test or bench: the shipped `systemd/haproxy/seatboard.cfg`
//! with only its `bind` and `server` lines, `maxconn` and the root-only lines
//! replaced, run by [`crate::proc::Haproxy`]; and checks of its answers. Used by `tests/it/fleet.rs`,
//! `tests/it/browser.rs` and the `fleet` and `soak` benches.
#![allow(dead_code)]

pub use crate::http::get_status;
pub use crate::proc::{free_port, Haproxy};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

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
