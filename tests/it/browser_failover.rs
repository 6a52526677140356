//! The board page in headless Chromium, through HAProxy (the shipped
//! `systemd/haproxy/seatboard.cfg`) over https with a self-signed certificate
//! made here with openssl, two `seatboard serve` nodes on one Redis: the node
//! holding the page's WebSocket is SIGKILLed, and the page stays live on the
//! other one without a reload (tests/browser/failover.mjs).

use crate::common;
use crate::lb;
use crate::tls_util;
use common::*;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn board_stays_live_through_haproxy_when_its_node_is_killed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scripts = root.join("tests/browser");
    assert!(
        scripts.join("node_modules/playwright-core").exists(),
        "playwright-core missing: run the README's test command (it runs npm ci in tests/browser)"
    );
    let redis = RedisServer::start();
    let uri = redis.uri();
    let args = ["serve", "--auth", "none", "--redis", &uri, "--shards", "1"];
    let mut nodes = vec![Seatboard::start(&args), Seatboard::start(&args)];
    let dir = std::env::temp_dir().join(format!("seatboard-failover-{}", std::process::id()));
    let pem = tls_util::self_signed_pem(&dir);
    let port = lb::free_port();
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let cfg = lb::render(&lb::shipped(), &lb::Bind::Tls(port, &pem), &ports, 1000);
    let proxy = lb::Haproxy::start(&dir, port, &cfg, 1);

    // The selection API: section 0..3 of LIVE1 change every 150 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let stop = stop.clone();
        let uri = uri.clone();
        std::thread::spawn(move || {
            let mut version = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let taken = (version * 7 % 41).to_string();
                let _ = Command::new(bin())
                    .args(["publish", "--redis", &uri, "--course", "LIVE1"])
                    .args(["--section", &(version % 4).to_string(), "--total", "40"])
                    .args(["--taken", &taken, "--version", &version.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                std::thread::sleep(Duration::from_millis(150));
            }
        })
    };

    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let mut page = Command::new("node")
        .arg(scripts.join("failover.mjs"))
        .arg(format!("https://127.0.0.1:{port}"))
        .arg(out_dir.join("failover.png"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("node must be installed");
    let mut lines = std::io::BufReader::new(page.stdout.take().expect("stdout")).lines();
    let live = lines.next().and_then(Result::ok).unwrap_or_default();
    let node_id = live
        .strip_prefix("LIVE ")
        .unwrap_or_else(|| panic!("page never went live: {live:?}"));
    // The node id is `<host>-<pid>`.
    let pid: i32 = node_id
        .rsplit('-')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("node id without a pid: {node_id}"));
    let i = nodes
        .iter()
        .position(|n| n.pid() == pid)
        .unwrap_or_else(|| panic!("node {node_id} is not one of ours"));
    drop(nodes.remove(i)); // SIGKILL
    let status = page.wait().expect("node exit");
    for l in lines.map_while(Result::ok) {
        println!("{l}");
    }
    stop.store(true, Ordering::Relaxed);
    let _ = publisher.join();
    assert!(status.success(), "failover.mjs failed");
    assert!(out_dir.join("failover.png").exists(), "no screenshot");
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `EventSource` on a page of another origin through the shipped HAProxy
/// configuration (https, self-signed): hello, the full frame, presence and
/// live frames, and the stream outlives 40 s without an update (longer than
/// HAProxy's 30 s client and server timeouts) with no reconnect
/// (tests/browser/sse.mjs).
#[test]
fn event_source_through_haproxy_stays_open_through_a_quiet_spell() {
    const SECRET: &str = "sse-test-secret-of-at-least-32-bytes!!";
    let redis = RedisServer::start();
    let uri = redis.uri();
    publish_section(&uri, "CS101", "1", "10", "4");
    let host_port = free_port();
    let host_origin = format!("http://127.0.0.1:{host_port}");
    let node = Seatboard::start_env(
        &[
            "serve",
            "--redis",
            &uri,
            "--allowed-origins",
            &host_origin,
            "--shards",
            "1",
        ],
        &[("SEATBOARD_JWT_SECRET", SECRET)],
    );
    let dir = std::env::temp_dir().join(format!("seatboard-sse-lb-{}", std::process::id()));
    let pem = tls_util::self_signed_pem(&dir);
    let port = lb::free_port();
    let cfg = lb::render(
        &lb::shipped(),
        &lb::Bind::Tls(port, &pem),
        &[node.port],
        1000,
    );
    let _proxy = lb::Haproxy::start(&dir, port, &cfg, 1);
    crate::browser::run_sse_page(
        &format!("https://127.0.0.1:{port}"),
        &uri,
        SECRET,
        host_port,
        40_000,
        "sse_haproxy.png",
    );
}
