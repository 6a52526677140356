//! The `soak` scenario: one hub (`--nodes N`: N behind the shipped HAProxy
//! configuration) on one Redis for `--minutes` (default 20)
//! with everything going wrong at once and again: a storm that comes and goes
//! (bursts at `--rate` snapshots/s, quiet stretches), steady viewers that
//! reconnect like the board page, viewers churning in and out (a third dropped
//! without a close), a few slow consumers, an admin coming and going (the
//! firehose on and off), and on a schedule: the hub SIGKILLed and started
//! again, a rolling restart (SIGTERM, drain, start), Redis restarted, Redis
//! frozen (SIGSTOP, SIGCONT).
//!
//! Every 10 s it samples the hub and Redis (RSS, open fds, threads) and the
//! hub's `/metrics` counters. After every event it checks that every steady
//! viewer's board converges to the last published state (`loadgen`'s
//! `blind` + `ref`). The hub-restarting events happen in the first quarter
//! (the warm-up); the Redis events repeat over the other three, so the second
//! and the last quarter see the same faults and their figures compare one
//! process over time. Result: `target/bench/soak.json`.
//!
//! `--cluster`: a Redis Cluster of three primaries with a replica each
//! instead of the one Redis, the hub(s) on it with `--redis-mode cluster`
//! (sharded pub/sub); the Redis events become `primary_kill` (the primary of
//! the hottest course SIGKILLed, its replica promoted, the dead node left
//! dead) and `primary_freeze` (a primary SIGSTOPped past the node timeout, so
//! its replica takes over, then SIGCONT: it rejoins as a replica).

use crate::cluster_util::{self, Cluster};
use crate::measure::progress;
use crate::procs::{self, Fleet};
use crate::publish::Publisher;
use crate::redis_proc::RedisProc as Redis;
use crate::{Opts, Outcome};
use loadgen::{now_us, zipf_cdf, zipf_pick, Command};
use seatboard::redis::commands::Commands;
use seatboard::redis::{Redis as SbRedis, RedisFlags, RedisMode};
use serde_json::{json, Value};
use shards::Snapshot;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the processes are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How long an event's viewers may take to hold the last published state.
const CONVERGE_MAX: Duration = Duration::from_secs(60);
/// The hub's drain window in a rolling restart.
const DRAIN_MS: u64 = 5_000;
/// Slow consumers (never read) watching the hottest courses.
const STUCK: usize = 20;

fn work_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench")
        .join("soak")
}

/// The hub: `seatboard serve` on a fixed port at the default log level, its
/// stderr appended to one log file over every restart.
struct Hub {
    port: u16,
    flags: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    pid: Arc<AtomicU32>,
}

impl Hub {
    fn start(port: u16, flags: Vec<String>, log: PathBuf) -> Hub {
        let _ = std::fs::remove_file(&log);
        let mut h = Hub {
            port,
            flags,
            log,
            child: None,
            pid: Arc::new(AtomicU32::new(0)),
        };
        assert!(h.spawn(), "the hub did not become ready");
        h
    }

