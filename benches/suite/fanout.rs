//! `fanout`: one hot course, every client watching it, one update per tick
//! (or `--rate` per second): the server's CPU per delivered frame, latency
//! and the final boards, and the floor in the same run.

use crate::children::Fleet;
use crate::floor;
use crate::measure::{
    correctness, counter, cpu_pct, machine_row, merged_latency, progress, wire_row,
};
use crate::procs::{self, Usage};
use crate::publish::SelectionApi;
use crate::redis_rig::RedisRig;
use crate::server::serve;
use crate::setup::{fleet, server_flags, wait_open};
use crate::{Opts, Outcome};
use loadgen::Hist;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::proc::Seatboard;

/// What the fanout's window measured, from its start to its end.
struct Window {
    updates: u64,
    dt: f64,
    u0: Usage,
    u1: Usage,
    k0: (u64, u64),
    k1: (u64, u64),
    m0: Value,
    m1: Value,
}

/// Runs `fanout`.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("fanout");
    let redis = RedisRig::start();
    let server = serve(&redis, &server_flags(o, &[]));
    let courses = vec!["HOT".to_string()];
    let mut publisher = SelectionApi::connect(redis.port, courses.clone(), o.sections);
    publisher.seed();
    let mut f = fleet(o, server.port, &courses, 0.0, false, o.seconds + 900.0);
    let open = wait_open(o, &mut f, o.clients, "fanout");
    std::thread::sleep(Duration::from_secs(2));
    let interval = interval(o);
    let w = publish_window(o, &server, &mut publisher, &mut f, interval);
    std::thread::sleep(Duration::from_millis((o.tick_ms * 5).max(1000)));
    let reports = f.report();
    let lat = merged_latency(&reports);
    let correct = correctness(&reports, &publisher, o.clients);
    let frames = counter(&w.m1, "frames") - counter(&w.m0, "frames");
    let per_frame = rows(&mut out, o, &w, interval, &lat, correct, open);
    let wire = wire_row(&mut out, &server, &w.m0, &w.m1, frames);
    machine_row(&mut out, w.k0, w.k1);
    if !o.no_floor {
        // The floor in the same run: same clients, rate and frame size.
        floor::rows(&mut out, o, wire, interval, per_frame, "ratio_to_floor", "");
    }
    out
}

/// Publishes one update to the hot course every `interval` for
/// `--seconds`, printing progress each second, and measures the window.
fn publish_window(
    o: &Opts,
    server: &Seatboard,
    publisher: &mut SelectionApi,
    f: &mut Fleet,
    interval: Duration,
) -> Window {
    let m0 = f.mark();
    let u0 = procs::usage(server.child.id());
    let k0 = procs::machine_ticks();
    let t0 = Instant::now();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut next = Instant::now();
    let mut next_progress = t0 + Duration::from_secs(1);
    let mut prev = (u0, counter(&m0, "frames"), Instant::now());
    let mut updates = 0u64;
    while t0.elapsed().as_secs_f64() < o.seconds {
        publisher.queue(0, rng.u32(0..o.sections), loadgen::now_us());
        publisher.flush();
        updates += 1;
        next += interval;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(1);
            let now = (
                procs::usage(server.child.id()),
                f.sum(|c| c.frames),
                Instant::now(),
            );
            let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
            progress(
                o,
                format!(
                    "[fanout] {:.0}/{:.0}s server cpu {:.1}% of a core  frames/s {:.0}",
                    t0.elapsed().as_secs_f64(),
                    o.seconds,
                    cpu_pct(prev.0, now.0, dt),
                    (now.1.saturating_sub(prev.1)) as f64 / dt
                ),
            );
            prev = now;
        }
    }
    // The last update's frame is due within a tick; include it in the window.
    std::thread::sleep(Duration::from_millis(o.tick_ms / 2 + 50));
    Window {
        updates,
        dt: t0.elapsed().as_secs_f64(),
        u0,
        u1: procs::usage(server.child.id()),
        k0,
        k1: procs::machine_ticks(),
        m0,
        m1: f.mark(),
    }
}

/// The fanout's rows and checks; returns the server's CPU per frame (µs).
fn rows(
    out: &mut Outcome,
    o: &Opts,
    w: &Window,
    interval: Duration,
    lat: &Hist,
    (ok, total): (u64, u64),
    open: u64,
) -> f64 {
    let (updates, dt) = (w.updates, w.dt);
    let frames = counter(&w.m1, "frames") - counter(&w.m0, "frames");
    let cpu_us = w.u1.cpu_us.saturating_sub(w.u0.cpu_us);
    let per_frame = cpu_us as f64 / frames.max(1) as f64;
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "updates",
        format!(
            "{updates} (one per {:.0} ms; tick {} ms)",
            interval.as_secs_f64() * 1e3,
            o.tick_ms
        ),
        json!(updates),
    );
    out.row(
        "frames_delivered",
        format!("{frames} in {dt:.1} s"),
        json!(frames),
    );
    out.row(
        "frames_per_s",
        format!("{:.0}", frames as f64 / dt),
        json!(frames as f64 / dt),
    );
    out.row(
        "server_cpu_us_per_frame",
        format!("{per_frame:.3} us"),
        json!(per_frame),
    );
    out.row(
        "frames_per_cpu_s",
        format!("{:.0}", frames as f64 / (cpu_us.max(1) as f64 / 1e6)),
        json!(frames as f64 / (cpu_us.max(1) as f64 / 1e6)),
    );
    out.row(
        "server_cpu_pct_core",
        format!("{:.1}%", cpu_pct(w.u0, w.u1, dt)),
        json!(cpu_pct(w.u0, w.u1, dt)),
    );
    let (p50, p99) = (lat.quantile(0.5), lat.quantile(0.99));
    out.row(
        "latency_ms",
        format!("p50 {:.1}  p99 {:.1}", p50 as f64 / 1e3, p99 as f64 / 1e3),
        json!({"p50": p50 as f64 / 1e3, "p99": p99 as f64 / 1e3}),
    );
    out.row(
        "final_state_correct",
        format!("{ok}/{total}"),
        json!(100.0 * ok as f64 / total.max(1) as f64),
    );
    out.check(open as usize == o.clients, "not every client connected");
    out.check(
        ok == total,
        "final state differs from the last published state",
    );
    out.check(frames > 0, "no frame delivered");
    per_frame
}

/// Fanout's update interval: `--rate` updates/s, or one per tick.
pub fn interval(o: &Opts) -> Duration {
    if o.rate_set {
        Duration::from_secs_f64(1.0 / o.rate.max(0.01))
    } else {
        Duration::from_millis(o.tick_ms)
    }
}
