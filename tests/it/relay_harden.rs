//! `seatboard relay` as an attacker or an unlucky operator would run it
//! (contract §10): a flood of 64 KiB sections with Redis down stays within
//! `--max-pending-bytes` (RSS read from `/proc`), and so do 300,000 small
//! sections written with Redis up (the versions remembered for coalescing
//! count against the bound); a Redis frozen under a flood
//! is noticed within 10 s, ten times in a row; slow HTTP clients never delay
//! `/healthz`; a forged version then `HDEL` takes real publishes after the
//! 10 s window; UDP is off unless asked; a live stream socket, or a live
//! datagram socket connected to another peer, at `--socket` is refused;
//! SIGTERM with Redis frozen or down is over within 2 s; a newer, larger
//! snapshot of a held section replaces it at the bytes bound; reconnect
//! attempts to a Redis that resets every connection are at most 2 s apart.

use crate::common::*;
use crate::redis_util::{eventually, payload};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};
use testkit::relay::Relay;

const T: Duration = Duration::from_secs(15);

/// Sends on the Unix socket, waiting out a full socket buffer (EAGAIN).
fn send_all(relay: &Relay, p: &[u8]) {
    let end = Instant::now() + T;
    while relay.send_unix(p).is_err() {
        assert!(Instant::now() < end, "the relay's socket stayed full");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A Redis URI nothing listens on: Redis down from the start.
fn nowhere() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

/// A process's resident memory, from `/proc/<pid>/status`.
fn rss_bytes(pid: i32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// A memory figure (`VmRSS:`, `VmHWM:`) of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn hash_version(redis: &RedisServer, course: &str, section: u32) -> Option<u64> {
    let v = redis.cli(&["HGET", &format!("seatstate:{course}"), &section.to_string()]);
    serde_json::from_str::<serde_json::Value>(&v).ok()?["version"].as_u64()
}

/// A valid snapshot of `section` at `version`, `len` bytes or a little under.
fn sized_payload(course: &str, section: u32, version: u64, len: usize) -> String {
    let head = format!(
        r#"{{"course":"{course}","section":{section},"total_seats":10,"seats_taken":1,"version":{version},"seat_info":{{"p":""#
    );
    let fill = len.saturating_sub(head.len() + 3);
    format!("{head}{}\"}}}}", "x".repeat(fill))
}

#[test]
fn a_flood_of_64_kib_sections_with_redis_down_stays_within_the_bytes_bound() {
    let relay = Relay::start(&nowhere(), &[]);
    let at_start = rss_bytes(relay.pid());
    const SENT: u32 = 4000;
    for s in 0..SENT {
        let p = sized_payload("FLOOD", s, 1, 65_000);
        assert!(p.len() <= 65_536 && p.len() > 64_000, "{}", p.len());
        send_all(&relay, p.as_bytes());
    }
    // Every datagram received, and each then held or dropped (a datagram is
    // counted received before it is either).
    let (mut held, mut full) = (0.0, 0.0);
    eventually(
        Duration::from_secs(60),
        "every datagram received and placed",
        || {
            held = relay.metric("seatboard_relay_pending");
            full = relay.metric("seatboard_relay_dropped_total{reason=\"full\"}");
            relay.metric("seatboard_relay_received_total") == f64::from(SENT)
                && held + full == f64::from(SENT)
        },
    );
    let rss = rss_bytes(relay.pid());
    let bound = 64u64 << 20;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "64 KiB flood, Redis down: {SENT} sections offered ({} MiB), {held} held, {full} dropped full, RSS {:.1} MiB from {:.1} MiB at start (bound {} MiB)",
        (u64::from(SENT) * 65_000) >> 20,
        mib(rss),
        mib(at_start),
        bound >> 20
    );
    assert!(held * 65_000.0 <= bound as f64, "{held} sections held");
    assert!(full > 0.0, "the bytes bound never bit");
    // What the flood added (the held snapshots, their maps, the allocator's
    // slack) stays within the bound plus a few MiB; the start's RSS is the
    // binary's code and the runtime's, whatever is held.
    assert!(
        rss.saturating_sub(at_start) < bound + (8 << 20),
        "RSS grew {:.1} MiB, past the bound plus a few MiB",
        mib(rss.saturating_sub(at_start))
    );
    assert_eq!(relay.healthz()["redis"], false);
}

#[test]
fn many_small_sections_written_with_redis_up_stay_within_the_bytes_bound() {
    let redis = RedisServer::start();
    let bound: u64 = 4 << 20;
    let relay = Relay::start(&redis.uri(), &["--max-pending-bytes", &bound.to_string()]);
    let at_start = status_bytes(relay.pid(), "VmHWM:");
    // A blocking sender: every datagram is taken, none waits on a retry.
    let sender = std::os::unix::net::UnixDatagram::unbound().expect("sender");
    sender.set_write_timeout(Some(T)).expect("write timeout");
    const COURSES: u32 = 100;
    const SECTIONS: u32 = 3000;
    for c in 0..COURSES {
        let course = format!("MANY{c:03}");
        for s in 0..SECTIONS {
            let p = payload(&course, s, 10, 1, 1);
            sender.send_to(p.as_bytes(), &relay.socket).expect("send");
        }
    }
    let sent = u64::from(COURSES * SECTIONS);
    assert!(
        relay.settled(sent, Duration::from_secs(120)),
        "{}",
        relay.metrics()
    );
    let published = relay.metric("seatboard_relay_published_total");
    let hwm = status_bytes(relay.pid(), "VmHWM:");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{sent} small sections, Redis up: {published} published, peak RSS {:.1} MiB from {:.1} MiB at start (bound {} MiB)",
        mib(hwm),
        mib(at_start),
        bound >> 20
    );
    assert!(
        published >= 100_000.0,
        "Redis took too few to tell: {published}"
    );
    // Remembering every one of them for 10 s would take about 40 MiB.
    assert!(
        hwm.saturating_sub(at_start) < bound + (8 << 20),
        "peak RSS grew {:.1} MiB, past the bound plus a few MiB",
        mib(hwm.saturating_sub(at_start))
    );
}

