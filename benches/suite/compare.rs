//! `compare`: the server's drivers (io_uring, epoll, and tokio when built
//! with `--features tokio-shell`) on the same `--inner` scenario, A B A B,
//! as frames per server CPU-second and their ratios; after a fanout, each
//! against the floor.

use crate::measure::progress;
use crate::{fanout, floor, storm, Opts, Outcome};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Each driver's frames per server CPU-second, one entry per run.
type ByDriver = BTreeMap<&'static str, Vec<f64>>;

/// Runs `compare`.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("compare");
    // Built with `--features tokio-shell`, the server also has `--driver tokio`:
    // a third column, A B C A B C.
    let drivers: &[&'static str] = if cfg!(feature = "tokio-shell") {
        &["uring", "epoll", "tokio"]
    } else {
        &["uring", "epoll"]
    };
    let (by, runs) = run_drivers(&mut out, o, drivers);
    driver_rows(&mut out, o, drivers, &by);
    if o.inner != "storm" {
        // CPU per frame against the floor, measured in the same run with the
        // first run's frame size.
        let wire = runs
            .first()
            .and_then(|r| r["result"]["wire_bytes_per_frame"]["per_frame"].as_f64())
            .unwrap_or(o.frame_bytes as f64);
        let means: Vec<f64> = drivers.iter().map(|d| mean(&by, d)).collect();
        floor_rows(&mut out, o, drivers, &means, wire);
    }
    out.json["runs"] = json!(runs);
    out
}

/// The `--inner` scenario once per driver, twice over (A B A B); each run's
/// frames per server CPU-second by driver, and each run's JSON.
fn run_drivers(out: &mut Outcome, o: &Opts, drivers: &[&'static str]) -> (ByDriver, Vec<Value>) {
    let metric = "frames_per_cpu_s";
    let mut by = ByDriver::new();
    let mut runs = Vec::new();
    let order: Vec<&'static str> = drivers.iter().chain(drivers).copied().collect();
    for (i, &driver) in order.iter().enumerate() {
        let mut oo = o.clone();
        oo.driver = Some(driver.into());
        oo.no_floor = true;
        progress(
            o,
            format!(
                "[compare] run {} of {}: {} with --driver {driver}",
                i + 1,
                order.len(),
                o.inner
            ),
        );
        let r = match o.inner.as_str() {
            "storm" => storm::run(&oo),
            _ => fanout::run(&oo),
        };
        let v = match o.inner.as_str() {
            "storm" => {
                // Frames delivered per server CPU-second.
                let frames = r.json["frames_delivered"].as_f64().unwrap_or(0.0);
                let pct = r.json["server_cpu_pct_2cores"].as_f64().unwrap_or(0.0) * 2.0;
                frames / (pct / 100.0 * o.seconds).max(1e-9)
            }
            _ => r.json[metric].as_f64().unwrap_or(0.0),
        };
        out.problems
            .extend(r.problems.iter().map(|p| format!("{driver}: {p}")));
        by.entry(driver).or_default().push(v);
        runs.push(json!({"driver": driver, "run": i + 1, "frames_per_cpu_s": v, "result": r.json}));
    }
    (by, runs)
}

/// A driver's mean over its runs (0 when it has none).
fn mean(by: &ByDriver, driver: &str) -> f64 {
    by.get(driver)
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        .unwrap_or(0.0)
}

/// What ran, each driver's runs and mean, and the drivers' ratios.
fn driver_rows(out: &mut Outcome, o: &Opts, drivers: &[&str], by: &ByDriver) {
    let mean = |d: &str| mean(by, d);
    let (u, e) = (mean("uring"), mean("epoll"));
    out.row(
        "inner",
        format!(
            "{} with {} clients, {:.0} s per run, {}",
            o.inner,
            o.clients,
            o.seconds,
            if drivers.len() == 3 {
                "A B C A B C"
            } else {
                "A B A B"
            }
        ),
        json!(o.inner),
    );
    for &d in drivers {
        let m = mean(d);
        out.row(
            &format!("{d}_frames_per_cpu_s"),
            format!(
                "{:?}  mean {m:.0}",
                by.get(d)
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|x| x.round())
                    .collect::<Vec<_>>()
            ),
            json!(m),
        );
    }
    out.row(
        "ratio_uring_over_epoll",
        format!("{:.2}x", u / e.max(1e-9)),
        json!(u / e.max(1e-9)),
    );
    if drivers.contains(&"tokio") {
        let t = mean("tokio").max(1e-9);
        out.row(
            "ratio_uring_over_tokio",
            format!("{:.2}x", u / t),
            json!(u / t),
        );
        out.row(
            "ratio_epoll_over_tokio",
            format!("{:.2}x", e / t),
            json!(e / t),
        );
    }
}

/// The floor with frames of `wire` bytes at the fanout's interval, and each
/// driver's CPU per frame (from its mean, `means` in the order of `drivers`)
/// against it.
fn floor_rows(out: &mut Outcome, o: &Opts, drivers: &[&str], means: &[f64], wire: f64) {
    progress(o, "[compare] the floor".into());
    let fl = floor::run(
        &Opts {
            frame_bytes: wire.round() as usize,
            ..o.clone()
        },
        fanout::interval(o),
    );
    let floor_us = fl.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0);
    out.row(
        "floor_cpu_us_per_frame",
        format!("{floor_us:.3} us"),
        json!(floor_us),
    );
    for (&d, &m) in drivers.iter().zip(means) {
        let us = 1e6 / m.max(1e-9);
        out.row(
            &format!("{d}_over_floor"),
            format!(
                "{us:.3} us per frame = {:.2}x the floor",
                us / floor_us.max(1e-9)
            ),
            json!(us / floor_us.max(1e-9)),
        );
    }
    out.problems
        .extend(fl.problems.iter().map(|p| format!("floor: {p}")));
    out.json["floor"] = fl.json;
}
