//! Redis unreachable for the whole run (a listener that accepts every
//! connection and resets it at once): `serve` keeps reconnecting, and the
//! outage is logged once, not once per attempt.

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
