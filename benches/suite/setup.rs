//! What a scenario starts before it measures: Redis, the server's flags, the
//! course names, the load-generator fleet, and the wait for its connections.

use crate::children::Fleet;
use crate::measure::progress;
use crate::redis_rig::RedisRig;
use crate::Opts;
use std::time::{Duration, Instant};

/// Server flags: the scenario's tick, driver and shards, a generous accept
/// bucket (ramp-up is not what is measured, except in `handshake`), and `extra`.
pub fn server_flags(o: &Opts, extra: &[&str]) -> Vec<String> {
    let mut f: Vec<String> = vec![
        "--tick-ms".into(),
        o.tick_ms.to_string(),
        "--accept-rate".into(),
        "10000000".into(),
        "--accept-burst".into(),
        "1000000".into(),
        "--max-connections".into(),
        "1000000".into(),
    ];
    if let Some(d) = &o.driver {
        f.extend(["--driver".into(), d.clone()]);
    }
    if let Some(s) = o.shards {
        f.extend(["--shards".into(), s.to_string()]);
    }
    f.extend(["--compression".into(), o.compression.clone()]);
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

/// The scenario's `n` course codes, `C0000` up.
pub fn course_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("C{i:04}")).collect()
}

/// Splits `clients` over load-generator processes (each well under the fd limit).
pub fn fleet(
    o: &Opts,
    port: u16,
    courses: &[String],
    skew: f64,
    churn: bool,
    max_secs: f64,
) -> Fleet {
    let procs = if o.procs > 0 {
        o.procs
    } else if churn {
        2
    } else {
        o.clients.div_ceil(9000).max(1)
    };
    let configs = (0..procs)
        .map(|i| loadgen::Config {
            port,
            child: i as u32,
            clients: o.clients / procs + usize::from(i < o.clients % procs),
            courses: courses.to_vec(),
            skew,
            connect_rate: o.connect_rate / procs as f64,
            inflight: o.inflight,
            churn,
            secret: crate::server::SECRET.into(),
            tokens_file: o.tokens_file.clone(),
            seed: 0x5eed + i as u64,
            max_secs: max_secs.ceil() as u64,
            sources: 8,
            watch: !o.no_watch,
            upgrade_courses: o.upgrade_courses,
            deflate: o.compression == "on",
            sse: o.transport == "sse",
            ..loadgen::Config::default()
        })
        .collect();
    Fleet::start(configs)
}

/// Waits until `target` connections are open (or no progress for 15 s).
pub fn wait_open(o: &Opts, f: &mut Fleet, target: usize, label: &str) -> u64 {
    let start = Instant::now();
    let mut last = (0u64, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let open = f.sum(|c| c.open);
        let failed = f.sum(|c| c.failed);
        let refused = f.sum(|c| c.refused);
        progress(
            o,
            format!(
                "[{label}] {:.1}s connecting: open={open}/{target} refused={refused} failed={failed}",
                start.elapsed().as_secs_f64()
            ),
        );
        if open as usize >= target {
            return open;
        }
        if open > last.0 {
            last = (open, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(15) {
            return open;
        }
    }
}

/// Redis for a scenario (three primaries under `--redis-mode cluster`),
/// `--redis-rtt-ms` away from the server (through delay proxies; the
/// publishers connect direct), and the server flags that go with it.
pub fn start_redis(o: &Opts) -> (RedisRig, &'static [&'static str]) {
    if o.cluster {
        (
            RedisRig::start_cluster(3, o.redis_rtt_ms),
            &["--redis-mode", "cluster"],
        )
    } else if o.redis_rtt_ms > 0.0 {
        (RedisRig::start().at_distance(o.redis_rtt_ms), &[])
    } else {
        (RedisRig::start(), &[])
    }
}
