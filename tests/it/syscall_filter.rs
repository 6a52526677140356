//! The units' `SystemCallFilter=` lets through every system call seatboard
//! really makes: a `serve` run (both drivers, a few connections, a drain) and
//! an analytics worker and a publish relay run under `strace -f -c`, each call checked against the
//! unit's filter expanded by `systemd-analyze syscall-filter`. A later
//! hardening line that denies pinning or io_uring fails here, not in production.

use crate::common;
use common::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The members of a syscall group (`@name`), nested groups expanded.
fn expand_group(group: &str, out: &mut BTreeSet<String>, seen: &mut BTreeSet<String>) {
    if !seen.insert(group.to_string()) {
        return;
    }
    let o = Command::new("systemd-analyze")
        .args(["syscall-filter", group])
        .output()
        .expect("systemd-analyze must be installed (tests/run.sh installs systemd)");
    assert!(
        o.status.success(),
        "systemd-analyze syscall-filter {group}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let members: Vec<&str> = text
        .lines()
        .skip(1) // the group's own name
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(!members.is_empty(), "{group} expanded to nothing:\n{text}");
    for m in members {
        if m.starts_with('@') {
            expand_group(m, out, seen);
        } else {
            out.insert(m.to_string());
        }
    }
}

/// One `SystemCallFilter=` item (a call or a group, `:errno` suffix dropped).
fn expand_item(item: &str) -> BTreeSet<String> {
    let name = item.split(':').next().unwrap_or(item);
    let mut out = BTreeSet::new();
    if name.starts_with('@') {
        expand_group(name, &mut out, &mut BTreeSet::new());
    } else {
        out.insert(name.to_string());
    }
    out
}

/// The calls a unit's filter allows, following systemd.exec(5): the first
/// assignment sets the mode (an allow list also admits `@default`), later
/// ones add (`name`) or remove (`~name`) in order; an empty one resets.
fn allowed_by(unit: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("systemd")
            .join(unit),
    )
    .expect("unit file");
    let mut allowed: Option<BTreeSet<String>> = None;
    for line in text.lines() {
        let Some(value) = line.trim().strip_prefix("SystemCallFilter=") else {
            continue;
        };
        if value.trim().is_empty() {
            allowed = None;
            continue;
        }
        let (deny, list) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        let set = allowed.get_or_insert_with(|| {
            assert!(
                !deny,
                "{unit}: a deny-list-first filter is not what this test models"
            );
            expand_item("@default")
        });
        for item in list.split_whitespace() {
            for call in expand_item(item) {
                if deny {
                    set.remove(&call);
                } else {
                    set.insert(call);
                }
            }
        }
    }
    allowed.unwrap_or_else(|| panic!("{unit} has no SystemCallFilter="))
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "seatboard-{tag}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `strace -f -c -o <summary> <seatboard> <args>`.
fn traced(summary: &Path, args: &[&str]) -> Child {
    Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(summary)
        .arg("--")
        .arg(bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("strace must be installed (tests/run.sh installs it)")
}

/// The traced seatboard: strace's only child.
fn tracee_pid(strace: &Child) -> i32 {
    let path = format!("/proc/{0}/task/{0}/children", strace.id());
    wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(&path)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
    .expect("strace started seatboard")
}

/// SIGTERMs the tracee, waits for strace, and returns the calls it counted.
fn finish(mut strace: Child, summary: &Path) -> BTreeSet<String> {
    let pid = tracee_pid(&strace);
    // SAFETY: kill(2) on the process this test started (through strace).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = wait_for(Duration::from_secs(30), || strace.try_wait().ok().flatten());
    if status.is_none() {
        let _ = strace.kill();
        let _ = strace.wait();
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "seatboard under strace did not exit 0 after SIGTERM"
    );
    let text = std::fs::read_to_string(summary).expect("strace summary");
    let calls: BTreeSet<String> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .filter_map(|l| l.split_whitespace().last())
        .filter(|name| *name != "total")
        // A summary under -f can carry a placeholder (`...>`) in the name
        // column; a system call's name is `[a-z0-9_]+`.
        .filter(|name| {
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .map(str::to_string)
        .collect();
    assert!(calls.len() > 10, "too few calls parsed from:\n{text}");
    calls
}

fn assert_allowed(unit: &str, what: &str, calls: &BTreeSet<String>) {
    let allowed = allowed_by(unit);
    let denied: Vec<&String> = calls.iter().filter(|c| !allowed.contains(*c)).collect();
    assert!(
        denied.is_empty(),
        "{unit}'s SystemCallFilter= denies calls {what} makes: {denied:?}"
    );
}

fn serve_run(driver: &str) -> BTreeSet<String> {
    let redis = RedisServer::start();
    let dir = scratch(&format!("strace-{driver}"));
    let summary = dir.join("summary");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let uri = redis.uri();
    let strace = traced(
        &summary,
        &[
            "serve",
            "--auth",
            "none",
            "--redis",
            &uri,
            "--listen",
            &listen,
            "--shards",
            "2",
            "--driver",
            driver,
            "--tick-ms",
            "50",
            "--drain-ms",
            "300",
            "--log-level",
            "warn",
        ],
    );
    let strace = KillOnDrop(Some(strace));
    let up = wait_for(Duration::from_secs(30), || {
        let h = http_get(port, "/healthz").ok()?;
        h.body.contains("\"redis\":true").then_some(())
    });
    assert!(
        up.is_some(),
        "{driver}: seatboard under strace never served"
    );
    let mut clients = Vec::new();
    for i in 0..4 {
        let mut ws = ws_connect(port, &format!("/ws?user=s{i}")).expect("connect");
        assert_eq!(next_json(&mut ws).expect("hello")["type"], "hello");
        send_json(&mut ws, json!({"op":"watch","course":"SYS1"}));
        next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
        clients.push(ws);
    }
    let payload = json!({"course":"SYS1","section":1,"total_seats":40,"seats_taken":7,"version":2})
        .to_string();
    redis.cli(&["PUBLISH", "seats:SYS1", &payload]);
    for ws in &mut clients {
        let f = next_of_type(ws, "frame", Duration::from_secs(10)).expect("a live frame");
        assert_eq!(f["sections"][0]["seats_taken"], 7);
    }
    assert_eq!(http_get(port, "/metrics").expect("metrics").status, 200);
    assert_eq!(http_get(port, "/ws").expect("refusal").status, 400);
    // Drain with the clients still open: the close path is traced too.
    let calls = finish(strace.take(), &summary);
    drop(clients);
    let _ = std::fs::remove_dir_all(&dir);
    calls
}

/// Kills strace if the test panics before `finish`.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn take(mut self) -> Child {
        self.0.take().expect("child")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn hub_unit_allows_every_call_on_io_uring() {
    let calls = serve_run("uring");
    for needed in ["io_uring_setup", "io_uring_enter", "sched_setaffinity"] {
        assert!(
            calls.contains(needed),
            "a uring run should make {needed}: {calls:?}"
        );
    }
    assert_allowed("seatboard.service", "serve --driver uring", &calls);
}

#[test]
fn hub_unit_allows_every_call_on_epoll() {
    let calls = serve_run("epoll");
    assert!(calls.contains("sched_setaffinity"), "shards pin: {calls:?}");
    assert!(
        calls.iter().any(|c| c.starts_with("epoll_")),
        "an epoll run waits in epoll: {calls:?}"
    );
    assert_allowed("seatboard.service", "serve --driver epoll", &calls);
}

#[test]
fn analytics_unit_allows_every_call() {
    let redis = RedisServer::start();
    let dir = scratch("strace-analytics");
    let summary = dir.join("summary");
    let uri = redis.uri();
    let strace = KillOnDrop(Some(traced(
        &summary,
        &[
            "analytics",
            "--redis",
            &uri,
            "--session",
            "sys",
            "--bucket-ms",
            "200",
            "--log-level",
            "warn",
        ],
    )));
    let payload = json!({"course":"SYS2","section":1,"total_seats":40,"seats_taken":3,"version":1})
        .to_string();
    // Publish until a bucket with an update has been written.
    let written = wait_for(Duration::from_secs(30), || {
        redis.cli(&["PUBLISH", "seats:SYS2", &payload]);
        std::thread::sleep(Duration::from_millis(100));
        let n: u64 = redis.cli(&["XLEN", "analytics:sys"]).parse().ok()?;
        (n > 0).then_some(())
    });
    assert!(written.is_some(), "the worker never wrote an entry");
    let calls = finish(strace.take(), &summary);
    let _ = std::fs::remove_dir_all(&dir);
    assert_allowed("seatboard-analytics.service", "analytics", &calls);
}

#[test]
fn relay_unit_allows_every_call() {
    let redis = RedisServer::start();
    let dir = scratch("strace-relay");
    let summary = dir.join("summary");
    let socket = dir.join("run/relay.sock");
    let (udp, metrics) = (free_port(), free_port());
    let uri = redis.uri();
    let strace = KillOnDrop(Some(traced(
        &summary,
        &[
            "relay",
            "--socket",
            socket.to_str().expect("path"),
            "--udp",
            &format!("127.0.0.1:{udp}"),
            "--metrics",
            &format!("127.0.0.1:{metrics}"),
            "--redis",
            &uri,
        ],
    )));
    let sender = std::os::unix::net::UnixDatagram::unbound().expect("socket");
    let udp_sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    // Send (both ways) until the state hash holds a snapshot; scrape too.
    let written = wait_for(Duration::from_secs(30), || {
        for (i, section) in [1, 2].iter().enumerate() {
            let p = json!({"course":"SYS3","section":section,"total_seats":40,"seats_taken":3,"version":1})
                .to_string();
            if i == 0 {
                let _ = sender.send_to(p.as_bytes(), &socket);
            } else {
                let _ = udp_sender.send_to(p.as_bytes(), ("127.0.0.1", udp));
            }
        }
        let _ = http_get(metrics, "/metrics");
        std::thread::sleep(Duration::from_millis(100));
        (redis.cli(&["HLEN", "seatstate:SYS3"]) == "2").then_some(())
    });
    assert!(written.is_some(), "the relay never wrote");
    let calls = finish(strace.take(), &summary);
    let _ = std::fs::remove_dir_all(&dir);
    assert_allowed("seatboard-relay.service", "relay", &calls);
}

#[test]
fn a_denied_call_is_caught() {
    // The model itself: the unit's own deny line must remove what it names.
    let allowed = allowed_by("seatboard.service");
    for denied in ["reboot", "mount", "ptrace", "swapon"] {
        assert!(!allowed.contains(denied), "{denied} should be denied");
    }
    assert!(allowed.contains("read") && allowed.contains("io_uring_enter"));
}
