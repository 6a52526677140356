//! The shipped HAProxy configuration (`systemd/haproxy/seatboard.cfg`) in
//! front of a real `seatboard`: per-source limits on new and on open
//! connections (stick tables), so one source past them is refused 429 while
//! another source is served; and request logs without query strings, so a
//! `?token=` never lands in them.

use crate::common;
use crate::lb;
use common::*;
use socket2::{Domain, Socket, Type};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

/// A number the shipped configuration compares with `sc0_<what> gt N`.
fn shipped_limit(what: &str) -> usize {
    let cfg = lb::shipped();
    let at = cfg
        .find(&format!("sc0_{what} gt "))
        .unwrap_or_else(|| panic!("no sc0_{what} limit in the shipped config"));
    cfg[at..]
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

/// The shipped config, limits kept, logging each request to stdout.
fn config(lb_port: u16, node: u16) -> String {
    let cfg =
        lb::render_with_source_limits(&lb::shipped(), &lb::Bind::Plain(lb_port), &[node], 5000);
    let mut out = String::new();
    for line in cfg.lines() {
        out.push_str(line);
        out.push('\n');
        match line.trim() {
            "global" => out.push_str("    log stdout format raw local0\n"),
            "defaults" => out.push_str("    log global\n"),
            _ => {}
        }
    }
    out
}

/// A TCP connection to the proxy from `source` (another loopback address).
fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let from = SocketAddr::from((source, 0));
    s.bind(&from.into()).expect("bind the source address");
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    s.connect(&to.into()).expect("connect");
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(T)).expect("timeout");
    s
}

/// The status of `request` sent from `source` on a fresh connection.
fn status_from(source: [u8; 4], port: u16, request: &str) -> Option<u16> {
    let mut s = connect_from(source, port);
    s.write_all(request.as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    head.split_whitespace().nth(1)?.parse().ok()
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: seatboard\r\nConnection: close\r\n\r\n")
}

fn upgrade(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: seatboard\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

struct Rig {
    _redis: RedisServer,
    _sb: Seatboard,
    proxy: lb::Haproxy,
    _dir: TempDir,
}

/// A directory removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rig(name: &str) -> Rig {
    let redis = RedisServer::start();
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--accept-burst",
        "2000",
        "--redis",
        &redis.uri(),
    ]);
    let dir = std::env::temp_dir().join(format!("seatboard-{name}-{}", std::process::id()));
    let lb_port = lb::free_port();
    let proxy = lb::Haproxy::start(&dir, lb_port, &config(lb_port, sb.port), 1);
    assert!(
        proxy.wait_ready("/readyz", T),
        "haproxy never saw the node up"
    );
    Rig {
        _redis: redis,
        _sb: sb,
        proxy,
        _dir: TempDir(dir),
    }
}

#[test]
fn one_source_past_the_open_connection_limit_is_refused_while_another_is_served() {
    let cur = shipped_limit("conn_cur");
    let rate = shipped_limit("conn_rate");
    assert!(
        cur < rate,
        "the open-connection limit is reached first here"
    );
    let r = rig("lb-cur");
    let port = r.proxy.port;
    // One source holds `cur` connections open (an upgrade each).
    let mut held = Vec::new();
    for i in 0..cur {
        let mut s = connect_from([127, 0, 0, 2], port);
        s.write_all(upgrade(&format!("/ws?user=u{i}")).as_bytes())
            .expect("upgrade");
        held.push(s);
    }
    // Every one of them answered 101 (each is open when the next is counted).
    for s in held.iter_mut() {
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("answer");
        assert_eq!(&head, b"HTTP/1.1 101", "{}", String::from_utf8_lossy(&head));
    }
    // One more from that source is refused; another source is served.
    assert_eq!(
        status_from([127, 0, 0, 2], port, &get("/healthz")),
        Some(429)
    );
    assert_eq!(
        status_from([127, 0, 0, 3], port, &upgrade("/ws?user=other")),
        Some(101)
    );
    assert_eq!(
        status_from([127, 0, 0, 3], port, &get("/healthz")),
        Some(200)
    );
    // The first source is served again once its connections close.
    drop(held);
    let back = wait_for(T, || {
        (status_from([127, 0, 0, 2], port, &get("/healthz")) == Some(200)).then_some(())
    });
    assert!(back.is_some(), "served again below the limit");
}

#[test]
fn one_source_past_the_new_connection_rate_is_refused_while_another_is_served() {
    let rate = shipped_limit("conn_rate");
    let r = rig("lb-rate");
    let port = r.proxy.port;
    // Short requests one after another: never more than one open at a time.
    let statuses: Vec<Option<u16>> = (0..rate + 50)
        .map(|_| status_from([127, 0, 0, 4], port, &get("/healthz")))
        .collect();
    let first_refused = statuses
        .iter()
        .position(|s| *s == Some(429))
        .expect("refused past the rate");
    assert!(
        first_refused >= rate * 9 / 10,
        "refused after {first_refused} of {rate}"
    );
    assert!(statuses[..first_refused].iter().all(|s| *s == Some(200)));
    assert_eq!(
        status_from([127, 0, 0, 5], port, &get("/healthz")),
        Some(200)
    );
    assert_eq!(
        status_from([127, 0, 0, 4], port, &get("/healthz")),
        Some(429)
    );
}

#[test]
fn a_token_in_the_query_string_never_reaches_the_proxy_log() {
    let r = rig("lb-log");
    let port = r.proxy.port;
    let secret = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.c2ln";
    assert_eq!(
        status_from(
            [127, 0, 0, 6],
            port,
            &get(&format!("/admin?token={secret}"))
        ),
        Some(200)
    );
    assert!(status_from(
        [127, 0, 0, 6],
        port,
        &upgrade(&format!("/ws/admin?token={secret}"))
    )
    .is_some());
    let log = wait_for(T, || {
        let log = std::fs::read_to_string(r.proxy.log(0)).ok()?;
        (log.contains("GET /admin HTTP/1.1") && log.contains("GET /ws/admin HTTP/1.1"))
            .then_some(log)
    })
    .unwrap_or_else(|| {
        panic!(
            "both requests logged: {}",
            std::fs::read_to_string(r.proxy.log(0)).unwrap_or_default()
        )
    });
    for line in log.lines().filter(|l| l.contains("/admin")) {
        eprintln!("proxy log: {line}");
    }
    assert!(!log.contains(secret), "token in the log: {log}");
    assert!(!log.contains("token="), "query string in the log: {log}");
    // The source address and the status are still there.
    assert!(
        log.lines()
            .any(|l| l.starts_with("127.0.0.6:") && l.contains(" 200 ")),
        "{log}"
    );
}
