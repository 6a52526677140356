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

mod cpu;
mod event;
mod report;
mod storm_loop;
mod tally;

use crate::children::Fleet;
use crate::lb::{self, Bind, Haproxy};
use crate::measure::{counter, progress};
use crate::node::ServeNode;
use crate::publish::SelectionApi;
use crate::setup::course_names;
use crate::{Opts, Outcome};
use cpu::{roles, storm_with_event};
use report::{event_json, event_problems, event_rows, Measured};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tally::{haproxy_answers, pct, recovery};
use testkit::proc::{free_port, RedisServer};

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

/// Everything one run owns.
struct Rig {
    // Dropped in this order: the proxy, the nodes, then Redis.
    pub(super) lb: Haproxy,
    pub(super) nodes: Vec<ServeNode>,
    pub(super) redis: RedisServer,
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
    let redis = RedisServer::start_in(
        &dir.join(format!("redis-{}", std::process::id())),
        &["--client-output-buffer-limit", "pubsub", "0", "0", "0"],
    );
    let mut flags = node_flags(o);
    flags.extend(["--redis".into(), redis.uri()]);
    let nodes: Vec<ServeNode> = (0..o.nodes.max(2))
        .map(|_| ServeNode::start(free_port(), flags.clone(), None))
        .collect();
    let port = free_port();
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

/// One event in its own run.
pub fn run_event(
    o: &Opts,
    event: &str,
    haproxy_procs: usize,
) -> (Value, Vec<(String, String)>, Vec<String>) {
    let mut problems = Vec::new();
    let rig = start_rig(o, haproxy_procs);
    let courses = course_names(o.courses);
    let mut publisher = SelectionApi::connect(rig.redis.port, courses.clone(), o.sections);
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
            .map(|(n, &start)| refused_503(n.port).saturating_sub(start))
            .sum::<u64>()
    });
    settle(o, &mut f);
    let reports = f.report();
    let (lb_answers, lb_retried) = haproxy_answers(&rig.lb, lb_pids.len());
    drop(rig);
    let tally = tally::tally(&reports);
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

/// Upgrades the node on `port` refused with 503 so far (accept rate,
/// draining, full), from its `/metrics`; 0 when it does not answer.
pub(super) fn refused_503(port: u16) -> u64 {
    let text = testkit::scrape::get_ok(port, "/metrics", std::time::Duration::from_secs(3))
        .unwrap_or_default();
    testkit::scrape::sum_lines(&text, |k| {
        k.starts_with("seatboard_handshakes_refused_total{")
            && ["rate_limited", "draining", "node_full"]
                .iter()
                .any(|r| k.contains(r))
    }) as u64
}
