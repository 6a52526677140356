//! Real-browser checks: headless Chromium (playwright-core) opens the board and
//! the admin page of a running demo or of a hub on Redis. Screenshots land in
//! target/browser/.

use crate::common;
use crate::redis_util;
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

/// The back/forward cache on: the board leaves for another page and comes
/// back from the cache, live again within 2 s (tests/browser/bfcache.mjs).
#[test]
fn board_comes_back_from_the_back_forward_cache_live() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    run_script("bfcache.mjs", sb.port, "bfcache.png");
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
    let redis = RedisServer::start();
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
    let redis = RedisServer::start();
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
    let _new = Seatboard::spawn_on(
        port,
        &["demo", "--shards", "2", "--log-level", "warn"],
        &[],
        None,
    );
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

/// The university's page on another origin imports /client.js and shows
/// `<seat-count>` cells and a `<seat-board>` with a token from its own
/// backend (tests/browser/embed.mjs serves that page and mints the token);
/// seatboard runs on Redis with `--allowed-origins` naming that origin, and is
/// killed and started again on the same port halfway through.
#[test]
fn embedded_elements_on_another_origin_stay_live_across_a_restart() {
    use std::io::{BufRead, Write};
    const SECRET: &str = "embed-test-secret-of-at-least-32-bytes!";
    let redis = RedisServer::start();
    let uri = redis.uri();
    let publish = |course: &str, section: &str, total: &str, taken: &str| {
        publish_section(&uri, course, section, total, taken)
    };
    publish("CS101", "1", "10", "4");
    publish("CS101", "3", "2", "2");
    publish("MATH101", "1", "30", "10");
    let host_port = free_port();
    let host_origin = format!("http://127.0.0.1:{host_port}");
    let serve_args = || {
        vec![
            "serve".to_string(),
            "--redis".into(),
            uri.clone(),
            "--allowed-origins".into(),
            host_origin.clone(),
            "--shards".into(),
            "2".into(),
        ]
    };
    let env = [("SEATBOARD_JWT_SECRET", SECRET)];
    let first_args = serve_args();
    let first: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut sb = Some(Seatboard::start_env(&first, &env));
    let port = sb.as_ref().map(|s| s.port).unwrap_or_default();

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let shot = out_dir.join("embed.png");
    let mut node = Command::new("node")
        .arg(root.join("tests/browser/embed.mjs"))
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(host_port.to_string())
        .arg(&shot)
        .env("SEATBOARD_JWT_SECRET", SECRET)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node must be installed");
    let mut to_page = node.stdin.take().expect("stdin");
    let from_page = std::io::BufReader::new(node.stdout.take().expect("stdout"));
    let mut restarted = false;
    for line in from_page.lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(args) = line.strip_prefix("PUBLISH ") {
            let a: Vec<&str> = args.split_whitespace().collect();
            assert_eq!(a.len(), 4, "bad request from the page script: {line}");
            publish(a[0], a[1], a[2], a[3]);
            let _ = writeln!(to_page, "OK");
        } else if line == "RESTART" {
            if let Some(mut old) = sb.take() {
                let _ = old.child.kill();
                let _ = old.child.wait();
            }
            // A killed io_uring node's listeners outlive it for a moment (the
            // kernel tears its rings down after the exit): wait until none
            // listens on the port, so the new node binds it alone.
            wait_for(std::time::Duration::from_secs(60), || {
                let held = loopback_tcp()
                    .iter()
                    .any(|r| r.local_port == port && r.state == 0x0A);
                (!held).then_some(())
            })
            .expect("the killed node's listeners go away");
            let mut args = serve_args();
            args.extend(["--log-level".into(), "warn".into()]);
            sb = Some(Seatboard::spawn_on(port, &args, &env, None));
            wait_for(std::time::Duration::from_secs(15), || {
                http_get(port, "/healthz").ok().filter(|r| r.status == 200)
            })
            .expect("seatboard answers again");
            restarted = true;
            let _ = writeln!(to_page, "OK");
        }
    }
    drop(to_page);
    let status = node.wait().expect("node exit");
    assert!(status.success(), "embed.mjs failed");
    assert!(restarted, "the script never asked for the restart");
    assert!(shot.exists(), "no screenshot written");
}

