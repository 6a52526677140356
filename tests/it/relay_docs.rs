//! docs/publishing.md's relay senders, taken from the page as shown and run
//! against `seatboard relay` and a real redis-server: Go (`go run`), Python,
//! Node (`dgram`), Java (single-file source launch) and PHP each publish;
//! 40 senders in several languages through two relays on one Redis leave the
//! newest version of each section in the hash; and the one rule from the
//! sender's side: 100,000 sends from Python and from Go while the relay runs,
//! while Redis is frozen, while the relay is stopped and while its queue is
//! full never raise to the caller, and the relay's counters say what became
//! of each datagram. (C# is shown on the page, not run: no .NET here.)

use crate::common::*;
use crate::redis_util::eventually;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use testkit::relay::{socket_dir, Relay};

const T: Duration = Duration::from_secs(20);
/// The programs the suite runs (C# is shown, not run).
const RUN: [&str; 5] = [
    "relay_send.go",
    "relay_send.py",
    "relay_send.mjs",
    "RelaySend.java",
    "relay_send.php",
];

fn page() -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/publishing.md"))
        .expect("docs/publishing.md")
}

/// The code block after `<!-- relay-snippet: NAME -->`, exactly as shown.
fn snippet(page: &str, name: &str) -> String {
    let marker = format!("<!-- relay-snippet: {name} -->\n```");
    let at = page
        .find(&marker)
        .unwrap_or_else(|| panic!("{name} not on the page"))
        + marker.len();
    let body = &page[at..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    let end = body.find("\n```\n").expect("closing fence");
    format!("{}\n", &body[..end])
}

/// A folder with every snippet written out, and Go's caches in it.
struct Programs {
    dir: PathBuf,
}

impl Programs {
    fn new() -> Programs {
        let dir = socket_dir("docs");
        let page = page();
        for name in RUN {
            std::fs::write(dir.join(name), snippet(&page, name)).expect("write snippet");
        }
        std::fs::create_dir_all(dir.join("home")).expect("home");
        Programs { dir }
    }

    /// A command in the folder with Go's caches and HOME writable.
    fn command(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.current_dir(&self.dir)
            .env("HOME", self.dir.join("home"))
            .env("GOCACHE", self.dir.join("home/gocache"))
            .env("GOPATH", self.dir.join("home/go"))
            .stdin(Stdio::null());
        c
    }

    /// Runs the program `name` (as the page says to run it) toward `relay`.
    fn sender(&self, name: &str, relay: &Relay, args: &[String]) -> Command {
        let mut c = match name {
            "relay_send.go" => {
                let mut c = self.command("go");
                c.args(["run", name]);
                c
            }
            "relay_send.py" => {
                let mut c = self.command("python3");
                c.arg(name);
                c
            }
            "relay_send.mjs" => {
                let mut c = self.command("node");
                c.arg(name);
                c
            }
            "RelaySend.java" => {
                let mut c = self.command("java");
                c.arg(name);
                c
            }
            "relay_send.php" => {
                let mut c = self.command("php");
                c.arg(name);
                c
            }
            "go-binary" => self.command(self.dir.join("relay_send").to_str().unwrap()),
            other => panic!("{other}"),
        };
        c.args(args)
            .env("SEATBOARD_RELAY_SOCKET", &relay.socket)
            .env("SEATBOARD_RELAY_UDP", relay.udp.to_string());
        c
    }

    /// `go build` of the Go snippet (with `extra` files beside it) to `out`.
    fn go_build(&self, extra: &[&str], out: &str) -> PathBuf {
        let st = self
            .command("go")
            .args(["build", "-o", out, "relay_send.go"])
            .args(extra)
            .status()
            .expect("go (golang-go) must be installed; tests/run.sh installs it");
        assert!(st.success(), "go build");
        self.dir.join(out)
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        // Go's module cache is read-only; make it removable first.
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn hash_version(redis: &RedisServer, course: &str, section: u32) -> Option<u64> {
    let v = redis.cli(&["HGET", &format!("seatstate:{course}"), &section.to_string()]);
    serde_json::from_str::<serde_json::Value>(&v).ok()?["version"].as_u64()
}

fn args(course: &str, section: u32, taken: u32, version: u64) -> Vec<String> {
    vec![
        course.into(),
        section.to_string(),
        "100".into(),
        taken.to_string(),
        version.to_string(),
    ]
}

fn ok(out: Output, what: &str) {
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{what}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_page_shows_every_sender_and_says_csharp_is_not_run() {
    let page = page();
    for name in RUN.iter().chain(&["RelaySend.cs"]) {
        let text = snippet(&page, name);
        assert!(text.lines().count() > 10, "{name} is a fragment");
    }
    assert!(page.contains("not run by the test\nsuite"), "the C# note");
    assert!(page.contains("fastcgi_finish_request()"));
}

#[test]
fn every_language_sends_through_the_relay() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    let p = Programs::new();
    for (i, name) in RUN.iter().enumerate() {
        let course = format!("DOC{i}");
        let out = p
            .sender(name, &relay, &args(&course, 3, 41, 17))
            .output()
            .expect(name);
        ok(out, name);
        eventually(T, name, || hash_version(&redis, &course, 3) == Some(17));
    }
    assert_eq!(relay.metric("seatboard_relay_published_total"), 5.0);
}

#[test]
fn forty_senders_through_one_relay_leave_the_newest() {
    forty_senders(1);
}

#[test]
fn forty_senders_through_two_relays_on_one_redis_leave_the_newest() {
    forty_senders(2);
}

/// 40 senders in five languages, four sections, versions 1..=10 of each in a
/// shuffled order, spread over `n` relays on one Redis.
fn forty_senders(n: usize) {
    let redis = RedisServer::start();
    let relays: Vec<Relay> = (0..n).map(|_| Relay::start(&redis.uri(), &[])).collect();
    let p = Programs::new();
    p.go_build(&[], "relay_send");
    // Four sections, versions 1..=10 each, in a shuffled order over 40 senders.
    let mut sends: Vec<(u32, u64)> = (0..4).flat_map(|s| (1..=10).map(move |v| (s, v))).collect();
    fastrand::shuffle(&mut sends);
    let langs = [
        "relay_send.py",
        "relay_send.mjs",
        "go-binary",
        "relay_send.php",
        "relay_send.py",
        "relay_send.mjs",
        "go-binary",
        "relay_send.php",
        "RelaySend.java",
        "relay_send.py",
    ];
    let children: Vec<_> = sends
        .iter()
        .enumerate()
        .map(|(i, (s, v))| {
            let lang = langs[i % langs.len()];
            let child = p
                .sender(lang, &relays[i % n], &args("FORTY", *s, *v as u32, *v))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect(lang);
            (lang, child)
        })
        .collect();
    for (lang, c) in children {
        ok(c.wait_with_output().expect("wait"), lang);
    }
    eventually(T, "the newest of each section in the hash", || {
        (0..4).all(|s| hash_version(&redis, "FORTY", s) == Some(10))
    });
    let received: f64 = relays
        .iter()
        .map(|r| r.metric("seatboard_relay_received_total"))
        .sum();
    assert_eq!(received, 40.0);
    for r in &relays {
        assert!(r.settled(0, T), "{}", r.metrics());
        assert!(r.metric("seatboard_relay_received_total") > 0.0);
    }
}

/// The relay's figures once its receive count stops moving.
fn quiet(relay: &Relay) -> String {
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let m = relay.metrics();
        let now = metric_value(&m, "seatboard_relay_received_total");
        if now == last {
            return m;
        }
        last = now;
    }
}

fn redis_pid(redis: &RedisServer) -> i32 {
    redis
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("redis pid")
}

fn freeze(pid: i32, on: bool) {
    // SAFETY: kill(2) on the test's own redis-server.
    unsafe { libc::kill(pid, if on { libc::SIGSTOP } else { libc::SIGCONT }) };
}

/// 100,000 sends from Python (the page's `publish`, imported) and from Go
/// (the page's `Publish`, called from a second file's `init`) toward `relay`;
/// each must end with exit 0 and nothing on stderr: no error reached the caller.
fn send_100k(p: &Programs, go: &Path, relay: &Relay, course: &str) {
    let py = format!(
        "import relay_send\nfor i in range(100000):\n    relay_send.publish('{course}PY', i % 1000, 100, i % 100, i // 1000 + 1)\n"
    );
    let out = p
        .command("python3")
        .args(["-c", &py])
        .env("SEATBOARD_RELAY_SOCKET", &relay.socket)
        .output()
        .expect("python3");
    ok(out, "python sender");
    let out = p
        .command(go.to_str().unwrap())
        .env("SEATBOARD_RELAY_SOCKET", &relay.socket)
        .env("RULE_COURSE", format!("{course}GO"))
        .output()
        .expect("go sender");
    ok(out, "go sender");
}

const GO_HARNESS: &str = r#"package main

import "os"

// Runs before main: 100,000 sends through the page's Publish, then exit 0.
func init() {
	course := os.Getenv("RULE_COURSE")
	for i := 0; i < 100000; i++ {
		Publish(Snapshot{Course: course, Section: i % 1000, TotalSeats: 100,
			SeatsTaken: i % 100, Version: int64(i/1000 + 1)})
	}
	os.Exit(0)
}
"#;

fn counts(m: &str) -> [f64; 7] {
    [
        "seatboard_relay_received_total",
        "seatboard_relay_published_total",
        "seatboard_relay_coalesced_total",
        "seatboard_relay_rejected_total{",
        "seatboard_relay_dropped_total{reason=\"full\"}",
        "seatboard_relay_dropped_total{reason=\"redis_down\"}",
        "seatboard_relay_pending",
    ]
    .map(|k| metric_value(m, k))
}

#[test]
fn the_one_rule_from_the_senders_side() {
    let redis = RedisServer::start();
    let p = Programs::new();
    std::fs::write(p.dir.join("rule_harness.go"), GO_HARNESS).expect("harness");
    let go = p.go_build(&["rule_harness.go"], "rule_sender");
    let pid = redis_pid(&redis);

    // The relay runs normally: what it received is published or coalesced.
    let relay = Relay::start(&redis.uri(), &[]);
    send_100k(&p, &go, &relay, "NORMAL");
    assert!(relay.settled(0, T), "{}", relay.metrics());
    let [received, published, coalesced, rejected, full, down, pending] = counts(&relay.metrics());
    assert!(received > 0.0);
    assert_eq!((rejected, full, down, pending), (0.0, 0.0, 0.0, 0.0));
    assert_eq!(published + coalesced, received);
    drop(relay);

    // Redis frozen: the relay holds the newest of each section, nothing dropped.
    freeze(pid, true);
    let relay = Relay::start(&redis.uri(), &[]);
    send_100k(&p, &go, &relay, "FROZEN");
    let m = quiet(&relay);
    let [received, published, coalesced, rejected, full, down, pending] = counts(&m);
    freeze(pid, false);
    assert_eq!(metric_value(&m, "seatboard_relay_redis_up"), 0.0, "{m}");
    assert_eq!(
        (published, rejected, full, down),
        (0.0, 0.0, 0.0, 0.0),
        "{m}"
    );
    // At most one per section (2000), and a batch being written may hold a
    // section a second time until Redis answers.
    let batch = seatboard::relay::writer::BATCH as f64;
    assert!(pending > 0.0 && pending <= 2000.0 + batch, "{m}");
    assert_eq!(coalesced + pending, received, "{m}");
    // Once Redis answers, what was held is written.
    assert!(relay.settled(0, T), "{}", relay.metrics());
    let [received, published, coalesced, _, full, down, _] = counts(&relay.metrics());
    assert_eq!((full, down), (0.0, 0.0));
    assert!(published >= pending - batch, "{}", relay.metrics());
    assert_eq!(published + coalesced, received);
    drop(relay);

    // Its queue full: Redis frozen and room for 100 sections only.
    freeze(pid, true);
    let relay = Relay::start(&redis.uri(), &["--max-pending", "100"]);
    send_100k(&p, &go, &relay, "FULL");
    let m = quiet(&relay);
    freeze(pid, false);
    let [received, published, coalesced, _, full, down, pending] = counts(&m);
    assert_eq!((published, down), (0.0, 0.0), "{m}");
    // At most --max-pending sections held; each may have one snapshot on
    // its way to the frozen Redis and a newer one held beside it.
    assert!((1.0..=200.0).contains(&pending), "{m}");
    assert!(full > 0.0, "{m}");
    assert_eq!(coalesced + full + pending, received, "{m}");
    drop(relay);

    // The relay stopped: by SIGTERM (its socket removed: ENOENT), and killed
    // (a stale socket file: ECONNREFUSED).
    let mut relay = Relay::start(&redis.uri(), &[]);
    relay.signal(libc::SIGTERM);
    assert_eq!(relay.wait_exit(T).and_then(|s| s.code()), Some(0));
    assert!(!relay.socket.exists());
    send_100k(&p, &go, &relay, "STOPPED");
    let mut relay = Relay::start(&redis.uri(), &[]);
    relay.signal(libc::SIGKILL);
    relay.wait_exit(T).expect("killed");
    assert!(relay.socket.exists());
    send_100k(&p, &go, &relay, "KILLED");
    assert_eq!(redis.cli(&["EXISTS", "seatstate:STOPPEDPY"]), "0");
}
