//! `cargo run -p sim --release -- --seeds N [--start S]`: runs N seeds and
//! reports seeds and steps per second; a failure prints its seed, the
//! invariant, the shrunk schedule and the command that replays it.
//! `--seed S [--keep i,j,…] [--trace]`: one seed (only the kept steps of its
//! schedule), every event printed with `--trace`.
//! `--no-shrink`: a failure is printed as found (a quick count of failures).
//! `--plant BUG` (feature `planted-bugs`): runs with one planted bug
//! (`read-backwards`, `read-before-confirmed`, `no-reread`,
//! `refresh-without-ttl`, `firehose-keeps-narrow`, `admin-counts-duplicates`,
//! `read-ignores-replace`).

use sim::schedule::Step;
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    seeds: u64,
    start: u64,
    seed: Option<u64>,
    keep: Option<Vec<usize>>,
    trace: bool,
    plant: Option<String>,
    shrink: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1_000,
        start: 0,
        seed: None,
        keep: None,
        trace: false,
        plant: None,
        shrink: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seeds" => a.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?,
            "--start" => a.start = value()?.parse().map_err(|e| format!("--start: {e}"))?,
            "--seed" => a.seed = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--keep" => {
                let v = value()?;
                let keep: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                a.keep = Some(keep.map_err(|e| format!("--keep: {e}"))?);
            }
            "--trace" => a.trace = true,
            "--plant" => a.plant = Some(value()?),
            "--no-shrink" => a.shrink = false,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(bug) = &args.plant {
        if let Err(e) = plant(bug) {
            eprintln!("sim: --plant: {e}");
            return ExitCode::from(2);
        }
    }
    // A panic in the product is reported as a failure, not printed raw.
    std::panic::set_hook(Box::new(|_| {}));
    if let Some(seed) = args.seed {
        let (shape, steps) = sim::schedule(seed);
        let kept: Vec<Step> = match &args.keep {
            Some(k) => k.iter().filter_map(|&i| steps.get(i).cloned()).collect(),
            None => steps,
        };
        if args.trace {
            for (i, s) in kept.iter().enumerate() {
                println!("step {i:>3}: {s}");
            }
        }
        let out = sim::run(seed, shape, kept, args.trace);
        return match out.failure {
            None => {
                println!("seed {seed}: ok ({} events)", out.events);
                ExitCode::SUCCESS
            }
            Some(f) => {
                println!("seed {seed}: FAILED {f}");
                ExitCode::FAILURE
            }
        };
    }
    let started = Instant::now();
    let mut events = 0u64;
    let mut failed = 0u64;
    for seed in args.start..args.start + args.seeds {
        let out = sim::run_seed(seed, false);
        events += out.events;
        if let Some(f) = out.failure {
            failed += 1;
            if args.shrink {
                report(seed, &f);
            } else {
                println!("seed {seed}: FAILED {f}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} seeds, {failed} failed, {:.1} s: {:.0} seeds/s, {:.0} steps/s",
        args.seeds,
        secs,
        args.seeds as f64 / secs,
        events as f64 / secs
    );
    println!(
        "{{\"seeds\":{},\"failed\":{failed},\"seconds\":{secs:.3},\"seeds_per_s\":{:.1},\"steps_per_s\":{:.0}}}",
        args.seeds,
        args.seeds as f64 / secs,
        events as f64 / secs
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Plants the named bug in this thread's product code.
#[cfg(feature = "planted-bugs")]
fn plant(name: &str) -> Result<(), String> {
    use seatboard::planted::Bug;
    let bug = match name {
        "read-backwards" => Bug::ReadBackwards,
        "read-before-confirmed" => Bug::ReadBeforeConfirmed,
        "no-reread" => Bug::NoRereadAfterReconnect,
        "refresh-without-ttl" => Bug::RefreshWithoutTtl,
        "firehose-keeps-narrow" => Bug::FirehoseKeepsNarrow,
        "admin-counts-duplicates" => Bug::AdminCountsDuplicates,
        "read-ignores-replace" => Bug::ReadIgnoresReplace,
        other => return Err(format!("no planted bug {other}")),
    };
    seatboard::planted::plant(Some(bug));
    Ok(())
}

/// Without the feature there is nothing to plant.
#[cfg(not(feature = "planted-bugs"))]
fn plant(_name: &str) -> Result<(), String> {
    Err("built without the planted-bugs feature".into())
}

fn report(seed: u64, f: &sim::Failure) {
    println!("seed {seed}: FAILED {f}");
    let (shape, steps) = sim::schedule(seed);
    let (keep, last) = sim::shrink::shrink(seed, shape, &steps, f, 400);
    println!(
        "  shrunk to {} of {} steps: {last}",
        keep.len(),
        steps.len()
    );
    for &i in &keep {
        println!("    {}", steps[i]);
    }
    let list: Vec<String> = keep.iter().map(usize::to_string).collect();
    println!(
        "  replay: cargo run -p sim --release -- --seed {seed} --keep {} --trace",
        list.join(",")
    );
}
