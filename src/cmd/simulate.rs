//! `seatboard simulate`: a synthetic selection window published into Redis at a
//! steady rate through the non-blocking `Publisher`, so a Redis blip drops
//! snapshots (counted) instead of stopping the run.

use super::simulator::SelectionWindow;
use crate::cli::SimulateArgs;
use crate::clock;
use crate::publisher::{Publisher, PublisherConfig};
use shards::snapshot::{valid_version, MAX_VERSION};
use shards::Snapshot;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often progress is printed on stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// How long the snapshots still queued when the window ends may take to
/// reach Redis: a rate beyond what Redis (or this process) takes ends on
/// time, and what is left is reported as not sent.
const FLUSH_AFTER: Duration = Duration::from_secs(1);

/// Versions are `<start unix ms> * 1000 + <per-section counter>`: increasing
/// within a run, and a later run starts above anything an earlier one reached
/// (unless a section got over 1000 updates per millisecond of the earlier run).
fn version_base() -> u64 {
    clock::unix_ms().saturating_mul(1000)
}

/// The window's snapshot with the run's version and the publish time.
fn restamp(s: &Snapshot, base: u64, ts: u64) -> Snapshot {
    let info = serde_json::from_str::<serde_json::Value>(&s.json)
        .ok()
        .and_then(|v| v.get("seat_info").map(|i| i.to_string()));
    Snapshot::build(
        s.course.clone(),
        s.section,
        s.total_seats,
        s.seats_taken,
        info.as_deref(),
        Some(base + s.version.unwrap_or(0)),
        Some(ts),
    )
}

/// A run whose versions would pass 2^53 (the hub rejects those): refused
/// before anything reaches Redis, naming the flag.
fn check_versions(args: &SimulateArgs, base: u64) -> Result<(), String> {
    let updates = (args.rate * args.duration).ceil();
    let last = base.saturating_add(updates as u64);
    if updates >= MAX_VERSION as f64 || !valid_version(last) {
        return Err(format!(
            "invalid value '{}' for '--duration': at --rate {} the run's versions would pass 2^53 ({MAX_VERSION}), the largest a hub accepts",
            args.duration, args.rate
        ));
    }
    Ok(())
}

/// Runs the window for `--duration` seconds and reports the achieved rate.
pub fn run(args: SimulateArgs) -> ExitCode {
    let base = version_base();
    if let Err(e) = check_versions(&args, base) {
        return crate::logging::usage(&e);
    }
    let t = &args.target;
    let publisher = match Publisher::start(PublisherConfig {
        redis: t.redis.clone(),
        channel_prefix: t.channel_prefix.clone(),
        state_prefix: t.state_prefix.clone(),
        queue: (args.rate as usize).clamp(1024, 1 << 20),
        state_ttl: None,
    }) {
        Ok(p) => p,
        Err(e) => {
            crate::logging::line(&format!("error: {e}"));
            return ExitCode::from(2);
        }
    };
    let names = SelectionWindow::synthetic_names(args.courses as usize);
    let mut window = SelectionWindow::new(&names, args.hot_skew, clock::unix_ms());
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let duration = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let mut next = start;
    let mut next_progress = start + PROGRESS_EVERY;
    let mut sent: u64 = 0;
    let end = start + duration;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if next > now {
            std::thread::sleep((next - now).min(end - now).min(Duration::from_millis(50)));
            continue;
        }
        // Catch up in a burst after a stall, but never more than a second's
        // worth, and never past the window's end (a rate this process cannot
        // generate would otherwise run on far past it).
        let mut burst = 0;
        while burst < args.rate.ceil() as u64 {
            let now = Instant::now();
            if next > now || now >= end {
                break;
            }
            let ts = clock::unix_ms();
            let s = restamp(&window.next(ts), base, ts);
            publisher.publish(s);
            sent += 1;
            burst += 1;
            next += interval;
        }
        if next + Duration::from_secs(1) < Instant::now() {
            next = Instant::now();
        }
        if Instant::now() >= next_progress {
            next_progress += PROGRESS_EVERY;
            let secs = start.elapsed().as_secs_f64();
            crate::logging::line(&format!(
                "simulate: {:.0} s, {} published, {} dropped, {:.1}/s",
                secs,
                publisher.published(),
                publisher.dropped(),
                publisher.published() as f64 / secs
            ));
        }
    }
    publisher.flush(FLUSH_AFTER);
    let secs = start.elapsed().as_secs_f64();
    let (published, dropped) = (publisher.published(), publisher.dropped());
    println!(
        "simulate: generated {sent}, published {published}, dropped {dropped}, not sent {} in {secs:.2} s: achieved {:.1} snapshots/s (asked {:.1})",
        sent.saturating_sub(published + dropped),
        published as f64 / secs,
        args.rate
    );
    ExitCode::SUCCESS
}
