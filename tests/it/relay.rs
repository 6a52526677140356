//! `seatboard relay` (contract §10) against a real redis-server: datagrams
//! over the Unix socket and UDP land in the state hash, on the channel and on
//! a `serve` board; shuffled versions leave the newest; malformed and
//! oversized datagrams are counted and dropped; Redis stopped, frozen and
//! back; the relay restarted; SIGTERM drains; flags; metrics from start; a
//! cluster with SPUBLISH; an older snapshot never written within 10 s of a
//! newer one, however many sections are written meanwhile; an IPv4-mapped
//! loopback `--udp`.

use crate::cluster_util::{courses_on, Cluster};
use crate::common::*;
use crate::redis_util::{client, eventually, payload, serve, watch};
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use testkit::delay_proxy::RedisAtDistance;
use testkit::relay::Relay;

const T: Duration = Duration::from_secs(15);

/// A raw RESP subscriber (`SUBSCRIBE` or `SSUBSCRIBE`) that collects what it reads.
struct Sub {
    conn: TcpStream,
    seen: String,
}

impl Sub {
    fn new(port: u16, verb: &str, channels: &[&str]) -> Sub {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("redis");
        conn.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let mut cmd = format!("*{}\r\n${}\r\n{verb}\r\n", channels.len() + 1, verb.len());
        for c in channels {
            cmd.push_str(&format!("${}\r\n{c}\r\n", c.len()));
        }
        conn.write_all(cmd.as_bytes()).expect("subscribe");
        let mut s = Sub {
            conn,
            seen: String::new(),
        };
        let n = channels.len();
        assert!(
            s.wait(|seen| seen.matches("subscribe").count() >= n),
            "not subscribed"
        );
        s
    }

