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

mod background;
mod clients;
mod events;
mod sampler;
mod storm;
mod summary;

use crate::children::Fleet;
use crate::cluster_util::Cluster;
use crate::node::ServeNode;
use crate::publish::SelectionApi;
use crate::server::SECRET;
use crate::storm_pub::Sink;
use crate::{Opts, Outcome};
use background::{run_schedule, Background, Viewers};
use std::path::{Path, PathBuf};
use std::time::Duration;
use storm::ClusterPub;
use summary::{checks, rows, summarize};
use testkit::proc::{free_port, RedisServer};

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

/// The soak's Redis: one server, or a cluster of three primaries with a
/// replica each.
enum Store {
    Single(RedisServer),
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
    let mut hubs: Vec<ServeNode> = (0..nodes)
        .map(|i| {
            let log = dir.join(format!("hub-{}-{}.log", std::process::id(), i + 1));
            ServeNode::start(free_port(), flags.clone(), Some(log))
        })
        .collect();
    let proxy = (nodes > 1).then(|| start_proxy(o, &dir, &hubs));
    // Where viewers connect: the proxy, or the one hub.
    let port = proxy.as_ref().map_or(hubs[0].port, |lb| lb.port);
    let courses = crate::setup::course_names(o.courses);
    let mut publisher: Box<dyn Sink> = match &store {
        Store::Single(r) => Box::new(SelectionApi::connect(r.port, courses.clone(), o.sections)),
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
    let logs: Vec<PathBuf> = hubs.iter().filter_map(|h| h.log.clone()).collect();
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
        Store::Single(RedisServer::start_in(
            &dir.join(format!("redis-{}", std::process::id())),
            &["--client-output-buffer-limit", "pubsub", "0", "0", "0"],
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
fn start_proxy(o: &Opts, dir: &Path, hubs: &[ServeNode]) -> crate::lb::Haproxy {
    let port = free_port();
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
        secret: SECRET.into(),
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
