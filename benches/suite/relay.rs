//! `relay`: the one rule measured from the sender's side, and what the relay
//! costs. The sender is this process: one non-blocking `sendto` per snapshot
//! on an unconnected Unix datagram socket (what every sender of
//! docs/publishing.md does), paced at `--rate` (15,000/s) over `--courses` x
//! `--sections` sections with rising versions, for `--seconds` per case:
//! the relay running, Redis frozen (SIGSTOP), the relay stopped (no socket:
//! ENOENT), its queue full (`--max-pending 100` and Redis frozen), and a burst
//! sent unpaced (the socket buffer full: EAGAIN). Each case's send p99/max in
//! µs. In the same run, the relay's CPU and Redis's CPU per snapshot against
//! the `Publisher` writing directly at the same rate (its thread's CPU), and
//! coalescing at one hot section: every snapshot to one section. Last, the
//! relay's memory under a flood of 64 KiB sections with Redis down, at two
//! `--max-pending-bytes` bounds: RSS against each bound.

use super::{Opts, Outcome};
use crate::procs;
use crate::redis_rig::RedisRig;
use seatboard::publisher::{Publisher, PublisherConfig};
use seatboard::redis::RedisFlags;
use serde_json::{json, Value};
use shards::Snapshot;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::common::metric_value;
use testkit::relay::Relay;

/// Send latencies of one case.
struct Sends {
    ns: Vec<u32>,
    errors: u64,
}

impl Sends {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.ns.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied().unwrap_or(0) as f64 / 1000.0
    }

    fn json(&self) -> Value {
        json!({"sends": self.ns.len(), "errors": self.errors,
               "p50_us": self.pct(0.50), "p99_us": self.pct(0.99), "max_us": self.pct(1.0)})
    }

    fn shown(&self) -> String {
        format!("p99 {:.1} / max {:.0} µs", self.pct(0.99), self.pct(1.0))
    }
}

/// The `n`th snapshot's payload: section `n` mod `sections`, version `n + 1`.
fn payload(n: u64, courses: usize, sections: u32, hot: bool) -> String {
    let (course, section) = if hot {
        (0, 0)
    } else {
        let s = n % (courses as u64 * u64::from(sections));
        (s / u64::from(sections), (s % u64::from(sections)) as u32)
    };
    format!(
        r#"{{"course":"RELAY{course}","section":{section},"total_seats":40,"seats_taken":{},"seat_info":{{"room":"B12"}},"version":{},"ts":0}}"#,
        n % 40,
        n + 1
    )
}

/// Sends at `rate`/s (unpaced when `rate` is 0) for `seconds` or `max` sends.
fn send(to: &Path, o: &Opts, rate: f64, seconds: f64, max: u64, first: u64, hot: bool) -> Sends {
    let sock = UnixDatagram::unbound().expect("socket");
    sock.set_nonblocking(true).expect("nonblocking");
    let mut out = Sends {
        ns: Vec::with_capacity((rate * seconds) as usize + 1),
        errors: 0,
    };
    let t0 = Instant::now();
    let mut n = 0u64;
    while n < max && t0.elapsed().as_secs_f64() < seconds {
        let due = if rate > 0.0 {
            (t0.elapsed().as_secs_f64() * rate) as u64
        } else {
            n + 1
        };
        if n >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let p = payload(first + n, o.courses, o.sections, hot);
        let t = Instant::now();
        let r = sock.send_to(p.as_bytes(), to);
        out.ns
            .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        out.errors += u64::from(r.is_err());
        n += 1;
    }
    out
}

/// CPU µs of this process's threads whose name starts with `prefix`.
fn threads_cpu_us(prefix: &str) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let f: Vec<&str> = after.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            (ticks(11) + ticks(12)) * 1_000_000 / hz
        })
        .sum()
}

fn freeze(pid: u32, on: bool) {
    // SAFETY: kill(2) on the scenario's own redis-server.
    unsafe { libc::kill(pid as i32, if on { libc::SIGSTOP } else { libc::SIGCONT }) };
}

/// Relay and Redis CPU over one paced run through the relay.
struct Through {
    sends: Sends,
    received: f64,
    published: f64,
    relay_cpu_us: u64,
    redis_cpu_us: u64,
}

