//! Who used the CPU while the fleet's storm ran: each role's share of a
//! core before the event, the machine's idle time.

use super::event::{event_thread, Moments};
use super::storm_loop::storm_through;
use super::Rig;
use crate::children::Fleet;
use crate::measure::counter;
use crate::procs;
use crate::publish::SelectionApi;
use crate::Opts;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The storm's CPU before the event, by role (% of one core), the
/// machine's idle share then, and how busy each load generator was.
pub(super) struct BeforeEvent {
    pub(super) cpu: BTreeMap<String, f64>,
    pub(super) idle: f64,
    pub(super) loadgen_busy: f64,
}

/// What the storm around the event measured.
pub(super) struct StormRun {
    pub(super) published: u64,
    pub(super) secs: f64,
    pub(super) m0: Value,
    pub(super) m1: Value,
    pub(super) k0: (u64, u64),
    pub(super) k1: (u64, u64),
    pub(super) before: BeforeEvent,
    pub(super) moments: Moments,
}

/// Who uses the CPU in the storm: the share each role takes of the 2 cores
/// shows what bounds the size that can be driven.
pub(super) fn roles(
    lb_pids: &[u32],
    node_pids: &[u32],
    loadgen_pids: Vec<u32>,
    redis_pid: u32,
) -> Vec<(&'static str, Vec<u32>)> {
    vec![
        ("haproxy", lb_pids.to_vec()),
        ("nodes", node_pids.to_vec()),
        ("loadgen", loadgen_pids),
        ("redis", vec![redis_pid]),
        ("runner", vec![std::process::id()]),
        // Loopback TCP work the kernel defers to its softirq threads under
        // load is this rig's traffic too.
        ("ksoftirqd", ksoftirqd_pids()),
    ]
}

/// Each role's CPU so far (µs), in the order of `roles`.
pub(super) fn role_cpu(roles: &[(&str, Vec<u32>)]) -> Vec<u64> {
    roles
        .iter()
        .map(|(_, pids)| pids.iter().map(|&p| procs::usage(p).cpu_us).sum())
        .collect()
}

/// The kernel's `ksoftirqd/N` threads.
pub(super) fn ksoftirqd_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("ksoftirqd/"))
        })
        .collect()
}

/// The storm through the event: the event runs on its own thread (with the
/// rig) from `o.before_s` on while this one publishes; returns what was
/// measured and the rig back.
pub(super) fn storm_with_event(
    o: &Opts,
    event: &str,
    rig: Rig,
    publisher: &mut SelectionApi,
    f: &mut Fleet,
    roles: Vec<(&'static str, Vec<u32>)>,
) -> (StormRun, Rig) {
    let (tx, rx) = mpsc::channel();
    let (ack_tx, ack_rx) = mpsc::channel();
    let mut handle = None;
    let mut rig_slot = Some((rig, ack_rx));
    let c0 = (role_cpu(&roles), Instant::now());
    let mut at_event = None;
    let k0 = procs::machine_ticks();
    let m0 = f.mark();
    let (published, secs, m_event) = storm_through(
        o,
        publisher,
        f,
        &rx,
        &ack_tx,
        o.before_s,
        o.after_s,
        Duration::from_secs_f64(o.max_wait_s),
        || {
            at_event = Some((role_cpu(&roles), Instant::now(), procs::machine_ticks()));
            if let Some((r, ack)) = rig_slot.take() {
                handle = Some(event_thread(
                    event.to_string(),
                    r,
                    o.clone(),
                    tx.clone(),
                    ack,
                ));
            }
        },
    );
    let k1 = procs::machine_ticks();
    let m1 = f.mark();
    let (rig, moments) = handle.expect("event ran").join().expect("event thread");
    let before = before_event(roles, c0, at_event, k0, (&m0, &m_event), f.pids().len());
    let run = StormRun {
        published,
        secs,
        m0,
        m1,
        k0,
        k1,
        before,
        moments,
    };
    (run, rig)
}

/// The storm before the event: each role's share of a core from `c0` to the
/// event (`at_event`), the rest of the machine's busy time as `others`, the
/// machine's idle share, and how busy each of the `loadgens` was.
pub(super) fn before_event(
    roles: Vec<(&str, Vec<u32>)>,
    c0: (Vec<u64>, Instant),
    at_event: Option<(Vec<u64>, Instant, (u64, u64))>,
    k0: (u64, u64),
    (m0, m_event): (&Value, &Value),
    loadgens: usize,
) -> BeforeEvent {
    let Some((c1, t1, kb)) = at_event else {
        return BeforeEvent {
            cpu: BTreeMap::new(),
            idle: f64::NAN,
            loadgen_busy: f64::NAN,
        };
    };
    let secs = t1.duration_since(c0.1).as_secs_f64().max(1e-3);
    let busy = counter(m_event, "busy_ms").saturating_sub(counter(m0, "busy_ms"));
    let loadgen_busy = busy as f64 / 10.0 / secs / loadgens.max(1) as f64;
    let mut shares: BTreeMap<String, f64> = roles
        .into_iter()
        .zip(c1.iter().zip(&c0.0))
        .map(|((name, _), (b, a))| {
            let pct = b.saturating_sub(*a) as f64 / 1e6 / secs * 100.0;
            (name.to_string(), (pct * 10.0).round() / 10.0)
        })
        .collect();
    // The rest of the machine's busy time: other processes on the
    // shared box (their builds and tests), the kernel's own threads.
    let idle = procs::idle_pct(k0, kb);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let ours: f64 = shares.values().sum();
    let others = ((100.0 - idle) * cores - ours).max(0.0);
    shares.insert("others".into(), (others * 10.0).round() / 10.0);
    BeforeEvent {
        cpu: shares,
        idle,
        loadgen_busy,
    }
}
