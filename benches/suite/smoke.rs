//! The short run of every scenario that `cargo test --all-targets` executes
//! (the suite run without `--bench` in its arguments).

use crate::Opts;
use std::time::Instant;

/// Runs every scenario of the plan; the exit status (1 if one failed).
pub fn run() -> i32 {
    let t0 = Instant::now();
    let (mut passed, mut failed) = (0, 0);
    for (name, o) in plan() {
        if one(name, &o) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("bench smoke took {:.1} s", t0.elapsed().as_secs_f64());
    println!("smoke: {passed} passed, {failed} failed");
    i32::from(failed > 0)
}

/// Each scenario of the smoke with its short options, in the order they run.
fn plan() -> Vec<(&'static str, Opts)> {
    let base = base();
    [
        costs(&base),
        loads(&base),
        workers(&base),
        deployments(&base),
    ]
    .concat()
}

/// The short options every scenario starts from.
fn base() -> Opts {
    Opts {
        clients: 200,
        seconds: 2.0,
        rate: 2000.0,
        courses: 40,
        tick_ms: 100,
        procs: 1,
        snapshots: 20_000,
        ..Opts::default()
    }
}

/// `base` with what `change` sets.
fn tuned(base: &Opts, change: impl FnOnce(&mut Opts)) -> Opts {
    let mut o = base.clone();
    change(&mut o);
    o
}

/// What one thing costs a node: ingest, a publish, an idle connection, a
/// connect, a first board.
fn costs(base: &Opts) -> Vec<(&'static str, Opts)> {
    vec![
        ("ingest", base.clone()),
        ("publish_cost", tuned(base, |o| o.snapshots = 2_000)),
        ("idle", base.clone()),
        (
            "idle",
            tuned(base, |o| {
                o.upgrade_courses = true;
                o.no_floor = true;
            }),
        ),
        ("connect_cost", tuned(base, |o| o.clients = 100)),
        ("first_board", tuned(base, |o| o.clients = 100)),
    ]
}

/// A node under load: storms (several processes, a cluster, a distant
/// Redis while viewers connect), fan-out, the floor, handshakes, reconnects.
fn loads(base: &Opts) -> Vec<(&'static str, Opts)> {
    vec![
        (
            "storm",
            tuned(base, |o| {
                o.clients = 300;
                o.procs = 2;
            }),
        ),
        (
            "storm",
            tuned(base, |o| {
                o.clients = 200;
                o.cluster = true;
            }),
        ),
        (
            "storm",
            tuned(base, |o| {
                o.clients = 200;
                o.redis_rtt_ms = 4.0;
                o.connect_during = true;
            }),
        ),
        ("fanout", base.clone()),
        (
            "floor",
            tuned(base, |o| {
                o.clients = 100;
                o.seconds = 1.0;
            }),
        ),
        ("handshake", base.clone()),
        ("reconnect", base.clone()),
    ]
}

/// The workers beside the nodes: the relay and the reconciler.
fn workers(base: &Opts) -> Vec<(&'static str, Opts)> {
    vec![
        ("relay", tuned(base, |o| o.seconds = 1.0)),
        (
            "reconcile",
            tuned(base, |o| {
                o.courses = 50;
                o.sections = 8;
                o.rate = 500.0;
                o.seconds = 1.0;
            }),
        ),
    ]
}

/// Whole deployments: the comparison, a fleet losing a node, the soak.
fn deployments(base: &Opts) -> Vec<(&'static str, Opts)> {
    vec![
        (
            "compare",
            tuned(base, |o| {
                o.clients = 100;
                o.seconds = 1.0;
            }),
        ),
        (
            "fleet",
            tuned(base, |o| {
                o.clients = 300;
                o.event = Some("kill".into());
                o.before_s = 2.0;
                o.after_s = 1.0;
                o.max_wait_s = 20.0;
                o.min_during_s = 1.0;
                o.haproxy_procs = 1;
            }),
        ),
        ("soak", tuned(base, |o| o.minutes = 1.0)),
    ]
}

/// Runs scenario `name` with `o`, printing its table and whether it passed.
fn one(name: &str, o: &Opts) -> bool {
    let t = Instant::now();
    match std::panic::catch_unwind(|| crate::run(name, o)) {
        Ok(Ok(out)) => {
            out.print();
            if out.problems.is_empty() {
                println!("smoke {name}: ok ({:.1} s)", t.elapsed().as_secs_f64());
                true
            } else {
                println!("smoke {name}: FAILED: {:?}", out.problems);
                false
            }
        }
        Ok(Err(e)) => {
            println!("smoke {name}: FAILED: {e}");
            false
        }
        Err(_) => {
            println!("smoke {name}: FAILED (panicked)");
            false
        }
    }
}