fn through_relay(relay: &Relay, redis_pid: u32, o: &Opts, first: u64, hot: bool) -> Through {
    let (r0, d0) = (
        procs::usage(relay.pid() as u32).cpu_us,
        procs::usage(redis_pid).cpu_us,
    );
    let m0 = relay.metrics();
    let sends = send(&relay.socket, o, o.rate, o.seconds, u64::MAX, first, hot);
    relay.settled(0, Duration::from_secs(30));
    let m1 = relay.metrics();
    let delta = |k: &str| metric_value(&m1, k) - metric_value(&m0, k);
    Through {
        received: delta("seatboard_relay_received_total"),
        published: delta("seatboard_relay_published_total"),
        relay_cpu_us: procs::usage(relay.pid() as u32).cpu_us - r0,
        redis_cpu_us: procs::usage(redis_pid).cpu_us - d0,
        sends,
    }
}

/// The same snapshots through the `Publisher` (its thread's CPU, Redis's CPU).
struct Direct {
    calls: Sends,
    published: u64,
    thread_cpu_us: u64,
    redis_cpu_us: u64,
}

fn through_publisher(uri: &str, redis_pid: u32, o: &Opts, first: u64, hot: bool) -> Direct {
    let p = Publisher::start(PublisherConfig {
        redis: RedisFlags::new(uri),
        channel_prefix: "seats:".into(),
        state_prefix: "seatstate:".into(),
        queue: 10_000,
        state_ttl: None,
    })
    .expect("publisher");
    let (t0, d0) = (
        threads_cpu_us("seatboard-publi"),
        procs::usage(redis_pid).cpu_us,
    );
    let mut calls = Sends {
        ns: Vec::new(),
        errors: 0,
    };
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < o.seconds {
        if n >= (start.elapsed().as_secs_f64() * o.rate) as u64 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let text = payload(first + n, o.courses, o.sections, hot);
        let s = Snapshot::parse(text.as_bytes(), None).expect("valid");
        let t = Instant::now();
        let ok = p.publish(s);
        calls
            .ns
            .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        calls.errors += u64::from(!ok);
        n += 1;
    }
    p.flush(Duration::from_secs(30));
    Direct {
        published: p.published(),
        thread_cpu_us: threads_cpu_us("seatboard-publi") - t0,
        redis_cpu_us: procs::usage(redis_pid).cpu_us - d0,
        calls,
    }
}

/// Runs the scenario.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("relay");
    let redis = RedisRig::start();
    let rpid = redis.pids()[0];
    let uri = redis.uri();
    let relay = Relay::start(&uri, &[]);
    // Warm up: the script loaded, the connection made.
    send(&relay.socket, o, 0.0, 1.0, 1000, 0, false);
    relay.settled(0, Duration::from_secs(30));

    // 1. Normal, through the relay and through the Publisher: CPU per snapshot.
    // (Each case's versions start above the last's: the relay never writes
    // a version lower than one it wrote.)
    let base = 1_000_000u64;
    let normal = through_relay(&relay, rpid, o, base, false);
    let direct = through_publisher(&uri, rpid, o, base + 10_000_000, false);
    cpu_rows(&mut out, o, &normal, &direct);
    // 2-5. The faults.
    let faults = fault_cases(&mut out, o, &relay, rpid, &uri);
    send_rows(&mut out, &normal, &direct, &faults);
    // 6. One hot section: the relay coalesces, the Publisher writes each.
    hot_section(&mut out, o, &relay, rpid, &uri);
    // 7. Memory: a flood of 64 KiB sections, Redis down.
    memory_bound(&mut out);
    out
}

/// A snapshot of section `s` a little under 64 KiB.
fn big_payload(s: u32) -> String {
    let head = format!(
        r#"{{"course":"FLOOD","section":{s},"total_seats":40,"seats_taken":1,"version":1,"seat_info":{{"p":""#
    );
    format!("{head}{}\"}}}}", "x".repeat(65_000 - head.len()))
}

