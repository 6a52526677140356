//! seatboard's benchmark suite (`cargo bench --bench suite -- <scenario> [flags]`).
//!
//! Scenarios: `idle`, `storm`, `fanout`, `floor`, `ingest`, `publish_cost`, `handshake`, `compare`,
//! `fleet`, `reconnect`.
//! Each prints a table and writes `target/bench/<scenario>.json`. Run without
//! `--bench` in its arguments (as `cargo test --all-targets` does) it runs a
//! short smoke of every scenario and exits non-zero if one fails.
//!
//! The runner starts `redis-server` and `seatboard serve` (the release build
//! under `cargo bench`), and load-generator processes (this binary re-executed
//! as `__loadgen`, see `loadgen.rs`); it samples the server's CPU time and RSS
//! from /proc. All traffic goes to 127.0.0.0/8 and every run is bounded in
//! connections and time.

#[path = "../../tests/cluster_util/mod.rs"]
mod cluster_util;
#[path = "../../tests/common/mod.rs"]
mod common;
mod fleet;
mod floor;
mod handshake;
use seatboard::rehearse::hist;
mod ingest;
#[path = "../../tests/jwt_util/mod.rs"]
mod jwt_util;
#[path = "../../tests/lb/mod.rs"]
mod lb;
use seatboard::rehearse::viewers as loadgen;
mod procs;
mod publish;
mod publish_cost;
mod reconnect;
mod redis_proc;
mod soak;
mod stuck;

use hist::Hist;
use procs::{Fleet, Redis, Server, Usage};
use publish::Publisher;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Options shared by the scenarios (`--name value`).
#[derive(Debug, Clone)]
struct Opts {
    clients: usize,
    seconds: f64,
    rate: f64,
    courses: usize,
    sections: u32,
    skew: f64,
    procs: usize,
    driver: Option<String>,
    shards: Option<u32>,
    tick_ms: u64,
    connect_rate: f64,
    inflight: usize,
    inner: String,
    snapshots: usize,
    quiet: bool,
    no_watch: bool,
    /// Storm: extra clients that never read.
    stuck: usize,
    /// Storm: a three-primary Redis Cluster with sharded pub/sub instead of one Redis.
    cluster: bool,
    /// Fleet: seatboard nodes behind HAProxy.
    nodes: usize,
    /// Fleet: one event (`kill`, `rolling`, `redis_restart`); all when unset.
    event: Option<String>,
    /// Fleet: the nodes' `--drain-ms`.
    drain_ms: u64,
    /// Fleet: storm seconds before the event, and after recovery.
    before_s: f64,
    after_s: f64,
    /// Fleet: give up waiting for recovery this long after the event.
    max_wait_s: f64,
    /// Fleet: the survivors' "during" window lasts at least this long.
    min_during_s: f64,
    /// Fleet: HAProxy processes sharing the port.
    haproxy_procs: usize,
    /// The server's `--compression`; `on` also makes the load generator offer
    /// permessage-deflate (as browsers do).
    compression: String,
    /// Fanout: `--rate` was given (updates/s); otherwise one update per tick.
    rate_set: bool,
    /// Floor: the frame's size on the wire.
    frame_bytes: usize,
    /// Storm, fanout, idle: skip the floor run (compare runs one floor for all).
    no_floor: bool,
    /// Handshake: the token algorithm (`hs256`, `rs256`, `es256`, `eddsa`, `all`).
    alg: Option<String>,
    /// Load generators: pre-minted tokens, one a line (else HS256 minted per connection).
    tokens_file: Option<String>,
    /// Soak: how long it runs.
    minutes: f64,
    /// Storm, fanout: viewers on `ws` (WebSocket), `sse` (Server-Sent
    /// Events), or `both` (runs on each, A B A B, and their CPU per frame).
    transport: String,
    /// Reconnect: one pass (`default` or `wide` accept bucket); both when unset.
    pass: Option<String>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            clients: 1000,
            seconds: 10.0,
            rate: 15_000.0,
            courses: 500,
            sections: 8,
            skew: 1.1,
            procs: 0,
            driver: None,
            shards: None,
            tick_ms: 200,
            connect_rate: 8000.0,
            inflight: 256,
            inner: "fanout".into(),
            snapshots: 500_000,
            quiet: false,
            no_watch: false,
            stuck: 0,
            cluster: false,
            nodes: 3,
            event: None,
            drain_ms: 10_000,
            before_s: 10.0,
            after_s: 3.0,
            max_wait_s: 30.0,
            min_during_s: 5.0,
            haproxy_procs: 2,
            compression: "on".into(),
            rate_set: false,
            frame_bytes: 190,
            no_floor: false,
            alg: None,
            tokens_file: None,
            minutes: 20.0,
            transport: "ws".into(),
            pass: None,
        }
    }
}

