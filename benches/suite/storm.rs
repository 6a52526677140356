//! `storm`: a publishing storm over many courses (Zipf), every client
//! watching one: server CPU (in total and by thread), latency, delivery and
//! every board against the last published state; with `--stuck N`, clients
//! that never read; with `--connect-during`, the viewers connect while the
//! storm is published (how the frame rate comes up, and each course's first
//! full frame after its first watch); then the floor in the same run.

use crate::children::Fleet;
use crate::floor;
use crate::measure::{
    correctness, counter, cpu_pct, machine_row, merged_latency, progress, usage_sum, wire_row,
};
use crate::procs::{self, Usage};
use crate::publish::SelectionApi;
use crate::redis_rig::RedisRig;
use crate::server::serve;
use crate::setup::{course_names, fleet, server_flags, start_redis, wait_open};
use crate::stuck;
use crate::{Opts, Outcome};
use loadgen::seeding;
use loadgen::Hist;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testkit::proc::Seatboard;

/// What the storm's window measured, from its start to its end.
struct Window {
    dt: f64,
    u0: Usage,
    u1: Usage,
    rss_peak: u64,
    k0: (u64, u64),
    k1: (u64, u64),
    r0: Usage,
    r1: Usage,
    lg0: u64,
    lg1: u64,
    th0: BTreeMap<String, u64>,
    th1: BTreeMap<String, u64>,
    m0: Value,
    m1: Value,
    /// When the window started and ended, Unix µs.
    start_us: u64,
    end_us: u64,
}

impl Window {
    /// Frames the clients received in the window.
    fn frames(&self) -> u64 {
        counter(&self.m1, "frames") - counter(&self.m0, "frames")
    }
}

/// Runs `storm` (`storm_cluster` under `--redis-mode cluster`).
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new(if o.cluster { "storm_cluster" } else { "storm" });
    let courses = course_names(o.courses);
    let (redis, mode) = start_redis(o);
    let server = serve(&redis, &server_flags(o, mode));
    let mut publisher = if o.cluster {
        let direct = |p| redis.direct_port(p);
        SelectionApi::connect_cluster_via(&redis.ports, courses.clone(), o.sections, direct)
    } else {
        SelectionApi::connect(redis.port, courses.clone(), o.sections)
    };
    publisher.seed();
    let mut f = fleet(o, server.port, &courses, o.skew, false, o.seconds + 900.0);
    let open_before = (!o.connect_during).then(|| wait_open(o, &mut f, o.clients, "storm"));
    let rss_before_stuck = procs::usage(server.child.id()).rss_kib;
    let stuck = stuck::open(server.port, o.stuck, &courses[..3.min(courses.len())]);
    if o.stuck > 0 {
        progress(
            o,
            format!(
                "[storm] {} stuck clients watching the 3 hottest courses",
                stuck.len()
            ),
        );
    }
    if !o.connect_during {
        std::thread::sleep(Duration::from_secs(2));
    }
    let w = publish_window(o, &server, &redis, &mut publisher, &mut f);
    let open = open_before.unwrap_or_else(|| wait_open(o, &mut f, o.clients, "storm"));
    // Settle: every course's last change renders within a tick; give it several.
    std::thread::sleep(Duration::from_millis((o.tick_ms * 5).max(1500)));
    let reports = f.report();
    let lat = merged_latency(&reports);
    let correct = correctness(&reports, &publisher, o.clients);
    let dropped = server.metric("seatboard_frames_dropped_total");
    let resyncs = server.metric("seatboard_resyncs_total");
    load_rows(&mut out, o, &publisher, &w, open);
    if o.stuck > 0 {
        stuck_row(&mut out, &server, stuck.len(), rss_before_stuck, w.rss_peak);
    }
    drop(stuck);
    delivery_rows(&mut out, o, &w, &lat, correct, (dropped, resyncs));
    seeding_rows(&mut out, &reports, (w.start_us, w.end_us));
    out.check(open as usize == o.clients, "not every client connected");
    out.check(
        correct.0 == correct.1,
        "final state differs from the last published state",
    );
    out.check(w.frames() > 0, "no frame delivered");
    let wire = wire_row(&mut out, &server, &w.m0, &w.m1, w.frames());
    machine_row(&mut out, w.k0, w.k1);
    let shard_per_frame = thread_rows(&mut out, &w);
    if !o.no_floor && w.frames() > 0 {
        // The floor in the same run: as many clients, each sent a frame of
        // the storm's wire size as often as the storm delivered one to it.
        let every = Duration::from_secs_f64(o.clients as f64 * w.dt / w.frames() as f64);
        floor::rows(
            &mut out,
            o,
            wire,
            every,
            shard_per_frame,
            "shard_ratio_to_floor",
            " (shard threads)",
        );
    }
    out
}

