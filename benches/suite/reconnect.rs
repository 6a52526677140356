//! The `reconnect` scenario: a node's viewers all come back at once. N
//! viewers watch the storm's courses (every section seeded), then every
//! connection is reset at the same moment (`Command::Drop`, see the `loadgen` crate) and each
//! viewer reconnects the way the board page does after a lost connection (a
//! full-jitter backoff under 500 ms), as when a load balancer sends a dead
//! node's viewers on to this one.
//!
//! Two passes, each on a fresh server: the node's default accept bucket, and
//! the bucket opened wide (`--accept-rate 100000 --accept-burst 20000`) to
//! see the server itself (`--pass default|wide` runs one). Per pass: time from
//! the drop until each viewer's board is true again (p50, p99, all), server
//! CPU per reconnection (drop to the last board true), refusals by status, and
//! the server's RSS before the drop and after every viewer is back.

use crate::children::Fleet;
use crate::measure::{counter, progress};
use crate::procs;
use crate::publish::SelectionApi;
use crate::redis_rig::RedisRig;
use crate::server::serve;
use crate::setup::{course_names, fleet};
use crate::{Opts, Outcome};
use loadgen::Command;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testkit::proc::Seatboard;

/// The accept flags of the wide-open pass.
const WIDE: [&str; 4] = ["--accept-rate", "100000", "--accept-burst", "20000"];

/// The node's default accept rate (`--accept-rate`), for the first fill.
const DEFAULT_RATE: f64 = 2000.0;

/// Runs the passes `o.pass` names (both when unset).
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("reconnect");
    for pass in ["default", "wide"] {
        if o.pass.as_deref().is_some_and(|p| p != pass) {
            continue;
        }
        run_pass(o, pass, &mut out);
    }
    out
}

/// Seatboard flags of a pass: the scenario's tick, driver and shards, and the
/// accept bucket under test (no flag: the node's default).
fn pass_flags(o: &Opts, pass: &str) -> Vec<String> {
    let mut f: Vec<String> = vec!["--tick-ms".into(), o.tick_ms.to_string()];
    if pass == "wide" {
        f.extend(WIDE.iter().map(|s| s.to_string()));
    }
    if let Some(d) = &o.driver {
        f.extend(["--driver".into(), d.clone()]);
    }
    if let Some(s) = o.shards {
        f.extend(["--shards".into(), s.to_string()]);
    }
    f.extend(["--compression".into(), o.compression.clone()]);
    f
}

