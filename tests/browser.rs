//! Real-browser checks: headless Chromium (playwright-core) opens the board and
//! the admin page of a running demo. Screenshots land in target/browser/.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

fn run_script(script: &str, port: u16, shot: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core missing: run the README's test command (it runs npm ci in tests/browser)"
    );
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let status = Command::new("node")
        .arg(dir.join(script))
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(out_dir.join(shot))
        .status()
        .expect("node must be installed");
    assert!(status.success(), "{script} failed");
    assert!(out_dir.join(shot).exists(), "no screenshot written");
}

#[test]
fn board_page_shows_live_seats() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("board.mjs", sb.port, "board.png");
}

#[test]
fn admin_page_lists_courses() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("admin.mjs", sb.port, "admin.png");
}

/// A child process killed on drop.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Reaped {
    Reaped(
        Command::new(bin())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn seatboard"),
    )
}

#[test]
fn admin_page_on_redis_with_simulate_and_analytics() {
    let redis = Redis::start();
    let uri = redis.uri();
    let _analytics = spawn(&[
        "analytics",
        "--redis",
        &uri,
        "--bucket-ms",
        "1000",
        "--session",
        "browser",
        "--log-level",
        "warn",
    ]);
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--session",
        "browser",
        "--shards",
        "2",
    ]);
    let _sim = spawn(&[
        "simulate",
        "--redis",
        &uri,
        "--rate",
        "60",
        "--courses",
        "12",
        "--duration",
        "120",
    ]);
    run_script("admin.mjs", sb.port, "admin-redis.png");
}
