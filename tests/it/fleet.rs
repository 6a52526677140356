//! A small fleet: HAProxy (the shipped `systemd/haproxy/seatboard.cfg`) in
//! front of two `seatboard serve` nodes on one Redis, a few hundred viewers
//! that reconnect like the board page (the bench's load generator, run on a
//! thread here), snapshots published all along. One node is SIGKILLed: every
//! viewer it held must get a true board again through the other node, and at
//! the end every viewer's board must equal what was published last.

use crate::common;
use crate::{lb, publish};
use loadgen::{Command, Counters, Output};

use common::*;
use serde_json::Value;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SECRET: &str = "fleet-test-secret-0123456789abcdef0123456789";
const VIEWERS: usize = 300;

/// The load generator on a thread, and its messages.
struct Viewers {
    tx: mpsc::Sender<Command>,
    rx: mpsc::Receiver<Output>,
    last: Counters,
}

impl Viewers {
    fn start(port: u16, courses: &[String]) -> Viewers {
        let cfg = loadgen::Config {
            port,
            child: 0,
            clients: VIEWERS,
            courses: courses.to_vec(),
            skew: 1.1,
            connect_rate: 1000.0,
            inflight: 128,
            churn: false,
            secret: SECRET.into(),
            seed: 12,
            max_secs: 300,
            sources: 4,
            watch: true,
            // Browsers offer permessage-deflate; the viewers do too.
            deflate: true,
            tokens_file: None,
            sse: false,
            ..loadgen::Config::default()
        };
        let (tx, cmd_rx) = mpsc::channel::<Command>();
        let (out_tx, rx) = mpsc::channel::<Output>();
        std::thread::spawn(move || {
            loadgen::run_with(cfg, cmd_rx, move |v| {
                let _ = out_tx.send(v);
            })
        });
        Viewers {
            tx,
            rx,
            last: Counters::default(),
        }
    }

    fn send(&self, cmd: Command) {
        self.tx.send(cmd).expect("load generator alive");
    }

    /// The latest progress counter.
    fn counter(&mut self, k: fn(&Counters) -> u64) -> u64 {
        while let Ok(o) = self.rx.try_recv() {
            if let Output::Progress(p) = o {
                self.last = p.counters;
            }
        }
        k(&self.last)
    }

    fn report(self) -> Value {
        self.send(Command::Report);
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Output::Report(r)) = self.rx.recv_timeout(Duration::from_secs(1)) {
                return serde_json::to_value(r).expect("report json");
            }
        }
        panic!("no report from the load generator");
    }
}

