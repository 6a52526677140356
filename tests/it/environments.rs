//! Several environments on one box: two `seatboard serve` instances configured
//! by the shipped per-instance env files (`systemd/instances/*.env.example`:
//! their own key prefixes), one real `redis-server`, behind real HAProxy
//! running the shipped `systemd/haproxy/seatboard-environments.cfg`. Each host
//! name reaches only its own instance, and each board shows only what was
//! published under its own prefix.

use crate::common;
use crate::lb;
use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tungstenite::client::IntoClientRequest;
use tungstenite::stream::MaybeTlsStream;

const PROD_HOST: &str = "seats.example.edu";
const DEV_HOST: &str = "seats-dev.example.edu";

/// One environment: its env file's variables, the host name routed to it, and
/// the backend that routes it.
struct Env {
    vars: Vec<(String, String)>,
    host: &'static str,
    backend: &'static str,
}

impl Env {
    fn load(file: &str, host: &'static str, backend: &'static str) -> Env {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("systemd/instances")
            .join(file);
        let text = std::fs::read_to_string(&path).expect("env example");
        let vars = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env {
            vars,
            host,
            backend,
        }
    }

    fn var(&self, name: &str) -> &str {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("env example lacks {name}"))
    }

    /// The variables that keep environments apart in Redis.
    fn prefixes(&self) -> Vec<(&str, &str)> {
        [
            "SEATBOARD_CHANNEL_PREFIX",
            "SEATBOARD_STATE_PREFIX",
            "SEATBOARD_PRESENCE_PREFIX",
        ]
        .into_iter()
        .map(|k| (k, self.var(k)))
        .collect()
    }
}