const USAGE: &str =
    "usage: cargo bench --bench suite -- <idle|storm|fanout|floor|ingest|handshake|compare|fleet|soak|reconnect> \
[--clients C] [--seconds D] [--rate R (storm: snapshots/s; fanout: updates/s, default one per tick)] \
[--compression on|off] [--frame-bytes B (floor)] [--courses N] [--sections S] [--skew Z] [--procs P] \
[--driver uring|epoll|auto|tokio] [--shards N] [--tick-ms T] [--connect-rate R] [--inflight K] \
[--inner fanout|storm] [--snapshots N] [--no-watch (idle: connect only)] \
[--no-floor (storm, fanout, idle: skip the floor run)] \
[--alg hs256|rs256|es256|eddsa|all (handshake: token algorithm, default all side by side)] \
[--transport ws|sse|both (storm, fanout: viewers on WebSocket, Server-Sent Events, or each in turn)] \
[--stuck N (storm: N more clients watch the 3 hottest courses and never read)] \
[--redis-mode standalone|cluster (storm, idle: cluster = 3 primaries, SPUBLISH/SSUBSCRIBE)] \
[fleet: --event kill|rolling|redis_restart --nodes N --drain-ms D --before S --haproxy-procs P] \
[soak: --minutes M --cluster (3 primaries with a replica each; a primary killed)] [reconnect: --pass default|wide (one accept bucket; both when unset)]";

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts::default();
    let mut scenario = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with("--") {
            scenario = Some(a.clone());
            continue;
        }
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        let num = |s: String| {
            s.parse::<f64>()
                .map_err(|_| format!("bad number for {a}: {s}"))
        };
        match a.as_str() {
            "--clients" => o.clients = num(val()?)? as usize,
            "--seconds" => o.seconds = num(val()?)?,
            "--rate" => {
                o.rate = num(val()?)?;
                o.rate_set = true;
            }
            "--compression" => o.compression = val()?,
            "--frame-bytes" => o.frame_bytes = num(val()?)? as usize,
            "--courses" => o.courses = num(val()?)? as usize,
            "--sections" => o.sections = num(val()?)? as u32,
            "--skew" => o.skew = num(val()?)?,
            "--procs" => o.procs = num(val()?)? as usize,
            "--driver" => o.driver = Some(val()?),
            "--shards" => o.shards = Some(num(val()?)? as u32),
            "--tick-ms" => o.tick_ms = num(val()?)? as u64,
            "--connect-rate" => o.connect_rate = num(val()?)?,
            "--inflight" => o.inflight = num(val()?)? as usize,
            "--inner" => o.inner = val()?,
            "--snapshots" => o.snapshots = num(val()?)? as usize,
            "--no-watch" => o.no_watch = true,
            "--no-floor" => o.no_floor = true,
            "--alg" => o.alg = Some(val()?),
            "--transport" => {
                o.transport = val()?;
                if !matches!(o.transport.as_str(), "ws" | "sse" | "both") {
                    return Err(format!("unknown --transport {}", o.transport));
                }
            }
            "--stuck" => o.stuck = num(val()?)? as usize,
            "--redis-mode" => {
                o.cluster = match val()?.as_str() {
                    "standalone" => false,
                    "cluster" => true,
                    m => return Err(format!("unknown --redis-mode {m}")),
                }
            }
            "--cluster" => o.cluster = true,
            "--nodes" => o.nodes = num(val()?)? as usize,
            "--minutes" => o.minutes = num(val()?)?,
            "--event" => o.event = Some(val()?),
            "--drain-ms" => o.drain_ms = num(val()?)? as u64,
            "--before" => o.before_s = num(val()?)?,
            "--haproxy-procs" => o.haproxy_procs = num(val()?)? as usize,
            "--pass" => o.pass = Some(val()?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if scenario.as_deref() == Some("fleet") {
        if !args.iter().any(|a| a == "--clients") {
            o.clients = 15_000;
        }
        // Under the three nodes' default accept buckets (2,000/s each).
        if !args.iter().any(|a| a == "--connect-rate") {
            o.connect_rate = 3000.0;
        }
        // Three nodes on the box's 2 cores: one shard each (two each only
        // add threads that take turns: nodes +15 points of a core, the
        // survivors' p99 up, at 15,000 viewers).
        if o.shards.is_none() {
            o.shards = Some(1);
        }
        if let Some(e) = &o.event {
            if !fleet::EVENTS.contains(&e.as_str()) {
                return Err(format!("unknown event {e}"));
            }
        }
    }
    scenario
        .map(|s| (s, o))
        .ok_or_else(|| "no scenario given".into())
}

/// What a scenario measured.
struct Outcome {
    scenario: String,
    rows: Vec<(String, String)>,
    json: Value,
    problems: Vec<String>,
}

impl Outcome {
    fn new(scenario: &str) -> Outcome {
        Outcome {
            scenario: scenario.into(),
            rows: Vec::new(),
            json: json!({ "scenario": scenario }),
            problems: Vec::new(),
        }
    }

    fn row(&mut self, key: &str, shown: String, value: Value) {
        self.rows.push((key.into(), shown));
        self.json[key] = value;
    }

    fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            self.problems.push(what.into());
        }
    }

    fn print(&self) {
        let w = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        println!("\n== {} ==", self.scenario);
        for (k, v) in &self.rows {
            println!("  {k:<w$}  {v}");
        }
        for p in &self.problems {
            println!("  PROBLEM: {p}");
        }
    }

    fn save(&self) {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("bench");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{}.json", self.scenario));
        let text = serde_json::to_string_pretty(&self.json).expect("json");
        match std::fs::write(&path, text) {
            Ok(()) => println!("  -> {}", path.display()),
            Err(e) => println!("  (could not write {}: {e})", path.display()),
        }
    }
}

fn progress(o: &Opts, msg: String) {
    if !o.quiet {
        eprintln!("  .. {msg}");
    }
}

/// Server flags: the scenario's tick, driver and shards, a generous accept
/// bucket (ramp-up is not what is measured, except in `handshake`), and `extra`.
fn server_flags(o: &Opts, extra: &[&str]) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "--tick-ms".into(),
        o.tick_ms.to_string(),
        "--accept-rate".into(),
        "10000000".into(),
        "--accept-burst".into(),
        "1000000".into(),
        "--max-connections".into(),
        "1000000".into(),
    ];
    if let Some(d) = &o.driver {
        f.extend(["--driver".into(), d.clone()]);
    }
    if let Some(s) = o.shards {
        f.extend(["--shards".into(), s.to_string()]);
    }
    f.extend(["--compression".into(), o.compression.clone()]);
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

fn course_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("C{i:04}")).collect()
}

/// Splits `clients` over load-generator processes (each well under the fd limit).
fn fleet(o: &Opts, port: u16, courses: &[String], skew: f64, churn: bool, max_secs: f64) -> Fleet {
    let procs = if o.procs > 0 {
        o.procs
    } else if churn {
        2
    } else {
        o.clients.div_ceil(9000).max(1)
    };
    let configs = (0..procs)
        .map(|i| loadgen::Config {
            port,
            child: i as u32,
            clients: o.clients / procs + usize::from(i < o.clients % procs),
            courses: courses.to_vec(),
            skew,
            connect_rate: o.connect_rate / procs as f64,
            inflight: o.inflight,
            churn,
            secret: procs::SECRET.into(),
            tokens_file: o.tokens_file.clone(),
            seed: 0x5eed + i as u64,
            max_secs: max_secs.ceil() as u64,
            sources: 8,
            watch: !o.no_watch,
            deflate: o.compression == "on",
            sse: o.transport == "sse",
            ..loadgen::Config::default()
        })
        .collect();
    Fleet::start(configs)
}