/// An HS256 token valid for an hour.
fn mint(secret: &str, user: &str, role: shards::Role) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    seatboard::auth::mint(secret.as_bytes(), user, role, exp)
}

/// The admin page at 10,000 courses on Redis, opened with `?token=` (moved
/// into the cookie): cards, only the rows on screen drawn, search, sort and
/// scroll (tests/browser/admin_scale.mjs), while a publisher changes a few
/// courses every tick and a student watches one. Prints the page's
/// main-thread time per admin message measured in Chromium, and the same at
/// 24 courses in the same run, for the ratio.
#[test]
fn admin_page_at_ten_thousand_courses() {
    let big = admin_page_figures(10_000, "admin-10000.png");
    let small = admin_page_figures(24, "admin-24.png");
    for key in ["page_ms_per_message", "main_thread_ms_per_message"] {
        let (b, s) = (big[key].as_f64(), small[key].as_f64());
        let (Some(b), Some(s)) = (b, s) else {
            panic!("no {key} in {big} / {small}");
        };
        println!(
            "{key}: 10,000 courses {b} ms, 24 courses {s} ms, ratio {:.2}",
            b / s.max(0.01)
        );
    }
    assert!(big["rows_in_dom"].as_u64().is_some_and(|r| r <= 100));
}

/// Runs tests/browser/admin_scale.mjs against a hub seeded with `n` courses;
/// its figures.
fn admin_page_figures(n: usize, shot: &str) -> serde_json::Value {
    use std::sync::atomic::{AtomicBool, Ordering};
    let redis = RedisServer::start();
    redis_util::seed_courses(&redis, n);
    let secret = "admin-page-scale-test-secret-0123456789";
    let uri = redis.uri();
    let sb = Seatboard::start(&[
        "serve",
        "--jwt-secret",
        secret,
        "--redis",
        &uri,
        "--shards",
        "2",
    ]);
    let admin = mint(secret, "boss", shards::Role::Admin);
    let student = mint(secret, "stu", shards::Role::Student);
    let mut viewer = ws_connect(sb.port, &format!("/ws?token={student}")).expect("student");
    next_json(&mut viewer).expect("hello");
    send_json(
        &mut viewer,
        serde_json::json!({"op":"watch","course":"U00001"}),
    );
    next_of_type(&mut viewer, "frame", std::time::Duration::from_secs(10)).expect("watch answer");
    // About 40 snapshots a second over random courses: every admin tick has a
    // delta of a few dozen entries (and the rates falling back to 0).
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop_pub = std::sync::Arc::clone(&stop);
    let port = redis.port;
    let publisher = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("redis");
        let mut r = BufReader::new(conn);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut version = 2;
        let mut line = String::new();
        while !stop_pub.load(Ordering::Relaxed) {
            let c = redis_util::seeded_course(rng.usize(0..n));
            let p = redis_util::payload(&c, rng.u32(1..=3), 40, rng.u32(0..=40), version);
            version += 1;
            let ch = format!("seats:{c}");
            let cmd = format!(
                "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{ch}\r\n${}\r\n{p}\r\n",
                ch.len(),
                p.len()
            );
            r.get_mut().write_all(cmd.as_bytes()).expect("publish");
            line.clear();
            r.read_line(&mut line).expect("reply");
            // Pacing of the load, not a wait for anything.
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    });
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let out = Command::new("node")
        .arg(root.join("tests/browser/admin_scale.mjs"))
        .arg(format!("http://127.0.0.1:{}", sb.port))
        .arg(&admin)
        .arg(out_dir.join(shot))
        .arg(n.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("node must be installed");
    stop.store(true, Ordering::Relaxed);
    publisher.join().expect("publisher");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "admin_scale.mjs failed at {n} courses"
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("admin-scale: "))
        .and_then(|j| serde_json::from_str(j).ok())
        .expect("the figures line")
}

