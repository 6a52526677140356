//! A log reader that goes away never freezes the boards: with stderr a FIFO
//! whose reader closed, or `/dev/full`, a node keeps delivering updates after
//! malformed snapshots (each of which logs), counts the lines it dropped, and
//! drains on SIGTERM with exit 0. A long-lived thread that panics fails the
//! node instead of leaving it half alive: `/healthz` and `/readyz` answer 503
//! and the process exits 70. Credentials never reach `--help` or an error.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

/// `serve` on `redis` with `stderr`, logging at info; waits for `/healthz`.
fn serve_with_stderr(redis: &RedisServer, stderr: Stdio, env: &[(&str, &str)]) -> (Child, u16) {
    let port = free_port();
    let child = seatboard_command()
        .args(["serve", "--auth", "none", "--log-level", "info"])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--drain-ms",
            "300",
        ])
        .args(["--redis", &redis.uri()])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn seatboard");
    wait_for(T, || {
        http_get(port, "/healthz").ok().filter(|r| r.status == 200)
    })
    .expect("seatboard did not answer /healthz");
    (child, port)
}

/// Malformed snapshots (each logged) then a real one: the viewer gets the real
/// one, the node counts the lines stderr refused, and SIGTERM drains to exit 0.
fn keeps_serving_with_a_dead_stderr(redis: &RedisServer, mut child: Child, port: u16) {
    let mut ws = RawWs::hello(port, "u1");
    ws.text(r#"{"op":"watch","course":"CS101"}"#);
    ws.next_of_type("frame", T).expect("the watch answer");
    for bad in [
        "not json",
        r#"{"course":"CS101"}"#,
        r#"{"course":"XX9","section":1,"total_seats":1,"seats_taken":0}"#,
    ] {
        redis.cli(&["PUBLISH", "seats:CS101", bad]);
    }
    publish_section(&redis.uri(), "CS101", "7", "40", "39");
    let frame = wait_for(T, || {
        let f = ws.next_of_type("frame", Duration::from_secs(1))?;
        (seats_taken(&f, 7) == Some(39)).then_some(f)
    });
    assert!(
        frame.is_some(),
        "the update after the malformed snapshots arrived"
    );
    let metrics = http_get(port, "/metrics").expect("/metrics").body;
    assert!(
        metric_value(&metrics, "seatboard_ingest_rejected_total{") >= 3.0,
        "malformed snapshots counted: {metrics}"
    );
    assert!(
        metric_value(&metrics, "seatboard_log_dropped_total") >= 1.0,
        "the log lines stderr refused are counted"
    );
    drop(ws);
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_for(T, || child.try_wait().ok().flatten());
    let _ = child.kill();
    let status = status.expect("exited after SIGTERM");
    assert_eq!(status.code(), Some(0), "drained and exited 0: {status:?}");
}

#[test]
fn a_fifo_whose_reader_left_does_not_freeze_the_board() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seatboard-fifo-{}", free_port()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("log");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo(3) on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // The reader first (non-blocking), so opening the write end does not wait.
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("fifo reader");
    let writer = OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("fifo writer");
    let (child, port) = serve_with_stderr(&redis, Stdio::from(writer), &[]);
    // The log reader goes away: from now on every write to stderr is EPIPE.
    drop(reader);
    keeps_serving_with_a_dead_stderr(&redis, child, port);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_log_disk_does_not_freeze_the_board() {
    let redis = RedisServer::start();
    let full = File::options()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let (child, port) = serve_with_stderr(&redis, Stdio::from(full), &[]);
    keeps_serving_with_a_dead_stderr(&redis, child, port);
}

/// The thread named by the test hook panics on a watch of `PANIC-TEST`:
/// the node answers 503 `failed` while it closes its connections, then
/// exits 70.
fn a_panic_fails_the_node(thread: &str, check_health: bool) {
    let redis = RedisServer::start();
    let (mut child, port) =
        serve_with_stderr(&redis, Stdio::null(), &[("SEATBOARD_TEST_PANIC", thread)]);
    // A viewer that never answers the close keeps the node closing for its
    // close grace: the window in which /healthz is read.
    let mut holder = RawWs::hello(port, "holder");
    holder.text(r#"{"op":"watch","course":"CS101"}"#);
    holder.next_of_type("frame", T).expect("the watch answer");
    let mut trip = RawWs::hello(port, "tripper");
    trip.text(r#"{"op":"watch","course":"PANIC-TEST"}"#);
    if check_health {
        let failed = wait_for(T, || {
            let r = http_get(port, "/healthz").ok()?;
            (r.status == 503).then_some(r)
        })
        .expect("/healthz turned 503 before the exit");
        assert!(
            failed.body.contains(r#""status":"failed""#),
            "{}",
            failed.body
        );
        assert!(
            failed.body.contains(thread),
            "names the thread: {}",
            failed.body
        );
        let ready = http_get(port, "/readyz").expect("/readyz");
        assert_eq!(ready.status, 503, "/readyz of a failed node");
    }
    let status = wait_for(T, || child.try_wait().ok().flatten());
    let _ = child.kill();
    let status = status.expect("a failed node exits by itself");
    assert_eq!(status.code(), Some(70), "exit 70 for systemd: {status:?}");
}

#[test]
fn an_ingest_panic_fails_the_node() {
    a_panic_fails_the_node("seatboard-ingest", true);
}

#[test]
fn a_presence_panic_fails_the_node() {
    a_panic_fails_the_node("seatboard-presence", true);
}

#[test]
fn a_shard_panic_fails_the_node() {
    // The panicking shard may hold the only listener: no health check.
    a_panic_fails_the_node("seatboard-shard", false);
}

const PASSWORD: &str = "Hunter2Secret";

#[test]
fn help_and_errors_never_show_a_redis_password() {
    let uri = format!("rediss://svc:{PASSWORD}@redis.example.net:6380");
    for sub in ["serve", "publish", "analytics", "simulate"] {
        let out = seatboard_command()
            .args([sub, "--help"])
            .env("REALTIME_REDIS_URI", &uri)
            .output()
            .expect("run --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--redis"), "{sub} --help lists --redis");
        assert!(
            !text.contains(PASSWORD),
            "{sub} --help shows the password: {text}"
        );
    }
    let bad = format!("redis://u:{PASSWORD}@127.0.0.1:1,redis://u:other{PASSWORD}@127.0.0.1:2");
    let out = seatboard_command()
        .args(["serve", "--auth", "none", "--redis", &bad])
        .output()
        .expect("run serve");
    assert_eq!(out.status.code(), Some(2), "a bad --redis is a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().next().unwrap_or("").contains("'--redis'"),
        "{err}"
    );
    assert!(
        !err.contains(PASSWORD),
        "the error shows the password: {err}"
    );
}
