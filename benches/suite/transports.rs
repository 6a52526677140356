//! `storm --transport both`, `fanout --transport both`: the scenario on
//! WebSocket and on Server-Sent Events in turn, and their CPU per frame.

use crate::measure::progress;
use crate::{fanout, storm, Opts, Outcome};
use serde_json::json;
use std::collections::BTreeMap;

/// The server's CPU per delivered frame of one storm or fanout run (µs).
fn cpu_us_per_frame(scenario: &str, r: &Outcome, o: &Opts) -> f64 {
    match scenario {
        "storm" => {
            let frames = r.json["frames_delivered"].as_f64().unwrap_or(0.0);
            let pct = r.json["server_cpu_pct_2cores"].as_f64().unwrap_or(0.0) * 2.0;
            pct / 100.0 * o.seconds * 1e6 / frames.max(1.0)
        }
        _ => r.json["server_cpu_us_per_frame"].as_f64().unwrap_or(0.0),
    }
}

/// Storm or fanout on WebSocket and on Server-Sent Events in one run (A B A
/// B): the server's CPU per delivered frame on each, and their ratio.
pub fn run(scenario: &str, o: &Opts) -> Outcome {
    let mut out = Outcome::new(&format!("{scenario}_transports"));
    let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut runs = Vec::new();
    for (i, t) in ["ws", "sse", "ws", "sse"].into_iter().enumerate() {
        let oo = Opts {
            transport: t.into(),
            no_floor: true,
            ..o.clone()
        };
        progress(
            o,
            format!("[{scenario}] run {} of 4: --transport {t}", i + 1),
        );
        let r = if scenario == "storm" {
            storm::run(&oo)
        } else {
            fanout::run(&oo)
        };
        let us = cpu_us_per_frame(scenario, &r, &oo);
        out.problems
            .extend(r.problems.iter().map(|p| format!("{t}: {p}")));
        by.entry(t).or_default().push(us);
        runs.push(json!({"transport": t, "run": i + 1, "cpu_us_per_frame": us, "result": r.json}));
    }
    let mean = |t: &str| {
        by.get(t)
            .map_or(0.0, |v| v.iter().sum::<f64>() / v.len() as f64)
    };
    for t in ["ws", "sse"] {
        out.row(
            &format!("{t}_cpu_us_per_frame"),
            format!(
                "{:?}  mean {:.3} us",
                by.get(t).cloned().unwrap_or_default(),
                mean(t)
            ),
            json!(mean(t)),
        );
    }
    let ratio = mean("sse") / mean("ws").max(1e-9);
    out.row("ratio_sse_over_ws", format!("{ratio:.3}x"), json!(ratio));
    out.check(
        ratio <= 1.1,
        "SSE costs more than 1.1x WebSocket's CPU per frame",
    );
    out.json["runs"] = json!(runs);
    out
}
