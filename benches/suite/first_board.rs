//! `first_board`: a new viewer's time from its TCP connect to its first full
//! frame (p50, p99), its courses named in the upgrade (`/ws?course=C`)
//! against a `watch` message after the `hello`, at 0 ms and at
//! `--client-rtt-ms` of client round trip (the test kit's delay proxy between
//! the load generator and the node), alternated; and each connect phase's
//! server CPU per connection. A warm fleet keeps every course held by the
//! node, as on a reconnect.

use crate::children::Fleet;
use crate::measure::progress;
use crate::procs;
use crate::reconnect::wait_answered;
use crate::redis_rig::RedisRig;
use crate::server::serve;
use crate::setup::{course_names, fleet, server_flags};
use crate::{Opts, Outcome};
use loadgen::Hist;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use testkit::delay_proxy::DelayProxy;
use testkit::publish::SelectionApi;

/// One measured fleet: first-board p50 and p99 (ms), server CPU per connection (µs).
struct Pass {
    p50_ms: f64,
    p99_ms: f64,
    cpu_us: f64,
}

/// Runs `first_board`.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("first_board");
    let courses = course_names(o.courses);
    let redis = RedisRig::start();
    let server = serve(&redis, &server_flags(o, &["--max-conns-per-user", "64"]));
    let mut publisher = SelectionApi::connect(redis.port, courses.clone(), o.sections);
    publisher.seed();
    let n = o.clients as u64;
    let mut warm = fleet(o, server.port, &courses, o.skew, false, 1800.0);
    let warmed = wait_answered(&mut warm, n, true, Duration::from_secs(120));
    out.check(warmed, "the warm fleet did not get every board");
    let pid = server.child.id();
    for rtt in [0.0, o.client_rtt_ms] {
        let one_way = Duration::from_secs_f64(rtt / 2e3);
        let proxy = (rtt > 0.0)
            .then(|| DelayProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port)), one_way));
        let port = proxy.as_ref().map_or(server.port, DelayProxy::port);
        let mut passes: [Vec<Pass>; 2] = [Vec::new(), Vec::new()];
        for round in 0..2 {
            for (k, named) in [(0, false), (1, true)] {
                let named = if round == 1 { !named } else { named };
                let k = if round == 1 { 1 - k } else { k };
                let p = one_pass(o, &courses, port, pid, named, &mut out);
                progress(
                    o,
                    format!(
                        "[first_board] rtt {rtt} ms, {}: p50 {:.1} ms, p99 {:.1} ms, {:.0} µs/conn",
                        if named { "upgrade" } else { "watch" },
                        p.p50_ms,
                        p.p99_ms,
                        p.cpu_us
                    ),
                );
                passes[k].push(p);
            }
        }
        rows(&mut out, rtt, &passes);
    }
    drop(warm.report());
    out
}

/// Connects `--clients` new viewers (their courses `named` in the upgrade
/// or sent in a `watch`), waits for every board, and closes them.
fn one_pass(
    o: &Opts,
    courses: &[String],
    port: u16,
    pid: u32,
    named: bool,
    out: &mut Outcome,
) -> Pass {
    let po = Opts {
        upgrade_courses: named,
        ..o.clone()
    };
    let before = procs::usage(pid);
    let mut f: Fleet = fleet(&po, port, courses, o.skew, false, 600.0);
    let ok = wait_answered(&mut f, o.clients as u64, true, Duration::from_secs(120));
    let after = procs::usage(pid);
    out.check(ok, "a measured fleet did not get every board");
    let mut h = Hist::default();
    for r in f.report() {
        h.merge_json(&r["first_board"]);
    }
    Pass {
        p50_ms: h.quantile(0.5) as f64 / 1e3,
        p99_ms: h.quantile(0.99) as f64 / 1e3,
        cpu_us: after.cpu_us.saturating_sub(before.cpu_us) as f64 / o.clients.max(1) as f64,
    }
}

/// The rows of one round trip: each way's figures (mean of its passes) and
/// the upgrade's ratio to the watch message.
fn rows(out: &mut Outcome, rtt: f64, passes: &[Vec<Pass>; 2]) {
    let mean =
        |ps: &[Pass], f: fn(&Pass) -> f64| ps.iter().map(f).sum::<f64>() / ps.len().max(1) as f64;
    let mut figs = Vec::new();
    for (name, how, ps) in [
        ("watch", "sent in a watch message", &passes[0]),
        ("upgrade", "named in the upgrade", &passes[1]),
    ] {
        let (p50, p99, cpu) = (
            mean(ps, |p| p.p50_ms),
            mean(ps, |p| p.p99_ms),
            mean(ps, |p| p.cpu_us),
        );
        out.row(
            &format!("rtt{rtt:.0}_{name}"),
            format!("courses {how}: first full frame p50 {p50:.1} ms, p99 {p99:.1} ms after the TCP connect; {cpu:.0} µs of server CPU per connection"),
            json!({"p50_ms": p50, "p99_ms": p99, "cpu_us_per_conn": cpu}),
        );
        figs.push((p50, p99, cpu));
    }
    let r = |f: fn(&(f64, f64, f64)) -> f64| f(&figs[1]) / f(&figs[0]).max(1e-9);
    let (r50, r99, rcpu) = (r(|x| x.0), r(|x| x.1), r(|x| x.2));
    out.row(
        &format!("rtt{rtt:.0}_upgrade_to_watch"),
        format!("courses in the upgrade / in a watch message: p50 {r50:.2}x, p99 {r99:.2}x, server CPU {rcpu:.2}x"),
        json!({"p50": r50, "p99": r99, "cpu": rcpu}),
    );
}
