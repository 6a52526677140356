//! What the soak measured: growth between the second and the last quarter,
//! panics and log volume; its rows and checks.

use super::background::Finished;
use super::STUCK;
use crate::{Opts, Outcome};
use serde_json::{json, Value};
use std::path::PathBuf;

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Hub `i`'s samples of one quarter (1-based) that belong to its final process.
pub(super) fn quarter(
    samples: &[Value],
    total_s: f64,
    q: usize,
    i: usize,
    pid: u64,
) -> Vec<&Value> {
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
pub(super) fn growth(samples: &[Value], total_s: f64, hubs: usize) -> (f64, i64, i64, bool) {
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

pub(super) fn hub_growth(samples: &[Value], total_s: f64, i: usize) -> (f64, i64, i64, bool) {
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

/// What the soak measured, for its rows and checks.
pub(super) struct Summary {
    pub(super) nodes: usize,
    pub(super) open: u64,
    pub(super) fin: Finished,
    pub(super) panics: usize,
    pub(super) log_bytes_per_min: f64,
    pub(super) rss_growth_pct: f64,
    pub(super) fd_growth: i64,
    pub(super) thread_growth: i64,
    pub(super) same_process: bool,
    pub(super) churn_upgrades: u64,
    pub(super) closed_by_server: u64,
}

/// Reads the hubs' `logs` and sums up the run.
pub(super) fn summarize(
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
pub(super) fn rows(out: &mut Outcome, o: &Opts, s: &Summary, events: &[Value]) {
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
pub(super) fn checks(out: &mut Outcome, o: &Opts, s: &Summary, events: &[Value]) {
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
