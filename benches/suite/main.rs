//! seatboard's benchmark suite (`cargo bench --bench suite -- <scenario> [flags]`).
//!
//! Scenarios: `idle`, `first_board`, `connect_cost`, `storm`, `fanout`, `floor`, `ingest`, `publish_cost`, `handshake`, `compare`,
//! `fleet`, `reconnect`, `relay`, `reconcile`.
//! Each prints a table and writes `target/bench/<scenario>.json`. Run without
//! `--bench` in its arguments (as `cargo test --all-targets` does) it runs a
//! short smoke of every scenario and exits non-zero if one fails.
//!
//! The runner starts `redis-server` and `seatboard serve` (the release build
//! under `cargo bench`), and load-generator processes (this binary re-executed
//! as `__loadgen`, see the `loadgen` crate); it samples the server's CPU time and RSS
//! from /proc. All traffic goes to 127.0.0.0/8 and every run is bounded in
//! connections and time.

mod children;
mod compare;
mod connect_cost;
mod fanout;
mod first_board;
mod fleet;
mod floor;
mod floor_server;
mod handshake;
mod idle;
mod ingest;
mod measure;
mod node;
mod opts;
mod outcome;
mod procs;
mod publish_cost;
mod reconcile;
mod reconnect;
mod redis_rig;
mod relay;
mod server;
mod setup;
mod smoke;
mod soak;
mod storm;
mod storm_pub;
mod stuck;
mod transports;

use opts::{Opts, USAGE};
use outcome::Outcome;
use testkit::{cluster_util, jwt_util, lb, publish};

/// Runs `scenario` with `o`.
fn run(scenario: &str, o: &Opts) -> Result<Outcome, String> {
    Ok(match scenario {
        "idle" => idle::run(o),
        "first_board" => first_board::run(o),
        "connect_cost" => connect_cost::run(o),
        "storm" | "fanout" if o.transport == "both" => transports::run(scenario, o),
        "storm" => storm::run(o),
        "fanout" => fanout::run(o),
        "floor" => floor::run(o, fanout::interval(o)),
        "ingest" => ingest::run(o.snapshots, o.courses, o.sections, o.skew),
        "publish_cost" => publish_cost::run(o),
        "handshake" => handshake::run(o),
        "compare" => compare::run(o),
        "fleet" => fleet::run(o, o.haproxy_procs),
        "soak" => soak::run(o),
        "reconnect" => reconnect::run(o),
        "relay" => relay::run(o),
        "reconcile" => reconcile::run(o),
        other => return Err(format!("unknown scenario {other}")),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("__floor") {
        let cfg: floor_server::Config =
            serde_json::from_str(args.get(1).expect("config")).expect("floor config");
        floor_server::run(cfg);
        return;
    }
    if args.first().map(String::as_str) == Some("__connect_floor") {
        let cfg: floor_server::ConnectConfig =
            serde_json::from_str(args.get(1).expect("config")).expect("connect floor config");
        floor_server::run_connect(cfg);
        return;
    }
    if args.first().map(String::as_str) == Some(children::SUBCOMMAND) {
        if let Err(e) = loadgen::child_main() {
            eprintln!("error: {}: bad config: {e}", children::SUBCOMMAND);
            std::process::exit(2);
        }
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        std::process::exit(smoke::run());
    }
    let args: Vec<String> = args.into_iter().filter(|a| a != "--bench").collect();
    if args.is_empty() {
        println!("{USAGE}");
        return;
    }
    let (scenario, opts) = match opts::parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    match run(&scenario, &opts) {
        Ok(out) => {
            out.print();
            out.save();
            if !out.problems.is_empty() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
