//! The measurements the scenarios share: CPU, RSS and wake-ups from /proc,
//! the load generators' counters, latency and boards, and the rows that
//! report them.

use crate::children::Fleet;
use crate::procs::{self, Usage};
use crate::publish::SelectionApi;
use crate::{Opts, Outcome};
use loadgen::Hist;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testkit::proc::Seatboard;

/// A progress line on stderr (not under `quiet`).
pub fn progress(o: &Opts, msg: String) {
    if !o.quiet {
        eprintln!("  .. {msg}");
    }
}

/// Records how busy the machine was in the measured window: the load
/// generator, Redis and the server share its 2 cores, and so does anything
/// else running, which the numbers must not hide.
pub fn machine_row(out: &mut Outcome, a: (u64, u64), b: (u64, u64)) {
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

/// CPU from `a` to `b` over `secs`, in percent of one core.
pub fn cpu_pct(a: Usage, b: Usage, secs: f64) -> f64 {
    (b.cpu_us.saturating_sub(a.cpu_us)) as f64 / (secs * 1e6) * 100.0
}

/// Sleeps `secs`, printing server CPU, RSS and the rate of the load
/// generators' `counter` (e.g. `frames`, `upgrades`) each second.
pub fn watch(o: &Opts, label: &str, counter: &str, secs: f64, server: &Seatboard, f: &mut Fleet) {
    let start = Instant::now();
    let mut prev = (
        procs::usage(server.child.id()),
        f.sum_named(counter),
        Instant::now(),
    );
    while start.elapsed().as_secs_f64() < secs {
        let left = secs - start.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs_f64(left.clamp(0.0, 1.0)));
        let now = (
            procs::usage(server.child.id()),
            f.sum_named(counter),
            Instant::now(),
        );
        let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
        progress(
            o,
            format!(
                "[{label}] {:.0}/{secs:.0}s  server cpu {:.1}% of a core  rss {} MiB  {counter}/s {:.0}  open {}  refused {}",
                start.elapsed().as_secs_f64(),
                cpu_pct(prev.0, now.0, dt),
                now.0.rss_kib / 1024,
                now.1.saturating_sub(prev.1) as f64 / dt,
                f.sum(|c| c.open),
                f.sum(|c| c.refused),
            ),
        );
        prev = now;
    }
}

/// The load generators' latency histograms merged into one.
pub fn merged_latency(reports: &[Value]) -> Hist {
    let mut h = Hist::default();
    for r in reports {
        h.merge_json(&r["latency"]);
    }
    h
}

/// (clients whose board equals the publisher's, clients checked).
pub fn correctness(reports: &[Value], p: &SelectionApi, expected_clients: usize) -> (u64, u64) {
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

/// A load-generator counter of a report or mark (0 when absent).
pub fn counter(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Wake-ups per second of each thread of `pid` from `w0` to now, over `secs`.
pub fn wakeup_rates(pid: u32, w0: &BTreeMap<String, u64>, secs: f64) -> Vec<(String, f64)> {
    procs::wakeups(pid)
        .iter()
        .map(|(k, v)| {
            let n = v.saturating_sub(w0.get(k).copied().unwrap_or(0));
            (k.clone(), n as f64 / secs)
        })
        .collect()
}

/// A row with the total wake-ups per second and each thread's.
pub fn wakeups_row(out: &mut Outcome, key: &str, per_thread: &[(String, f64)], secs: f64) {
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

/// Each thread's growth from `th0` to `th1` (CPU µs or wake-ups), divided by `n`
/// (connections, reconnections).
pub fn per_each(
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
pub fn by_thread_text<'a>(
    by_thread: impl IntoIterator<Item = (&'a String, &'a f64)>,
    places: usize,
) -> String {
    by_thread
        .into_iter()
        .map(|(k, v)| format!("{k} {v:.places$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU and RSS summed over `pids` (e.g. every Redis process).
pub fn usage_sum(pids: &[u32]) -> Usage {
    pids.iter().fold(Usage::default(), |a, &p| {
        let u = procs::usage(p);
        Usage {
            cpu_us: a.cpu_us + u.cpu_us,
            rss_kib: a.rss_kib + u.rss_kib,
            rss_anon_kib: a.rss_anon_kib + u.rss_anon_kib,
        }
    })
}

/// Bytes on the wire per delivered frame (load generator's count over the
/// window), and the server's sent-vs-payload totals; returns the former.
pub fn wire_row(out: &mut Outcome, server: &Seatboard, m0: &Value, m1: &Value, frames: u64) -> f64 {
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