/// Waits until `target` connections are open (or no progress for 15 s).
fn wait_open(o: &Opts, f: &mut Fleet, target: usize, label: &str) -> u64 {
    let start = Instant::now();
    let mut last = (0u64, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let open = f.sum("open");
        let failed = f.sum("failed");
        let refused = f.sum("refused");
        progress(
            o,
            format!(
                "[{label}] {:.1}s connecting: open={open}/{target} refused={refused} failed={failed}",
                start.elapsed().as_secs_f64()
            ),
        );
        if open as usize >= target {
            return open;
        }
        if open > last.0 {
            last = (open, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(15) {
            return open;
        }
    }
}

/// Records how busy the machine was in the measured window: the load
/// generator, Redis and the server share its 2 cores, and so does anything
/// else running, which the numbers must not hide.
fn machine_row(out: &mut Outcome, a: (u64, u64), b: (u64, u64)) {
    let idle = procs::idle_pct(a, b);
    out.row(
        "machine_idle_pct",
        format!(
            "{idle:.1}% of the machine idle in the window (load avg {:.2})",
            procs::loadavg()
        ),
        json!(idle),
    );
}

fn cpu_pct(a: Usage, b: Usage, secs: f64) -> f64 {
    (b.cpu_us.saturating_sub(a.cpu_us)) as f64 / (secs * 1e6) * 100.0
}

/// Sleeps `secs`, printing server CPU, RSS and the rate of the load
/// generators' `counter` (e.g. `frames`, `upgrades`) each second.
fn watch(o: &Opts, label: &str, counter: &str, secs: f64, server: &Server, f: &mut Fleet) {
    let start = Instant::now();
    let mut prev = (server.usage(), f.sum(counter), Instant::now());
    while start.elapsed().as_secs_f64() < secs {
        let left = secs - start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs_f64(left.clamp(0.0, 1.0)));
        let now = (server.usage(), f.sum(counter), Instant::now());
        let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
        progress(
            o,
            format!(
                "[{label}] {:.0}/{secs:.0}s  server cpu {:.1}% of a core  rss {} MiB  {counter}/s {:.0}  open {}  refused {}",
                start.elapsed().as_secs_f64(),
                cpu_pct(prev.0, now.0, dt),
                now.0.rss_kib / 1024,
                now.1.saturating_sub(prev.1) as f64 / dt,
                f.sum("open"),
                f.sum("refused"),
            ),
        );
        prev = now;
    }
}

fn merged_latency(reports: &[Value]) -> Hist {
    let mut h = Hist::default();
    for r in reports {
        h.merge_json(&r["latency"]);
    }
    h
}

/// (clients whose board equals the publisher's, clients checked).
fn correctness(reports: &[Value], p: &Publisher, expected_clients: usize) -> (u64, u64) {
    let mut ok = 0;
    for r in reports {
        for d in r["digests"].as_array().into_iter().flatten() {
            let (c, dg, n) = (
                d[0].as_u64().unwrap_or(0) as usize,
                d[1].as_u64().unwrap_or(0),
                d[2].as_u64().unwrap_or(0),
            );
            if dg == p.expected(c) {
                ok += n;
            }
        }
    }
    (ok, expected_clients as u64)
}

fn counter(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Redis for a scenario (three primaries under `--redis-mode cluster`) and
/// the server flags that go with it.
fn start_redis(o: &Opts) -> (Redis, &'static [&'static str]) {
    if o.cluster {
        (Redis::start_cluster(3), &["--redis-mode", "cluster"])
    } else {
        (Redis::start(), &[])
    }
}

/// Wake-ups per second of each thread of `pid` from `w0` to now, over `secs`.
fn wakeup_rates(pid: u32, w0: &BTreeMap<String, u64>, secs: f64) -> Vec<(String, f64)> {
    procs::wakeups(pid)
        .iter()
        .map(|(k, v)| {
            let n = v.saturating_sub(w0.get(k).copied().unwrap_or(0));
            (k.clone(), n as f64 / secs)
        })
        .collect()
}

/// A row with the total wake-ups per second and each thread's.
fn wakeups_row(out: &mut Outcome, key: &str, per_thread: &[(String, f64)], secs: f64) {
    let total: f64 = per_thread.iter().map(|x| x.1).sum();
    out.row(
        key,
        format!(
            "{total:.2}/s over {secs:.0} s ({})",
            by_thread_text(per_thread.iter().map(|(k, v)| (k, v)), 2)
        ),
        json!({"total": total, "threads": per_thread.iter().cloned().collect::<BTreeMap<_, _>>()}),
    );
}

fn idle(o: &Opts) -> Outcome {
    let mut out = Outcome::new(if o.cluster { "idle_cluster" } else { "idle" });
    let (redis, mode) = start_redis(o);
    let server = Server::start(&redis, &server_flags(o, mode));
    std::thread::sleep(Duration::from_secs(1));
    // Wake-ups with no connection at all: every thread's context switches.
    let quiet = o.seconds.min(20.0);
    let w0 = procs::wakeups(server.pid());
    std::thread::sleep(Duration::from_secs_f64(quiet));
    let per_thread = wakeup_rates(server.pid(), &w0, quiet);
    wakeups_row(&mut out, "wakeups_per_s_no_connection", &per_thread, quiet);
    let before = server.usage();
    let th0 = procs::cpu_by_thread(server.pid());
    let frames0 = server.metric("seatboard_frames_sent_total");
    let cw0 = procs::wakeups(server.pid());
    let courses = course_names(o.courses);
    let t_connect = Instant::now();
    let mut f = fleet(o, server.port, &courses, o.skew, false, o.seconds + 600.0);
    // The connect phase: from the first connect until every client has its
    // watch answer (or is open, under --no-watch).
    let answered = reconnect::wait_answered(
        &mut f,
        o.clients as u64,
        !o.no_watch,
        Duration::from_secs(120),
    );
    let connected = server.usage();
    let th1 = procs::cpu_by_thread(server.pid());
    let frames = server.metric("seatboard_frames_sent_total") - frames0;
    let cw1 = procs::wakeups(server.pid());
    let connect_secs = t_connect.elapsed().as_secs_f64();
    let open = wait_open(o, &mut f, o.clients, "idle");
    let connect_cpu = connect_rows(
        &mut out,
        (before, connected),
        (&th0, &th1),
        open,
        connect_secs,
    );
    let per = frames / open.max(1) as f64;
    out.row(
        "connect_frames_per_conn",
        format!("{per:.2} frames queued per connection in the connect phase ({frames:.0})"),
        json!(per),
    );
    let switches = per_each(&cw0, &cw1, open);
    let total: f64 = switches.values().sum();
    out.row(
        "connect_switches_per_conn",
        format!(
            "{total:.2} context switches per connection in the connect phase (by thread {})",
            by_thread_text(&switches, 2)
        ),
        json!({"per_conn": total, "by_thread": switches}),
    );
    out.check(answered, "not every client had its watch answer");
    std::thread::sleep(Duration::from_secs(3));
    let after = server.usage();
    let k0 = procs::machine_ticks();
    let window = o.seconds;
    let w0 = procs::wakeups(server.pid());
    watch(o, "idle", "frames", window, &server, &mut f);
    let end = server.usage();
    let k1 = procs::machine_ticks();
    // The same with the clients connected and watching (nothing published):
    // the shards' timers and the clients' pings, and the ingest thread asleep
    // on its pub/sub connection(s).
    let per_thread = wakeup_rates(server.pid(), &w0, window);
    wakeups_row(&mut out, "wakeups_per_s_watching", &per_thread, window);
    let marks = f.mark();
    let lg_cpu = f.cpu_us();
    drop(f.report());
    let per_conn =
        (after.rss_kib.saturating_sub(before.rss_kib) * 1024) as f64 / open.max(1) as f64;
    let cpu = cpu_pct(after, end, window);
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "rss_before_kib",
        format!("{} KiB", before.rss_kib),
        json!(before.rss_kib),
    );
    out.row(
        "rss_after_kib",
        format!("{} KiB", after.rss_kib),
        json!(after.rss_kib),
    );
    out.row(
        "rss_per_conn_bytes",
        format!("{per_conn:.0} B per connection"),
        json!(per_conn),
    );
    out.row(
        "idle_cpu_pct_core",
        format!("{cpu:.2}% of one core over {window:.0} s"),
        json!(cpu),
    );
    out.row(
        "frames_received",
        counter(&marks, "frames").to_string(),
        json!(counter(&marks, "frames")),
    );
    out.row(
        "loadgen_cpu_s",
        format!("{:.1} s", lg_cpu as f64 / 1e6),
        json!(lg_cpu as f64 / 1e6),
    );
    out.check(open as usize == o.clients, "not every client connected");
    machine_row(&mut out, k0, k1);
    drop(server);
    if !o.no_floor && !o.no_watch && o.transport == "ws" {
        connect_floor_rows(&mut out, o, &courses, connect_cpu);
    }
    out
}