/// Publishes the storm (`--rate` snapshots/s for `--seconds`), printing
/// progress each second, and measures the window.
fn publish_window(
    o: &Opts,
    server: &Seatboard,
    redis: &RedisRig,
    publisher: &mut SelectionApi,
    f: &mut Fleet,
) -> Window {
    let m0 = f.mark();
    let u0 = procs::usage(server.child.id());
    let mut rss_peak = u0.rss_kib;
    let k0 = procs::machine_ticks();
    let r0 = usage_sum(&redis.pids());
    let lg0 = f.cpu_us();
    let th0 = procs::cpu_by_thread(server.child.id());
    let t0 = Instant::now();
    let start_us = loadgen::now_us();
    let (rate, secs) = (o.rate, o.seconds);
    let mut prev = (u0, counter(&m0, "frames"), Instant::now());
    publisher.storm(rate, secs, o.skew, 7, |sent| {
        let now = (procs::usage(server.child.id()), f.sum(|c| c.frames), Instant::now());
        rss_peak = rss_peak.max(now.0.rss_kib);
        let dt = now.2.duration_since(prev.2).as_secs_f64().max(1e-3);
        progress(
            o,
            format!(
                "[storm] {:.0}/{secs:.0}s published {sent}  server cpu {:.1}% of a core  frames/s {:.0}  open {}",
                t0.elapsed().as_secs_f64(),
                cpu_pct(prev.0, now.0, dt),
                (now.1.saturating_sub(prev.1)) as f64 / dt,
                f.sum(|c| c.open)
            ),
        );
        prev = now;
    });
    let dt = t0.elapsed().as_secs_f64();
    Window {
        dt,
        u0,
        u1: procs::usage(server.child.id()),
        rss_peak,
        k0,
        k1: procs::machine_ticks(),
        r0,
        r1: usage_sum(&redis.pids()),
        lg0,
        lg1: f.cpu_us(),
        th0,
        th1: procs::cpu_by_thread(server.child.id()),
        m0,
        m1: f.mark(),
        start_us,
        end_us: loadgen::now_us(),
    }
}

/// How the frame rate came up after the window's first frame (frames per
/// second over the steady rate, also per open viewer), and each course's first
/// full frame after its first watch (a course new to the node waits for
/// its subscription and its state read from Redis).
fn seeding_rows(out: &mut Outcome, reports: &[Value], (start_us, end_us): (u64, u64)) {
    let records: Vec<&Value> = reports.iter().map(|r| &r["seeding"]).collect();
    let mut secs = seeding::frames_by_second(&records);
    // Watch answers before the window (viewers connected first) are not its ramp.
    secs.retain(|e| e[0] >= start_us / 1_000_000);
    if let Some(r) = seeding::ramp(&secs, end_us / 1_000_000) {
        out.row(
            "min_second_frames_ratio",
            format!(
                "{:.2} of the steady {:.0} frames/s in the worst whole second after the window's first frame ({:.2} per open viewer); frames/s from the first frame: {:?}",
                r.min_ratio, r.steady, r.min_ratio_per_viewer, r.series
            ),
            json!({"min_ratio": r.min_ratio, "min_ratio_per_viewer": r.min_ratio_per_viewer, "steady_frames_per_s": r.steady, "frames_per_s": r.series}),
        );
    }
    let firsts = seeding::first_full_ms(&records);
    let mut ms: Vec<f64> = firsts.iter().flatten().copied().collect();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms.get(((ms.len() as f64 * p) as usize).min(ms.len().saturating_sub(1)));
    let (p50, p99, max) = (q(0.5), q(0.99), ms.last());
    out.row(
        "first_full_ms",
        format!(
            "p50 {:.1}  p99 {:.1}  max {:.1} over {} courses ({} without one)",
            p50.unwrap_or(&0.0),
            p99.unwrap_or(&0.0),
            max.unwrap_or(&0.0),
            ms.len(),
            firsts.len() - ms.len()
        ),
        json!({"p50": p50, "p99": p99, "max": max, "courses": ms.len(), "missing": firsts.len() - ms.len()}),
    );
}

/// The clients, what was published and the server's CPU.
fn load_rows(out: &mut Outcome, o: &Opts, publisher: &SelectionApi, w: &Window, open: u64) {
    let cpu = cpu_pct(w.u0, w.u1, w.dt);
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "published",
        format!(
            "{} snapshots in {:.1} s ({:.0}/s over {} courses, Zipf {})",
            publisher.published,
            w.dt,
            (publisher.published as f64 - (o.courses as u64 * o.sections as u64) as f64) / w.dt,
            o.courses,
            o.skew
        ),
        json!(publisher.published),
    );
    out.row(
        "server_cpu_pct_2cores",
        format!("{:.1}% of 2 cores ({cpu:.1}% of one)", cpu / 2.0),
        json!(cpu / 2.0),
    );
}

