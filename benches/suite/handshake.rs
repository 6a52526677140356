//! `handshake`: authenticated upgrades per second and server CPU per upgrade
//! (a reconnect storm: connect, 101, reset, again), per token algorithm.
//! `--alg hs256|rs256|es256|eddsa|all` (default all): each algorithm gets a
//! fresh server (`--jwt-public-key` for the public-key ones) and the same load,
//! one after the other in one run, reported side by side as ratios to HS256.
//! Tokens are minted before the load starts (signing is the identity
//! provider's cost, not the server's), up to 1,000 users per algorithm.

use super::jwt_util::{Key, Kind};
use super::measure::{counter, cpu_pct, machine_row, watch};
use super::setup::{course_names, fleet, server_flags};
use super::{Opts, Outcome};
use crate::procs;
use crate::redis_rig::RedisRig;
use crate::server::serve;
use serde_json::{json, Value};
use std::time::Instant;

/// Algorithms `--alg all` runs, HS256 first (the ratios' base).
pub const ALGS: [&str; 4] = ["hs256", "rs256", "es256", "eddsa"];

/// Most distinct users (tokens) per algorithm; fewer with a smaller `--clients`.
const USERS: usize = 1000;

/// What one algorithm's run measured.
struct Run {
    alg: &'static str,
    upgrades: u64,
    per_s: f64,
    cpu_us_per: f64,
    cpu_pct: f64,
    refused: u64,
    failed: u64,
    statuses: std::collections::BTreeMap<u64, u64>,
}

/// The algorithms `--alg` names.
pub fn algs(o: &Opts) -> Result<Vec<&'static str>, String> {
    match o.alg.as_deref() {
        None | Some("all") => Ok(ALGS.to_vec()),
        Some(a) => ALGS
            .iter()
            .find(|x| **x == a)
            .map(|x| vec![*x])
            .ok_or_else(|| format!("unknown --alg {a} (hs256, rs256, es256, eddsa, all)")),
    }
}

/// Writes `users` tokens of `alg` to a file; returns it and the server flags that verify them.
fn tokens(alg: &str, users: usize, dir: &std::path::Path) -> (String, Vec<String>) {
    let exp = super::jwt_util::now() + 3600;
    let (lines, flags): (Vec<String>, Vec<String>) = match alg {
        "hs256" => (
            (0..users)
                .map(|i| {
                    let user = format!("hs-{i}");
                    seatboard::auth::mint(
                        crate::server::SECRET.as_bytes(),
                        &user,
                        shards::Role::Student,
                        exp,
                    )
                })
                .collect(),
            Vec::new(),
        ),
        _ => {
            let (kind, jose) = match alg {
                "rs256" => (Kind::Rsa(2048), "RS256"),
                "es256" => (Kind::P256, "ES256"),
                _ => (Kind::Ed25519, "EdDSA"),
            };
            let key = Key::new(dir, kind, alg);
            let lines = (0..users)
                .map(|i| key.token(jose, &format!("{alg}-{i}"), json!({})))
                .collect();
            let pem = key.public_pem.to_string_lossy().into_owned();
            (lines, vec!["--jwt-public-key".into(), pem])
        }
    };
    let path = dir.join(format!("{alg}.tokens"));
    std::fs::write(&path, lines.join("\n")).expect("tokens file");
    (path.to_string_lossy().into_owned(), flags)
}

fn measure(o: &Opts, redis: &RedisRig, alg: &'static str, dir: &std::path::Path) -> Run {
    let (file, extra) = tokens(alg, o.clients.clamp(50, USERS), dir);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = serve(redis, &server_flags(o, &extra));
    let courses = course_names(1);
    let mut oo = o.clone();
    oo.connect_rate = 1e12;
    oo.tokens_file = Some(file);
    let mut f = fleet(&oo, server.port, &courses, 0.0, true, o.seconds + 60.0);
    let u0 = procs::usage(server.child.id());
    let m0 = f.mark();
    let t0 = Instant::now();
    watch(
        o,
        &format!("handshake {alg}"),
        "upgrades",
        o.seconds,
        &server,
        &mut f,
    );
    let dt = t0.elapsed().as_secs_f64();
    let u1 = procs::usage(server.child.id());
    let m1 = f.mark();
    let reports = f.report();
    let upgrades = counter(&m1, "upgrades") - counter(&m0, "upgrades");
    let mut statuses: std::collections::BTreeMap<u64, u64> = Default::default();
    for r in &reports {
        for s in r["refusals"].as_array().into_iter().flatten() {
            *statuses.entry(s[0].as_u64().unwrap_or(0)).or_default() += s[1].as_u64().unwrap_or(0);
        }
    }
    Run {
        alg,
        upgrades,
        per_s: upgrades as f64 / dt,
        cpu_us_per: u1.cpu_us.saturating_sub(u0.cpu_us) as f64 / upgrades.max(1) as f64,
        cpu_pct: cpu_pct(u0, u1, dt),
        refused: counter(&m1, "refused") - counter(&m0, "refused"),
        failed: counter(&m1, "failed") - counter(&m0, "failed"),
        statuses,
    }
}

/// Runs the scenario.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("handshake");
    let algs = match algs(o) {
        Ok(a) => a,
        Err(e) => {
            out.check(false, &e);
            return out;
        }
    };
    let dir = std::env::temp_dir().join(format!("seatboard-bench-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("key dir");
    let redis = RedisRig::start();
    let k0 = procs::machine_ticks();
    let runs: Vec<Run> = algs.iter().map(|a| measure(o, &redis, a, &dir)).collect();
    let k1 = procs::machine_ticks();
    let _ = std::fs::remove_dir_all(&dir);
    let base = runs.iter().find(|r| r.alg == "hs256");
    let mut all = Vec::new();
    for r in &runs {
        let ratio = |v: f64, b: f64| if b > 0.0 { v / b } else { 0.0 };
        let (rate_x, cpu_x) = base.map_or((1.0, 1.0), |b| {
            (ratio(r.per_s, b.per_s), ratio(r.cpu_us_per, b.cpu_us_per))
        });
        out.row(
            &format!("{}_upgrades_per_s", r.alg),
            format!(
                "{:.0}/s ({} in {:.0} s; x{rate_x:.2} of HS256), server {:.1} us CPU per upgrade (x{cpu_x:.2}), {:.0}% of a core; refused {} {:?}, failed {}",
                r.per_s, r.upgrades, o.seconds, r.cpu_us_per, r.cpu_pct, r.refused, r.statuses, r.failed
            ),
            json!(r.per_s),
        );
        all.push(json!({
            "alg": r.alg, "upgrades": r.upgrades, "per_s": r.per_s, "cpu_us_per_upgrade": r.cpu_us_per,
            "server_cpu_pct_core": r.cpu_pct, "per_s_vs_hs256": rate_x, "cpu_vs_hs256": cpu_x,
            "refused": r.refused, "statuses": r.statuses, "failed": r.failed,
        }));
        out.check(r.upgrades > 0, &format!("no {} upgrade succeeded", r.alg));
        out.check(
            !r.statuses.contains_key(&401),
            &format!("{} tokens refused with 401", r.alg),
        );
    }
    out.json["algs"] = Value::Array(all);
    machine_row(&mut out, k0, k1);
    out
}