/// Runs tests/browser/sse.mjs against seatboard at `base` (directly or
/// through a proxy): its host page on `host_port` mints tokens with `secret`;
/// the script's `PUBLISH` requests go to Redis at `redis_uri`.
pub(crate) fn run_sse_page(
    base: &str,
    redis_uri: &str,
    secret: &str,
    host_port: u16,
    quiet_ms: u64,
    shot: &str,
) {
    use std::io::{BufRead, Write};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let shot = out_dir.join(shot);
    let _ = std::fs::remove_file(&shot);
    let mut node = Command::new("node")
        .arg(root.join("tests/browser/sse.mjs"))
        .arg(base)
        .arg(host_port.to_string())
        .arg(&shot)
        .arg(quiet_ms.to_string())
        .env("SEATBOARD_JWT_SECRET", secret)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node must be installed");
    let mut to_page = node.stdin.take().expect("stdin");
    let from_page = std::io::BufReader::new(node.stdout.take().expect("stdout"));
    for line in from_page.lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(args) = line.strip_prefix("PUBLISH ") {
            let a: Vec<&str> = args.split_whitespace().collect();
            assert_eq!(a.len(), 4, "bad request from the page script: {line}");
            publish_section(redis_uri, a[0], a[1], a[2], a[3]);
            let _ = writeln!(to_page, "OK");
        }
    }
    drop(to_page);
    assert!(node.wait().expect("node exit").success(), "sse.mjs failed");
    assert!(shot.exists(), "no screenshot written");
}

/// A plain `EventSource` (with credentials) on a page of another origin that
/// `--allowed-origins` names gets hello, the full frame, presence and a live
/// frame (tests/browser/sse.mjs).
#[test]
fn event_source_on_another_origin_gets_live_frames() {
    const SECRET: &str = "sse-test-secret-of-at-least-32-bytes!!";
    let redis = RedisServer::start();
    let uri = redis.uri();
    publish_section(&uri, "CS101", "1", "10", "4");
    let host_port = free_port();
    let host_origin = format!("http://127.0.0.1:{host_port}");
    let sb = Seatboard::start_env(
        &[
            "serve",
            "--redis",
            &uri,
            "--allowed-origins",
            &host_origin,
            "--shards",
            "2",
        ],
        &[("SEATBOARD_JWT_SECRET", SECRET)],
    );
    run_sse_page(
        &format!("http://127.0.0.1:{}", sb.port),
        &uri,
        SECRET,
        host_port,
        0,
        "sse.png",
    );
}

/// A publisher's `seat_info` may hold anything: the board draws every section
/// and each room as text, even a room whose `toString` is not a function.
#[test]
fn board_draws_any_seat_info_as_text() {
    let redis = RedisServer::start();
    let uri = redis.uri();
    let rooms = [
        r#"{"toString":"B12"}"#,
        r#"["A","B"]"#,
        "42",
        r#""C3""#,
        "null",
    ];
    for (i, room) in rooms.iter().enumerate() {
        let n = (i + 1).to_string();
        let st = seatboard_command()
            .args(["publish", "--redis", &uri, "--course", "ODD101"])
            .args(["--section", &n, "--total", "10", "--taken"])
            .arg((10 - i - 1).to_string())
            .args(["--seat-info", &format!(r#"{{"room":{room}}}"#)])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("seatboard publish");
        assert!(st.success(), "publish ODD101 {n} with room {room}");
    }
    let sb = Seatboard::start(&["serve", "--auth", "none", "--redis", &uri]);
    run_script("seat_info.mjs", sb.port, "seat_info.png");
}

/// The board page names its courses in the upgrade: its first boards arrive
/// with the `hello` and no `watch` message is sent, on the first connection
/// and after a break; a course added later goes as a `watch` message
/// (tests/browser/first_board.mjs).
#[test]
fn board_page_gets_its_first_boards_without_a_watch_message() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    run_script("first_board.mjs", sb.port, "first_board.png");
}
