//! The server under test: `seatboard serve` on the scenario's Redis, with
//! the bench's JWT secret.

use crate::redis_rig::RedisRig;
use std::time::Duration;
use testkit::proc::{free_port, Seatboard};

/// The bench's JWT secret.
pub const SECRET: &str = "bench-secret-not-for-production-0123456789";

/// Starts `seatboard serve` (`SEATBOARD_BIN`: another build, for
/// before/after comparisons) on a free port and `redis` with `extra` flags,
/// and waits until `/healthz` says `ok` (Redis connected).
pub fn serve(redis: &RedisRig, extra: &[String]) -> Seatboard {
    serve_bin(None, redis, extra)
}

/// [`serve`] with the binary at `bin` when given (another build served
/// beside the one under test, in the same run).
pub fn serve_bin(bin: Option<&str>, redis: &RedisRig, extra: &[String]) -> Seatboard {
    let mut args: Vec<String> = vec!["serve".into(), "--redis".into(), redis.server_uri()];
    args.extend(
        [
            "--auth",
            "jwt",
            "--jwt-secret",
            SECRET,
            "--log-level",
            "warn",
        ]
        .map(String::from),
    );
    args.extend_from_slice(extra);
    let cmd = bin.map_or_else(testkit::proc::seatboard_command, testkit::proc::command_for);
    let mut sb = Seatboard::spawn_cmd_on(cmd, free_port(), &args, &[], None);
    let healthy = sb.wait_answer("/healthz", Duration::from_secs(20), |r| {
        r.status == 200 && r.body.contains("\"ok\"")
    });
    if let Ok(Some(st)) = sb.child.try_wait() {
        panic!("seatboard serve exited at start: {st}");
    }
    assert!(healthy, "seatboard did not become healthy");
    sb
}
