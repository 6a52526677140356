//! The publishing side: `Publisher::publish()` never waits on Redis, whatever
//! Redis does (stopped, or accepting TCP and never answering); it delivers when
//! Redis is there; `seatboard publish` and `seatboard simulate` write the state
//! hash and the channel so a watcher sees them.

use crate::common;
use crate::redis_util;
use common::*;
use redis_util::*;
use seatboard::publisher::{Publisher, PublisherConfig};
use shards::Snapshot;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn config(uri: String) -> PublisherConfig {
    PublisherConfig {
        redis: seatboard::redis::RedisFlags::new(&uri),
        channel_prefix: "seats:".into(),
        state_prefix: "seatstate:".into(),
        queue: 64,
        state_ttl: None,
    }
}

fn snap(i: u64) -> Snapshot {
    Snapshot::build(
        "CS101".into(),
        (i % 5) as u32,
        40,
        (i % 40) as u32,
        None,
        Some(i + 1),
        Some(i),
    )
}

/// The slowest a `publish()` may take. Any wait on Redis takes at least the
/// connect timeout (500 ms); a fifth of it leaves room for a loaded box
/// descheduling the test thread, which alone took a call past 6 ms.
const NOT_WAITING: Duration =
    Duration::from_millis(seatboard::redis::CONNECT_TIMEOUT.as_millis() as u64 / 5);

/// Publishes `n` snapshots; returns the slowest single call.
fn slowest_publish(p: &Publisher, n: u64) -> Duration {
    (0..n)
        .map(|i| {
            let t = Instant::now();
            p.publish(snap(i));
            t.elapsed()
        })
        .max()
        .unwrap_or_default()
}

#[test]
fn publish_never_blocks_while_redis_is_stopped() {
    let mut redis = RedisServer::start();
    redis.kill();
    let p = Publisher::start(config(redis.uri())).expect("publisher");
    let slowest = slowest_publish(&p, 5000);
    println!("Redis stopped: slowest publish() {slowest:?}");
    assert!(slowest < NOT_WAITING, "{slowest:?}");
    assert!(p.flush(T));
    assert_eq!(p.published(), 0);
    assert_eq!(p.dropped(), 5000, "every snapshot dropped and counted");
}

#[test]
fn publish_never_blocks_while_redis_is_black_holed() {
    // Accepts TCP (the kernel completes the handshake) and never reads or answers.
    let hole = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = hole.local_addr().unwrap().port();
    let p = Publisher::start(config(format!("redis://127.0.0.1:{port}"))).expect("publisher");
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    // Keep publishing across several connect/IO timeouts of the background thread.
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        slowest = slowest.max(slowest_publish(&p, 100));
        n += 100;
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("Redis black-holed: {n} publish() calls, slowest {slowest:?}");
    assert!(slowest < NOT_WAITING, "{slowest:?}");
    assert_eq!(p.published(), 0);
    assert!(
        p.dropped() >= n - 64 - 256,
        "dropped {} of {n}",
        p.dropped()
    );
    drop(hole);
}

