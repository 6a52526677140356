//! The `fleet` scenario: HAProxy (the shipped `systemd/haproxy/seatboard.cfg`)
//! in front of several `seatboard serve` nodes on one Redis, viewers that
//! reconnect like the board page (the `loadgen` crate), a storm of snapshots, and one
//! event per run: `kill` (SIGKILL a node), `rolling` (SIGTERM, drain, start
//! again, node by node) or `redis_restart` (`SHUTDOWN SAVE`, start again on
//! the same port and dump).
//!
//! Measured per event: when the affected viewers' boards were true again
//! (see `loadgen/src/recovery.rs`), refusals served (503 + `Retry-After`), the
//! survivors' p99 publish-to-screen latency before and during the event,
//! final-state correctness, and the longest blind interval. The result goes
//! into `target/bench/fleet.json` under the event's key; a run of one event
//! keeps the other events' keys from earlier runs.

use crate::lb::{self, Bind, Haproxy};
use crate::measure::{counter, progress};
use crate::procs::{self, Fleet};
use crate::publish::Publisher;
use crate::redis_proc::RedisProc as Redis;
use crate::setup::course_names;
use crate::{Opts, Outcome};
use loadgen::{Command, Hist};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The events, in the order `fleet` without `--event` runs them.
pub const EVENTS: [&str; 3] = ["kill", "rolling", "redis_restart"];

fn now_ms() -> u64 {
    loadgen::now_us() / 1000
}

fn work_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("bench")
        .join("fleet")
}

/// One `seatboard serve` node on a fixed port (restartable there).
struct Node {
    port: u16,
    flags: Vec<String>,
    child: Option<Child>,
}

impl Node {
    fn start(port: u16, flags: Vec<String>) -> Node {
        let mut n = Node {
            port,
            flags,
            child: None,
        };
        assert!(n.spawn(), "seatboard node did not become ready");
        n
    }

