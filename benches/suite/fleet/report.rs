//! One fleet event's JSON, table rows and problems.

use super::cpu::StormRun;
use super::tally::{Recovery, Tally};
use crate::procs;
use crate::Opts;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Everything one event measured, for its JSON, rows and problems.
pub(super) struct Measured {
    pub(super) storm: StormRun,
    pub(super) tally: Tally,
    pub(super) rec: Recovery,
    pub(super) open: u64,
    /// Snapshots published in the storm, the seeding not counted.
    pub(super) published: u64,
    pub(super) rate: f64,
    pub(super) correct: (u64, u64),
    pub(super) final_correct: f64,
    pub(super) refused: u64,
    pub(super) refused_all: u64,
    pub(super) disconnected: u64,
    pub(super) b99: f64,
    pub(super) d99: f64,
    pub(super) node_refused: Option<u64>,
    pub(super) lb_answers: BTreeMap<String, u64>,
    pub(super) lb_retried: u64,
    pub(super) haproxy_processes: usize,
    pub(super) nodes: usize,
}

/// The event's JSON (`target/bench/fleet.json` under its name).
pub(super) fn event_json(o: &Opts, m: &Measured) -> Value {
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
pub(super) fn event_rows(o: &Opts, event: &str, m: &Measured) -> Vec<(String, String)> {
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
pub(super) fn event_problems(event: &str, m: &Measured) -> Vec<String> {
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
