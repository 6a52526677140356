//! Redis unreachable for the whole run (a listener that accepts every
//! connection and resets it at once): `serve` keeps reconnecting, each of
//! its Redis connections on its own jittered backoff (none on a shared
//! one-second tick, so no two dial in the same millisecond attempt after
//! attempt), and the outage is logged once, not once per attempt.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::resetting::ResettingListener;

/// `serve` against `redis` (unreachable), its stderr in `log`; answering.
fn serve_against(redis: &ResettingListener, log: &Path) -> Seatboard {
    let uri = format!("redis://127.0.0.1:{}", redis.port());
    let args = [
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--log-level",
        "warn",
    ];
    let mut sb = Seatboard::spawn_on(free_port(), &args, &[], Some(log));
    assert!(
        sb.wait_answer("/healthz", Duration::from_secs(15), |r| r.status == 200),
        "seatboard did not answer /healthz"
    );
    sb
}

fn log_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("seatboard-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The listener's accept times from `from` to `to` after its first one,
/// once that much of the outage has passed.
fn attempts_between(redis: &ResettingListener, from: Duration, to: Duration) -> Vec<Duration> {
    let first = wait_for(Duration::from_secs(10), || {
        redis.accepted().first().copied()
    })
    .expect("the node never dialed Redis");
    wait_for(to + Duration::from_secs(5), || {
        (first.elapsed() >= to).then_some(())
    })
    .expect("the window passed");
    redis
        .accepted()
        .into_iter()
        .map(|t| t.duration_since(first))
        .filter(|t| *t >= from && *t < to)
        .collect()
}

#[test]
fn every_redis_connection_retries_on_its_own_jittered_schedule() {
    let redis = ResettingListener::start();
    let log = log_path("backoff");
    let sb = serve_against(&redis, &log);
    assert_eq!(healthz_json(sb.port)["status"], "degraded");
    // Past the first doublings of the backoff (from 50 ms), where the
    // connections opened together are still close by construction.
    let (from, to) = (Duration::from_secs(2), Duration::from_secs(10));
    let at = attempts_between(&redis, from, to);
    // Three connections (the pub/sub source's, the state reader's, the
    // history's) each retry at least every 2 s.
    assert!(at.len() >= 8, "too few attempts: {at:?}");
    assert!(
        at.windows(2)
            .all(|w| w[1] - w[0] <= Duration::from_millis(2_500)),
        "a gap past the 2 s cap: {at:?}"
    );
    // Connections that retry on a one-second tick dial at the same point of
    // every second: each attempt of theirs within 10 ms of that phase (here
    // 12 of 18 attempts, two of them 2 ms apart at each of four ticks). On
    // jittered schedules the phases spread over the second: 18 of them put
    // 7 in one 20 ms bin roughly once in 500,000 runs.
    let phase = |t: &Duration| (t.as_micros() % 1_000_000) as i64;
    let in_step = at
        .iter()
        .map(|a| {
            at.iter()
                .filter(|b| {
                    let d = (phase(a) - phase(b)).rem_euclid(1_000_000);
                    d.min(1_000_000 - d) <= 10_000
                })
                .count()
        })
        .max()
        .unwrap_or(0);
    println!(
        "{} attempts, at most {in_step} at one point of the second: {at:?}",
        at.len()
    );
    assert!(
        in_step <= 6,
        "{in_step} attempts at one point of the second: {at:?}"
    );
    // Nor do two attempts keep falling within 5 ms of each other.
    let close = at
        .windows(2)
        .filter(|w| w[1] - w[0] < Duration::from_millis(5))
        .count();
    assert!(close <= 5, "{close} attempts in step: {at:?}");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn an_outage_is_logged_once_not_at_every_attempt() {
    let redis = ResettingListener::start();
    let log = log_path("outage-log");
    let sb = serve_against(&redis, &log);
    // Twelve seconds of outage: 6 to 12 attempts of every connection.
    let at = attempts_between(&redis, Duration::ZERO, Duration::from_secs(12));
    assert!(at.len() >= 12, "too few attempts: {at:?}");
    assert_eq!(healthz_json(sb.port)["status"], "degraded");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let history = text
        .lines()
        .filter(|l| l.contains("history: XRANGE failed"))
        .count();
    assert_eq!(
        history, 1,
        "history's outage logged {history} times:\n{text}"
    );
    let warns = text.lines().filter(|l| l.contains("WARN")).count();
    assert!(warns <= 4, "{warns} WARN lines over one outage:\n{text}");
    let _ = std::fs::remove_file(&log);
}