/// 2,000 sections of 64 KiB (125 MiB) sent to a relay whose Redis is down,
/// at a bound of 16 MiB and of 64 MiB (the default): RSS after each flood.
fn memory_bound(out: &mut Outcome) {
    const SECTIONS: u32 = 2000;
    let mut rows = Vec::new();
    for bound_mib in [16u64, 64] {
        let nowhere = format!("redis://127.0.0.1:{}", testkit::proc::free_port());
        let bytes = (bound_mib << 20).to_string();
        let relay = Relay::start(&nowhere, &["--max-pending-bytes", &bytes]);
        let sock = UnixDatagram::unbound().expect("socket");
        for s in 0..SECTIONS {
            let p = big_payload(s);
            let end = Instant::now() + Duration::from_secs(30);
            while sock.send_to(p.as_bytes(), &relay.socket).is_err() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let end = Instant::now() + Duration::from_secs(60);
        while relay.metric("seatboard_relay_received_total") < f64::from(SECTIONS)
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let held = relay.metric("seatboard_relay_pending");
        let rss_mib = procs::usage(relay.pid() as u32).rss_kib as f64 / 1024.0;
        out.check(
            rss_mib < (bound_mib + 32) as f64,
            "the relay's RSS past its bytes bound plus a few MiB",
        );
        rows.push((bound_mib, held, rss_mib));
    }
    let shown: Vec<String> = rows
        .iter()
        .map(|(b, held, rss)| format!("bound {b} MiB: {held:.0} held, RSS {rss:.1} MiB"))
        .collect();
    out.row(
        "relay_rss_64kib_flood",
        format!(
            "{SECTIONS} x 64 KiB sections, Redis down: {} (RSS ratio {:.2} for a 4x bound)",
            shown.join("; "),
            rows[1].2 / rows[0].2.max(1.0)
        ),
        json!(rows
            .iter()
            .map(|(b, held, rss)| json!({"bound_mib": b, "held": held, "rss_mib": rss}))
            .collect::<Vec<_>>()),
    );
}

/// `x` per `n`, `n` at least 1.
fn per(us: u64, n: f64) -> f64 {
    us as f64 / n.max(1.0)
}

/// CPU per snapshot through the relay and through the Publisher.
fn cpu_rows(out: &mut Outcome, o: &Opts, normal: &Through, direct: &Direct) {
    out.check(
        normal.published > 0.0,
        "nothing published through the relay",
    );
    out.check(direct.published > 0, "nothing published by the Publisher");
    let relay_cpu = per(normal.relay_cpu_us, normal.received);
    let relay_redis = per(normal.redis_cpu_us, normal.received);
    let pub_cpu = per(direct.thread_cpu_us, direct.published as f64);
    let pub_redis = per(direct.redis_cpu_us, direct.published as f64);
    out.row(
        "relay_cpu_us_per_snapshot",
        format!(
            "{:.0}/s: relay {relay_cpu:.2} µs (all its threads) / Publisher thread {pub_cpu:.2} µs",
            o.rate
        ),
        json!({"rate": o.rate, "relay": relay_cpu, "publisher_thread": pub_cpu,
               "received": normal.received, "published": normal.published}),
    );
    out.row(
        "redis_cpu_us_per_snapshot",
        format!("via the relay {relay_redis:.2} µs / via the Publisher {pub_redis:.2} µs"),
        json!({"relay": relay_redis, "publisher": pub_redis}),
    );
}

/// The sends of the fault cases, and what the relay held and dropped.
struct Faults {
    frozen: Sends,
    full: Sends,
    stopped: Sends,
    burst: Sends,
    held: f64,
    dropped_full: f64,
}

/// Redis frozen, the queue full, the relay stopped, an unpaced burst.
fn fault_cases(out: &mut Outcome, o: &Opts, relay: &Relay, rpid: u32, uri: &str) -> Faults {
    // 2. Redis frozen.
    freeze(rpid, true);
    let frozen = send(
        &relay.socket,
        o,
        o.rate,
        o.seconds,
        u64::MAX,
        20_000_000,
        false,
    );
    let m = relay.metrics();
    freeze(rpid, false);
    out.check(
        metric_value(&m, "seatboard_relay_dropped_total{") == 0.0,
        "dropped while Redis was frozen with room to hold",
    );
    let held = metric_value(&m, "seatboard_relay_pending");
    relay.settled(0, Duration::from_secs(30));

    // 3. Queue full: room for 100 sections, Redis frozen.
    let small = Relay::start(uri, &["--max-pending", "100"]);
    freeze(rpid, true);
    let full = send(
        &small.socket,
        o,
        o.rate,
        o.seconds,
        u64::MAX,
        30_000_000,
        false,
    );
    std::thread::sleep(Duration::from_millis(500));
    let m = small.metrics();
    freeze(rpid, false);
    let dropped_full = metric_value(&m, "seatboard_relay_dropped_total{reason=\"full\"}");
    out.check(dropped_full > 0.0, "nothing dropped as full");
    drop(small);

    // 4. The relay stopped: no socket (ENOENT).
    let gone = relay.socket.with_extension("gone");
    let stopped = send(&gone, o, o.rate, o.seconds, u64::MAX, 40_000_000, false);
    out.check(
        stopped.errors == stopped.ns.len() as u64,
        "a send to no relay did not fail",
    );

    // 5. A burst, unpaced: the socket buffer fills (EAGAIN).
    let n = (o.rate * o.seconds) as u64;
    let burst = send(&relay.socket, o, 0.0, 60.0, n, 50_000_000, false);
    relay.settled(0, Duration::from_secs(30));
    Faults {
        frozen,
        full,
        stopped,
        burst,
        held,
        dropped_full,
    }
}

/// Each case's send latencies and errors, what the relay held, and the
/// Publisher's call.
fn send_rows(out: &mut Outcome, normal: &Through, direct: &Direct, f: &Faults) {
    let (frozen, full, stopped, burst) = (&f.frozen, &f.full, &f.stopped, &f.burst);
    let (held, dropped_full) = (f.held, f.dropped_full);
    let cases = [
        ("normal", &normal.sends),
        ("redis_frozen", frozen),
        ("queue_full", full),
        ("relay_stopped", stopped),
        ("burst", burst),
    ];
    out.row(
        "relay_send_us",
        cases
            .iter()
            .map(|(k, s)| format!("{k} {}", s.shown()))
            .collect::<Vec<_>>()
            .join(", "),
        cases
            .iter()
            .map(|(k, s)| (k.to_string(), s.json()))
            .collect(),
    );
    out.row(
        "relay_send_errors",
        format!(
            "ignored by the sender: normal {}, redis_frozen {}, queue_full {}, relay_stopped {} (ENOENT), burst {} of {} (EAGAIN)",
            normal.sends.errors, frozen.errors, full.errors, stopped.errors, burst.errors, burst.ns.len()
        ),
        json!({"normal": normal.sends.errors, "redis_frozen": frozen.errors,
               "queue_full": full.errors, "relay_stopped": stopped.errors,
               "burst": burst.errors}),
    );
    out.row(
        "relay_held",
        format!("Redis frozen: {held} sections held, none dropped; queue full: {dropped_full} new sections dropped (full)"),
        json!({"held_while_frozen": held, "dropped_full": dropped_full}),
    );
    let publisher_call = direct.calls.json();
    out.row(
        "publisher_call_us",
        format!("Publisher::publish() {}", direct.calls.shown()),
        publisher_call,
    );
}

/// One hot section: what the relay wrote of what it received, and Redis's
/// CPU, against the Publisher writing each.
fn hot_section(out: &mut Outcome, o: &Opts, relay: &Relay, rpid: u32, uri: &str) {
    let hot = through_relay(relay, rpid, o, 60_000_000, true);
    let hot_direct = through_publisher(uri, rpid, o, 70_000_000, true);
    let written = hot.published / hot.received.max(1.0);
    out.check(hot.published > 0.0, "the hot section was not written");
    out.row(
        "relay_hot_section",
        format!(
            "{:.0}/s to one section: the relay wrote {:.0} of {:.0} ({:.1}%), Redis CPU {:.2} µs per snapshot sent / the Publisher wrote {} of {}, Redis CPU {:.2} µs",
            o.rate,
            hot.published,
            hot.received,
            written * 100.0,
            per(hot.redis_cpu_us, hot.received),
            hot_direct.published,
            hot_direct.calls.ns.len(),
            per(hot_direct.redis_cpu_us, hot_direct.calls.ns.len() as f64),
        ),
        json!({"received": hot.received, "published": hot.published,
               "redis_cpu_us_per_sent": per(hot.redis_cpu_us, hot.received),
               "relay_cpu_us_per_sent": per(hot.relay_cpu_us, hot.received),
               "publisher_published": hot_direct.published,
               "publisher_redis_cpu_us_per_sent": per(hot_direct.redis_cpu_us, hot_direct.calls.ns.len() as f64)}),
    );
}