#[test]
fn publisher_delivers_and_recovers_after_a_blip() {
    let mut redis = RedisServer::start();
    let p = Publisher::start(config(redis.uri())).expect("publisher");
    for i in 0..50 {
        assert!(p.publish(snap(i)));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(p.flush(T));
    assert_eq!(p.published(), 50);
    assert_eq!(redis.cli(&["HLEN", "seatstate:CS101"]), "5");
    redis.kill();
    for i in 50..100 {
        p.publish(snap(i));
    }
    assert!(p.flush(T));
    assert!(p.dropped() > 0);
    redis.restart();
    let before = p.published();
    wait_for(T, || {
        p.publish(snap(1000));
        p.flush(T);
        (p.published() > before).then_some(())
    })
    .expect("publishing again after Redis returned");
    let v = redis.cli(&["HGET", "seatstate:CS101", "0"]);
    assert!(v.contains("\"version\":1001"), "{v}");
}

#[test]
fn publish_and_simulate_commands_reach_a_watcher() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &[]);
    let mut ws = client(&sb, "user=alice");
    watch(&mut ws, "CS101");
    let out = Command::new(bin())
        .args([
            "publish",
            "--course",
            "CS101",
            "--section",
            "3",
            "--total",
            "42",
        ])
        .args([
            "--taken",
            "41",
            "--version",
            "17",
            "--seat-info",
            r#"{"room":"B12"}"#,
        ])
        .args(["--redis", &redis.uri()])
        .output()
        .expect("run publish");
    assert!(out.status.success(), "{out:?}");
    let f = read_until(&mut ws, T, |m| m["type"] == "frame").expect("frame from publish");
    let s = section(&f, 3).unwrap();
    assert_eq!(s["seats_taken"], 41);
    assert_eq!(s["version"], 17);
    assert_eq!(s["seat_info"]["room"], "B12");
    let stored: serde_json::Value =
        serde_json::from_str(&redis.cli(&["HGET", "seatstate:CS101", "3"])).unwrap();
    assert_eq!(stored["version"], 17);
    assert!(stored["ts"].as_u64().is_some(), "publish stamps ts");

    // Bad input exits 2 and names the flag.
    let bad = Command::new(bin())
        .args([
            "publish",
            "--course",
            "CS 101",
            "--section",
            "1",
            "--total",
            "1",
        ])
        .args(["--taken", "0", "--redis", &redis.uri()])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--course"));

    // simulate: a watcher of the hottest course gets frames, hashes are written.
    let mut w2 = client(&sb, "user=bob");
    watch(&mut w2, "COURSE0000");
    let sim = Command::new(bin())
        .args([
            "simulate",
            "--rate",
            "200",
            "--courses",
            "3",
            "--duration",
            "2",
        ])
        .args(["--redis", &redis.uri()])
        .output()
        .expect("run simulate");
    assert!(sim.status.success(), "{sim:?}");
    let report = String::from_utf8_lossy(&sim.stdout);
    println!("{report}");
    assert!(report.contains("achieved"), "{report}");
    read_until(&mut w2, T, |m| {
        m["type"] == "frame" && m["course"] == "COURSE0000"
    })
    .expect("simulated frames");
    let hlen: u64 = redis
        .cli(&["HLEN", "seatstate:COURSE0000"])
        .parse()
        .unwrap();
    assert!(hlen >= 1);
    // /api/courses follows the state hashes (refreshed every 10 s).
    eventually(Duration::from_secs(15), "courses listed", || {
        http_get(sb.port, "/api/courses")
            .map(|r| r.body.contains("COURSE0002") && r.body.contains("CS101"))
            .unwrap_or(false)
    });
}

/// `simulate --duration S` is a window of S seconds whatever the rate: one
/// this process cannot generate (or Redis cannot take) ends on time, and the
/// report accounts for every snapshot generated.
#[test]
fn simulate_ends_with_its_window_at_a_rate_beyond_reach() {
    let redis = RedisServer::start();
    let mut sim = Command::new(bin())
        .args(["simulate", "--rate", "1e12", "--courses", "2"])
        .args(["--duration", "1", "--redis", &redis.uri()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run simulate");
    // The window (1 s) and the flush after it (1 s), with room for a busy box.
    let status = wait_for(Duration::from_secs(15), || sim.try_wait().ok().flatten());
    if status.is_none() {
        let _ = sim.kill();
        let _ = sim.wait();
        panic!("simulate --duration 1 at --rate 1e12 still ran after 15 s");
    }
    let out = sim.wait_with_output().expect("simulate output");
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stdout);
    let number = |after: &str| -> u64 {
        let at = report
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in {report}"));
        report[at + after.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number after {after:?} in {report}"))
    };
    let (generated, published) = (number("generated "), number("published "));
    assert!(published > 0 && published <= generated, "{report}");
    // What it reports published, Redis took.
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("PUBLISH calls in {stats}"));
    assert!(calls >= published, "{calls} PUBLISH calls, {report}");
}