/// The connect floor in the same run (see `floor::run_connect`): as many
/// clients at the same rate, each answered with the least a server can do;
/// the server's connect CPU per connection as a ratio to it.
fn connect_floor_rows(out: &mut Outcome, o: &Opts, courses: &[String], ours_us: f64) {
    let port = procs::free_port();
    let cfg = floor::ConnectConfig {
        port,
        max_secs: o.seconds as u64 + 600,
    };
    let mut child = floor::spawn("__connect_floor", &cfg);
    let pid = child.id();
    progress(o, "[idle] the connect floor".into());
    let (u0, w0) = (procs::usage(pid), procs::wakeups(pid));
    let mut f = fleet(o, port, courses, o.skew, false, o.seconds + 600.0);
    let answered =
        reconnect::wait_answered(&mut f, o.clients as u64, true, Duration::from_secs(120));
    let (u1, w1) = (procs::usage(pid), procs::wakeups(pid));
    let switches: f64 = per_each(&w0, &w1, o.clients as u64).values().sum();
    drop(f.report());
    let _ = child.kill();
    let _ = child.wait();
    let floor_us = u1.cpu_us.saturating_sub(u0.cpu_us) as f64 / o.clients.max(1) as f64;
    out.row(
        "connect_floor_cpu_us_per_conn",
        format!("{floor_us:.0} µs per connection (one epoll loop: accept, 101 + hello in one write, the watch answer and count in another)"),
        json!(floor_us),
    );
    out.row(
        "connect_floor_switches_per_conn",
        format!("{switches:.2} context switches per connection in the connect floor"),
        json!(switches),
    );
    let ratio = ours_us / floor_us.max(1e-9);
    out.row(
        "connect_ratio_to_floor",
        format!("{ratio:.2}x the connect floor's CPU per connection"),
        json!(ratio),
    );
    out.check(
        answered,
        "connect floor: not every client had its watch answer",
    );
}

/// Each thread's growth from `th0` to `th1` (CPU µs or wake-ups), divided by `n`
/// (connections, reconnections).
pub(crate) fn per_each(
    th0: &BTreeMap<String, u64>,
    th1: &BTreeMap<String, u64>,
    n: u64,
) -> BTreeMap<String, f64> {
    th1.iter()
        .map(|(k, v)| {
            let d = v.saturating_sub(th0.get(k).copied().unwrap_or(0));
            (k.clone(), d as f64 / n.max(1) as f64)
        })
        .collect()
}

