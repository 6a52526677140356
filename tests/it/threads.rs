//! A node's threads have one owner (`src/supervisor.rs`): SIGTERM stops them
//! in order and joins every one of them before the exit, and a panic in any
//! long-lived thread, even one that handles no watch, fails the node (exit 70,
//! the thread named in the log), as `docs/code-map.md`'s thread table says.

use crate::common::*;
use std::process::{Child, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// A node (`args` after the subcommand) logging at info into a file of its
/// own, with `env`; waits for `/healthz` when `healthy`.
fn node(args: &[&str], env: &[(&str, &str)], healthy: bool) -> (Child, u16, std::path::PathBuf) {
    let port = free_port();
    let log = std::env::temp_dir().join(format!("seatboard-threads-{port}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = seatboard_command()
        .args(args)
        .args([
            "--log-level",
            "info",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("spawn seatboard");
    if healthy {
        wait_for(T, || {
            http_get(port, "/healthz").ok().filter(|r| r.status == 200)
        })
        .expect("seatboard did not answer /healthz");
    }
    (child, port, log)
}

/// Waits for the exit (killing the node past `T`) and returns its code and log.
fn exit_and_log(mut child: Child, log: &std::path::Path) -> (Option<i32>, String) {
    let status = wait_for(T, || child.try_wait().ok().flatten());
    let _ = child.kill();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let _ = std::fs::remove_file(log);
    (status.expect("the node exits by itself").code(), text)
}

/// The `threads joined` line of a log, after a SIGTERM to an idle node.
fn joined_on_sigterm(args: &[&str]) -> String {
    let (child, _port, log) = node(args, &[], true);
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, text) = exit_and_log(child, &log);
    assert_eq!(code, Some(0), "drained and exited 0: {text}");
    text.lines()
        .find(|l| l.contains("threads joined"))
        .unwrap_or_else(|| panic!("no 'threads joined' line: {text}"))
        .to_owned()
}

/// Each thread is named, quoted, in the `joined` list, and only the log
/// writer (which writes the last lines) is left.
fn assert_joined(line: &str, threads: &[&str]) {
    let (joined, left) = line.split_once("left=").expect("a left= field");
    for t in threads {
        assert!(joined.contains(&format!("\"{t}\"")), "{t} joined: {line}");
    }
    assert!(
        left.starts_with("[\"log-writer\"]"),
        "only the log writer left: {line}"
    );
}

#[test]
fn sigterm_joins_every_thread_of_serve() {
    let redis = RedisServer::start();
    let line = joined_on_sigterm(&[
        "serve",
        "--auth",
        "none",
        "--shards",
        "2",
        "--redis",
        &redis.uri(),
    ]);
    assert_joined(
        &line,
        &[
            "seatboard-shard-0",
            "seatboard-shard-1",
            "seatboard-ingest",
            "seatboard-states",
            "seatboard-presence",
            "seatboard-history",
        ],
    );
    // In the documented order: the shards first, then what feeds them.
    let at = |t: &str| line.find(&format!("\"{t}\"")).expect("listed");
    assert!(at("seatboard-shard-1") < at("seatboard-ingest"), "{line}");
    assert!(at("seatboard-ingest") < at("seatboard-presence"), "{line}");
    assert!(at("seatboard-presence") < at("seatboard-history"), "{line}");
}

#[test]
fn sigterm_joins_every_thread_of_demo() {
    let line = joined_on_sigterm(&["demo", "--shards", "1"]);
    assert_joined(
        &line,
        &[
            "seatboard-shard-0",
            "seatboard-ingest",
            "seatboard-states",
            "seatboard-presence",
            "seatboard-simulator",
        ],
    );
}

/// The thread `name` panics as it starts: the node fails, exit 70, and the
/// log names the thread.
fn a_panic_at_start_fails_the_node(args: &[&str], name: &str) {
    let env = [("SEATBOARD_TEST_PANIC_AT_START", name)];
    let (child, _port, log) = node(args, &env, false);
    let (code, text) = exit_and_log(child, &log);
    assert_eq!(code, Some(70), "exit 70 for systemd: {text}");
    let failed = text
        .lines()
        .find(|l| l.contains("a long-lived thread panicked"))
        .unwrap_or_else(|| panic!("no failure line: {text}"));
    assert!(failed.contains(name), "names {name}: {failed}");
}

#[test]
fn a_state_reader_panic_fails_the_node() {
    let redis = RedisServer::start();
    let args = ["serve", "--auth", "none", "--redis", &redis.uri()];
    a_panic_at_start_fails_the_node(&args, "seatboard-states");
}

#[test]
fn a_history_panic_fails_the_node() {
    let redis = RedisServer::start();
    let args = ["serve", "--auth", "none", "--redis", &redis.uri()];
    a_panic_at_start_fails_the_node(&args, "seatboard-history");
}

#[test]
fn a_jwks_thread_panic_fails_the_node() {
    let redis = RedisServer::start();
    let jwks = format!("http://127.0.0.1:{}/jwks.json", free_port());
    let args = ["serve", "--jwks-url", &jwks, "--redis", &redis.uri()];
    a_panic_at_start_fails_the_node(&args, "seatboard-jwks");
}

#[test]
fn a_simulator_panic_fails_the_demo() {
    a_panic_at_start_fails_the_node(&["demo"], "seatboard-simulator");
}

#[test]
fn a_log_writer_panic_does_not_fail_the_node() {
    // The log writer's policy is to be logged: the node keeps serving, and
    // SIGTERM still drains to exit 0.
    let redis = RedisServer::start();
    let env = [("SEATBOARD_TEST_PANIC_AT_START", "log-writer")];
    let args = ["serve", "--auth", "none", "--redis", &redis.uri()];
    let (child, port, log) = node(&args, &env, true);
    let health = http_get(port, "/healthz").expect("/healthz");
    assert_eq!(health.status, 200, "{}", health.body);
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (code, _) = exit_and_log(child, &log);
    assert_eq!(code, Some(0));
}