    fn spawn(&mut self) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("hub log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_seatboard"))
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--auth", "jwt", "--jwt-secret", procs::SECRET])
            .args(&self.flags)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn seatboard");
        self.pid.store(child.id(), Relaxed);
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(30);
        while crate::lb::get_status(self.port, "/readyz") != Some(200) {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    fn reap(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while let Some(c) = self.child.as_mut() {
            if let Ok(Some(_)) = c.try_wait() {
                self.child = None;
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// A restart: `sig` (SIGKILL, or SIGTERM and its drain), then start again.
    fn restart(&mut self, sig: i32) -> bool {
        self.signal(sig);
        if !self.reap(Duration::from_millis(DRAIN_MS + 30_000)) {
            self.signal(libc::SIGKILL);
            self.reap(Duration::from_secs(5));
        }
        self.spawn()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A plain-HTTP GET's body, or `None`.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: seatboard\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

/// Counters of `/metrics` that show a leak or a fault over time.
const METRICS: [&str; 11] = [
    "seatboard_connections",
    "seatboard_courses_watched",
    "seatboard_subscriptions",
    "seatboard_frames_sent_total",
    "seatboard_frames_dropped_total",
    "seatboard_resyncs_total",
    "seatboard_slow_consumer_closes_total",
    "seatboard_ws_closes_total",
    "seatboard_ingest_messages_total",
    "seatboard_redis_reconnects_total",
    "seatboard_presence_errors_total",
];

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            let base = k.split('{').next()?;
            (base == name).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

fn count_dir(path: String) -> u64 {
    std::fs::read_dir(path).map_or(0, |d| d.count() as u64)
}

/// One sample of one process.
fn sample_process(pid: u32) -> Value {
    let u = procs::usage(pid);
    json!({
        "pid": pid,
        "rss_kib": u.rss_kib,
        "fds": count_dir(format!("/proc/{pid}/fd")),
        "threads": count_dir(format!("/proc/{pid}/task")),
        "cpu_us": u.cpu_us,
    })
}

/// Samples the hubs and Redis every 10 s until stopped.
fn sampler(
    hubs: Vec<(u16, Arc<AtomicU32>)>,
    others: Arc<Mutex<Vec<(String, u32)>>>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> std::thread::JoinHandle<Vec<Value>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut next = Instant::now();
        while !stop.load(Relaxed) {
            if Instant::now() < next {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            next += SAMPLE_EVERY;
            let hubs: Vec<Value> = hubs
                .iter()
                .map(|(port, pid)| {
                    let mut hub = sample_process(pid.load(Relaxed));
                    let metrics = get(*port, "/metrics").unwrap_or_default();
                    hub["metrics"] = METRICS
                        .iter()
                        .map(|m| (m.to_string(), json!(metric_sum(&metrics, m))))
                        .collect::<serde_json::Map<_, _>>()
                        .into();
                    hub
                })
                .collect();
            let mut s = json!({ "t_s": t0.elapsed().as_secs_f64().round(), "hubs": hubs });
            for (name, pid) in others.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                s[name.as_str()] = sample_process(*pid);
            }
            samples.push(s);
        }
        samples
    })
}

/// What the storm publishes through: the bench's RESP publisher on one
/// Redis, or [`ClusterPub`] on a cluster.
trait Sink: Send {
    /// Queues the next version of one section.
    fn queue(&mut self, course: usize, section: u32, t_us: u64);
    /// Writes what is queued, retrying until Redis takes it.
    fn flush(&mut self);
    /// Per course, per section: the last version published.
    fn versions(&self) -> Vec<Vec<u64>>;
    /// Courses published to.
    fn courses(&self) -> usize;
    /// Snapshots published.
    fn published(&self) -> u64;
    /// Version 1 of every section of every course.
    fn seed(&mut self, sections: u32) {
        for c in 0..self.courses() {
            for s in 0..sections {
                self.queue(c, s, now_us());
            }
            if c % 50 == 49 {
                self.flush();
            }
        }
        self.flush();
    }
}

impl Sink for Publisher {
    fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        Publisher::queue(self, course, section, t_us);
    }
    fn flush(&mut self) {
        Publisher::flush(self);
    }
    fn versions(&self) -> Vec<Vec<u64>> {
        Publisher::versions(self)
    }
    fn courses(&self) -> usize {
        self.courses.len()
    }
    fn published(&self) -> u64 {
        self.published
    }
    fn seed(&mut self, _sections: u32) {
        Publisher::seed(self);
    }
}

/// The same snapshots written through seatboard's own cluster-aware Redis
/// layer (`seatboard::publisher::write`: hashes, then SPUBLISH), which
/// follows a failover (`MOVED`, a dead primary, a new slot map).
struct ClusterPub {
    link: Commands,
    courses: Vec<String>,
    /// Per course, per section: (version, seats_taken).
    state: Vec<Vec<(u64, u32)>>,
    batch: Vec<Snapshot>,
    published: u64,
}

impl ClusterPub {
    fn connect(seeds: &str, courses: Vec<String>, sections: u32) -> ClusterPub {
        let mut flags = RedisFlags::new(seeds);
        flags.redis_mode = RedisMode::Cluster;
        let redis = SbRedis::from_flags(&flags).expect("cluster flags");
        ClusterPub {
            link: Commands::new(&redis, "soak"),
            state: vec![vec![(0, 0); sections as usize]; courses.len()],
            courses,
            batch: Vec::new(),
            published: 0,
        }
    }
}

impl Sink for ClusterPub {
    fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        let st = &mut self.state[course][section as usize];
        st.0 += 1;
        st.1 = (st.1 + 1 + (st.0 as u32 % 3)) % 61;
        let (version, taken) = *st;
        let name = &self.courses[course];
        let json = format!(
            "{{\"course\":\"{name}\",\"section\":{section},\"total_seats\":60,\"seats_taken\":{taken},\"seat_info\":{{\"room\":\"R{section}\",\"t\":{t_us}}},\"version\":{version},\"ts\":{}}}",
            t_us / 1000
        );
        let snap = Snapshot::parse(json.as_bytes(), Some(name)).expect("a valid snapshot");
        self.batch.push(snap);
        self.published += 1;
    }

    fn flush(&mut self) {
        let end = Instant::now() + Duration::from_secs(60);
        for chunk in self.batch.chunks(256) {
            // A repeat after a partial write is harmless: snapshots are versioned.
            while let Err(e) =
                seatboard::publisher::write(&mut self.link, "seats:", "seatstate:", chunk)
            {
                assert!(
                    Instant::now() < end,
                    "the cluster refused writes for 60 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.batch.clear();
    }

    fn versions(&self) -> Vec<Vec<u64>> {
        self.state
            .iter()
            .map(|c| c.iter().map(|s| s.0).collect())
            .collect()
    }

    fn courses(&self) -> usize {
        self.courses.len()
    }

    fn published(&self) -> u64 {
        self.published
    }
}

/// What the main thread asks of the publishing thread.
enum Ask {
    /// Stop publishing once the batch in hand is written; answer with the
    /// last published versions.
    Pause(mpsc::Sender<Vec<Vec<u64>>>),
    Resume,
    Stop,
}

/// The storm: `rate` snapshots/s for the first sixth of every `cycle`, a
/// trickle of 20/s the rest of it; paused while a check reads the truth.
fn storm_thread(
    mut p: Box<dyn Sink>,
    rate: f64,
    skew: f64,
    sections: u32,
    cycle: Duration,
    rx: mpsc::Receiver<Ask>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let cdf = zipf_cdf(p.courses(), skew);
        let mut rng = fastrand::Rng::with_seed(11);
        let (t0, mut last) = (Instant::now(), Instant::now());
        let mut owed = 0.0f64;
        let mut paused = false;
        loop {
            while let Ok(a) = rx.try_recv() {
                match a {
                    Ask::Pause(tx) => {
                        paused = true;
                        let _ = tx.send(p.versions());
                    }
                    Ask::Resume => paused = false,
                    Ask::Stop => return p.published(),
                }
            }
            let now = Instant::now();
            let dt = now.duration_since(last).as_secs_f64();
            last = now;
            let phase = t0.elapsed().as_secs_f64() % cycle.as_secs_f64();
            let r = if phase < cycle.as_secs_f64() / 6.0 {
                rate
            } else {
                20.0
            };
            // No catching up after a stall (Redis frozen): the storm moves on.
            owed = (owed + r * dt).min(r * 0.25);
            if paused {
                owed = 0.0;
            }
            let t = now_us();
            while owed >= 1.0 {
                p.queue(zipf_pick(&cdf, &mut rng), rng.u32(0..sections), t);
                owed -= 1.0;
            }
            p.flush();
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

/// A raw WebSocket upgrade with a token; the stream after the 101 head.
fn upgrade(port: u16, path: &str, user: &str, role: shards::Role) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    let exp = seatboard::clock::unix_ms() / 1000 + 3600;
    let token = seatboard::auth::mint(procs::SECRET.as_bytes(), user, role, exp);
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {token}\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 512];
    match s.read(&mut head) {
        Ok(n) if head[..n].starts_with(b"HTTP/1.1 101") => Some(s),
        _ => None,
    }
}

/// An admin that comes and goes: connected (reading the firehose) for half of
/// every `period`, away the other half.
fn admin(port: u16, period: Duration, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut sessions = 0u64;
        let t0 = Instant::now();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Relaxed) {
            let on =
                (t0.elapsed().as_secs_f64() % period.as_secs_f64()) < period.as_secs_f64() / 2.0;
            if !on {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let Some(mut s) = upgrade(port, "/ws/admin", "soak-admin", shards::Role::Admin) else {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            };
            sessions += 1;
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            while !stop.load(Relaxed)
                && (t0.elapsed().as_secs_f64() % period.as_secs_f64()) < period.as_secs_f64() / 2.0
            {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        }
        sessions
    })
}

/// Viewers that connect, watch one course and leave again: two of three
/// with a close frame, the third by dropping the socket (loadgen's churn
/// children leave the same way without watching, at 100/s).
fn churner(port: u16, courses: Vec<String>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let course = &courses[(n as usize * 7) % courses.len()];
            let Some(mut s) = upgrade(port, "/ws", &format!("churn{n}"), shards::Role::Student)
            else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let op = format!("{{\"op\":\"watch\",\"course\":\"{course}\"}}");
            let _ = s.write_all(&shards::ws_codec::client_frame(
                true,
                1,
                op.as_bytes(),
                [9, 8, 7, 6],
            ));
            if n % 3 != 0 {
                let _ = s.write_all(&shards::ws_codec::client_frame(
                    true,
                    8,
                    &1000u16.to_be_bytes(),
                    [1, 2, 3, 4],
                ));
            }
            // A few hundred a second: pacing of the load.
            std::thread::sleep(Duration::from_millis(3));
        }
        n
    })
}