/// Values by thread as a table cell: `thread value, …`, to `places` decimals.
pub(crate) fn by_thread_text<'a>(
    by_thread: impl IntoIterator<Item = (&'a String, &'a f64)>,
    places: usize,
) -> String {
    by_thread
        .into_iter()
        .map(|(k, v)| format!("{k} {v:.places$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The server CPU of the connect phase, per connection and by thread.
fn connect_rows(
    out: &mut Outcome,
    (a, b): (Usage, Usage),
    (th0, th1): (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    open: u64,
    secs: f64,
) -> f64 {
    let cpu = b.cpu_us.saturating_sub(a.cpu_us);
    let per = cpu as f64 / open.max(1) as f64;
    let by_thread = per_each(th0, th1, open);
    out.row(
        "connect_cpu_us_per_conn",
        format!(
            "{per:.0} µs of server CPU per connection ({:.2} s over the {secs:.1} s connect phase; by thread {})",
            cpu as f64 / 1e6,
            by_thread_text(&by_thread, 0)
        ),
        json!({"per_conn_us": per, "total_s": cpu as f64 / 1e6, "secs": secs, "by_thread_us": by_thread}),
    );
    per
}

fn storm(o: &Opts) -> Outcome {
    let mut out = Outcome::new(if o.cluster { "storm_cluster" } else { "storm" });
    let courses = course_names(o.courses);
    let (redis, mode) = start_redis(o);
    let server = Server::start(&redis, &server_flags(o, mode));
    let mut publisher = if o.cluster {
        Publisher::connect_cluster(&redis.ports, courses.clone(), o.sections)
    } else {
        Publisher::connect(redis.port, courses.clone(), o.sections)
    };
    publisher.seed();
    let mut f = fleet(o, server.port, &courses, o.skew, false, o.seconds + 900.0);
    let open = wait_open(o, &mut f, o.clients, "storm");
    let rss_before_stuck = server.usage().rss_kib;
    let stuck = stuck::open(server.port, o.stuck, &courses[..3.min(courses.len())]);
    if o.stuck > 0 {
        progress(
            o,
            format!(
                "[storm] {} stuck clients watching the 3 hottest courses",
                stuck.len()
            ),
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let m0 = f.mark();
    let u0 = server.usage();
    let mut rss_peak = u0.rss_kib;
    let k0 = procs::machine_ticks();
    let r0 = usage_sum(&redis.pids());
    let lg0 = f.cpu_us();
    let th0 = procs::cpu_by_thread(server.pid());
    let t0 = Instant::now();
    let (rate, secs) = (o.rate, o.seconds);
    let mut prev = (u0, counter(&m0, "frames"), Instant::now());
    publisher.storm(rate, secs, o.skew, 7, |sent| {
        let now = (server.usage(), f.sum("frames"), Instant::now());
        rss_peak = rss_peak.max(now.0.rss_kib);
        let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
        progress(
            o,
            format!(
                "[storm] {:.0}/{secs:.0}s published {sent}  server cpu {:.1}% of a core  frames/s {:.0}  open {}",
                t0.elapsed().as_secs_f64(),
                cpu_pct(prev.0, now.0, dt),
                (now.1.saturating_sub(prev.1)) as f64 / dt,
                f.sum("open")
            ),
        );
        prev = now;
    });
    let dt = t0.elapsed().as_secs_f64();
    let u1 = server.usage();
    let k1 = procs::machine_ticks();
    let r1 = usage_sum(&redis.pids());
    let lg1 = f.cpu_us();
    let th1 = procs::cpu_by_thread(server.pid());
    let m1 = f.mark();
    // Settle: every course's last change renders within a tick; give it several.
    std::thread::sleep(Duration::from_millis((o.tick_ms * 5).max(1500)));
    let reports = f.report();
    let lat = merged_latency(&reports);
    let (ok, total) = correctness(&reports, &publisher, o.clients);
    let frames = counter(&m1, "frames") - counter(&m0, "frames");
    let cpu = cpu_pct(u0, u1, dt);
    let dropped = server.metric("seatboard_frames_dropped_total");
    let resyncs = server.metric("seatboard_resyncs_total");
    let pct = 100.0 * ok as f64 / total.max(1) as f64;
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "published",
        format!(
            "{} snapshots in {dt:.1} s ({:.0}/s over {} courses, Zipf {})",
            publisher.published,
            (publisher.published as f64 - (o.courses as u64 * o.sections as u64) as f64) / dt,
            o.courses,
            o.skew
        ),
        json!(publisher.published),
    );
    out.row(
        "server_cpu_pct_2cores",
        format!("{:.1}% of 2 cores ({cpu:.1}% of one)", cpu / 2.0),
        json!(cpu / 2.0),
    );
    if o.stuck > 0 {
        let closes = server.metric("seatboard_slow_consumer_closes_total");
        out.row(
            "stuck_clients",
            format!(
                "{} opened; {closes} closed 4001; server RSS {rss_before_stuck} KiB before them, peak {rss_peak} KiB during the storm (+{} KiB, {:.0} B per stuck client)",
                stuck.len(),
                rss_peak.saturating_sub(rss_before_stuck),
                rss_peak.saturating_sub(rss_before_stuck) as f64 * 1024.0 / stuck.len().max(1) as f64
            ),
            json!({"opened": stuck.len(), "closed_4001": closes, "rss_before_kib": rss_before_stuck, "rss_peak_kib": rss_peak}),
        );
    }
    drop(stuck);
    out.row(
        "server_rss_kib",
        format!("{} KiB", u1.rss_kib),
        json!(u1.rss_kib),
    );
    out.row(
        "frames_delivered",
        format!("{frames} ({:.0}/s)", frames as f64 / dt),
        json!(frames),
    );
    out.row(
        "sections_delivered",
        (counter(&m1, "sections") - counter(&m0, "sections")).to_string(),
        json!(counter(&m1, "sections") - counter(&m0, "sections")),
    );
    out.row(
        "latency_samples",
        lat.total().to_string(),
        json!(lat.total()),
    );
    let (p50, p99, p999) = (lat.quantile(0.5), lat.quantile(0.99), lat.quantile(0.999));
    out.row("latency_ms", format!("p50 {:.1}  p99 {:.1}  p999 {:.1}  max {:.1} (tick {} ms)", p50 as f64 / 1e3, p99 as f64 / 1e3, p999 as f64 / 1e3, lat.max() as f64 / 1e3, o.tick_ms), json!({"p50": p50 as f64 / 1e3, "p99": p99 as f64 / 1e3, "p999": p999 as f64 / 1e3, "max": lat.max() as f64 / 1e3}));
    out.row(
        "final_state_correct",
        format!("{ok}/{total} clients ({pct:.2}%)"),
        json!(pct),
    );
    out.row(
        "server_frames_dropped_resyncs",
        format!("{dropped} dropped, {resyncs} resyncs (send queue full)"),
        json!({"dropped": dropped, "resyncs": resyncs}),
    );
    out.row(
        "closed_by_server",
        counter(&m1, "closed_by_server").to_string(),
        json!(counter(&m1, "closed_by_server")),
    );
    out.row(
        "redis_cpu_pct_core",
        format!("{:.1}%", cpu_pct(r0, r1, dt)),
        json!(cpu_pct(r0, r1, dt)),
    );
    out.row(
        "loadgen_cpu_pct_core",
        format!("{:.1}%", (lg1 - lg0) as f64 / dt / 1e4),
        json!((lg1 - lg0) as f64 / dt / 1e4),
    );
    out.check(open as usize == o.clients, "not every client connected");
    out.check(
        ok == total,
        "final state differs from the last published state",
    );
    out.check(frames > 0, "no frame delivered");
    let wire = wire_row(&mut out, &server, &m0, &m1, frames);
    machine_row(&mut out, k0, k1);
    let thread_us = |name: &str| {
        th1.get(name)
            .unwrap_or(&0)
            .saturating_sub(*th0.get(name).unwrap_or(&0))
    };
    let by_thread: serde_json::Map<String, Value> = th1
        .keys()
        .map(|k| (k.clone(), json!(thread_us(k))))
        .collect();
    out.row(
        "server_cpu_by_thread_us",
        by_thread
            .iter()
            .map(|(k, v)| format!("{k} {:.2} s", v.as_u64().unwrap_or(0) as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Object(by_thread),
    );
    let shard_per_frame = thread_us("seatboard-shard") as f64 / frames.max(1) as f64;
    out.row(
        "shard_cpu_us_per_frame",
        format!("{shard_per_frame:.3} us (shard threads only)"),
        json!(shard_per_frame),
    );
    if !o.no_floor && frames > 0 {
        // The floor in the same run: as many clients, each sent a frame of
        // the storm's wire size as often as the storm delivered one to it.
        let every = Duration::from_secs_f64(o.clients as f64 * dt / frames as f64);
        floor_rows(
            &mut out,
            o,
            wire,
            every,
            shard_per_frame,
            "shard_ratio_to_floor",
            " (shard threads)",
        );
    }
    out
}

fn usage_sum(pids: &[u32]) -> Usage {
    pids.iter().fold(Usage::default(), |a, &p| {
        let u = procs::usage(p);
        Usage {
            cpu_us: a.cpu_us + u.cpu_us,
            rss_kib: a.rss_kib + u.rss_kib,
        }
    })
}

fn fanout(o: &Opts) -> Outcome {
    let mut out = Outcome::new("fanout");
    let redis = Redis::start();
    let server = Server::start(&redis, &server_flags(o, &[]));
    let courses = vec!["HOT".to_string()];
    let mut publisher = Publisher::connect(redis.port, courses.clone(), o.sections);
    publisher.seed();
    let mut f = fleet(o, server.port, &courses, 0.0, false, o.seconds + 900.0);
    let open = wait_open(o, &mut f, o.clients, "fanout");
    std::thread::sleep(Duration::from_secs(2));
    let m0 = f.mark();
    let u0 = server.usage();
    let k0 = procs::machine_ticks();
    let t0 = Instant::now();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut next = Instant::now();
    let mut next_progress = t0 + Duration::from_secs(1);
    let mut prev = (u0, counter(&m0, "frames"), Instant::now());
    let mut updates = 0u64;
    let interval = fanout_interval(o);
    while t0.elapsed().as_secs_f64() < o.seconds {
        publisher.queue(0, rng.u32(0..o.sections), loadgen::now_us());
        publisher.flush();
        updates += 1;
        next += interval;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(1);
            let now = (server.usage(), f.sum("frames"), Instant::now());
            let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
            progress(
                o,
                format!(
                    "[fanout] {:.0}/{:.0}s server cpu {:.1}% of a core  frames/s {:.0}",
                    t0.elapsed().as_secs_f64(),
                    o.seconds,
                    cpu_pct(prev.0, now.0, dt),
                    (now.1.saturating_sub(prev.1)) as f64 / dt
                ),
            );
            prev = now;
        }
    }
    // The last update's frame is due within a tick; include it in the window.
    std::thread::sleep(Duration::from_millis(o.tick_ms / 2 + 50));
    let dt = t0.elapsed().as_secs_f64();
    let u1 = server.usage();
    let k1 = procs::machine_ticks();
    let m1 = f.mark();
    std::thread::sleep(Duration::from_millis((o.tick_ms * 5).max(1000)));
    let reports = f.report();
    let lat = merged_latency(&reports);
    let (ok, total) = correctness(&reports, &publisher, o.clients);
    let frames = counter(&m1, "frames") - counter(&m0, "frames");
    let cpu_us = u1.cpu_us.saturating_sub(u0.cpu_us);
    let per_frame = cpu_us as f64 / frames.max(1) as f64;
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "updates",
        format!(
            "{updates} (one per {:.0} ms; tick {} ms)",
            interval.as_secs_f64() * 1e3,
            o.tick_ms
        ),
        json!(updates),
    );
    out.row(
        "frames_delivered",
        format!("{frames} in {dt:.1} s"),
        json!(frames),
    );
    out.row(
        "frames_per_s",
        format!("{:.0}", frames as f64 / dt),
        json!(frames as f64 / dt),
    );
    out.row(
        "server_cpu_us_per_frame",
        format!("{per_frame:.3} us"),
        json!(per_frame),
    );
    out.row(
        "frames_per_cpu_s",
        format!("{:.0}", frames as f64 / (cpu_us.max(1) as f64 / 1e6)),
        json!(frames as f64 / (cpu_us.max(1) as f64 / 1e6)),
    );
    out.row(
        "server_cpu_pct_core",
        format!("{:.1}%", cpu_pct(u0, u1, dt)),
        json!(cpu_pct(u0, u1, dt)),
    );
    let (p50, p99) = (lat.quantile(0.5), lat.quantile(0.99));
    out.row(
        "latency_ms",
        format!("p50 {:.1}  p99 {:.1}", p50 as f64 / 1e3, p99 as f64 / 1e3),
        json!({"p50": p50 as f64 / 1e3, "p99": p99 as f64 / 1e3}),
    );
    out.row(
        "final_state_correct",
        format!("{ok}/{total}"),
        json!(100.0 * ok as f64 / total.max(1) as f64),
    );
    out.check(open as usize == o.clients, "not every client connected");
    out.check(
        ok == total,
        "final state differs from the last published state",
    );
    out.check(frames > 0, "no frame delivered");
    let wire = wire_row(&mut out, &server, &m0, &m1, frames);
    machine_row(&mut out, k0, k1);
    if !o.no_floor {
        // The floor in the same run: same clients, rate and frame size.
        floor_rows(&mut out, o, wire, interval, per_frame, "ratio_to_floor", "");
    }
    out
}

/// Runs the floor (same clients as `o`, one `wire`-byte frame to each every
/// `every`) and adds its CPU per frame and the ratio of `ours` to it, as row
/// `ratio_key`.
fn floor_rows(
    out: &mut Outcome,
    o: &Opts,
    wire: f64,
    every: Duration,
    ours: f64,
    ratio_key: &str,
    whose: &str,
) {
    let fl = floor_scenario(
        &Opts {
            frame_bytes: wire.round() as usize,
            ..o.clone()
        },
        every,
    );
    let floor_us = fl.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0);
    out.row(
        "floor_cpu_us_per_frame",
        format!(
            "{floor_us:.3} us (plain write(2) of a {wire:.0} B frame every {} ms to each client; machine {:.1}% idle)",
            every.as_millis(),
            fl.json["machine_idle_pct"].as_f64().unwrap_or(0.0)
        ),
        json!(floor_us),
    );
    let ratio = ours / floor_us.max(1e-9);
    out.row(
        ratio_key,
        format!("{ratio:.2}x the floor's CPU per frame{whose}"),
        json!(ratio),
    );
    out.problems
        .extend(fl.problems.iter().map(|p| format!("floor: {p}")));
    out.json["floor"] = fl.json;
}

/// Bytes on the wire per delivered frame (load generator's count over the
/// window), and the server's sent-vs-payload totals; returns the former.
fn wire_row(out: &mut Outcome, server: &Server, m0: &Value, m1: &Value, frames: u64) -> f64 {
    let bytes = counter(m1, "bytes") - counter(m0, "bytes");
    let compressed = counter(m1, "compressed") - counter(m0, "compressed");
    let per = bytes as f64 / frames.max(1) as f64;
    let sent = server.metric("seatboard_ws_bytes_sent_total");
    let payload = server.metric("seatboard_ws_payload_bytes_total");
    out.row(
        "wire_bytes_per_frame",
        format!(
            "{per:.1} B ({compressed} of the window's messages compressed; server total {sent:.0} B sent for {payload:.0} B of payload, {:.2}x)",
            payload / sent.max(1.0)
        ),
        json!({"per_frame": per, "compressed": compressed, "server_sent": sent, "server_payload": payload}),
    );
    per
}

/// The floor (see `floor.rs`): CPU per delivered frame of a plain `write(2)`
/// loop to `o.clients` loopback connections, one `o.frame_bytes` frame each per
/// `interval`.
fn floor_scenario(o: &Opts, interval: Duration) -> Outcome {
    let mut out = Outcome::new("floor");
    let port = procs::free_port();
    let cfg = floor::Config {
        port,
        clients: o.clients,
        interval_ms: interval.as_millis() as u64,
        frame: floor::frame_of_size(o.frame_bytes),
        max_secs: o.seconds as u64 + 600,
    };
    let mut child = floor::spawn("__floor", &cfg);
    let pid = child.id();
    let courses = vec!["HOT".to_string()];
    let mut f = fleet(o, port, &courses, 0.0, false, o.seconds + 600.0);
    let open = wait_open(o, &mut f, o.clients, "floor");
    std::thread::sleep(Duration::from_secs(2));
    let (m0, u0, k0) = (f.mark(), procs::usage(pid), procs::machine_ticks());
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < o.seconds {
        std::thread::sleep(Duration::from_millis(250));
    }
    let dt = t0.elapsed().as_secs_f64();
    let (m1, u1, k1) = (f.mark(), procs::usage(pid), procs::machine_ticks());
    drop(f.report());
    let _ = child.kill();
    let _ = child.wait();
    let frames = counter(&m1, "frames") - counter(&m0, "frames");
    let cpu_us = u1.cpu_us.saturating_sub(u0.cpu_us);
    let per_frame = cpu_us as f64 / frames.max(1) as f64;
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "frame_bytes",
        format!(
            "{} B on the wire, one per {} ms",
            cfg.frame.len(),
            cfg.interval_ms
        ),
        json!(cfg.frame.len()),
    );
    out.row(
        "frames_delivered",
        format!("{frames} in {dt:.1} s ({:.0}/s)", frames as f64 / dt),
        json!(frames),
    );
    out.row(
        "server_cpu_us_per_frame",
        format!("{per_frame:.3} us (the sender's CPU)"),
        json!(per_frame),
    );
    out.check(open as usize == o.clients, "not every client connected");
    out.check(frames > 0, "no frame delivered");
    machine_row(&mut out, k0, k1);
    out
}

fn compare(o: &Opts) -> Outcome {
    let mut out = Outcome::new("compare");
    let metric = "frames_per_cpu_s";
    let mut by: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut runs = Vec::new();
    // Built with `--features tokio-shell`, the server also has `--driver tokio`:
    // a third column, A B C A B C.
    let drivers: &[&str] = if cfg!(feature = "tokio-shell") {
        &["uring", "epoll", "tokio"]
    } else {
        &["uring", "epoll"]
    };
    let order: Vec<&str> = drivers.iter().chain(drivers).copied().collect();
    for (i, &driver) in order.iter().enumerate() {
        let mut oo = o.clone();
        oo.driver = Some(driver.into());
        oo.no_floor = true;
        progress(
            o,
            format!(
                "[compare] run {} of {}: {} with --driver {driver}",
                i + 1,
                order.len(),
                o.inner
            ),
        );
        let r = match o.inner.as_str() {
            "storm" => storm(&oo),
            _ => fanout(&oo),
        };
        let v = match o.inner.as_str() {
            "storm" => {
                // Frames delivered per server CPU-second.
                let frames = r.json["frames_delivered"].as_f64().unwrap_or(0.0);
                let pct = r.json["server_cpu_pct_2cores"].as_f64().unwrap_or(0.0) * 2.0;
                frames / (pct / 100.0 * o.seconds).max(1e-9)
            }
            _ => r.json[metric].as_f64().unwrap_or(0.0),
        };
        out.problems
            .extend(r.problems.iter().map(|p| format!("{driver}: {p}")));
        by.entry(driver).or_default().push(v);
        runs.push(json!({"driver": driver, "run": i + 1, "frames_per_cpu_s": v, "result": r.json}));
    }
    let mean = |d: &str| {
        by.get(d)
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
            .unwrap_or(0.0)
    };
    let (u, e) = (mean("uring"), mean("epoll"));
    out.row(
        "inner",
        format!(
            "{} with {} clients, {:.0} s per run, {}",
            o.inner,
            o.clients,
            o.seconds,
            if drivers.len() == 3 {
                "A B C A B C"
            } else {
                "A B A B"
            }
        ),
        json!(o.inner),
    );
    for &d in drivers {
        let m = mean(d);
        out.row(
            &format!("{d}_frames_per_cpu_s"),
            format!(
                "{:?}  mean {m:.0}",
                by.get(d)
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|x| x.round())
                    .collect::<Vec<_>>()
            ),
            json!(m),
        );
    }
    out.row(
        "ratio_uring_over_epoll",
        format!("{:.2}x", u / e.max(1e-9)),
        json!(u / e.max(1e-9)),
    );
    if drivers.contains(&"tokio") {
        let t = mean("tokio").max(1e-9);
        out.row(
            "ratio_uring_over_tokio",
            format!("{:.2}x", u / t),
            json!(u / t),
        );
        out.row(
            "ratio_epoll_over_tokio",
            format!("{:.2}x", e / t),
            json!(e / t),
        );
    }
    if o.inner != "storm" {
        // CPU per frame against the floor, measured in the same run with the
        // first run's frame size.
        let wire = runs
            .first()
            .and_then(|r| r["result"]["wire_bytes_per_frame"]["per_frame"].as_f64())
            .unwrap_or(o.frame_bytes as f64);
        progress(o, "[compare] the floor".into());
        let fl = floor_scenario(
            &Opts {
                frame_bytes: wire.round() as usize,
                ..o.clone()
            },
            fanout_interval(o),
        );
        let floor_us = fl.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0);
        out.row(
            "floor_cpu_us_per_frame",
            format!("{floor_us:.3} us"),
            json!(floor_us),
        );
        for &d in drivers {
            let us = 1e6 / mean(d).max(1e-9);
            out.row(
                &format!("{d}_over_floor"),
                format!(
                    "{us:.3} us per frame = {:.2}x the floor",
                    us / floor_us.max(1e-9)
                ),
                json!(us / floor_us.max(1e-9)),
            );
        }
        out.problems
            .extend(fl.problems.iter().map(|p| format!("floor: {p}")));
        out.json["floor"] = fl.json;
    }
    out.json["runs"] = json!(runs);
    out
}

/// The server's CPU per delivered frame of one storm or fanout run (µs).
fn cpu_us_per_frame(scenario: &str, r: &Outcome, o: &Opts) -> f64 {
    match scenario {
        "storm" => {
            let frames = r.json["frames_delivered"].as_f64().unwrap_or(0.0);
            let pct = r.json["server_cpu_pct_2cores"].as_f64().unwrap_or(0.0) * 2.0;
            pct / 100.0 * o.seconds * 1e6 / frames.max(1.0)
        }
        _ => r.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0),
    }
}

