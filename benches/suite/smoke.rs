//! The short run of every scenario that `cargo test --all-targets` executes
//! (the suite run without `--bench` in its arguments).

use crate::Opts;
use std::time::Instant;

/// Runs every scenario of the plan; the exit status (1 if one failed).
pub fn run() -> i32 {
    let t0 = Instant::now();
    let (mut passed, mut failed) = (0, 0);
    for (name, o) in plan() {
        if one(name, &o) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("bench smoke took {:.1} s", t0.elapsed().as_secs_f64());
    println!("smoke: {passed} passed, {failed} failed");
    i32::from(failed > 0)
}

/// Each scenario of the smoke with its short options.
fn plan() -> Vec<(&'static str, Opts)> {
    let base = Opts {
        clients: 200,
        seconds: 2.0,
        rate: 2000.0,
        courses: 40,
        tick_ms: 100,
        procs: 1,
        snapshots: 20_000,
        ..Opts::default()
    };
    vec![
        ("ingest", base.clone()),
        (
            "publish_cost",
            Opts {
                snapshots: 2_000,
                ..base.clone()
            },
        ),
        ("idle", base.clone()),
        (
            "idle",
            Opts {
                upgrade_courses: true,
                no_floor: true,
                ..base.clone()
            },
        ),
        (
            "connect_cost",
            Opts {
                clients: 100,
                ..base.clone()
            },
        ),
        (
            "first_board",
            Opts {
                clients: 100,
                ..base.clone()
            },
        ),
        (
            "storm",
            Opts {
                clients: 300,
                procs: 2,
                ..base.clone()
            },
        ),
        (
            "storm",
            Opts {
                clients: 200,
                cluster: true,
                ..base.clone()
            },
        ),
        (
            "storm",
            Opts {
                clients: 200,
                redis_rtt_ms: 4.0,
                connect_during: true,
                ..base.clone()
            },
        ),
        ("fanout", base.clone()),
        (
            "floor",
            Opts {
                clients: 100,
                seconds: 1.0,
                ..base.clone()
            },
        ),
        ("handshake", base.clone()),
        ("reconnect", base.clone()),
        (
            "relay",
            Opts {
                seconds: 1.0,
                ..base.clone()
            },
        ),
        (
            "reconcile",
            Opts {
                courses: 50,
                sections: 8,
                rate: 500.0,
                seconds: 1.0,
                ..base.clone()
            },
        ),
        (
            "compare",
            Opts {
                clients: 100,
                seconds: 1.0,
                ..base.clone()
            },
        ),
        (
            "fleet",
            Opts {
                clients: 300,
                event: Some("kill".into()),
                before_s: 2.0,
                after_s: 1.0,
                max_wait_s: 20.0,
                min_during_s: 1.0,
                haproxy_procs: 1,
                ..base.clone()
            },
        ),
        (
            "soak",
            Opts {
                minutes: 1.0,
                ..base.clone()
            },
        ),
    ]
}

/// Runs scenario `name` with `o`, printing its table and whether it passed.
fn one(name: &str, o: &Opts) -> bool {
    let t = Instant::now();
    match std::panic::catch_unwind(|| crate::run(name, o)) {
        Ok(Ok(out)) => {
            out.print();
            if out.problems.is_empty() {
                println!("smoke {name}: ok ({:.1} s)", t.elapsed().as_secs_f64());
                true
            } else {
                println!("smoke {name}: FAILED: {:?}", out.problems);
                false
            }
        }
        Ok(Err(e)) => {
            println!("smoke {name}: FAILED: {e}");
            false
        }
        Err(_) => {
            println!("smoke {name}: FAILED (panicked)");
            false
        }
    }
}
