//! `publish_cost`: what the state hash's compare-and-set costs the publisher
//! and Redis. The same batches of snapshots (`--snapshots`, 64 to a round
//! trip, 200 courses x 8 sections, versions rising) are written by
//! `seatboard::publisher::write` (script by `EVALSHA`, then `PUBLISH`) and by
//! plain `HSET`s, then `PUBLISH`es, alternating in rounds on one
//! redis-server, and reported as snapshots/s and Redis CPU per snapshot, each
//! as the script's ratio to plain `HSET`.

use super::{Opts, Outcome};
use crate::procs;
use crate::redis_rig::RedisRig;
use seatboard::publisher;
use seatboard::redis::commands::Commands;
use seatboard::redis::{PubSubMode, Redis as SbRedis, RedisFlags, RedisMode};
use serde_json::json;
use shards::Snapshot;
use std::time::Instant;

/// Snapshots per round trip (the `Publisher`'s batch).
const BATCH: usize = 64;
/// Rounds each way, alternated so drift on a shared box hits both alike.
const ROUNDS: usize = 6;

/// Elapsed µs and Redis CPU µs of one way over all rounds.
#[derive(Default, Clone, Copy)]
struct Cost {
    wall_us: u64,
    redis_cpu_us: u64,
    snapshots: u64,
}

fn snapshots(n: usize, base_version: u64) -> Vec<Snapshot> {
    (0..n)
        .map(|i| {
            let course: std::sync::Arc<str> = format!("PUB{}", i % 200).into();
            let section = ((i / 200) % 8) as u32;
            let v = base_version + i as u64;
            Snapshot::build(
                course,
                section,
                40,
                (v % 40) as u32,
                Some(r#"{"room":"B12"}"#),
                Some(v),
                Some(v),
            )
        })
        .collect()
}

/// The same batch written the way the script's is, hashes first and then
/// the publishes (two round trips), but each hash by a plain `HSET`.
fn plain(link: &mut Commands, batch: &[Snapshot]) -> Result<(), String> {
    let mut sets = Vec::with_capacity(batch.len());
    let mut pubs = Vec::with_capacity(batch.len());
    for s in batch {
        let payload = s.to_payload();
        let mut set = ::redis::cmd("HSET");
        set.arg(format!("seatstate:{}", s.course))
            .arg(s.section)
            .arg(&payload);
        let mut publish = ::redis::cmd("PUBLISH");
        publish.arg(format!("seats:{}", s.course)).arg(payload);
        sets.push(set);
        pubs.push(publish);
    }
    link.pipeline::<()>(&sets)?;
    Ok(link.pipeline::<()>(&pubs)?)
}

/// Writes `all` one way in batches, adding what it took to `cost`.
fn one_way(
    link: &mut Commands,
    all: &[Snapshot],
    script: bool,
    pid: u32,
    cost: &mut Cost,
) -> Result<(), String> {
    let cpu0 = procs::usage(pid).cpu_us;
    let t = Instant::now();
    for batch in all.chunks(BATCH) {
        if script {
            publisher::write(link, "seats:", "seatstate:", batch)?;
        } else {
            plain(link, batch)?;
        }
    }
    cost.wall_us += t.elapsed().as_micros() as u64;
    cost.redis_cpu_us += procs::usage(pid).cpu_us.saturating_sub(cpu0);
    cost.snapshots += all.len() as u64;
    Ok(())
}

/// Runs the scenario.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("publish_cost");
    let redis = RedisRig::start();
    let pid = redis.pids()[0];
    let flags = RedisFlags {
        redis: redis.uri(),
        redis_mode: RedisMode::Standalone,
        pubsub: PubSubMode::Sharded,
        redis_ca: None,
    };
    let sb = match SbRedis::from_flags(&flags) {
        Ok(r) => r,
        Err(e) => {
            out.check(false, &format!("redis flags: {e}"));
            return out;
        }
    };
    let mut link = Commands::new(&sb, "bench");
    let per_round = (o.snapshots / ROUNDS).max(BATCH);
    let (mut with, mut without) = (Cost::default(), Cost::default());
    for round in 0..ROUNDS {
        // Rising versions: every script call writes, as in a real window.
        let all = snapshots(per_round, 1 + (round * per_round) as u64);
        let first_script = round % 2 == 0;
        for script in [first_script, !first_script] {
            let cost = if script { &mut with } else { &mut without };
            if let Err(e) = one_way(&mut link, &all, script, pid, cost) {
                out.check(false, &format!("write failed: {e}"));
                return out;
            }
        }
    }
    let rate = |c: &Cost| c.snapshots as f64 / (c.wall_us.max(1) as f64 / 1e6);
    let cpu = |c: &Cost| c.redis_cpu_us as f64 / c.snapshots.max(1) as f64;
    let wall_ratio = rate(&without) / rate(&with);
    out.row(
        "publish_snapshots_per_s",
        format!(
            "script {:.0}/s, plain HSET {:.0}/s: the script costs {wall_ratio:.2}x the time",
            rate(&with),
            rate(&without)
        ),
        json!({"script": rate(&with), "hset": rate(&without), "cost_ratio": wall_ratio}),
    );
    let cpu_ratio = cpu(&with) / cpu(&without).max(1e-9);
    out.row(
        "publish_redis_cpu_us_per_snapshot",
        format!(
            "script {:.2} µs, plain HSET {:.2} µs of Redis CPU: {cpu_ratio:.2}x",
            cpu(&with),
            cpu(&without)
        ),
        json!({"script": cpu(&with), "hset": cpu(&without), "ratio": cpu_ratio}),
    );
    let versions = link.query::<String>(::redis::cmd("HGET").arg("seatstate:PUB0").arg(0));
    out.check(versions.is_ok(), "the state hash was written");
    out
}