/// Storm or fanout on WebSocket and on Server-Sent Events in one run (A B A
/// B): the server's CPU per delivered frame on each, and their ratio.
fn transports(scenario: &str, o: &Opts) -> Outcome {
    let mut out = Outcome::new(&format!("{scenario}_transports"));
    let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut runs = Vec::new();
    for (i, t) in ["ws", "sse", "ws", "sse"].into_iter().enumerate() {
        let oo = Opts {
            transport: t.into(),
            no_floor: true,
            ..o.clone()
        };
        progress(
            o,
            format!("[{scenario}] run {} of 4: --transport {t}", i + 1),
        );
        let r = if scenario == "storm" {
            storm(&oo)
        } else {
            fanout(&oo)
        };
        let us = cpu_us_per_frame(scenario, &r, &oo);
        out.problems
            .extend(r.problems.iter().map(|p| format!("{t}: {p}")));
        by.entry(t).or_default().push(us);
        runs.push(json!({"transport": t, "run": i + 1, "cpu_us_per_frame": us, "result": r.json}));
    }
    let mean = |t: &str| {
        by.get(t)
            .map_or(0.0, |v| v.iter().sum::<f64>() / v.len() as f64)
    };
    for t in ["ws", "sse"] {
        out.row(
            &format!("{t}_cpu_us_per_frame"),
            format!(
                "{:?}  mean {:.3} us",
                by.get(t).cloned().unwrap_or_default(),
                mean(t)
            ),
            json!(mean(t)),
        );
    }
    let ratio = mean("sse") / mean("ws").max(1e-9);
    out.row("ratio_sse_over_ws", format!("{ratio:.3}x"), json!(ratio));
    out.check(
        ratio <= 1.1,
        "SSE costs more than 1.1x WebSocket's CPU per frame",
    );
    out.json["runs"] = json!(runs);
    out
}