    fn wait(&mut self, mut f: impl FnMut(&str) -> bool) -> bool {
        let end = Instant::now() + T;
        let mut buf = [0u8; 65536];
        while Instant::now() < end {
            if f(&self.seen) {
                return true;
            }
            if let Ok(n) = self.conn.read(&mut buf) {
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
        f(&self.seen)
    }
}

fn version_in(json: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(json).ok()?["version"].as_u64()
}

fn hash_version(redis: &RedisServer, course: &str, section: u32) -> Option<u64> {
    version_in(&redis.cli(&["HGET", &format!("seatstate:{course}"), &section.to_string()]))
}

/// Sends on the Unix socket, waiting out a full socket buffer (EAGAIN).
fn send_all(relay: &Relay, p: &[u8]) {
    let end = Instant::now() + T;
    while relay.send_unix(p).is_err() {
        assert!(Instant::now() < end, "the relay's socket stayed full");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn datagrams_reach_the_hash_the_channel_and_a_board() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &[]);
    let mut ws = client(&sb, "user=u1");
    watch(&mut ws, "CS101");
    let mut sub = Sub::new(redis.port, "SUBSCRIBE", &["seats:CS101"]);
    let relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    send_all(&relay, payload("CS101", 1, 40, 10, 1).as_bytes());
    relay
        .send_udp(payload("CS101", 2, 40, 20, 1).as_bytes())
        .expect("udp send");
    // The Go publisher's field names.
    let go =
        r#"{"SharedCourseCode":"CS101","SectionID":3,"TotalSeats":40,"SeatsTaken":30,"Version":1}"#;
    send_all(&relay, go.as_bytes());
    eventually(T, "hash written", || {
        (1..=3).all(|s| hash_version(&redis, "CS101", s) == Some(1))
    });
    assert!(
        sub.wait(|seen| [
            "\"seats_taken\":10",
            "\"seats_taken\":20",
            "\"seats_taken\":30"
        ]
        .iter()
        .all(|n| seen.contains(n))),
        "not published: {}",
        sub.seen
    );
    let mut board = Board::default();
    let end = Instant::now() + T;
    while Instant::now() < end {
        if let Some(f) = next_of_type(&mut ws, "frame", Duration::from_secs(2)) {
            board.apply(&f);
        }
        if (1..=3)
            .all(|s| board.0.get(&s).map(|v| v["seats_taken"].clone()) == Some((s * 10).into()))
        {
            break;
        }
    }
    for s in 1..=3u64 {
        assert_eq!(board.0[&s]["seats_taken"], s * 10, "board {board:?}");
    }
    assert_eq!(relay.metric("seatboard_relay_published_total"), 3.0);
    assert_eq!(relay.metric("seatboard_relay_received_total"), 3.0);
}

#[test]
fn shuffled_versions_leave_the_newest() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    let mut sends: Vec<(u32, u64)> = (0..5)
        .flat_map(|s| (1..=400).map(move |v| (s, v)))
        .collect();
    fastrand::shuffle(&mut sends);
    for (i, (s, v)) in sends.iter().enumerate() {
        let p = payload("HOT", *s, 500, *v as u32, *v);
        if i % 2 == 0 {
            send_all(&relay, p.as_bytes());
        } else {
            relay.send_udp(p.as_bytes()).expect("udp send");
        }
        if i % 20 == 0 {
            // Paced: loopback UDP drops what overflows the receive buffer.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(relay.settled(sends.len() as u64, T), "{}", relay.metrics());
    for s in 0..5 {
        assert_eq!(hash_version(&redis, "HOT", s), Some(400), "section {s}");
    }
    let m = relay.metrics();
    let published = metric_value(&m, "seatboard_relay_published_total");
    let coalesced = metric_value(&m, "seatboard_relay_coalesced_total");
    assert_eq!(published + coalesced, sends.len() as f64, "{m}");
    assert!(coalesced > 0.0, "{m}");
}

#[test]
fn malformed_and_oversized_datagrams_are_counted_and_dropped() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    let big = format!(
        r#"{{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    let bad: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        b"[1,2]".to_vec(),
        br#"{"course":"CS101","section":1,"total_seats":2}"#.to_vec(),
        br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":9007199254740993}"#.to_vec(),
        br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":-1}"#.to_vec(),
        big.into_bytes(),
    ];
    for p in &bad {
        send_all(&relay, p);
    }
    send_all(
        &relay,
        payload("CS101", 1, 40, 5, 9_007_199_254_740_992).as_bytes(),
    );
    assert!(relay.settled(7, T), "{}", relay.metrics());
    let m = relay.metrics();
    assert_eq!(
        metric_value(&m, "seatboard_relay_rejected_total{reason=\"json\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "seatboard_relay_rejected_total{reason=\"schema\"}"),
        4.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "seatboard_relay_rejected_total{reason=\"too_large\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "seatboard_relay_published_total"),
        1.0,
        "{m}"
    );
    assert_eq!(
        hash_version(&redis, "CS101", 1),
        Some(9_007_199_254_740_992)
    );
    assert_eq!(relay.healthz()["status"], "ok");
}

#[test]
fn redis_stopped_and_restarted_mid_stream() {
    let mut redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    for s in 0..10 {
        send_all(&relay, payload("MID", s, 100, 1, 1).as_bytes());
    }
    assert!(relay.settled(10, T));
    redis.kill();
    // Held while Redis is away: the newest of each section.
    for v in 2..=50u64 {
        for s in 0..10 {
            send_all(&relay, payload("MID", s, 100, v as u32, v).as_bytes());
        }
    }
    eventually(T, "Redis down seen", || {
        relay.healthz()["redis"] == false && relay.metric("seatboard_relay_redis_up") == 0.0
    });
    eventually(T, "all received", || {
        relay.metric("seatboard_relay_received_total") == 500.0
    });
    assert_eq!(relay.metric("seatboard_relay_pending"), 10.0);
    assert_eq!(relay.healthz()["status"], "degraded");
    redis.restart();
    eventually(T, "written once Redis is back", || {
        (0..10).all(|s| hash_version(&redis, "MID", s) == Some(50))
    });
    // What arrives after it is back is written too.
    send_all(&relay, payload("MID", 3, 100, 51, 51).as_bytes());
    eventually(T, "later snapshot", || {
        hash_version(&redis, "MID", 3) == Some(51)
    });
    assert_eq!(relay.healthz()["redis"], true);
    assert_eq!(relay.metric("seatboard_relay_dropped_total{"), 0.0);
}

#[test]
fn a_frozen_redis_is_noticed_and_the_relay_writes_once_it_answers() {
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    let pid = redis
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse::<i32>().ok())
        .expect("redis pid");
    // SAFETY: kill(2) on the test's own redis-server.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    send_all(&relay, payload("FRZ", 1, 10, 1, 1).as_bytes());
    let noticed = wait_for(Duration::from_secs(10), || {
        (relay.healthz()["redis"] == false).then_some(())
    });
    assert_eq!(relay.metric("seatboard_relay_redis_up"), 0.0);
    send_all(&relay, payload("FRZ", 1, 10, 2, 2).as_bytes());
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(noticed.is_some(), "a frozen Redis not noticed within 10 s");
    eventually(T, "written after the thaw", || {
        hash_version(&redis, "FRZ", 1) == Some(2)
    });
    eventually(T, "up again", || relay.healthz()["redis"] == true);
}

#[test]
fn at_the_section_bound_the_newest_of_a_section_in_flight_is_kept() {
    // Redis 200 ms away each way: a write is in flight for 400 ms.
    let far = RedisAtDistance::start(Duration::from_millis(200));
    let relay = Relay::start(&far.far_uri(), &["--max-pending", "10"]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    for section in 0..10 {
        send_all(&relay, payload("MP", section, 10, 1, 1).as_bytes());
    }
    // The batch has reached Redis (the last of its ten is in the hash): its
    // replies are still 200 ms from the relay, the ten sections in flight.
    eventually(T, "the first ten in Redis", || {
        hash_version(&far.redis, "MP", 9) == Some(1)
    });
    // Newer snapshots of the same ten sections are no new sections; an
    // eleventh section is.
    for section in 0..10 {
        send_all(&relay, payload("MP", section, 10, 2, 2).as_bytes());
    }
    send_all(&relay, payload("MP", 10, 10, 1, 1).as_bytes());
    assert!(relay.settled(21, T), "{}", relay.metrics());
    let versions: Vec<Option<u64>> = (0..10).map(|s| hash_version(&far.redis, "MP", s)).collect();
    assert_eq!(versions, vec![Some(2); 10], "{}", relay.metrics());
    assert_eq!(hash_version(&far.redis, "MP", 10), None);
    assert_eq!(
        relay.metric("seatboard_relay_dropped_total{reason=\"full\"}"),
        1.0
    );
}

#[test]
fn a_restarted_relay_replaces_its_stale_socket_and_goes_on() {
    let redis = RedisServer::start();
    let mut relay = Relay::start(&redis.uri(), &[]);
    let (socket, udp) = (relay.socket.clone(), relay.udp.port());
    send_all(&relay, payload("RST", 1, 10, 1, 1).as_bytes());
    eventually(T, "first", || hash_version(&redis, "RST", 1) == Some(1));
    relay.signal(libc::SIGKILL);
    relay.wait_exit(T).expect("killed");
    assert!(socket.exists(), "a killed relay leaves its socket file");
    let relay = Relay::start_at(&socket, udp, &redis.uri(), &[]);
    send_all(&relay, payload("RST", 1, 10, 2, 2).as_bytes());
    relay
        .send_udp(payload("RST", 2, 10, 2, 2).as_bytes())
        .expect("udp");
    eventually(T, "after restart", || {
        hash_version(&redis, "RST", 1) == Some(2) && hash_version(&redis, "RST", 2) == Some(2)
    });
    let mode = std::fs::metadata(&socket).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    assert_eq!(mode.ok(), Some(0o660));
    // A second relay on a socket in use refuses to start: a bad value
    // (exit 2), the first line naming the flag, the socket still the first's.
    crate::relay_harden::refused_at_socket(&socket, &redis.uri(), "another process");
    send_all(&relay, payload("RST", 1, 10, 3, 3).as_bytes());
    eventually(T, "the first relay still reads its socket", || {
        hash_version(&redis, "RST", 1) == Some(3)
    });
}

#[test]
fn sigterm_writes_what_is_held_and_exits_0() {
    let redis = RedisServer::start();
    let mut relay = Relay::start(&redis.uri(), &[]);
    for s in 0..3000u32 {
        send_all(&relay, payload("TRM", s, 10, 1, 1).as_bytes());
    }
    eventually(T, "received", || {
        relay.metric("seatboard_relay_received_total") == 3000.0
    });
    relay.signal(libc::SIGTERM);
    let st = relay.wait_exit(Duration::from_secs(5)).expect("exited");
    assert_eq!(st.code(), Some(0));
    assert_eq!(redis.cli(&["HLEN", "seatstate:TRM"]), "3000");
    assert!(!relay.socket.exists(), "socket file left behind");

    // With Redis frozen: at most 2 s of trying, then exit 0.
    let mut relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    let pid: i32 = redis
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("pid");
    // SAFETY: kill(2) on the test's own redis-server.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    send_all(&relay, payload("TRM", 0, 10, 2, 2).as_bytes());
    eventually(T, "received", || {
        relay.metric("seatboard_relay_received_total") == 1.0
    });
    relay.signal(libc::SIGTERM);
    let st = relay.wait_exit(Duration::from_secs(6));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(st.and_then(|s| s.code()), Some(0));
}

#[test]
fn a_non_loopback_udp_address_exits_2_naming_the_flag() {
    for (flag, value) in [
        ("--udp", "0.0.0.0:7440"),
        ("--udp", "10.1.2.3:7440"),
        ("--udp", "not-an-address"),
        ("--metrics", "nope"),
        ("--max-pending", "0"),
    ] {
        let out = seatboard_command()
            .args(["relay", "--socket", ""])
            .args([flag, value])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains(flag), "{flag} {value}: {err}");
    }
    let out = seatboard_command()
        .args(["relay", "--help"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for f in [
        "--socket",
        "--udp",
        "--metrics",
        "--max-pending",
        "--redis",
        "--pubsub",
        "--channel-prefix",
        "--state-prefix",
        "SEATBOARD_RELAY_SOCKET",
        "SEATBOARD_RELAY_UDP",
        "SEATBOARD_RELAY_METRICS",
        "SEATBOARD_RELAY_MAX_PENDING",
    ] {
        assert!(help.contains(f), "{f} missing from relay --help");
    }
}

#[test]
fn metrics_are_exported_at_zero_from_start_and_env_twins_apply() {
    let dir = testkit::relay::socket_dir("env");
    let metrics = free_port();
    let mut child = seatboard_command()
        .arg("relay")
        .env("SEATBOARD_RELAY_SOCKET", dir.join("r.sock"))
        .env("SEATBOARD_RELAY_UDP", "")
        .env("SEATBOARD_RELAY_METRICS", format!("127.0.0.1:{metrics}"))
        .env("SEATBOARD_RELAY_MAX_PENDING", "5")
        // Nothing listens there: Redis is down from the start.
        .env(
            "REALTIME_REDIS_URI",
            format!("redis://127.0.0.1:{}", free_port()),
        )
        .spawn()
        .expect("relay");
    let m = wait_for(T, || {
        http_get(metrics, "/metrics")
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("metrics")
    .body;
    for line in [
        "seatboard_relay_received_total 0",
        "seatboard_relay_rejected_total{reason=\"json\"} 0",
        "seatboard_relay_rejected_total{reason=\"schema\"} 0",
        "seatboard_relay_rejected_total{reason=\"too_large\"} 0",
        "seatboard_relay_coalesced_total 0",
        "seatboard_relay_published_total 0",
        "seatboard_relay_dropped_total{reason=\"full\"} 0",
        "seatboard_relay_dropped_total{reason=\"redis_down\"} 0",
        "seatboard_relay_pending 0",
        "seatboard_relay_redis_up 0",
    ] {
        assert!(m.lines().any(|l| l == line), "{line} missing:\n{m}");
    }
    let h: serde_json::Value =
        serde_json::from_str(&http_get(metrics, "/healthz").expect("healthz").body).expect("json");
    assert_eq!(
        h,
        serde_json::json!({"status":"degraded","redis":false,"pending":0})
    );
    // --max-pending 5 by its variable: the sixth section is dropped as full.
    let tx = std::os::unix::net::UnixDatagram::unbound().expect("sock");
    for s in 0..6 {
        tx.send_to(payload("ENV", s, 10, 1, 1).as_bytes(), dir.join("r.sock"))
            .expect("send");
    }
    eventually(T, "full", || {
        let m = http_get(metrics, "/metrics")
            .map(|r| r.body)
            .unwrap_or_default();
        metric_value(&m, "seatboard_relay_dropped_total{reason=\"full\"}") == 1.0
            && metric_value(&m, "seatboard_relay_pending") == 5.0
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_for(T, || child.try_wait().ok().flatten()).expect("exit");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn cluster_writes_on_the_slot_owner_and_spublishes() {
    let c = Cluster::primaries_only();
    let primaries = c.primaries();
    let courses: Vec<String> = primaries
        .iter()
        .map(|p| courses_on(p, 1)[0].clone())
        .collect();
    let mut subs: Vec<Sub> = courses
        .iter()
        .map(|course| {
            let ch = format!("seats:{course}");
            Sub::new(c.owner(&ch).port, "SSUBSCRIBE", &[&ch])
        })
        .collect();
    let relay = Relay::start(&c.uri(), &[]);
    for v in [3u64, 1, 2] {
        for course in &courses {
            send_all(&relay, payload(course, 7, 50, v as u32, v).as_bytes());
        }
    }
    for course in &courses {
        let key = format!("seatstate:{course}");
        let owner = c.owner(&key).port;
        eventually(T, "hash on the owner", || {
            version_in(&c.cli(owner, &["HGET", &key, "7"])) == Some(3)
        });
    }
    for (sub, course) in subs.iter_mut().zip(&courses) {
        let want = format!("\"course\":\"{course}\"");
        assert!(
            sub.wait(|s| s.contains(&want) && s.contains("\"version\":3")),
            "{}",
            sub.seen
        );
    }
}

#[test]
fn a_snapshot_redis_refuses_is_dropped_and_the_rest_written() {
    let redis = RedisServer::start();
    // Not a hash: the compare-and-set fails with WRONGTYPE for this course only.
    redis.cli(&["SET", "seatstate:BAD", "x"]);
    let relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    send_all(&relay, payload("BAD", 1, 10, 1, 1).as_bytes());
    send_all(&relay, payload("GOOD", 1, 10, 1, 1).as_bytes());
    assert!(relay.settled(2, T), "{}", relay.metrics());
    assert_eq!(hash_version(&redis, "GOOD", 1), Some(1));
    assert_eq!(
        relay.metric("seatboard_relay_dropped_total{reason=\"redis_down\"}"),
        1.0
    );
    assert_eq!(relay.healthz()["redis"], true);
}

/// Connections Redis has accepted since it started (`INFO stats`).
fn connections_received(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix("total_connections_received:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no connection count in INFO stats: {stats}"))
}

#[test]
fn a_refusal_keeps_the_relays_connection() {
    let redis = RedisServer::start();
    redis.cli(&["SET", "seatstate:BAD", "x"]);
    let relay = Relay::start(&redis.uri(), &[]);
    eventually(T, "relay sees Redis", || relay.healthz()["redis"] == true);
    // One good write first: the relay's command connection is open.
    send_all(&relay, payload("GOOD", 1, 10, 1, 1).as_bytes());
    assert!(relay.settled(1, T), "{}", relay.metrics());
    let before = connections_received(&redis);
    // Twenty refusals, each answered by Redis in full: the connection they
    // came on is in step, and Redis is up.
    for section in 1..=20 {
        send_all(&relay, payload("BAD", section, 10, 1, 1).as_bytes());
        assert!(relay.settled(1 + section as u64, T), "{}", relay.metrics());
    }
    send_all(&relay, payload("GOOD", 2, 10, 1, 1).as_bytes());
    assert!(relay.settled(22, T), "{}", relay.metrics());
    // (The INFO read here is one connection of its own.)
    let after = connections_received(&redis);
    assert_eq!(hash_version(&redis, "GOOD", 2), Some(1));
    assert_eq!(
        relay.metric("seatboard_relay_dropped_total{reason=\"redis_down\"}"),
        20.0
    );
    assert!(
        after - before <= 1,
        "{} connections for 20 refusals (the relay reconnected after each)",
        after - before
    );
    assert_eq!(relay.healthz()["redis"], true);
}

#[test]
fn an_older_snapshot_is_not_written_within_10_s_however_many_sections_are_written() {
    let redis = RedisServer::start();
    // Ten sections held at most: what was written is remembered whatever that bound.
    let relay = Relay::start(&redis.uri(), &["--max-pending", "10"]);
    send_all(&relay, payload("FX", 1, 100, 100, 100).as_bytes());
    eventually(T, "v100 written", || {
        hash_version(&redis, "FX", 1) == Some(100)
    });
    let written = Instant::now();
    // Thirty other sections written, ten at a time (none dropped as full).
    let mut received = 1;
    for round in 0..3u32 {
        for s in 0..10 {
            send_all(
                &relay,
                payload("OTHER", round * 10 + s, 10, 1, 1).as_bytes(),
            );
        }
        received += 10;
        assert!(relay.settled(received, T), "{}", relay.metrics());
    }
    // The field deleted (by hand, or by a repair): only the relay's memory
    // of v100 keeps the older v50 out of the hash now.
    redis.cli(&["HDEL", "seatstate:FX", "1"]);
    let coalesced = relay.metric("seatboard_relay_coalesced_total");
    send_all(&relay, payload("FX", 1, 100, 50, 50).as_bytes());
    assert!(relay.settled(received + 1, T), "{}", relay.metrics());
    let after = written.elapsed();
    assert!(
        after < Duration::from_secs(10),
        "inconclusive: v50 settled {after:?} after v100 was written"
    );
    assert_eq!(
        hash_version(&redis, "FX", 1),
        None,
        "v50 written {after:?} after v100"
    );
    assert_eq!(
        relay.metric("seatboard_relay_coalesced_total"),
        coalesced + 1.0
    );
    assert_eq!(
        relay.metric("seatboard_relay_dropped_total{reason=\"full\"}"),
        0.0
    );
}

/// A relay process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_ipv4_mapped_loopback_udp_address_is_taken_as_loopback() {
    let redis = RedisServer::start();
    let (udp, metrics) = (free_port(), free_port());
    let mut relay = Running(
        seatboard_command()
            .arg("relay")
            .args(["--socket", ""])
            .args(["--udp", &format!("[::ffff:127.0.0.1]:{udp}")])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .args(["--redis", &redis.uri()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn seatboard relay"),
    );
    let started = wait_for(T, || {
        if let Ok(Some(st)) = relay.0.try_wait() {
            return Some(Err(st));
        }
        http_get(metrics, "/healthz")
            .is_ok_and(|r| r.status == 200)
            .then_some(Ok(()))
    });
    if let Some(Err(st)) = started {
        let mut err = String::new();
        if let Some(mut e) = relay.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("the relay exited ({st}): {err}");
    }
    assert!(started.is_some(), "the relay did not answer /healthz");
    // A sender on IPv4 loopback reaches it.
    let tx = UdpSocket::bind("127.0.0.1:0").expect("udp sender");
    tx.send_to(
        payload("MAPPED", 1, 10, 1, 1).as_bytes(),
        ("127.0.0.1", udp),
    )
    .expect("udp send");
    eventually(T, "written", || {
        hash_version(&redis, "MAPPED", 1) == Some(1)
    });
}
