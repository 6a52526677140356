//! The soak's sampler: every 10 s the hubs' and Redis's RSS, descriptors,
//! threads and CPU, and the hubs' `/metrics` counters.

use super::SAMPLE_EVERY;
use crate::procs;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::scrape;

/// Counters of `/metrics` that show a leak or a fault over time.
pub(super) const METRICS: [&str; 11] = [
    "seatboard_connections",
    "seatboard_courses_watched",
    "seatboard_subscriptions",
    "seatboard_frames_sent_total",
    "seatboard_frames_dropped_total",
    "seatboard_resyncs_total",
    "seatboard_slow_consumer_closes_total",
    "seatboard_ws_closes_total",
    "seatboard_ingest_messages_total",
    "seatboard_redis_reconnects_total",
    "seatboard_presence_errors_total",
];

pub(super) fn count_dir(path: String) -> u64 {
    std::fs::read_dir(path).map_or(0, |d| d.count() as u64)
}

/// One sample of one process.
pub(super) fn sample_process(pid: u32) -> Value {
    let u = procs::usage(pid);
    json!({
        "pid": pid,
        "rss_kib": u.rss_kib,
        "fds": count_dir(format!("/proc/{pid}/fd")),
        "threads": count_dir(format!("/proc/{pid}/task")),
        "cpu_us": u.cpu_us,
    })
}

/// Samples the hubs and Redis every 10 s until stopped.
pub(super) fn sampler(
    hubs: Vec<(u16, Arc<AtomicU32>)>,
    others: Arc<Mutex<Vec<(String, u32)>>>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> std::thread::JoinHandle<Vec<Value>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut next = Instant::now();
        while !stop.load(Relaxed) {
            if Instant::now() < next {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            next += SAMPLE_EVERY;
            let hubs: Vec<Value> = hubs
                .iter()
                .map(|(port, pid)| {
                    let mut hub = sample_process(pid.load(Relaxed));
                    let metrics = scrape::get_ok(*port, "/metrics", Duration::from_secs(3))
                        .unwrap_or_default();
                    hub["metrics"] = METRICS
                        .iter()
                        .map(|m| (m.to_string(), json!(scrape::metric_sum(&metrics, m))))
                        .collect::<serde_json::Map<_, _>>()
                        .into();
                    hub
                })
                .collect();
            let mut s = json!({ "t_s": t0.elapsed().as_secs_f64().round(), "hubs": hubs });
            for (name, pid) in others.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                s[name.as_str()] = sample_process(*pid);
            }
            samples.push(s);
        }
        samples
    })
}