#[test]
fn killing_a_node_behind_haproxy_every_viewer_sees_a_true_board_again() {
    let redis = RedisServer::start();
    let uri = redis.uri();
    let args = [
        "serve",
        "--redis",
        &uri,
        "--auth",
        "jwt",
        "--jwt-secret",
        SECRET,
        "--shards",
        "1",
        "--tick-ms",
        "100",
    ];
    let mut nodes = vec![Seatboard::start(&args), Seatboard::start(&args)];
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let lb_port = lb::free_port();
    let cfg = lb::render(&lb::shipped(), &lb::Bind::Plain(lb_port), &ports, 2000);
    // The shipped file's essentials survived the rendering.
    for must in [
        "timeout tunnel 120s",
        "balance leastconn",
        "http-check send meth GET uri /readyz",
        "option forwardfor",
        "option redispatch",
    ] {
        assert!(cfg.contains(must), "rendered config lost `{must}`");
    }
    let dir = std::env::temp_dir().join(format!("seatboard-fleet-{}", std::process::id()));
    let proxy = lb::Haproxy::start(&dir, lb_port, &cfg, 1);
    assert!(
        proxy.wait_ready("/readyz", Duration::from_secs(20)),
        "haproxy never saw a node up"
    );

    let courses: Vec<String> = (0..20).map(|i| format!("F{i:02}")).collect();
    let mut publisher = publish::SelectionApi::connect(redis.port, courses.clone(), 4);
    publisher.seed();
    let mut viewers = Viewers::start(lb_port, &courses);
    let t = Instant::now();
    while viewers.counter(|c| c.open) < VIEWERS as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "only {} of {VIEWERS} viewers connected through haproxy",
            viewers.counter(|c| c.open)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both nodes hold viewers (leastconn spreads them).
    let held: Vec<f64> = nodes
        .iter()
        .map(|n| n.metric("seatboard_connections{"))
        .collect();
    assert!(
        held.iter().all(|&c| c >= 30.0),
        "viewers not spread over both nodes: {held:?}"
    );

    let mut rng_section = 0u32;
    let mut publish_for = |p: &mut publish::SelectionApi, d: Duration, v: &Viewers| {
        let end = Instant::now() + d;
        let mut next_ref = Instant::now();
        while Instant::now() < end {
            for c in 0..courses.len() {
                p.queue(c, rng_section % 4, loadgen::now_us());
            }
            rng_section += 1;
            p.flush();
            if Instant::now() >= next_ref {
                next_ref += Duration::from_millis(500);
                v.send(Command::Ref {
                    versions: p.versions(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    publish_for(&mut publisher, Duration::from_secs(1), &viewers);
    viewers.send(Command::Arm);
    publish_for(&mut publisher, Duration::from_millis(300), &viewers);
    let victim = nodes.remove(0);
    let lost = victim.metric("seatboard_connections{");
    drop(victim); // SIGKILL
    let killed_at = Instant::now();
    // Keep publishing until every viewer the dead node held sees again.
    loop {
        publish_for(&mut publisher, Duration::from_millis(500), &viewers);
        let (blind, recovered) = (
            viewers.counter(|c| c.blind),
            viewers.counter(|c| c.recovered),
        );
        if blind == 0 && recovered as f64 >= lost {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(90),
            "after 90 s {blind} viewers still blind ({recovered} recovered, {lost} lost)"
        );
    }
    // The survivor holds every viewer now (its gauge may lag the last upgrades).
    let mut survivor = 0.0;
    let _ = wait_for(Duration::from_secs(10), || {
        survivor = nodes[0].metric("seatboard_connections{");
        (survivor >= VIEWERS as f64).then_some(())
    });
    assert!(
        survivor >= VIEWERS as f64,
        "the surviving node holds {survivor} of {VIEWERS}"
    );
    // Publishing has stopped; the last snapshots may still be a tick or two
    // away from some viewers. Mark every viewer blind until it has seen the
    // final versions, and wait for that (each adds one more interval).
    let recovered_before = viewers.counter(|c| c.recovered);
    viewers.send(Command::Blind);
    viewers.send(Command::Ref {
        versions: publisher.versions(),
    });
    // `recovered` only grows, so a progress line older than the commands
    // cannot satisfy this.
    let converged = wait_for(Duration::from_secs(20), || {
        (viewers.counter(|c| c.recovered) >= recovered_before + VIEWERS as u64).then_some(())
    });
    assert!(
        converged.is_some(),
        "{} viewers never saw the last published versions",
        viewers.counter(|c| c.blind)
    );
    let report = viewers.report();
    let intervals = report["intervals"].as_array().cloned().unwrap_or_default();
    assert!(
        intervals.len() as f64 >= lost + VIEWERS as f64,
        "{} blind intervals for {lost} lost connections and {VIEWERS} final checks",
        intervals.len()
    );
    assert_eq!(report["still_blind"].as_array().map(Vec::len), Some(0));
    // Every viewer is open again and its board equals the last published state.
    let mut ok = 0;
    let mut seen = 0;
    for d in report["digests"].as_array().into_iter().flatten() {
        let (c, dg, n) = (
            d[0].as_u64().unwrap() as usize,
            d[1].as_u64().unwrap(),
            d[2].as_u64().unwrap(),
        );
        seen += n;
        if dg == publisher.expected(c) {
            ok += n;
        }
    }
    assert_eq!(
        seen, VIEWERS as u64,
        "not every viewer is connected at the end"
    );
    assert_eq!(ok, VIEWERS as u64, "boards differ from the published state");
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no node able to take an upgrade, HAProxy answers by itself: first
/// every connect is refused (retries spent), then the checks have marked
/// every node down (no server). Either way the viewer gets the contract's
/// refusal, 503 with a jittered whole-second `Retry-After`, so it waits for
/// the hint instead of backing off blind (`http-error` in the shipped config).
#[test]
fn haproxy_refuses_with_retry_after_when_no_node_can_take_the_upgrade() {
    // Two node addresses nobody listens on.
    let nodes = [lb::free_port(), lb::free_port()];
    let lb_port = lb::free_port();
    let cfg = lb::render(&lb::shipped(), &lb::Bind::Plain(lb_port), &nodes, 100);
    let dir = std::env::temp_dir().join(format!("seatboard-fleet-503-{}", std::process::id()));
    let proxy = lb::Haproxy::start(&dir, lb_port, &cfg, 1);
    let mut seen = std::collections::BTreeSet::new();
    // Checks run every second and take 2 failures: 4 s covers both phases.
    let end = Instant::now() + Duration::from_secs(4);
    let mut answers = 0;
    while Instant::now() < end || answers < 20 {
        let head = lb::upgrade_head(lb_port).expect("haproxy answered");
        let status = head.split_whitespace().nth(1);
        assert_eq!(status, Some("503"), "not a refusal: {head}");
        let after: u64 = lb::header(&head, "retry-after")
            .unwrap_or_else(|| panic!("HAProxy's own 503 without Retry-After: {head}"))
            .parse()
            .unwrap_or_else(|e| panic!("Retry-After not whole seconds ({e}): {head}"));
        assert!((1..=3).contains(&after), "Retry-After {after}: {head}");
        seen.insert(after);
        answers += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.len() >= 2,
        "Retry-After not jittered over {answers} refusals: {seen:?}"
    );
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}
