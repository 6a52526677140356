//! `floor`: the least any sender can spend to fan a frame out on this box,
//! measured against the floor child (`floor_server.rs`); `storm`, `fanout`
//! and `compare` report the server's CPU per frame as a ratio to it.

use crate::floor_server;
use crate::measure::{counter, machine_row};
use crate::procs;
use crate::setup::{fleet, wait_open};
use crate::{Opts, Outcome};
use serde_json::json;
use std::time::{Duration, Instant};

/// The floor (see `floor_server.rs`): CPU per delivered frame of a plain `write(2)`
/// loop to `o.clients` loopback connections, one `o.frame_bytes` frame each per
/// `interval`.
pub fn run(o: &Opts, interval: Duration) -> Outcome {
    let mut out = Outcome::new("floor");
    let port = testkit::proc::free_port();
    let cfg = floor_server::Config {
        port,
        clients: o.clients,
        interval_ms: interval.as_millis() as u64,
        frame: floor_server::frame_of_size(o.frame_bytes),
        max_secs: o.seconds as u64 + 600,
    };
    let mut child = floor_server::spawn("__floor", &cfg);
    let pid = child.id();
    let courses = vec!["HOT".to_string()];
    let mut f = fleet(o, port, &courses, 0.0, false, o.seconds + 600.0);
    let open = wait_open(o, &mut f, o.clients, "floor");
    std::thread::sleep(Duration::from_secs(2));
    let (m0, u0, k0) = (f.mark(), procs::usage(pid), procs::machine_ticks());
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < o.seconds {
        std::thread::sleep(Duration::from_millis(250));
    }
    let dt = t0.elapsed().as_secs_f64();
    let (m1, u1, k1) = (f.mark(), procs::usage(pid), procs::machine_ticks());
    drop(f.report());
    let _ = child.kill();
    let _ = child.wait();
    let frames = counter(&m1, "frames") - counter(&m0, "frames");
    let cpu_us = u1.cpu_us.saturating_sub(u0.cpu_us);
    let per_frame = cpu_us as f64 / frames.max(1) as f64;
    out.row(
        "clients",
        format!("{open} open of {}", o.clients),
        json!(open),
    );
    out.row(
        "frame_bytes",
        format!(
            "{} B on the wire, one per {} ms",
            cfg.frame.len(),
            cfg.interval_ms
        ),
        json!(cfg.frame.len()),
    );
    out.row(
        "frames_delivered",
        format!("{frames} in {dt:.1} s ({:.0}/s)", frames as f64 / dt),
        json!(frames),
    );
    out.row(
        "server_cpu_us_per_frame",
        format!("{per_frame:.3} us (the sender's CPU)"),
        json!(per_frame),
    );
    out.check(open as usize == o.clients, "not every client connected");
    out.check(frames > 0, "no frame delivered");
    machine_row(&mut out, k0, k1);
    out
}

/// Runs the floor (same clients as `o`, one `wire`-byte frame to each every
/// `every`) and adds its CPU per frame and the ratio of `ours` to it, as row
/// `ratio_key`.
pub fn rows(
    out: &mut Outcome,
    o: &Opts,
    wire: f64,
    every: Duration,
    ours: f64,
    ratio_key: &str,
    whose: &str,
) {
    let fl = run(
        &Opts {
            frame_bytes: wire.round() as usize,
            ..o.clone()
        },
        every,
    );
    let floor_us = fl.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0);
    out.row(
        "floor_cpu_us_per_frame",
        format!(
            "{floor_us:.3} us (plain write(2) of a {wire:.0} B frame every {} ms to each client; machine {:.1}% idle)",
            every.as_millis(),
            fl.json["machine_idle_pct"].as_f64().unwrap_or(0.0)
        ),
        json!(floor_us),
    );
    let ratio = ours / floor_us.max(1e-9);
    out.row(
        ratio_key,
        format!("{ratio:.2}x the floor's CPU per frame{whose}"),
        json!(ratio),
    );
    out.problems
        .extend(fl.problems.iter().map(|p| format!("floor: {p}")));
    out.json["floor"] = fl.json;
}