/// One scheduled fault.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    NodeKill,
    Rolling,
    RedisRestart,
    RedisFreeze,
    PrimaryKill,
    PrimaryFreeze,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::NodeKill => "node_kill",
            Kind::Rolling => "rolling_restart",
            Kind::RedisRestart => "redis_restart",
            Kind::RedisFreeze => "redis_freeze",
            Kind::PrimaryKill => "primary_kill",
            Kind::PrimaryFreeze => "primary_freeze",
        }
    }
}

/// The events and when (s from the start): the hub's restarts in the warm-up
/// quarter, then Redis restart + freeze pairs (in a cluster: primary kill +
/// freeze pairs) evenly over the other three.
fn schedule(total_s: f64, cluster: bool) -> Vec<(f64, Kind)> {
    let (restart, freeze) = if cluster {
        (Kind::PrimaryKill, Kind::PrimaryFreeze)
    } else {
        (Kind::RedisRestart, Kind::RedisFreeze)
    };
    let q = total_s / 4.0;
    let mut v = vec![(q * 0.25, Kind::NodeKill), (q * 0.6, Kind::Rolling)];
    let pairs = ((total_s / 60.0 / 20.0 * 3.0).round() as usize).clamp(1, 12);
    let span = total_s - q;
    for i in 0..pairs {
        let at = q + span * i as f64 / pairs as f64;
        v.push((at + span / pairs as f64 * 0.1, restart));
        v.push((at + span / pairs as f64 * 0.5, freeze));
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Hub `i`'s samples of one quarter (1-based) that belong to its final process.
fn quarter(samples: &[Value], total_s: f64, q: usize, i: usize, pid: u64) -> Vec<&Value> {
    let (a, b) = (total_s * (q - 1) as f64 / 4.0, total_s * q as f64 / 4.0);
    samples
        .iter()
        .map(|s| (s["t_s"].as_f64().unwrap_or(0.0), &s["hubs"][i]))
        .filter(|(t, h)| *t >= a && *t < b && h["pid"].as_u64() == Some(pid))
        .map(|(_, h)| h)
        .collect()
}

/// The worst growth figures of any hub between the second and the last
/// quarter of its final process.
fn growth(samples: &[Value], total_s: f64, hubs: usize) -> (f64, i64, i64, bool) {
    let mut worst = (f64::NAN, i64::MIN, i64::MIN, true);
    for i in 0..hubs {
        let (r, fd, th, same) = hub_growth(samples, total_s, i);
        worst.0 = if worst.0.is_nan() { r } else { worst.0.max(r) };
        worst.1 = worst.1.max(fd);
        worst.2 = worst.2.max(th);
        worst.3 &= same;
    }
    worst
}

fn hub_growth(samples: &[Value], total_s: f64, i: usize) -> (f64, i64, i64, bool) {
    let pid = samples
        .last()
        .and_then(|s| s["hubs"][i]["pid"].as_u64())
        .unwrap_or(0);
    let (q2, q4) = (
        quarter(samples, total_s, 2, i, pid),
        quarter(samples, total_s, 4, i, pid),
    );
    let same_process = !q2.is_empty() && !q4.is_empty();
    let f = |v: &[&Value], k: &dyn Fn(&Value) -> f64| median(v.iter().map(|s| k(s)).collect());
    let rss = |s: &Value| s["rss_kib"].as_f64().unwrap_or(0.0);
    // Descriptors beyond the open connections: the process's own.
    let own_fds = |s: &Value| {
        s["fds"].as_f64().unwrap_or(0.0)
            - s["metrics"]["seatboard_connections"]
                .as_f64()
                .unwrap_or(0.0)
    };
    let threads = |s: &Value| s["threads"].as_f64().unwrap_or(0.0);
    let rss_pct = (f(&q4, &rss) / f(&q2, &rss) - 1.0) * 100.0;
    let fd = (f(&q4, &own_fds) - f(&q2, &own_fds)).round() as i64;
    let th = (f(&q4, &threads) - f(&q2, &threads)).round() as i64;
    (rss_pct, fd, th, same_process)
}

/// Whether the hub reports Redis down.
fn degraded(port: u16) -> bool {
    get(port, "/healthz")
        .and_then(|b| serde_json::from_str::<Value>(&b).ok())
        .is_some_and(|h| h["redis"] == false && h["status"] == "degraded")
}

/// The soak's Redis: one server, or a cluster of three primaries with a
/// replica each.
enum Store {
    Single(Redis),
    Cluster(Cluster),
}

impl Store {
    /// `--redis` for the hubs.
    fn uri(&self) -> String {
        match self {
            Store::Single(r) => r.uri(),
            Store::Cluster(c) => c.uri(),
        }
    }
}

/// The primary to fault: the one serving the hottest course's channel when
/// it has a live replica to take over, else any primary that has one.
fn victim(c: &Cluster, hottest: &str) -> Option<(cluster_util::NodeLine, u16)> {
    let lines = c.nodes_now();
    let live_replica = |id: &str| {
        lines
            .iter()
            .filter(|l| l.primary_id.as_deref() == Some(id))
            .find(|l| cluster_util::cli(l.port, &["PING"]) == "PONG")
            .map(|l| l.port)
    };
    let hot = c.owner(&format!("seats:{hottest}"));
    let mut primaries: Vec<_> = lines.iter().filter(|l| l.primary).cloned().collect();
    primaries.sort_by_key(|l| l.id != hot.id);
    primaries
        .into_iter()
        .find_map(|p| live_replica(&p.id).map(|r| (p, r)))
}

/// A cluster node's process id (`INFO server`).
fn node_pid(port: u16) -> Option<i32> {
    cluster_util::cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:")?.parse().ok())
}

/// `primary_kill` and `primary_freeze`: SIGKILL (left dead for the rest of
/// the run) or SIGSTOP for `freeze` then SIGCONT; both wait for the replica's
/// promotion.
fn cluster_event(kind: Kind, c: &mut Cluster, hottest: &str, freeze: Duration) -> Value {
    let t = Instant::now();
    let Some((primary, replica)) = victim(c, hottest) else {
        return json!({"skipped": "no primary has a live replica"});
    };
    let owns_hottest = c.owner(&format!("seats:{hottest}")).id == primary.id;
    // When the replica reports itself primary (ms from the fault).
    let promoted = || {
        crate::common::wait_for(Duration::from_secs(30), || {
            let role = cluster_util::cli(replica, &["ROLE"]);
            (role.lines().next().map(str::trim) == Some("master"))
                .then(|| t.elapsed().as_millis() as u64)
        })
    };
    if kind == Kind::PrimaryKill {
        c.kill(primary.port);
        let ms = promoted();
        return json!({"killed": primary.port, "owned_hottest": owns_hottest,
                      "promoted": replica, "promoted_ms": ms});
    }
    let pid = node_pid(primary.port).unwrap_or(0);
    // SAFETY: kill(2) on a redis-server of this run's cluster.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let ms = promoted();
    let rest = freeze.saturating_sub(t.elapsed());
    std::thread::sleep(rest);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    json!({"frozen": primary.port, "owned_hottest": owns_hottest, "frozen_ms": t.elapsed().as_millis() as u64,
           "promoted": replica, "promoted_ms": ms})
}

/// Runs one event; returns the moment the fault was over and notes.
fn run_event(
    kind: Kind,
    hubs: &mut [Hub],
    store: &mut Store,
    hottest: &str,
    freeze: Duration,
) -> (Instant, Value) {
    let t = Instant::now();
    let notes = match (kind, store) {
        (Kind::NodeKill, _) => {
            let up = hubs[0].restart(libc::SIGKILL);
            json!({"ready_again": up, "restart_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::Rolling, _) => {
            let mut up = true;
            for (i, hub) in hubs.iter_mut().enumerate() {
                if i > 0 {
                    // Until the proxy's checks saw the last one up (rise 2 at 1 s).
                    std::thread::sleep(Duration::from_millis(2500));
                }
                up &= hub.restart(libc::SIGTERM);
            }
            json!({"ready_again": up, "drain_and_restart_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::PrimaryKill | Kind::PrimaryFreeze, Store::Cluster(c)) => {
            cluster_event(kind, c, hottest, freeze)
        }
        (Kind::RedisRestart, Store::Single(redis)) => {
            redis.restart();
            json!({"redis_down_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::RedisFreeze, Store::Single(redis)) => {
            redis.signal(libc::SIGSTOP);
            let mut noticed = None;
            let mut answered = 0u32;
            let mut unanswered = 0u32;
            while t.elapsed() < freeze {
                match get(hubs[0].port, "/metrics") {
                    Some(_) => answered += 1,
                    None => unanswered += 1,
                }
                if noticed.is_none() && degraded(hubs[0].port) {
                    noticed = Some(t.elapsed().as_millis() as u64);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            redis.signal(libc::SIGCONT);
            json!({"frozen_ms": freeze.as_millis() as u64, "noticed_ms": noticed,
                   "metrics_answered": answered, "metrics_unanswered": unanswered})
        }
        (k, _) => json!({"skipped": format!("{} needs the other Redis setup", k.name())}),
    };
    (Instant::now(), notes)
}

/// After an event: pauses the storm, tells the steady viewers the last
/// published state, and waits until every one holds it. (fraction correct,
/// ms from the end of the fault until all held it).
fn converge(
    f: &mut Fleet,
    pub_tx: &mpsc::Sender<Ask>,
    over: Instant,
    viewers: usize,
) -> (f64, Option<u64>) {
    let (tx, rx) = mpsc::channel();
    let _ = pub_tx.send(Ask::Pause(tx));
    let versions = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the publisher paused");
    f.command(Command::Blind);
    f.command(Command::Ref { versions });
    let end = Instant::now() + CONVERGE_MAX;
    let mut recovered = None;
    // The children report every 500 ms: blind 0 twice in a row after the ref.
    let mut clean = 0;
    std::thread::sleep(Duration::from_millis(600));
    let mut next_note = Instant::now();
    while Instant::now() < end {
        let blind = f.sum(|c| c.blind);
        let open = f.sum(|c| c.open);
        if Instant::now() >= next_note {
            next_note += Duration::from_secs(5);
            let c: Vec<String> = [
                "open",
                "connecting",
                "blind",
                "refused",
                "failed",
                "reconnects",
            ]
            .iter()
            .map(|k| format!("{k} {}", f.sum_named(k)))
            .collect();
            eprintln!("  .. [soak] converging: {}", c.join(", "));
        }
        if blind == 0 && open as usize >= viewers {
            clean += 1;
            if clean >= 2 {
                recovered = Some(over.elapsed().as_millis() as u64);
                break;
            }
        } else {
            clean = 0;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let blind = f.sum(|c| c.blind) as f64;
    let correct = if recovered.is_some() {
        1.0
    } else {
        1.0 - blind.min(viewers as f64) / viewers.max(1) as f64
    };
    let _ = pub_tx.send(Ask::Resume);
    (correct, recovered)
}

/// `soak [--minutes M]`.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new(if o.cluster { "soak_cluster" } else { "soak" });
    let total_s = o.minutes * 60.0;
    let dir = work_dir();
    let _ = std::fs::create_dir_all(&dir);
    let mut store = start_store(o, &dir);
    let flags = hub_flags(o, &store);
    // `--nodes N`: N hubs behind the shipped HAProxy configuration.
    let nodes = if std::env::args().any(|a| a == "--nodes") {
        o.nodes.max(1)
    } else {
        1
    };
    let mut hubs: Vec<Hub> = (0..nodes)
        .map(|i| {
            let log = dir.join(format!("hub-{}-{}.log", std::process::id(), i + 1));
            Hub::start(crate::lb::stable_port(), flags.clone(), log)
        })
        .collect();
    let proxy = (nodes > 1).then(|| start_proxy(o, &dir, &hubs));
    // Where viewers connect: the proxy, or the one hub.
    let port = proxy.as_ref().map_or(hubs[0].port, |lb| lb.port);
    let courses = crate::setup::course_names(o.courses);
    let mut publisher: Box<dyn Sink> = match &store {
        Store::Single(r) => Box::new(Publisher::connect(r.port, courses.clone(), o.sections)),
        Store::Cluster(c) => Box::new(ClusterPub::connect(&c.uri(), courses.clone(), o.sections)),
    };
    publisher.seed(o.sections);
    let max_secs = total_s + 600.0;
    let mut f = crate::setup::fleet(o, port, &courses, o.skew, false, max_secs);
    let open = crate::setup::wait_open(o, &mut f, o.clients, "soak");
    let churn = churn_fleet(o, port, &courses, max_secs);
    let bg = Background::start(o, publisher, &hubs, &store, port, &courses);
    let mut stuck = crate::stuck::open(port, STUCK, &courses[..3.min(courses.len())]);
    let viewers = Viewers {
        port,
        courses: &courses,
        open,
    };
    let events = run_schedule(o, &bg, &mut f, &mut hubs, &mut store, &viewers, &mut stuck);
    while bg.t0.elapsed().as_secs_f64() < total_s {
        std::thread::sleep(Duration::from_millis(200));
    }
    let fin = bg.finish();
    let churn_reports = churn.report();
    let reports = f.report();
    drop(stuck);
    drop(proxy);
    let logs: Vec<PathBuf> = hubs.iter().map(|h| h.log.clone()).collect();
    drop(hubs);
    let s = summarize(o, nodes, open, fin, &churn_reports, &reports, &logs);
    rows(&mut out, o, &s, &events);
    checks(&mut out, o, &s, &events);
    drop(store);
    out
}

/// The soak's Redis: one server, or (`--cluster`) a cluster.
fn start_store(o: &Opts, dir: &Path) -> Store {
    if o.cluster {
        Store::Cluster(Cluster::start())
    } else {
        Store::Single(Redis::start(
            &dir.join(format!("redis-{}", std::process::id())),
        ))
    }
}

/// The hubs' flags on `store`.
fn hub_flags(o: &Opts, store: &Store) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        "--redis".into(),
        store.uri(),
        "--tick-ms".into(),
        o.tick_ms.to_string(),
        "--drain-ms".into(),
        DRAIN_MS.to_string(),
        "--accept-rate".into(),
        "20000".into(),
        "--accept-burst".into(),
        "5000".into(),
    ];
    if o.cluster {
        flags.extend(["--redis-mode".into(), "cluster".into()]);
    }
    flags
}

/// The shipped HAProxy configuration in front of `hubs` (one thread per
/// process), once it sees a hub up.
fn start_proxy(o: &Opts, dir: &Path, hubs: &[Hub]) -> crate::lb::Haproxy {
    let port = crate::lb::free_port();
    let ports: Vec<u16> = hubs.iter().map(|h| h.port).collect();
    let cfg = crate::lb::render(
        &crate::lb::shipped(),
        &crate::lb::Bind::Plain(port),
        &ports,
        9000,
    );
    let cfg = cfg.replacen("global\n", "global\n    nbthread 1\n", 1);
    let lb = crate::lb::Haproxy::start(
        dir,
        port,
        &crate::lb::log_to_stdout(&cfg),
        o.haproxy_procs.max(1),
    );
    assert!(
        lb.wait_ready("/readyz", Duration::from_secs(20)),
        "haproxy never saw a hub up"
    );
    lb
}

/// The load generator's churning viewers (100 connects/s, a third dropped
/// without a close).
fn churn_fleet(o: &Opts, port: u16, courses: &[String], max_secs: f64) -> Fleet {
    Fleet::start(vec![loadgen::Config {
        port,
        child: 90,
        clients: 0,
        courses: courses.to_vec(),
        skew: o.skew,
        connect_rate: 100.0,
        inflight: 32,
        churn: true,
        secret: procs::SECRET.into(),
        seed: 0xc4,
        max_secs: max_secs.ceil() as u64,
        sources: 4,
        watch: true,
        deflate: false,
        tokens_file: None,
        sse: false,
        ..loadgen::Config::default()
    }])
}

/// The soak's Redis process to sample (none for a cluster).
fn redis_pid(s: &Store) -> Vec<(String, u32)> {
    match s {
        Store::Single(r) => vec![("redis".to_string(), r.pid())],
        Store::Cluster(_) => Vec::new(),
    }
}

/// What runs all through the soak: the sampler, the storm, the admin and
/// the in-process churner.
struct Background {
    stop: Arc<AtomicBool>,
    t0: Instant,
    others: Arc<Mutex<Vec<(String, u32)>>>,
    samples: std::thread::JoinHandle<Vec<Value>>,
    pub_tx: mpsc::Sender<Ask>,
    pub_thread: std::thread::JoinHandle<u64>,
    admins: std::thread::JoinHandle<u64>,
    churned: std::thread::JoinHandle<u64>,
}

/// What the background threads counted, once stopped.
struct Finished {
    published: u64,
    samples: Vec<Value>,
    admin_sessions: u64,
    churn_in_process: u64,
}

impl Background {
    /// Starts the background threads on `port`; the storm publishes through
    /// `publisher`.
    fn start(
        o: &Opts,
        publisher: Box<dyn Sink>,
        hubs: &[Hub],
        store: &Store,
        port: u16,
        courses: &[String],
    ) -> Background {
        let total_s = o.minutes * 60.0;
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let others = Arc::new(Mutex::new(redis_pid(store)));
        let samples = sampler(
            hubs.iter().map(|h| (h.port, Arc::clone(&h.pid))).collect(),
            Arc::clone(&others),
            Arc::clone(&stop),
            t0,
        );
        let cycle = Duration::from_secs_f64((total_s / 4.0).min(120.0));
        let (pub_tx, pub_rx) = mpsc::channel();
        let pub_thread = storm_thread(publisher, o.rate, o.skew, o.sections, cycle, pub_rx);
        let admins = admin(
            port,
            Duration::from_secs_f64((total_s / 8.0).min(60.0)),
            Arc::clone(&stop),
        );
        let churned = churner(
            port,
            courses[..courses.len().min(50)].to_vec(),
            Arc::clone(&stop),
        );
        Background {
            stop,
            t0,
            others,
            samples,
            pub_tx,
            pub_thread,
            admins,
            churned,
        }
    }

    /// Stops the threads and collects their counts.
    fn finish(self) -> Finished {
        self.stop.store(true, Relaxed);
        let _ = self.pub_tx.send(Ask::Stop);
        let published = self.pub_thread.join().unwrap_or(0);
        let samples = self.samples.join().unwrap_or_default();
        let admin_sessions = self.admins.join().unwrap_or(0);
        let churn_in_process = self.churned.join().unwrap_or(0);
        Finished {
            published,
            samples,
            admin_sessions,
            churn_in_process,
        }
    }
}

/// Where the steady viewers connect, what they watch and how many are open.
struct Viewers<'a> {
    port: u16,
    courses: &'a [String],
    open: u64,
}

/// The events on their schedule, each followed by the check that every
/// steady viewer's board converges; returns each event's JSON.
fn run_schedule(
    o: &Opts,
    bg: &Background,
    f: &mut Fleet,
    hubs: &mut [Hub],
    store: &mut Store,
    v: &Viewers,
    stuck: &mut Vec<TcpStream>,
) -> Vec<Value> {
    let (t0, courses) = (bg.t0, v.courses);
    let freeze = Duration::from_secs(if o.minutes >= 5.0 { 15 } else { 10 });
    let mut events = Vec::new();
    for (at, kind) in schedule(o.minutes * 60.0, o.cluster) {
        while t0.elapsed().as_secs_f64() < at {
            std::thread::sleep(Duration::from_millis(200));
        }
        progress(
            o,
            format!(
                "[soak] {:.0}s {}: open {}",
                t0.elapsed().as_secs_f64(),
                kind.name(),
                f.sum(|c| c.open)
            ),
        );
        let started = t0.elapsed().as_secs_f64();
        let (over, notes) = run_event(kind, hubs, store, &courses[0], freeze);
        *bg.others.lock().unwrap_or_else(|e| e.into_inner()) = redis_pid(store);
        let (correct, recovered) = converge(f, &bg.pub_tx, over, v.open as usize);
        progress(
            o,
            format!(
                "[soak] {}: final_correct {correct:.4}, recovered_all_ms {recovered:?}",
                kind.name()
            ),
        );
        events.push(
            json!({"kind": kind.name(), "at_s": started.round(), "final_correct": correct,
                           "recovered_all_ms": recovered, "notes": notes}),
        );
        // Slow consumers again (a restarted hub dropped the old ones).
        drop(std::mem::take(stuck));
        *stuck = crate::stuck::open(v.port, STUCK, &courses[..3.min(courses.len())]);
    }
    events
}

/// What the soak measured, for its rows and checks.
struct Summary {
    nodes: usize,
    open: u64,
    fin: Finished,
    panics: usize,
    log_bytes_per_min: f64,
    rss_growth_pct: f64,
    fd_growth: i64,
    thread_growth: i64,
    same_process: bool,
    churn_upgrades: u64,
    closed_by_server: u64,
}

/// Reads the hubs' `logs` and sums up the run.
fn summarize(
    o: &Opts,
    nodes: usize,
    open: u64,
    fin: Finished,
    churn_reports: &[Value],
    reports: &[Value],
    logs: &[PathBuf],
) -> Summary {
    let logs: Vec<String> = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    let panics: usize = logs.iter().map(|l| l.matches("panicked").count()).sum();
    // Per hub: each has its own log (and disk) in production.
    let log_bytes_per_min =
        logs.iter().map(|l| l.len()).max().unwrap_or(0) as f64 / o.minutes.max(1e-3);
    let (rss_growth_pct, fd_growth, thread_growth, same_process) =
        growth(&fin.samples, o.minutes * 60.0, nodes);
    let churn_upgrades: u64 = churn_reports
        .iter()
        .map(|r| r["counters"]["upgrades"].as_u64().unwrap_or(0))
        .sum();
    let closed_by_server: u64 = reports
        .iter()
        .map(|r| r["counters"]["closed_by_server"].as_u64().unwrap_or(0))
        .sum();
    Summary {
        nodes,
        open,
        fin,
        panics,
        log_bytes_per_min,
        rss_growth_pct,
        fd_growth,
        thread_growth,
        same_process,
        churn_upgrades,
        closed_by_server,
    }
}

/// The soak's rows: the load, each event, growth, panics and log volume.
fn rows(out: &mut Outcome, o: &Opts, s: &Summary, events: &[Value]) {
    let (nodes, open, published) = (s.nodes, s.open, s.fin.published);
    let (churn_in_process, churn_upgrades) = (s.fin.churn_in_process, s.churn_upgrades);
    let (admin_sessions, closed_by_server) = (s.fin.admin_sessions, s.closed_by_server);
    out.row("minutes", format!("{}", o.minutes), json!(o.minutes));
    out.row(
        "load",
        format!(
            "{nodes} hub(s){}; {open} steady viewers over {} courses x {} sections; storm bursts at {}/s ({} snapshots in all); churn {} in-process + {churn_upgrades} by loadgen (a third of each dropped without a close); {STUCK} slow consumers; {admin_sessions} admin sessions",
            if nodes > 1 { " behind HAProxy" } else { "" },
            o.courses, o.sections, o.rate, published, churn_in_process
        ),
        json!({"hubs": nodes, "viewers": open, "courses": o.courses, "sections": o.sections, "burst_rate": o.rate,
               "published": published, "churn_in_process": churn_in_process,
               "churn_loadgen": churn_upgrades, "stuck": STUCK, "admin_sessions": admin_sessions,
               "closed_by_server": closed_by_server}),
    );
    for e in events {
        out.rows.push((
            format!(
                "event {} at {} s",
                e["kind"].as_str().unwrap_or(""),
                e["at_s"]
            ),
            format!(
                "final_correct {} recovered_all_ms {} {}",
                e["final_correct"], e["recovered_all_ms"], e["notes"]
            ),
        ));
    }
    out.json["events"] = json!(events);
    out.row(
        "rss_growth_pct",
        format!(
            "{:.1} % (median of the last quarter against the second's)",
            s.rss_growth_pct
        ),
        json!(s.rss_growth_pct),
    );
    out.row(
        "fd_growth",
        format!("{} (own descriptors, beyond open connections)", s.fd_growth),
        json!(s.fd_growth),
    );
    out.row(
        "thread_growth",
        s.thread_growth.to_string(),
        json!(s.thread_growth),
    );
    out.row("panics", s.panics.to_string(), json!(s.panics));
    out.row(
        "log_bytes_per_min",
        format!("{:.0} B/min at --log-level info", s.log_bytes_per_min),
        json!(s.log_bytes_per_min),
    );
    out.json["samples"] = json!(s.fin.samples);
}

/// The soak's checks: every viewer connected, one process throughout, every
/// board true after each event, no panic, no growth, modest logs.
fn checks(out: &mut Outcome, o: &Opts, s: &Summary, events: &[Value]) {
    out.check(
        s.open as usize == o.clients,
        "not every steady viewer connected",
    );
    // A short run (the suite's smoke) has quarters too short to say anything
    // about growth, and its warm-up restarts may reach into the second quarter.
    let judged = o.minutes >= 10.0;
    out.check(
        !judged || s.same_process,
        "the hub was restarted after the warm-up (growth figures span two processes)",
    );
    for e in events {
        out.check(
            e["final_correct"].as_f64() == Some(1.0),
            &format!("{} at {} s: boards not all true", e["kind"], e["at_s"]),
        );
    }
    out.check(s.panics == 0, "the hub panicked");
    out.check(
        !judged || (s.rss_growth_pct.is_finite() && s.rss_growth_pct <= 10.0),
        "RSS grew more than 10 %",
    );
    out.check(!judged || s.fd_growth <= 0, "open fds grew");
    out.check(!judged || s.thread_growth <= 0, "threads grew");
    out.check(
        s.log_bytes_per_min < 100.0 * 1024.0,
        "logs over 100 KB a minute",
    );
}
