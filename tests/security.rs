//! The security refusals of issue #16: weak JWT secrets at start, cookie tokens
//! from another site's page (cross-site WebSocket hijacking), and the headers
//! on pages and JSON answers (contract sections 1, 3 and 4).

mod common;
use common::*;
use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

/// Runs `seatboard <args>` with `env` (and no inherited `SEATBOARD_JWT_SECRET`),
/// expecting it to exit on its own: (exit code, first stderr line).
fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let port = free_port();
    let mut child = seatboard_command()
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env_remove("SEATBOARD_JWT_SECRET")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn seatboard");
    let status = wait_for(Duration::from_secs(20), || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("seatboard {args:?} kept running; it should have refused to start");
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let first = err.lines().next().unwrap_or_default().to_owned();
    (status.and_then(|s| s.code()), first)
}

/// A Redis URI nobody answers (serve starts without Redis, degraded).
fn nowhere() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

#[test]
fn serve_refuses_a_jwt_secret_under_32_bytes_flag_and_env() {
    let redis = nowhere();
    let short = "k".repeat(31);
    let base = ["serve", "--redis", redis.as_str(), "--shards", "1"];
    type Env<'a> = Vec<(&'a str, &'a str)>;
    let cases: Vec<(&str, Vec<&str>, Env)> = vec![
        ("flag, 31 bytes", vec!["--jwt-secret", &short], vec![]),
        ("flag, 1 byte", vec!["--jwt-secret", "x"], vec![]),
        (
            "env, 31 bytes",
            vec![],
            vec![("SEATBOARD_JWT_SECRET", &short)],
        ),
        (
            "env, change-me",
            vec![],
            vec![("SEATBOARD_JWT_SECRET", "change-me")],
        ),
        ("missing", vec![], vec![]),
    ];
    for (what, extra, env) in cases {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let (code, first) = run_to_exit(&args, &env);
        assert_eq!(code, Some(2), "{what}: exit code");
        assert!(
            first.contains("--jwt-secret"),
            "{what}: first stderr line must name the flag: {first:?}"
        );
    }
    // The refusal says how long and how to make one.
    let (_, first) = run_to_exit(&[&base[..], &["--jwt-secret", "x"]].concat(), &[]);
    assert!(first.contains("32 bytes"), "{first}");
    assert!(first.contains("openssl rand -base64 48"), "{first}");
}

#[test]
fn serve_starts_with_a_32_byte_secret_from_flag_or_env() {
    let redis = nowhere();
    let exact = "k".repeat(32);
    let sb = Seatboard::start(&[
        "serve",
        "--redis",
        &redis,
        "--shards",
        "1",
        "--jwt-secret",
        &exact,
    ]);
    assert_eq!(http_get(sb.port, "/healthz").unwrap().status, 200);
    let sb = Seatboard::start_env(
        &["serve", "--redis", &redis, "--shards", "1"],
        &[("SEATBOARD_JWT_SECRET", &exact)],
    );
    assert_eq!(http_get(sb.port, "/healthz").unwrap().status, 200);
}

#[test]
fn auth_none_needs_no_secret() {
    let redis = nowhere();
    let sb = Seatboard::start(&[
        "serve", "--auth", "none", "--redis", &redis, "--shards", "1",
    ]);
    assert_eq!(http_get(sb.port, "/healthz").unwrap().status, 200);
}