/// SIGSTOP/SIGCONT on the test's own redis-server.
fn freeze(redis: &RedisServer, on: bool) {
    redis.signal(if on { libc::SIGSTOP } else { libc::SIGCONT });
}

#[test]
fn a_frozen_redis_under_a_flood_is_noticed_within_10_s_ten_times_in_a_row() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &["--max-pending", "1000"]);
    let mut noticed = Vec::new();
    for run in 0..10u64 {
        eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
        freeze(&redis, true);
        let frozen = Instant::now();
        // 20,000 datagrams over 5,000 sections: the pending map full long
        // before the flood ends.
        for i in 0..20_000u64 {
            let p = payload("FRZ", (i % 5000) as u32, 100, 1, run * 100_000 + i + 1);
            send_all(&relay, p.as_bytes());
        }
        let seen = wait_for(Duration::from_secs(12), || {
            (relay.healthz()["redis"] == false).then(|| frozen.elapsed())
        });
        // Read while Redis is still frozen.
        let gauge = relay.metric("seatboard_relay_redis_up");
        freeze(&redis, false);
        let seen = seen.unwrap_or_else(|| panic!("run {run}: a frozen Redis not noticed"));
        assert!(seen <= Duration::from_secs(10), "run {run}: {seen:?}");
        assert_eq!(gauge, 0.0, "run {run}");
        noticed.push(seen);
    }
    println!("frozen Redis under a flood noticed after {noticed:?}");
    // Once it answers, the relay writes what it holds.
    eventually(Duration::from_secs(30), "written after the thaw", || {
        relay.healthz()["redis"] == true && relay.metric("seatboard_relay_pending") == 0.0
    });
}

/// `GET /healthz` on a connection of its own: the time to the whole answer.
fn timed_healthz(port: u16) -> Option<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    (text.starts_with("HTTP/1.1 200") && text.contains("\"pending\"")).then(|| t.elapsed())
}

#[test]
fn slow_http_clients_never_delay_healthz_and_are_dropped_at_2_s() {
    let relay = Relay::start(&nowhere(), &[]);
    let port = relay.metrics_port;
    // 600 clients that send nothing (past the endpoint's 512 open
    // connections: the oldest are dropped for new ones), then 100 that send
    // a head one byte every 300 ms.
    let idle: Vec<TcpStream> = (0..600)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    let mut slow: Vec<(TcpStream, Instant)> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let at = Instant::now();
            s.write_all(b"GET /healthz HTTP/1.1\r\n")
                .expect("first line");
            s.set_nonblocking(true).expect("nonblocking");
            (s, at)
        })
        .collect();
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut closed_at: Vec<Option<Duration>> = vec![None; slow.len()];
    while started.elapsed() < Duration::from_secs(5) {
        for ((s, at), closed) in slow.iter_mut().zip(closed_at.iter_mut()) {
            if closed.is_some() {
                continue;
            }
            let _ = s.write_all(b"X");
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => *closed = Some(at.elapsed()),
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    *closed = Some(at.elapsed())
                }
                _ => {}
            }
        }
        answers.push(timed_healthz(port));
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(idle);
    println!("healthz beside 100 slow and 600 idle clients: {answers:?}");
    for a in &answers {
        let took = a.expect("no answer to /healthz");
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
    // Each slow client is dropped once its head has taken 2 s (seen at the
    // next 300 ms round).
    for c in &closed_at {
        let at = c.expect("a slow client was never dropped");
        assert!(
            at >= Duration::from_millis(1500) && at < Duration::from_secs(4),
            "dropped at {at:?}"
        );
    }
}

