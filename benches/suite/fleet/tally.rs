//! What the load generators and HAProxy reported of one fleet event:
//! latencies, blind intervals, refusals, recovery times.

use super::event::Moments;
use super::now_ms;
use crate::lb::Haproxy;
use loadgen::Hist;
use serde_json::Value;
use std::collections::BTreeMap;

/// The load generators' reports of one event, merged.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) before: Hist,
    pub(super) during: Hist,
    pub(super) intervals: Vec<(u64, u64)>,
    pub(super) still_blind: Vec<u64>,
    pub(super) close_codes: BTreeMap<u64, u64>,
    pub(super) statuses: BTreeMap<u64, u64>,
}

/// How the viewers recovered: the 99th percentile and all (none while one
/// is still blind), the longest blind interval, and how many were affected.
pub(super) struct Recovery {
    pub(super) p99: Option<u64>,
    pub(super) all: Option<u64>,
    pub(super) max_blind: Option<u64>,
    pub(super) affected: usize,
}

/// What HAProxy answered other than a 101, from its request logs
/// (`lb::log_to_stdout`): "status termination-state server" -> count (a 503
/// from a node has state `----`; HAProxy's own has `SC` for connects refused
/// with the retries spent, `<NOSRV>` when no node was up, `sQ` for a queue
/// timeout); and how many logged requests HAProxy had to retry.
pub(super) fn haproxy_answers(lb: &Haproxy, procs: usize) -> (BTreeMap<String, u64>, u64) {
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

pub(super) fn pct(h: &Hist, q: f64) -> f64 {
    h.quantile(q) as f64 / 1e3
}

/// Index of the 99th percentile and the maximum of `v` (sorted in place).
pub(super) fn p99_and_max(v: &mut [u64]) -> (Option<u64>, Option<u64>) {
    if v.is_empty() {
        return (None, None);
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (Some(v[i]), v.last().copied())
}

/// The load generators' reports merged: survivors' latency before and
/// during, blind intervals, viewers still blind, close codes and refusals.
pub(super) fn tally(reports: &[Value]) -> Tally {
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
pub(super) fn recovery(event: &str, t: &Tally, moments: &Moments) -> Recovery {
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
