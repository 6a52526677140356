//! Real-browser checks: headless Chromium (playwright-core) opens the board and
//! the admin page of a running demo or of a hub on Redis. Screenshots land in
//! target/browser/.

use crate::common;
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

/// The CSP guard every browser check uses (tests/browser/csp.mjs) reports a
/// violation and refuses an `unsafe-inline` policy, so the checks below, which
/// pass, really ran with the pages' policy on and nothing blocked.
#[test]
fn csp_guard_catches_a_violation() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core missing: run the README's test command (it runs npm ci in tests/browser)"
    );
    let status = Command::new("node")
        .arg(dir.join("csp_selftest.mjs"))
        .status()
        .expect("node must be installed");
    assert!(status.success(), "csp_selftest.mjs failed");
}

#[test]
fn board_page_shows_live_seats() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("board.mjs", sb.port, "board.png");
}

/// Chromium offers permessage-deflate: the server accepts it, the board's
/// frames arrive compressed (fewer bytes on the wire than payload, and the
/// browser is the only client) and decode into the board.
#[test]
fn board_frames_arrive_compressed_in_chromium() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("deflate.mjs", sb.port, "deflate.png");
    let m = sb.metrics();
    let wire = metric_value(&m, "seatboard_ws_bytes_sent_total");
    let payload = metric_value(&m, "seatboard_ws_payload_bytes_total");
    // Uncompressed, every frame costs its payload plus a 2-10 B header on the
    // wire; only compressed frames can bring the wire total under the payload.
    assert!(
        wire > 0.0 && wire < payload,
        "compressed on the wire: {wire} B for {payload} B of payload"
    );
}

/// axe-core (light and dark) on / and /admin, keyboard-only use, 320 px, first
/// frame within 1 s, page size and compression, nothing from another host.
#[test]
fn pages_are_accessible_keyboard_usable_and_fit_a_phone() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("a11y.mjs", sb.port, "a11y.png");
}

/// A shortlist from the URL on a hub fed through Redis; `seatboard publish`
/// frees a seat in a full section and the page raises its alert.
#[test]
fn shortlist_from_the_url_and_an_alert_when_a_full_section_frees_a_seat() {
    use std::io::{BufRead, Write};
    let redis = Redis::start();
    let uri = redis.uri();
    let publish = |course: &str, section: &str, total: &str, taken: &str| {
        let st = seatboard_command()
            .args([
                "publish",
                "--redis",
                &uri,
                "--course",
                course,
                "--section",
                section,
            ])
            .args(["--total", total, "--taken", taken])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("seatboard publish");
        assert!(st.success(), "publish {course} {section} {taken}/{total}");
    };
    publish("CS101", "1", "10", "4");
    publish("CS101", "3", "2", "2");
    publish("MATH101", "1", "30", "10");
    let sb = Seatboard::start(&["serve", "--auth", "none", "--redis", &uri, "--shards", "2"]);

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let shot = out_dir.join("shortlist-alert.png");
    let mut node = Command::new("node")
        .arg(root.join("tests/browser/shortlist.mjs"))
        .arg(format!("http://127.0.0.1:{}", sb.port))
        .arg(&shot)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node must be installed");
    let mut to_page = node.stdin.take().expect("stdin");
    let from_page = std::io::BufReader::new(node.stdout.take().expect("stdout"));
    let mut published = 0;
    for line in from_page.lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(args) = line.strip_prefix("PUBLISH ") {
            let a: Vec<&str> = args.split_whitespace().collect();
            assert_eq!(a.len(), 4, "bad request from the page script: {line}");
            publish(a[0], a[1], a[2], a[3]);
            published += 1;
            let _ = writeln!(to_page, "OK");
        }
    }
    drop(to_page);
    let status = node.wait().expect("node exit");
    assert!(status.success(), "shortlist.mjs failed");
    assert!(published >= 3, "the script published {published} times");
    assert!(shot.exists(), "no screenshot written");
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

#[test]
fn rolling_restart_moves_the_page_to_the_new_node() {
    let mut old = Seatboard::start(&["demo", "--shards", "2", "--drain-ms", "2000"]);
    let port = old.port;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let mut page = Command::new("node")
        .arg(root.join("tests/browser/drain.mjs"))
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(out_dir.join("drain.png"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(page.stdout.take().unwrap()));
    let live = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(live.starts_with("LIVE "), "page never went live: {live:?}");
    // The new node shares the port (SO_REUSEPORT; another seatboard is allowed).
    let _new = seatboard_command()
        .args([
            "demo",
            "--shards",
            "2",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-level",
            "warn",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map(|child| Seatboard { port, child })
        .expect("second node");
    wait_for(std::time::Duration::from_secs(15), || {
        let m = http_get(port, "/healthz").ok()?;
        // Both answer on the port; any answer means the new one may be up too.
        (m.status == 200).then_some(())
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    old.signal(libc::SIGTERM);
    let status = page.wait().expect("node exit");
    for l in lines.map_while(Result::ok) {
        println!("{l}");
    }
    assert!(status.success(), "drain.mjs failed");
    let exit = old
        .wait_exit(std::time::Duration::from_secs(20))
        .expect("old node exits after its drain");
    assert_eq!(exit.code(), Some(0));
}