#[test]
fn a_forged_version_then_hdel_takes_real_publishes_after_the_window() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    let max = 9_007_199_254_740_992u64;
    send_all(&relay, payload("FORGE", 1, 10, 9, max).as_bytes());
    eventually(T, "the forged version written", || {
        hash_version(&redis, "FORGE", 1) == Some(max)
    });
    let forged = Instant::now();
    redis.cli(&["HDEL", "seatstate:FORGE", "1"]);
    // Within the window the relay still drops an older version as coalesced.
    let coalesced = relay.metric("seatboard_relay_coalesced_total");
    send_all(&relay, payload("FORGE", 1, 10, 3, 103).as_bytes());
    eventually(T, "103 coalesced", || {
        relay.metric("seatboard_relay_coalesced_total") > coalesced
    });
    // The selection API goes on publishing; past the window one lands.
    let mut v = 200;
    let landed = wait_for(Duration::from_secs(30), || {
        if let Some(got) = hash_version(&redis, "FORGE", 1) {
            return Some(got);
        }
        v += 1;
        send_all(&relay, payload("FORGE", 1, 10, 4, v).as_bytes());
        std::thread::sleep(Duration::from_millis(200));
        None
    });
    let after = forged.elapsed();
    let got = landed.expect("no real publish written after the window");
    println!("a real publish landed {after:?} after the forged version was written");
    assert!((200..=v).contains(&got), "{got}");
    assert!(
        after >= Duration::from_secs(9),
        "{after:?}: inside the window"
    );
}