/// The shipped file with its `bind` lines replaced by one plain bind on
/// `port`, each backend's `server` pointed at its instance, `maxconn` within
/// a test's open-file limit, the https redirect and the lines that need root
/// dropped. Routing stays as shipped.
fn render(shipped: &str, port: u16, backends: &[(&str, u16)]) -> String {
    let mut out = String::new();
    let (mut bound, mut backend, mut servers) = (false, "", 0);
    for line in shipped.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let word = t.split_whitespace().next().unwrap_or("");
        match word {
            "user" | "group" | "chroot" | "daemon" | "log" => continue,
            "stats" if t.starts_with("stats socket") => continue,
            "http-request" if t.contains("redirect scheme https") => continue,
            "maxconn" => out.push_str(&format!("{indent}maxconn 1000\n")),
            "bind" if bound => continue,
            "bind" => {
                bound = true;
                out.push_str(&format!("{indent}bind 127.0.0.1:{port}\n"));
            }
            "backend" => {
                backend = t.split_whitespace().nth(1).unwrap_or("");
                out.push_str(line);
                out.push('\n');
            }
            "server" => {
                let name = t.split_whitespace().nth(1).expect("server name");
                let (_, p) = backends
                    .iter()
                    .find(|(b, _)| *b == backend)
                    .unwrap_or_else(|| panic!("unexpected backend {backend}"));
                servers += 1;
                out.push_str(&format!("{indent}server {name} 127.0.0.1:{p}\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    assert!(
        bound && servers == backends.len(),
        "shipped config lost its bind or server lines"
    );
    out
}

/// The status of `GET path` through the proxy for `host`.
fn status_for(port: u16, host: &str, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A WebSocket through the proxy on `port`, asking for `host`, as `user`.
fn ws_via(port: u16, host: &str, user: &str) -> Ws {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the proxy");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut req = format!("ws://127.0.0.1:{port}/ws?user={user}")
        .into_client_request()
        .expect("request");
    req.headers_mut()
        .insert("Host", host.parse().expect("host header"));
    match tungstenite::client(req, MaybeTlsStream::Plain(stream)) {
        Ok((ws, _)) => ws,
        Err(e) => panic!("upgrade through the proxy for {host} failed: {e}"),
    }
}

/// Publishes one snapshot of CS101 section 1 the way the selection API of
/// `env` does: `seatboard publish` with that environment's prefixes.
fn publish(redis: &RedisServer, env: &Env, taken: u32, version: u32) {
    let out = Command::new(bin())
        .args(["publish", "--redis", &redis.uri(), "--course", "CS101"])
        .args(["--section", "1", "--total", "40"])
        .args([
            "--taken",
            &taken.to_string(),
            "--version",
            &version.to_string(),
        ])
        .envs(env.prefixes())
        .output()
        .expect("run publish");
    assert!(
        out.status.success(),
        "publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads frames of CS101 until section 1 shows `want` taken; panics on a
/// frame that shows a value in `never`.
fn expect_taken(ws: &mut Ws, want: u64, never: &[u64], who: &str) {
    loop {
        let frame = next_of_type(ws, "frame", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{who}: no frame showing {want} taken"));
        if let Some(taken) = seats_taken(&frame, 1) {
            assert!(
                !never.contains(&taken),
                "{who} saw another environment's snapshot: {frame}"
            );
            if taken == want {
                return;
            }
        }
    }
}

#[test]
fn each_host_reaches_only_its_own_environment() {
    let prod = Env::load("prod.env.example", PROD_HOST, "seatboard_prod");
    let dev = Env::load("dev.env.example", DEV_HOST, "seatboard_dev");
    for (p, d) in prod.prefixes().iter().zip(dev.prefixes()) {
        assert_ne!(p.1, d.1, "{} must differ between environments", p.0);
    }
    assert_ne!(prod.var("SEATBOARD_LISTEN"), dev.var("SEATBOARD_LISTEN"));

    let redis = RedisServer::start();
    let args = [
        "serve",
        "--redis",
        &redis.uri(),
        "--auth",
        "none",
        "--shards",
        "1",
        "--tick-ms",
        "100",
    ];
    // The shipped files' prefixes; the port, Redis and auth from the flags
    // (a flag wins over its variable).
    let nodes: Vec<Seatboard> = [&prod, &dev]
        .iter()
        .map(|e| Seatboard::start_env(&args, &e.prefixes()))
        .collect();

    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/haproxy/seatboard-environments.cfg"),
    )
    .expect("shipped environments config");
    let lb_port = lb::free_port();
    let cfg = render(
        &shipped,
        lb_port,
        &[(prod.backend, nodes[0].port), (dev.backend, nodes[1].port)],
    );
    let dir = std::env::temp_dir().join(format!("seatboard-envs-{}", std::process::id()));
    let proxy = lb::Haproxy::start(&dir, lb_port, &cfg, 1);
    for env in [&prod, &dev] {
        wait_for(Duration::from_secs(20), || {
            (status_for(lb_port, env.host, "/readyz") == Some(200)).then_some(())
        })
        .unwrap_or_else(|| panic!("{} never reached its node", env.host));
    }
    // A host name that is no environment's never reaches a node.
    assert_eq!(
        status_for(lb_port, "seats.example.org", "/readyz"),
        Some(404)
    );

    // Each host lands on its own process (the hello names the node: host-pid).
    let mut viewers = Vec::new();
    for (env, node, user) in [(&prod, &nodes[0], "p1"), (&dev, &nodes[1], "d1")] {
        let mut ws = ws_via(lb_port, env.host, user);
        let hello = next_of_type(&mut ws, "hello", Duration::from_secs(10)).expect("hello");
        let id = hello["node"].as_str().unwrap_or_default().to_string();
        assert!(
            id.ends_with(&format!("-{}", node.child.id())),
            "{} reached {id}, not its own instance (pid {})",
            env.host,
            node.child.id()
        );
        send_json(&mut ws, json!({"op": "watch", "course": "CS101"}));
        let answer = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
        assert_eq!(answer["full"], true);
        assert_eq!(answer["sections"], Value::Array(vec![]), "{answer}");
        viewers.push(ws);
    }
    let [prod_ws, dev_ws] = &mut viewers[..] else {
        unreachable!("two viewers")
    };

    // Presence is kept under each environment's own prefix.
    for (env, user) in [(&prod, "p1"), (&dev, "d1")] {
        let key = format!("{}CS101", env.var("SEATBOARD_PRESENCE_PREFIX"));
        wait_for(Duration::from_secs(10), || {
            (redis.cli(&["ZRANGE", &key, "0", "-1"]).trim() == user).then_some(())
        })
        .unwrap_or_else(|| panic!("{key} should hold {user} alone"));
    }
    assert_eq!(redis.cli(&["EXISTS", "presence:CS101"]).trim(), "0");

    // A snapshot published under one prefix shows on that board only: each
    // later snapshot of the other environment is a barrier proving the
    // earlier one never arrived.
    publish(&redis, &prod, 10, 1);
    expect_taken(prod_ws, 10, &[], "prod");
    publish(&redis, &dev, 33, 1);
    expect_taken(dev_ws, 33, &[10], "dev");
    publish(&redis, &prod, 11, 2);
    expect_taken(prod_ws, 11, &[33], "prod");
    publish(&redis, &dev, 34, 2);
    expect_taken(dev_ws, 34, &[10, 11], "dev");

    // A new viewer's watch answer comes from its own environment's state hash.
    for (env, want) in [(&prod, 11), (&dev, 34)] {
        let mut ws = ws_via(lb_port, env.host, "late");
        send_json(&mut ws, json!({"op": "watch", "course": "CS101"}));
        let answer = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
        assert_eq!(
            seats_taken(&answer, 1),
            Some(want),
            "{}: {answer}",
            env.host
        );
    }
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `global` and `defaults` sections (timeouts, retries, the 503 with
/// `Retry-After`) of a configuration, comments dropped.
fn shared_sections(cfg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in cfg.lines() {
        let t = line.trim();
        if !line.starts_with(' ') && !t.is_empty() && !t.starts_with('#') {
            inside = t == "global" || t == "defaults";
        }
        if inside && !t.is_empty() && !t.starts_with('#') {
            out.push(t.to_string());
        }
    }
    out
}

#[test]
fn environments_config_shares_the_single_config_settings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/haproxy");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("haproxy config");
    let single = shared_sections(&read("seatboard.cfg"));
    assert!(single.iter().any(|l| l.starts_with("timeout tunnel")));
    assert_eq!(
        shared_sections(&read("seatboard-environments.cfg")),
        single,
        "seatboard-environments.cfg must keep seatboard.cfg's global and defaults sections"
    );
}