/// Polls the load generators until `counter` reaches `target` or `limit` passes.
fn wait_counter(f: &mut Fleet, counter: &str, target: u64, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f.sum_named(counter) >= target {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f.sum_named(counter) >= target
}

/// Waits until every client is open and has its watch answer (a full frame).
/// Returns false after `limit`.
pub fn wait_answered(f: &mut Fleet, clients: u64, watch: bool, limit: Duration) -> bool {
    let c = if watch { "full_frames" } else { "open" };
    wait_counter(f, c, clients, limit) && wait_counter(f, "open", clients, limit)
}

fn run_pass(o: &Opts, pass: &str, out: &mut Outcome) {
    let key = |k: &str| format!("{pass}_{k}");
    let courses = course_names(o.courses);
    let redis = RedisRig::start();
    let server = serve(&redis, &pass_flags(o, pass));
    let mut publisher = SelectionApi::connect(redis.port, courses.clone(), o.sections);
    publisher.seed();
    let fill = Opts {
        connect_rate: if pass == "wide" {
            o.connect_rate
        } else {
            o.connect_rate.min(DEFAULT_RATE * 0.9)
        },
        ..o.clone()
    };
    let mut f = fleet(&fill, server.port, &courses, o.skew, false, 900.0);
    let n = o.clients as u64;
    let filled = wait_answered(&mut f, n, true, Duration::from_secs(120));
    progress(
        o,
        format!("[reconnect {pass}] {n} viewers watching: {filled}"),
    );
    f.command(Command::Ref {
        versions: publisher.versions(),
    });
    // Settle: the fill's garbage back to the OS (the tick does it) first.
    std::thread::sleep(Duration::from_secs(3));
    let u0 = procs::usage(server.child.id());
    let th0 = procs::cpu_by_thread(server.child.id());
    let w0 = procs::wakeups(server.child.id());
    let m0 = f.mark();
    let t0 = Instant::now();
    f.command(Command::Drop);
    let limit = Duration::from_secs(60);
    let recovered0 = counter(&m0, "recovered");
    let mut back = false;
    while t0.elapsed() < limit {
        if f.sum(|c| c.recovered) >= recovered0 + n {
            back = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = t0.elapsed().as_secs_f64();
    let u1 = procs::usage(server.child.id());
    let th1 = procs::cpu_by_thread(server.child.id());
    let w1 = procs::wakeups(server.child.id());
    progress(
        o,
        format!("[reconnect {pass}] back after {secs:.2} s: {back}"),
    );
    std::thread::sleep(Duration::from_secs(3));
    let u2 = procs::usage(server.child.id());
    let reports = f.report();
    let (ok, total) = crate::measure::correctness(&reports, &publisher, o.clients);
    rows(
        out,
        &key,
        &reports,
        (u0, u1, u2),
        (&th0, &th1),
        (&w0, &w1),
        n,
        secs,
    );
    out.row(
        &key("correct"),
        format!("{ok}/{total} boards equal the last published state"),
        json!({"ok": ok, "total": total}),
    );
    out.check(back, &format!("{pass}: not every viewer came back"));
    out.check(ok == total, &format!("{pass}: not every board is true"));
    let refused = refusals(&reports);
    let limited = server_refusals(&server);
    let other: u64 = limited
        .iter()
        .filter(|(r, _)| r.as_str() != "rate_limited")
        .map(|x| x.1)
        .sum();
    out.row(
        &key("refusals"),
        format!("by status {refused:?}; the server's by reason {limited:?}"),
        json!({"by_status": refused, "server_by_reason": limited}),
    );
    out.check(
        other == 0,
        &format!("{pass}: refusals other than the accept bucket's"),
    );
}

/// The rows of one pass.
#[allow(clippy::too_many_arguments)]
fn rows(
    out: &mut Outcome,
    key: &dyn Fn(&str) -> String,
    reports: &[Value],
    (u0, u1, u2): (procs::Usage, procs::Usage, procs::Usage),
    (th0, th1): (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    (w0, w1): (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    n: u64,
    secs: f64,
) {
    let mut times: Vec<u64> = reports
        .iter()
        .flat_map(|r| r["intervals"].as_array().cloned().unwrap_or_default())
        .filter_map(|iv| Some(iv[1].as_u64()?.saturating_sub(iv[0].as_u64()?)))
        .collect();
    times.sort_unstable();
    let q = |p: f64| {
        times
            .get(((times.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0)
    };
    out.row(
        &key("board_true_ms"),
        format!(
            "{} viewers back: p50 {} ms, p99 {} ms, all {} ms after the drop",
            times.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        ),
        json!({"viewers": times.len(), "p50": q(0.5), "p99": q(0.99), "all": q(1.0)}),
    );
    let cpu = u1.cpu_us.saturating_sub(u0.cpu_us);
    let per = cpu as f64 / n.max(1) as f64;
    let by_thread = crate::measure::per_each(th0, th1, n);
    out.row(
        &key("cpu_us_per_reconnect"),
        format!(
            "{per:.0} µs of server CPU per reconnection ({:.2} s over {secs:.2} s; by thread {})",
            cpu as f64 / 1e6,
            crate::measure::by_thread_text(&by_thread, 0)
        ),
        json!({"per_conn_us": per, "total_s": cpu as f64 / 1e6, "by_thread_us": by_thread}),
    );
    let wakes: BTreeMap<String, f64> = w1
        .iter()
        .map(|(k, v)| {
            let d = v.saturating_sub(w0.get(k).copied().unwrap_or(0));
            (k.clone(), d as f64 / n.max(1) as f64)
        })
        .collect();
    out.row(
        &key("wakeups_per_reconnect"),
        wakes
            .iter()
            .map(|(k, v)| format!("{k} {v:.2} per reconnection"))
            .collect::<Vec<_>>()
            .join(", "),
        json!(wakes),
    );
    let ratio = u2.rss_kib as f64 / u0.rss_kib.max(1) as f64;
    out.row(
        &key("rss_kib"),
        format!(
            "{} KiB before the drop, {} KiB 3 s after every viewer is back ({ratio:.3}x)",
            u0.rss_kib, u2.rss_kib
        ),
        json!({"before": u0.rss_kib, "after": u2.rss_kib, "ratio": ratio}),
    );
}

/// Refused upgrades after the drop, by HTTP status, over every load generator.
fn refusals(reports: &[Value]) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for r in reports {
        for e in r["refusals"].as_array().into_iter().flatten() {
            *m.entry(e[0].as_u64().unwrap_or(0)).or_default() += e[1].as_u64().unwrap_or(0);
        }
    }
    m
}

/// The server's `seatboard_handshakes_refused_total` by reason (whole run).
fn server_refusals(server: &Seatboard) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for l in server.get("/metrics").unwrap_or_default().lines() {
        let Some(rest) = l.strip_prefix("seatboard_handshakes_refused_total{") else {
            continue;
        };
        let reason = rest.split('"').nth(1).unwrap_or("").to_string();
        let v = l
            .rsplit_once(' ')
            .and_then(|x| x.1.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        if v > 0 {
            *m.entry(reason).or_default() += v;
        }
    }
    m
}