/// Fanout's update interval: `--rate` updates/s, or one per tick.
fn fanout_interval(o: &Opts) -> Duration {
    if o.rate_set {
        Duration::from_secs_f64(1.0 / o.rate.max(0.01))
    } else {
        Duration::from_millis(o.tick_ms)
    }
}

fn run(scenario: &str, o: &Opts) -> Result<Outcome, String> {
    Ok(match scenario {
        "idle" => idle(o),
        "storm" | "fanout" if o.transport == "both" => transports(scenario, o),
        "storm" => storm(o),
        "fanout" => fanout(o),
        "floor" => floor_scenario(o, fanout_interval(o)),
        "ingest" => ingest::run(o.snapshots, o.courses, o.sections, o.skew),
        "publish_cost" => publish_cost::run(o),
        "handshake" => handshake::run(o),
        "compare" => compare(o),
        "fleet" => fleet::run(o, o.haproxy_procs),
        "soak" => soak::run(o),
        "reconnect" => reconnect::run(o),
        other => return Err(format!("unknown scenario {other}")),
    })
}

/// The short run of every scenario that `cargo test --all-targets` executes.
fn smoke() -> i32 {
    let base = Opts {
        clients: 200,
        seconds: 2.0,
        rate: 2000.0,
        courses: 40,
        tick_ms: 100,
        procs: 1,
        snapshots: 20_000,
        ..Opts::default()
    };
    let plan: Vec<(&str, Opts)> = vec![
        ("ingest", base.clone()),
        (
            "publish_cost",
            Opts {
                snapshots: 2_000,
                ..base.clone()
            },
        ),
        ("idle", base.clone()),
        (
            "storm",
            Opts {
                clients: 300,
                procs: 2,
                ..base.clone()
            },
        ),
        (
            "storm",
            Opts {
                clients: 200,
                cluster: true,
                ..base.clone()
            },
        ),
        ("fanout", base.clone()),
        (
            "floor",
            Opts {
                clients: 100,
                seconds: 1.0,
                ..base.clone()
            },
        ),
        ("handshake", base.clone()),
        ("reconnect", base.clone()),
        (
            "compare",
            Opts {
                clients: 100,
                seconds: 1.0,
                ..base.clone()
            },
        ),
        (
            "fleet",
            Opts {
                clients: 300,
                event: Some("kill".into()),
                before_s: 2.0,
                after_s: 1.0,
                max_wait_s: 20.0,
                min_during_s: 1.0,
                haproxy_procs: 1,
                ..base.clone()
            },
        ),
        (
            "soak",
            Opts {
                minutes: 1.0,
                ..base.clone()
            },
        ),
    ];
    let t0 = Instant::now();
    let (mut passed, mut failed) = (0, 0);
    for (name, o) in plan {
        let t = Instant::now();
        let out = std::panic::catch_unwind(|| run(name, &o));
        match out {
            Ok(Ok(out)) => {
                out.print();
                if out.problems.is_empty() {
                    passed += 1;
                    println!("smoke {name}: ok ({:.1} s)", t.elapsed().as_secs_f64());
                } else {
                    failed += 1;
                    println!("smoke {name}: FAILED: {:?}", out.problems);
                }
            }
            Ok(Err(e)) => {
                failed += 1;
                println!("smoke {name}: FAILED: {e}");
            }
            Err(_) => {
                failed += 1;
                println!("smoke {name}: FAILED (panicked)");
            }
        }
    }
    println!("bench smoke took {:.1} s", t0.elapsed().as_secs_f64());
    println!("smoke: {passed} passed, {failed} failed");
    i32::from(failed > 0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("__floor") {
        let cfg: floor::Config =
            serde_json::from_str(args.get(1).expect("config")).expect("floor config");
        floor::run(cfg);
        return;
    }
    if args.first().map(String::as_str) == Some("__connect_floor") {
        let cfg: floor::ConnectConfig =
            serde_json::from_str(args.get(1).expect("config")).expect("connect floor config");
        floor::run_connect(cfg);
        return;
    }
    if args.first().map(String::as_str) == Some("__loadgen") {
        let cfg: loadgen::Config =
            serde_json::from_str(args.get(1).expect("config")).expect("loadgen config");
        loadgen::run(cfg);
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        std::process::exit(smoke());
    }
    let args: Vec<String> = args.into_iter().filter(|a| a != "--bench").collect();
    if args.is_empty() {
        println!("{USAGE}");
        return;
    }
    let (scenario, opts) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    match run(&scenario, &opts) {
        Ok(out) => {
            out.print();
            out.save();
            if !out.problems.is_empty() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