/// The stuck clients: how many, their 4001 closes and the server's RSS growth.
fn stuck_row(out: &mut Outcome, server: &Seatboard, opened: usize, rss_before: u64, rss_peak: u64) {
    let closes = server.metric("seatboard_slow_consumer_closes_total");
    out.row(
        "stuck_clients",
        format!(
            "{} opened; {closes} closed 4001; server RSS {rss_before} KiB before them, peak {rss_peak} KiB during the storm (+{} KiB, {:.0} B per stuck client)",
            opened,
            rss_peak.saturating_sub(rss_before),
            rss_peak.saturating_sub(rss_before) as f64 * 1024.0 / opened.max(1) as f64
        ),
        json!({"opened": opened, "closed_4001": closes, "rss_before_kib": rss_before, "rss_peak_kib": rss_peak}),
    );
}

/// What reached the clients: frames, sections, latency, the final boards,
/// the server's drops, and Redis' and the load generator's CPU.
fn delivery_rows(
    out: &mut Outcome,
    o: &Opts,
    w: &Window,
    lat: &Hist,
    (ok, total): (u64, u64),
    (dropped, resyncs): (f64, f64),
) {
    let (dt, frames) = (w.dt, w.frames());
    let pct = 100.0 * ok as f64 / total.max(1) as f64;
    out.row(
        "server_rss_kib",
        format!("{} KiB", w.u1.rss_kib),
        json!(w.u1.rss_kib),
    );
    out.row(
        "frames_delivered",
        format!("{frames} ({:.0}/s)", frames as f64 / dt),
        json!(frames),
    );
    let sections = counter(&w.m1, "sections") - counter(&w.m0, "sections");
    out.row("sections_delivered", sections.to_string(), json!(sections));
    out.row(
        "latency_samples",
        lat.total().to_string(),
        json!(lat.total()),
    );
    let (p50, p99, p999) = (lat.quantile(0.5), lat.quantile(0.99), lat.quantile(0.999));
    out.row("latency_ms", format!("p50 {:.1}  p99 {:.1}  p999 {:.1}  max {:.1} (tick {} ms)", p50 as f64 / 1e3, p99 as f64 / 1e3, p999 as f64 / 1e3, lat.max() as f64 / 1e3, o.tick_ms), json!({"p50": p50 as f64 / 1e3, "p99": p99 as f64 / 1e3, "p999": p999 as f64 / 1e3, "max": lat.max() as f64 / 1e3}));
    out.row(
        "final_state_correct",
        format!("{ok}/{total} clients ({pct:.2}%)"),
        json!(pct),
    );
    out.row(
        "server_frames_dropped_resyncs",
        format!("{dropped} dropped, {resyncs} resyncs (send queue full)"),
        json!({"dropped": dropped, "resyncs": resyncs}),
    );
    out.row(
        "closed_by_server",
        counter(&w.m1, "closed_by_server").to_string(),
        json!(counter(&w.m1, "closed_by_server")),
    );
    out.row(
        "redis_cpu_pct_core",
        format!("{:.1}%", cpu_pct(w.r0, w.r1, dt)),
        json!(cpu_pct(w.r0, w.r1, dt)),
    );
    out.row(
        "loadgen_cpu_pct_core",
        format!("{:.1}%", (w.lg1 - w.lg0) as f64 / dt / 1e4),
        json!((w.lg1 - w.lg0) as f64 / dt / 1e4),
    );
}

/// The server's CPU by thread in the window, and the shard threads' CPU per
/// delivered frame (returned, µs).
fn thread_rows(out: &mut Outcome, w: &Window) -> f64 {
    let thread_us = |name: &str| {
        w.th1
            .get(name)
            .unwrap_or(&0)
            .saturating_sub(*w.th0.get(name).unwrap_or(&0))
    };
    let by_thread: serde_json::Map<String, Value> = w
        .th1
        .keys()
        .map(|k| (k.clone(), json!(thread_us(k))))
        .collect();
    out.row(
        "server_cpu_by_thread_us",
        by_thread
            .iter()
            .map(|(k, v)| format!("{k} {:.2} s", v.as_u64().unwrap_or(0) as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Object(by_thread),
    );
    let shard_per_frame = thread_us("seatboard-shard") as f64 / w.frames().max(1) as f64;
    out.row(
        "shard_cpu_us_per_frame",
        format!("{shard_per_frame:.3} us (shard threads only)"),
        json!(shard_per_frame),
    );
    shard_per_frame
}