#[test]
fn udp_is_off_unless_asked() {
    let out = seatboard_command()
        .args(["relay", "--socket", "", "--metrics", ""])
        .args(["--redis", &nowhere()])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing to receive"), "{err}");
    let help = seatboard_command()
        .args(["relay", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    for f in ["--max-pending-bytes", "SEATBOARD_RELAY_MAX_PENDING_BYTES"] {
        assert!(help.contains(f), "{f} missing from relay --help");
    }
}

/// A relay started at `path` (`--redis redis`) refuses it as a bad value:
/// exit 2, the first line on stderr naming `--socket` and saying `why`.
pub(crate) fn refused_at_socket(path: &std::path::Path, redis: &str, why: &str) {
    let mut child = seatboard_command()
        .arg("relay")
        .arg("--socket")
        .arg(path)
        .args(["--udp", "", "--metrics", "", "--redis", redis])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    // A relay that took the path runs on: stopped, and the test fails.
    let exited = wait_for(T, || child.try_wait().ok().flatten());
    if exited.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(exited.is_some(), "the relay took {}: {err}", path.display());
    assert_eq!(out.status.code(), Some(2), "{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(first.contains("'--socket'") && first.contains(why), "{err}");
}

#[test]
fn a_live_stream_socket_at_socket_is_refused_and_kept() {
    let dir = testkit::relay::socket_dir("stream");
    let path = dir.join("other.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("listen");
    refused_at_socket(&path, &nowhere(), "'--socket'");
    // The other service's socket is still there and still answers.
    let _client = std::os::unix::net::UnixStream::connect(&path).expect("still listening");
    listener.accept().expect("accepted");
    // Once it is gone (a stale file), the relay replaces it.
    drop(listener);
    let relay = Relay::start_at(&path, free_port(), &nowhere(), &[]);
    send_all(&relay, payload("STALE", 1, 10, 1, 1).as_bytes());
    eventually(T, "received", || {
        relay.metric("seatboard_relay_received_total") == 1.0
    });
}

#[test]
fn a_file_at_socket_exits_2_naming_the_flag_and_is_kept() {
    let dir = testkit::relay::socket_dir("file");
    let path = dir.join("relay.sock");
    std::fs::write(&path, b"not a socket").expect("write");
    refused_at_socket(&path, &nowhere(), "not a socket");
    assert_eq!(
        std::fs::read(&path).ok().as_deref(),
        Some(&b"not a socket"[..]),
        "the file is never replaced"
    );
}

/// SIGTERM to `relay` while it holds snapshots: the time to its exit 0.
fn stop_time(relay: &mut Relay) -> Duration {
    for s in 0..2000 {
        send_all(relay, payload("TRM", s, 10, 1, 1).as_bytes());
    }
    eventually(T, "received", || {
        relay.metric("seatboard_relay_received_total") == 2000.0
    });
    let t = Instant::now();
    relay.signal(libc::SIGTERM);
    let st = relay.wait_exit(Duration::from_secs(10)).expect("exited");
    let took = t.elapsed();
    assert_eq!(st.code(), Some(0));
    took
}

#[test]
fn sigterm_with_redis_frozen_or_down_exits_within_2_s() {
    let redis = RedisServer::start();
    let mut relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    freeze(&redis, true);
    let frozen = stop_time(&mut relay);
    freeze(&redis, false);
    let mut relay = Relay::start(&nowhere(), &[]);
    let down = stop_time(&mut relay);
    println!("SIGTERM to exit: Redis frozen {frozen:?}, Redis down {down:?}");
    assert!(frozen <= Duration::from_secs(2), "{frozen:?}");
    assert!(down <= Duration::from_secs(2), "{down:?}");
}

#[test]
fn a_live_datagram_socket_connected_to_another_peer_at_socket_is_refused_and_kept() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixDatagram;
    let dir = testkit::relay::socket_dir("connected");
    let (path, peer_path) = (dir.join("held.sock"), dir.join("peer.sock"));
    let peer = UnixDatagram::bind(&peer_path).expect("peer");
    let held = UnixDatagram::bind(&path).expect("bind");
    held.connect(&peer_path).expect("connect");
    let inode = std::fs::metadata(&path).map(|m| m.ino()).ok();
    refused_at_socket(&path, &nowhere(), "'--socket'");
    assert_eq!(
        std::fs::metadata(&path).map(|m| m.ino()).ok(),
        inode,
        "the socket file was replaced"
    );
    // The other process's socket still works.
    held.send(b"still here").expect("send");
    peer.set_read_timeout(Some(T)).expect("timeout");
    let mut buf = [0u8; 16];
    let n = peer.recv(&mut buf).expect("recv");
    assert_eq!(&buf[..n], b"still here");
}

#[test]
fn a_newer_larger_snapshot_of_a_held_section_replaces_it_at_the_bytes_bound() {
    let mut redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &["--max-pending-bytes", "65536"]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    redis.kill();
    let full = "seatboard_relay_dropped_total{reason=\"full\"}";
    // Two sections of 30,000 bytes: most of the 64 KiB bound.
    for section in 0..2 {
        send_all(&relay, sized_payload("GROW", section, 1, 30_000).as_bytes());
    }
    // A newer, larger snapshot of a held section passes the bound: it
    // replaces the one held (within one datagram of slack).
    send_all(&relay, sized_payload("GROW", 0, 2, 40_000).as_bytes());
    eventually(T, "the newer one held in place of the older", || {
        relay.metric("seatboard_relay_received_total") == 3.0
            && relay.metric("seatboard_relay_pending") == 2.0
    });
    assert_eq!(relay.metric(full), 0.0, "{}", relay.metrics());
    // A new section past the bound is dropped, however small.
    send_all(&relay, sized_payload("GROW", 2, 1, 500).as_bytes());
    eventually(T, "the new section dropped", || relay.metric(full) == 1.0);
    redis.restart();
    assert!(relay.settled(4, T), "{}", relay.metrics());
    assert_eq!(hash_version(&redis, "GROW", 0), Some(2));
    assert_eq!(hash_version(&redis, "GROW", 1), Some(1));
    assert_eq!(hash_version(&redis, "GROW", 2), None);
    assert_eq!(relay.metric(full), 1.0);
}

#[test]
fn reconnect_attempts_to_a_redis_that_resets_every_connection_are_at_most_2_s_apart() {
    // A "Redis" that accepts and resets every connection at once.
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let relay = Relay::start(&format!("redis://127.0.0.1:{port}"), &[]);
    let watched = Instant::now();
    let mut attempts = Vec::new();
    while watched.elapsed() < Duration::from_secs(30) {
        match listener.accept() {
            Ok((conn, _)) => {
                attempts.push(Instant::now());
                let _ = socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    println!("reconnect gaps: {gaps:?}");
    assert!(gaps.len() >= 12, "{} attempts in 30 s", attempts.len());
    let longest = gaps.iter().max().copied().unwrap_or_default();
    assert!(longest <= Duration::from_secs(2), "a gap of {longest:?}");
    // Backed off, not hammering: the later gaps reach past half the cap.
    assert!(
        gaps.iter()
            .rev()
            .take(5)
            .all(|g| *g >= Duration::from_millis(900)),
        "{gaps:?}"
    );
    assert_eq!(relay.healthz()["redis"], false);
}