    /// Starts the process; false if it is not ready within 30 s.
    fn spawn(&mut self) -> bool {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_seatboard"))
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--auth", "jwt", "--jwt-secret", procs::SECRET])
            .args(["--log-level", "warn"])
            .args(&self.flags)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn seatboard");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(30);
        while lb::get_status(self.port, "/readyz") != Some(200) {
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

    fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Upgrades this process refused with 503 so far (accept rate, draining,
    /// full), from its `/metrics`; 0 when it does not answer.
    fn refused_503(&self) -> u64 {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.lines()
            .filter(|l| l.starts_with("seatboard_handshakes_refused_total{"))
            .filter(|l| {
                ["rate_limited", "draining", "node_full"]
                    .iter()
                    .any(|r| l.contains(r))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits for the process to exit (after a signal).
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
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What the event thread asks of the publishing thread.
enum Ask {
    /// A load-generator command (answered on the ack channel once sent).
    Cmd(Command),
    /// Stop sending reference boards until `Resume` (Redis is down).
    Pause,
    /// Send a reference board after the next successful write.
    Resume,
    /// The event is over.
    Done,
}

/// The event's moments, Unix ms.
#[derive(Default, Debug, Clone)]
struct Moments {
    start: u64,
    /// Redis answering again (redis_restart).
    redis_up: Option<u64>,
    end: u64,
    /// The nodes' 503 refusals (accept rate, draining, full) when it began.
    node_refused_start: Vec<u64>,
    notes: Vec<String>,
}

/// Everything one run owns.
struct Rig {
    // Dropped in this order: the proxy, the nodes, then Redis.
    lb: Haproxy,
    nodes: Vec<Node>,
    redis: Redis,
}

fn node_flags(o: &Opts) -> Vec<String> {
    let mut f = vec![
        "--tick-ms".to_string(),
        o.tick_ms.to_string(),
        "--drain-ms".into(),
        o.drain_ms.to_string(),
    ];
    if let Some(d) = &o.driver {
        f.extend(["--driver".into(), d.clone()]);
    }
    if let Some(s) = o.shards {
        f.extend(["--shards".into(), s.to_string()]);
    }
    f
}

fn start_rig(o: &Opts, haproxy_procs: usize) -> Rig {
    let dir = work_dir();
    let redis = Redis::start(&dir.join(format!("redis-{}", std::process::id())));
    let mut flags = node_flags(o);
    flags.extend(["--redis".into(), redis.uri()]);
    let nodes: Vec<Node> = (0..o.nodes.max(2))
        .map(|_| Node::start(lb::stable_port(), flags.clone()))
        .collect();
    let port = lb::free_port();
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    // Two descriptors per proxied viewer: each process stays under the
    // 20,000 open-file hard limit with at most 9,000 connections.
    let maxconn = 9000;
    let cfg = lb::render(&lb::shipped(), &Bind::Plain(port), &ports, maxconn);
    // One thread per process: the processes are how the bench scales HAProxy
    // (open-file limit), and more threads than the box's 2 cores only add
    // context switches to the nodes' and the load generator's.
    let cfg = cfg.replacen("global\n", "global\n    nbthread 1\n", 1);
    // Logs of earlier runs go; this run's stay for a look afterwards.
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("haproxy-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let lb = Haproxy::start(&dir, port, &lb::log_to_stdout(&cfg), haproxy_procs);
    assert!(
        lb.wait_ready("/readyz", Duration::from_secs(20)),
        "haproxy never saw a node up"
    );
    Rig { redis, nodes, lb }
}

/// Runs the event on its own thread while this one publishes.
fn event_thread(
    event: String,
    mut rig: Rig,
    o: Opts,
    tx: mpsc::Sender<Ask>,
    ack: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<(Rig, Moments)> {
    std::thread::spawn(move || {
        let mut m = Moments::default();
        let ask = |a: Ask| {
            let wait = matches!(a, Ask::Cmd(_));
            let _ = tx.send(a);
            if wait {
                let _ = ack.recv_timeout(Duration::from_secs(10));
            }
        };
        ask(Ask::Cmd(Command::Arm));
        ask(Ask::Cmd(Command::Lat {
            phase: "during".into(),
        }));
        m.node_refused_start = rig.nodes.iter().map(Node::refused_503).collect();
        match event.as_str() {
            "kill" => {
                m.start = now_ms();
                rig.nodes[0].signal(libc::SIGKILL);
                rig.nodes[0].reap(Duration::from_secs(5));
                m.notes.push("SIGKILL node1".to_string());
            }
            "rolling" => {
                m.start = now_ms();
                let t0 = Instant::now();
                for i in 0..rig.nodes.len() {
                    let t = Instant::now();
                    rig.nodes[i].signal(libc::SIGTERM);
                    let exited = rig.nodes[i].reap(Duration::from_millis(o.drain_ms + 30_000));
                    let drained = t.elapsed().as_secs_f64();
                    if !exited {
                        rig.nodes[i].signal(libc::SIGKILL);
                        rig.nodes[i].reap(Duration::from_secs(5));
                    }
                    let up = rig.nodes[i].spawn();
                    // Until every HAProxy process's checks saw it up (rise 2 at 1 s).
                    std::thread::sleep(Duration::from_millis(2500));
                    m.notes.push(format!(
                        "node{}: SIGTERM at +{:.1} s, drained and exited in {drained:.1} s (exited by itself: {exited}), {} after {:.1} s",
                        i + 1,
                        (t.duration_since(t0)).as_secs_f64(),
                        if up { "ready again" } else { "NOT READY (did not start)" },
                        t.elapsed().as_secs_f64()
                    ));
                }
            }
            "redis_restart" => {
                let _ = tx.send(Ask::Pause);
                ask(Ask::Cmd(Command::Blind));
                m.start = now_ms();
                rig.redis.restart();
                m.redis_up = Some(now_ms());
                let _ = tx.send(Ask::Resume);
                m.notes.push(format!(
                    "Redis SHUTDOWN SAVE + start on the same port: answering again after {} ms",
                    m.redis_up.unwrap_or(0) - m.start
                ));
            }
            other => panic!("unknown event {other}"),
        }
        m.end = now_ms();
        let _ = tx.send(Ask::Done);
        (rig, m)
    })
}

/// Publishes the storm until the event is over and every blind viewer sees
/// again (or `max_wait` after the event), sending reference boards each
/// `ref_every`. Returns (published snapshots, seconds, the load generators'
/// counters when the event began).
#[allow(clippy::too_many_arguments)]
fn storm_through(
    o: &Opts,
    p: &mut Publisher,
    f: &mut Fleet,
    rx: &mpsc::Receiver<Ask>,
    ack: &mpsc::Sender<()>,
    before_s: f64,
    after_s: f64,
    max_wait: Duration,
    mut start_event: impl FnMut(),
) -> (u64, f64, Value) {
    let cdf = loadgen::zipf_cdf(p.courses.len(), o.skew);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut st = StormLoop::new();
    f.command(Command::Lat {
        phase: "before".into(),
    });
    loop {
        let el = st.publish_due(o, p, &cdf, &mut rng);
        let now = Instant::now();
        if !st.started && el >= before_s {
            st.started = true;
            st.mark_at_event = Some(f.mark());
            st.event_at = Some(now);
            start_event();
        }
        st.answer(f, rx, ack, now);
        st.reference(f, p, now);
        st.show_progress(o, f, p, el, now);
        st.check_over(o, f, now, max_wait);
        if let Some(e) = st.end_at {
            if now.duration_since(e).as_secs_f64() >= after_s {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (
        p.published,
        st.t0.elapsed().as_secs_f64(),
        st.mark_at_event.unwrap_or(Value::Null),
    )
}

/// The storm loop's state from one pass to the next.
struct StormLoop {
    t0: Instant,
    sent: u64,
    started: bool,
    done_at: Option<Instant>,
    event_at: Option<Instant>,
    end_at: Option<Instant>,
    paused: bool,
    last_closed: (u64, Instant),
    send_ref: bool,
    next_ref: Instant,
    next_progress: Instant,
    mark_at_event: Option<Value>,
}

impl StormLoop {
    /// The state as the storm starts.
    fn new() -> StormLoop {
        StormLoop {
            t0: Instant::now(),
            sent: 0,
            started: false,
            done_at: None,
            event_at: None,
            end_at: None,
            paused: false,
            last_closed: (0, Instant::now()),
            send_ref: false,
            next_ref: Instant::now(),
            next_progress: Instant::now() + Duration::from_secs(1),
            mark_at_event: None,
        }
    }

    /// Publishes the snapshots due by now at `--rate`; returns the seconds
    /// since the start.
    fn publish_due(
        &mut self,
        o: &Opts,
        p: &mut Publisher,
        cdf: &[f64],
        rng: &mut fastrand::Rng,
    ) -> f64 {
        let el = self.t0.elapsed().as_secs_f64();
        let due = (o.rate * el) as u64;
        // Never catch up after a stall (Redis down): the window moves on.
        if due > self.sent + (o.rate * 0.25) as u64 {
            self.sent = due;
        }
        let t = loadgen::now_us();
        while self.sent < due {
            let c = loadgen::zipf_pick(cdf, rng);
            p.queue(c, rng.u32(0..o.sections), t);
            self.sent += 1;
        }
        p.flush();
        el
    }

    /// Does what the event thread asked.
    fn answer(
        &mut self,
        f: &mut Fleet,
        rx: &mpsc::Receiver<Ask>,
        ack: &mpsc::Sender<()>,
        now: Instant,
    ) {
        while let Ok(a) = rx.try_recv() {
            match a {
                Ask::Cmd(c) => {
                    f.command(c);
                    let _ = ack.send(());
                }
                Ask::Pause => self.paused = true,
                Ask::Resume => {
                    self.paused = false;
                    self.send_ref = true;
                }
                Ask::Done => self.done_at = Some(now),
            }
        }
    }

    /// Sends the load generators the reference board every 500 ms (not
    /// while paused) and right after a resume.
    fn reference(&mut self, f: &mut Fleet, p: &Publisher, now: Instant) {
        if (!self.paused && now >= self.next_ref) || self.send_ref {
            self.send_ref = false;
            self.next_ref = now + Duration::from_millis(500);
            f.command(Command::Ref {
                versions: p.versions(),
            });
        }
    }

    /// A progress line each second.
    fn show_progress(&mut self, o: &Opts, f: &mut Fleet, p: &Publisher, el: f64, now: Instant) {
        if now >= self.next_progress {
            self.next_progress += Duration::from_secs(1);
            progress(
                o,
                format!(
                    "[fleet] {el:.0}s published {}  open {}  blind {}  recovered {}  refused {} ({} with Retry-After)  closed {}",
                    p.published,
                    f.sum(|c| c.open),
                    f.sum(|c| c.blind),
                    f.sum(|c| c.recovered),
                    f.sum(|c| c.refused),
                    f.sum(|c| c.refused_retry_after),
                    f.sum(|c| c.closed_by_server),
                ),
            );
        }
    }

    /// Once the event is done: the end of the recovery, when it comes.
    fn check_over(&mut self, o: &Opts, f: &mut Fleet, now: Instant, max_wait: Duration) {
        let (Some(d), None) = (self.done_at, self.end_at) else {
            return;
        };
        let ev = self.event_at.unwrap_or(d);
        // Over when every child reports no blind viewer, some recovered,
        // and no connection closed for 2 s (children may report late on a
        // busy machine); and a few seconds of "during" at least, for the
        // survivors' latency.
        let closed = f.sum(|c| c.closed_by_server);
        let quiet = f.progress.iter().all(|p| p.blind == 0) && f.sum(|c| c.recovered) > 0;
        if closed != self.last_closed.0 || !quiet {
            self.last_closed = (closed, now);
        }
        let recovered = quiet
            && now.duration_since(self.last_closed.1) >= Duration::from_secs(2)
            && now.duration_since(ev).as_secs_f64() >= o.min_during_s;
        if recovered || now.duration_since(ev.max(d)) >= max_wait {
            self.end_at = Some(now);
            f.command(Command::Lat {
                phase: "after".into(),
            });
        }
    }
}

/// What HAProxy answered other than a 101, from its request logs
/// (`lb::log_to_stdout`): "status termination-state server" -> count (a 503
/// from a node has state `----`; HAProxy's own has `SC` for connects refused
/// with the retries spent, `<NOSRV>` when no node was up, `sQ` for a queue
/// timeout); and how many logged requests HAProxy had to retry.
fn haproxy_answers(lb: &Haproxy, procs: usize) -> (BTreeMap<String, u64>, u64) {
    let mut answers = BTreeMap::new();
    let mut retried = 0;
    for i in 0..procs.max(1) {
        let text = std::fs::read_to_string(lb.log(i)).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [status, state, server, retries, ..] = f[..] else {
                continue;
            };
            if status.len() != 3 || status.parse::<u16>().is_err() {
                continue;
            }
            if retries.trim_start_matches('+').parse::<u32>().unwrap_or(0) > 0 {
                retried += 1;
            }
            if status != "101" {
                *answers
                    .entry(format!("{status} {state} {server}"))
                    .or_default() += 1;
            }
        }
    }
    (answers, retried)
}

/// The kernel's `ksoftirqd/N` threads.
fn ksoftirqd_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("ksoftirqd/"))
        })
        .collect()
}

fn pct(h: &Hist, q: f64) -> f64 {
    h.quantile(q) as f64 / 1e3
}

/// Index of the 99th percentile and the maximum of `v` (sorted in place).
fn p99_and_max(v: &mut [u64]) -> (Option<u64>, Option<u64>) {
    if v.is_empty() {
        return (None, None);
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (Some(v[i]), v.last().copied())
}

/// The storm's CPU before the event, by role (% of one core), the
/// machine's idle share then, and how busy each load generator was.
struct BeforeEvent {
    cpu: BTreeMap<String, f64>,
    idle: f64,
    loadgen_busy: f64,
}

/// What the storm around the event measured.
struct StormRun {
    published: u64,
    secs: f64,
    m0: Value,
    m1: Value,
    k0: (u64, u64),
    k1: (u64, u64),
    before: BeforeEvent,
    moments: Moments,
}

/// The load generators' reports of one event, merged.
#[derive(Default)]
struct Tally {
    before: Hist,
    during: Hist,
    intervals: Vec<(u64, u64)>,
    still_blind: Vec<u64>,
    close_codes: BTreeMap<u64, u64>,
    statuses: BTreeMap<u64, u64>,
}

/// How the viewers recovered: the 99th percentile and all (none while one
/// is still blind), the longest blind interval, and how many were affected.
struct Recovery {
    p99: Option<u64>,
    all: Option<u64>,
    max_blind: Option<u64>,
    affected: usize,
}

/// Everything one event measured, for its JSON, rows and problems.
struct Measured {
    storm: StormRun,
    tally: Tally,
    rec: Recovery,
    open: u64,
    /// Snapshots published in the storm, the seeding not counted.
    published: u64,
    rate: f64,
    correct: (u64, u64),
    final_correct: f64,
    refused: u64,
    refused_all: u64,
    disconnected: u64,
    b99: f64,
    d99: f64,
    node_refused: Option<u64>,
    lb_answers: BTreeMap<String, u64>,
    lb_retried: u64,
    haproxy_processes: usize,
    nodes: usize,
}

/// One event in its own run.
pub fn run_event(
    o: &Opts,
    event: &str,
    haproxy_procs: usize,
) -> (Value, Vec<(String, String)>, Vec<String>) {
    let mut problems = Vec::new();
    let rig = start_rig(o, haproxy_procs);
    let courses = course_names(o.courses);
    let mut publisher = Publisher::connect(rig.redis.port, courses.clone(), o.sections);
    publisher.seed();
    let lb_port = rig.lb.port;
    let lb_pids = rig.lb.pids();
    let rig_redis_pid = rig.redis.pid();
    let node_pids: Vec<u32> = rig.nodes.iter().map(|n| n.pid()).collect();
    let mut f = crate::setup::fleet(o, lb_port, &courses, o.skew, false, 3600.0);
    let open = crate::setup::wait_open(o, &mut f, o.clients, &format!("fleet {event}"));
    if (open as usize) < o.clients {
        problems.push(format!("only {open} of {} viewers connected", o.clients));
    }
    std::thread::sleep(Duration::from_secs(2));
    let roles = roles(&lb_pids, &node_pids, f.pids(), rig_redis_pid);
    let (storm, rig) = storm_with_event(o, event, rig, &mut publisher, &mut f, roles);
    // What the nodes refused with 503 (HAProxy retried those on another node;
    // only the last of its tries reaches a viewer). A restarted node starts
    // counting at 0 again, so not for `rolling`.
    let node_refused = (event != "rolling").then(|| {
        rig.nodes
            .iter()
            .zip(&storm.moments.node_refused_start)
            .map(|(n, &start)| n.refused_503().saturating_sub(start))
            .sum::<u64>()
    });
    settle(o, &mut f);
    let reports = f.report();
    let (lb_answers, lb_retried) = haproxy_answers(&rig.lb, lb_pids.len());
    drop(rig);
    let tally = tally(&reports);
    let rec = recovery(event, &tally, &storm.moments);
    let correct = crate::measure::correctness(&reports, &publisher, o.clients);
    let (m0, m1) = (&storm.m0, &storm.m1);
    let delta = |k: &str| counter(m1, k) - counter(m0, k);
    let seeded = (o.courses as u64) * o.sections as u64;
    let m = Measured {
        open,
        published: storm.published.saturating_sub(seeded),
        rate: storm.published.saturating_sub(seeded) as f64 / storm.secs.max(1e-3),
        correct,
        final_correct: correct.0 as f64 / correct.1.max(1) as f64,
        refused: delta("refused_retry_after"),
        refused_all: delta("refused"),
        disconnected: delta("closed_by_server"),
        b99: pct(&tally.before, 0.99),
        d99: pct(&tally.during, 0.99),
        node_refused,
        lb_answers,
        lb_retried,
        haproxy_processes: lb_pids.len(),
        nodes: node_pids.len(),
        storm,
        tally,
        rec,
    };
    problems.extend(event_problems(event, &m));
    (event_json(o, &m), event_rows(o, event, &m), problems)
}

/// Who uses the CPU in the storm: the share each role takes of the 2 cores
/// shows what bounds the size that can be driven.
fn roles(
    lb_pids: &[u32],
    node_pids: &[u32],
    loadgen_pids: Vec<u32>,
    redis_pid: u32,
) -> Vec<(&'static str, Vec<u32>)> {
    vec![
        ("haproxy", lb_pids.to_vec()),
        ("nodes", node_pids.to_vec()),
        ("loadgen", loadgen_pids),
        ("redis", vec![redis_pid]),
        ("runner", vec![std::process::id()]),
        // Loopback TCP work the kernel defers to its softirq threads under
        // load is this rig's traffic too.
        ("ksoftirqd", ksoftirqd_pids()),
    ]
}

/// Each role's CPU so far (µs), in the order of `roles`.
fn role_cpu(roles: &[(&str, Vec<u32>)]) -> Vec<u64> {
    roles
        .iter()
        .map(|(_, pids)| pids.iter().map(|&p| procs::usage(p).cpu_us).sum())
        .collect()
}

/// The storm through the event: the event runs on its own thread (with the
/// rig) from `o.before_s` on while this one publishes; returns what was
/// measured and the rig back.
fn storm_with_event(
    o: &Opts,
    event: &str,
    rig: Rig,
    publisher: &mut Publisher,
    f: &mut Fleet,
    roles: Vec<(&'static str, Vec<u32>)>,
) -> (StormRun, Rig) {
    let (tx, rx) = mpsc::channel();
    let (ack_tx, ack_rx) = mpsc::channel();
    let mut handle = None;
    let mut rig_slot = Some((rig, ack_rx));
    let c0 = (role_cpu(&roles), Instant::now());
    let mut at_event = None;
    let k0 = procs::machine_ticks();
    let m0 = f.mark();
    let (published, secs, m_event) = storm_through(
        o,
        publisher,
        f,
        &rx,
        &ack_tx,
        o.before_s,
        o.after_s,
        Duration::from_secs_f64(o.max_wait_s),
        || {
            at_event = Some((role_cpu(&roles), Instant::now(), procs::machine_ticks()));
            if let Some((r, ack)) = rig_slot.take() {
                handle = Some(event_thread(
                    event.to_string(),
                    r,
                    o.clone(),
                    tx.clone(),
                    ack,
                ));
            }
        },
    );
    let k1 = procs::machine_ticks();
    let m1 = f.mark();
    let (rig, moments) = handle.expect("event ran").join().expect("event thread");
    let before = before_event(roles, c0, at_event, k0, (&m0, &m_event), f.pids().len());
    let run = StormRun {
        published,
        secs,
        m0,
        m1,
        k0,
        k1,
        before,
        moments,
    };
    (run, rig)
}

/// The storm before the event: each role's share of a core from `c0` to the
/// event (`at_event`), the rest of the machine's busy time as `others`, the
/// machine's idle share, and how busy each of the `loadgens` was.
fn before_event(
    roles: Vec<(&str, Vec<u32>)>,
    c0: (Vec<u64>, Instant),
    at_event: Option<(Vec<u64>, Instant, (u64, u64))>,
    k0: (u64, u64),
    (m0, m_event): (&Value, &Value),
    loadgens: usize,
) -> BeforeEvent {
    let Some((c1, t1, kb)) = at_event else {
        return BeforeEvent {
            cpu: BTreeMap::new(),
            idle: f64::NAN,
            loadgen_busy: f64::NAN,
        };
    };
    let secs = t1.duration_since(c0.1).as_secs_f64().max(1e-3);
    let busy = counter(m_event, "busy_ms").saturating_sub(counter(m0, "busy_ms"));
    let loadgen_busy = busy as f64 / 10.0 / secs / loadgens.max(1) as f64;
    let mut shares: BTreeMap<String, f64> = roles
        .into_iter()
        .zip(c1.iter().zip(&c0.0))
        .map(|((name, _), (b, a))| {
            let pct = b.saturating_sub(*a) as f64 / 1e6 / secs * 100.0;
            (name.to_string(), (pct * 10.0).round() / 10.0)
        })
        .collect();
    // The rest of the machine's busy time: other processes on the
    // shared box (their builds and tests), the kernel's own threads.
    let idle = procs::idle_pct(k0, kb);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let ours: f64 = shares.values().sum();
    let others = ((100.0 - idle) * cores - ours).max(0.0);
    shares.insert("others".into(), (others * 10.0).round() / 10.0);
    BeforeEvent {
        cpu: shares,
        idle,
        loadgen_busy,
    }
}

/// Settle: until no frame arrived for 2 s (at least 5 ticks; at most 60 s).
fn settle(o: &Opts, f: &mut Fleet) {
    std::thread::sleep(Duration::from_millis((o.tick_ms * 5).max(1000)));
    let settle = Instant::now();
    let mut frames = (counter(&f.mark(), "frames"), Instant::now());
    while settle.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        let n = counter(&f.mark(), "frames");
        if n != frames.0 {
            frames = (n, Instant::now());
        } else if frames.1.elapsed() >= Duration::from_secs(2) {
            break;
        }
    }
}

/// The load generators' reports merged: survivors' latency before and
/// during, blind intervals, viewers still blind, close codes and refusals.
fn tally(reports: &[Value]) -> Tally {
    let mut t = Tally::default();
    for r in reports {
        t.before.merge_json(&r["phases"]["before"]);
        t.during.merge_json(&r["phases"]["during"]);
        for iv in r["intervals"].as_array().into_iter().flatten() {
            t.intervals
                .push((iv[0].as_u64().unwrap_or(0), iv[1].as_u64().unwrap_or(0)));
        }
        for b in r["still_blind"].as_array().into_iter().flatten() {
            t.still_blind.push(b.as_u64().unwrap_or(0));
        }
        for c in r["close_codes"].as_array().into_iter().flatten() {
            *t.close_codes.entry(c[0].as_u64().unwrap_or(0)).or_default() +=
                c[1].as_u64().unwrap_or(0);
        }
        for c in r["refusals"].as_array().into_iter().flatten() {
            *t.statuses.entry(c[0].as_u64().unwrap_or(0)).or_default() +=
                c[1].as_u64().unwrap_or(0);
        }
    }
    t
}

/// Recovery times: from the kill, from Redis answering again, or (rolling:
/// a sequence of drains) from each viewer's own disconnect.
fn recovery(event: &str, t: &Tally, moments: &Moments) -> Recovery {
    let mut rec: Vec<u64> = t
        .intervals
        .iter()
        .map(|&(s, e)| match event {
            "kill" => e.saturating_sub(moments.start),
            "redis_restart" => e.saturating_sub(moments.redis_up.unwrap_or(moments.start)),
            _ => e.saturating_sub(s),
        })
        .collect();
    let mut blind: Vec<u64> = t
        .intervals
        .iter()
        .map(|&(s, e)| e.saturating_sub(s))
        .collect();
    let end_ms = now_ms();
    blind.extend(t.still_blind.iter().map(|&s| end_ms.saturating_sub(s)));
    let (p99, all) = p99_and_max(&mut rec);
    let (_, max_blind) = p99_and_max(&mut blind);
    Recovery {
        p99,
        all: if t.still_blind.is_empty() { all } else { None },
        max_blind,
        affected: t.intervals.len() + t.still_blind.len(),
    }
}

/// The event's JSON (`target/bench/fleet.json` under its name).
fn event_json(o: &Opts, m: &Measured) -> Value {
    let ms = |v: Option<u64>| v.map(Value::from).unwrap_or(Value::Null);
    let (s, t, moments) = (&m.storm, &m.tally, &m.storm.moments);
    json!({
        "recovered_p99_ms": ms(m.rec.p99),
        "recovered_all_ms": ms(m.rec.all),
        "final_correct": m.final_correct,
        "refused": m.refused,
        "survivors_p99_ms_before": m.b99,
        "survivors_p99_ms_during": m.d99,
        "max_blind_ms": ms(m.rec.max_blind),
        "affected": m.rec.affected,
        "still_blind": t.still_blind.len(),
        "disconnected": m.disconnected,
        "refused_any_status": m.refused_all,
        "refused_by_nodes": m.node_refused,
        "refusal_statuses": t.statuses,
        "haproxy_answers": m.lb_answers,
        "haproxy_retried": m.lb_retried,
        "close_codes": t.close_codes,
        "viewers": o.clients,
        "open_before": m.open,
        "published": m.published,
        "publish_rate": m.rate,
        "storm_seconds": s.secs,
        "event_ms": moments.end.saturating_sub(moments.start),
        "event_unix_ms": moments.start,
        "redis_up_after_ms": moments.redis_up.map(|u| u - moments.start),
        "survivors_samples_before": t.before.total(),
        "survivors_samples_during": t.during.total(),
        "notes": moments.notes,
        "haproxy_processes": m.haproxy_processes,
        "nodes": m.nodes,
        "machine_idle_pct": procs::idle_pct(s.k0, s.k1),
        "machine_idle_pct_before": s.before.idle,
        "cpu_pct_of_a_core_before": s.before.cpu,
        "loadgen_busy_pct_before": s.before.loadgen_busy,
    })
}

/// The event's rows of the table.
fn event_rows(o: &Opts, event: &str, m: &Measured) -> Vec<(String, String)> {
    let show = |v: Option<u64>| v.map_or("-".to_string(), |x| format!("{x} ms"));
    let (s, t) = (&m.storm, &m.tally);
    let (secs, rate, refused, refused_all) = (s.secs, m.rate, m.refused, m.refused_all);
    let (statuses, lb_answers, lb_retried) = (&t.statuses, &m.lb_answers, m.lb_retried);
    let (b99, d99, affected, disconnected) = (m.b99, m.d99, m.rec.affected, m.disconnected);
    let (idle_before, cpu_before) = (s.before.idle, &s.before.cpu);
    let loadgen_busy_before = s.before.loadgen_busy;
    vec![
        (
            format!("{event}: storm"),
            format!(
                "{} snapshots in {secs:.0} s ({rate:.0}/s achieved; {:.0}/s asked, no catching up after a stall)",
                m.published,
                o.rate
            ),
        ),
        (
            format!("{event}: affected"),
            format!("{affected} blind intervals ({} still blind at the end); {disconnected} connections closed", t.still_blind.len()),
        ),
        (
            format!("{event}: recovered"),
            format!("99 % after {}, 100 % after {}", show(m.rec.p99), show(m.rec.all)),
        ),
        (format!("{event}: max_blind"), show(m.rec.max_blind)),
        (
            format!("{event}: refused"),
            format!(
                "{refused} with 503 + Retry-After reached viewers ({refused_all} refusals in all: {statuses:?}); the nodes refused {} with 503 (HAProxy retried them on another node)",
                m.node_refused.map_or("(not counted: nodes restart)".to_string(), |n| n.to_string())
            ),
        ),
        (
            format!("{event}: haproxy"),
            format!("answers other than 101 (status, termination state, node): {lb_answers:?}; {lb_retried} requests retried"),
        ),
        (
            format!("{event}: survivors_p99"),
            format!("before {b99:.1} ms, during {d99:.1} ms ({} / {} samples)", t.before.total(), t.during.total()),
        ),
        (
            format!("{event}: final_correct"),
            format!("{}/{} ({:.2} %)", m.correct.0, m.correct.1, m.final_correct * 100.0),
        ),
        (
            format!("{event}: machine_idle"),
            format!(
                "{:.1} % (storm before the event: {idle_before:.1} %; CPU there, % of one core: {cpu_before:?}; each load generator outside epoll_wait {loadgen_busy_before:.0} % of the time)",
                procs::idle_pct(s.k0, s.k1)
            ),
        ),
    ]
}

/// The event's problems: viewers still blind, boards not true, nobody affected.
fn event_problems(event: &str, m: &Measured) -> Vec<String> {
    let mut problems = Vec::new();
    if !m.tally.still_blind.is_empty() {
        problems.push(format!(
            "{event}: {} viewers never saw a true board again",
            m.tally.still_blind.len()
        ));
    }
    if m.final_correct < 1.0 {
        problems.push(format!(
            "{event}: final state correct for {:.2} %",
            m.final_correct * 100.0
        ));
    }
    if m.rec.affected == 0 {
        problems.push(format!("{event}: no viewer was affected"));
    }
    problems
}

/// `fleet [--event E]`: each event in its own run.
pub fn run(o: &Opts, haproxy_procs: usize) -> Outcome {
    let mut out = Outcome::new("fleet");
    let path = work_dir().with_file_name("fleet.json");
    if let Ok(old) = std::fs::read_to_string(&path) {
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&old) {
            for (k, v) in m {
                if EVENTS.contains(&k.as_str()) {
                    out.json[k] = v;
                }
            }
        }
    }
    let events: Vec<&str> = match &o.event {
        Some(e) => vec![e.as_str()],
        None => EVENTS.to_vec(),
    };
    out.json["setup"] = json!({
        "viewers": o.clients, "nodes": o.nodes, "haproxy_processes": haproxy_procs,
        "rate": o.rate, "courses": o.courses, "sections": o.sections, "skew": o.skew,
        "drain_ms": o.drain_ms, "tick_ms": o.tick_ms,
    });
    for e in events {
        progress(o, format!("[fleet] event {e}"));
        let (j, rows, problems) = run_event(o, e, haproxy_procs);
        out.json[e] = j;
        for (k, v) in rows {
            out.rows.push((k, v));
        }
        out.problems.extend(problems);
    }
    out
}
