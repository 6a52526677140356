//! The front door (contract sections 3 and 4): one test per row of the refusal
//! table, their order, the head limits, and the refusal metrics.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn refused(sb: &Seatboard, reason: &str) -> f64 {
    metric_value(
        &sb.metrics(),
        &format!("seatboard_handshakes_refused_total{{reason=\"{reason}\"}}"),
    )
}

fn upgrade(port: u16, path: &str, extra: &str) -> HttpResponse {
    http_raw(port, upgrade_request(path, extra).as_bytes()).expect("response")
}

/// A valid upgrade's status (the 101 keeps the socket open, so read just the head).
fn upgrade_status(port: u16, path: &str, extra: &str) -> (u16, Option<TcpStream>) {
    raw_status(port, upgrade_request(path, extra))
}

/// [`upgrade_status`] of the request `request` as it is.
fn raw_status(port: u16, request: impl AsRef<[u8]>) -> (u16, Option<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_ref()).unwrap();
    let mut buf = Vec::new();
    let mut b = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    let r = parse_response(&buf).expect("a response head");
    (r.status, (r.status == 101).then_some(s))
}

fn retry_after(r: &HttpResponse) -> u64 {
    let v = r.header("Retry-After").expect("Retry-After");
    let s: u64 = v.parse().unwrap_or_else(|_| panic!("whole seconds: {v:?}"));
    assert!(s >= 1, "Retry-After {s}");
    s
}

#[test]
fn accept_bucket_503_with_retry_after_and_never_for_health_endpoints() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--accept-rate",
        "1",
        "--accept-burst",
        "1",
    ]);
    // The one token of the burst.
    let (status, _keep) = upgrade_status(sb.port, "/ws?user=a", "");
    assert_eq!(status, 101);
    let r = upgrade(sb.port, "/ws?user=b", "");
    assert_eq!(r.status, 503);
    retry_after(&r);
    // A request that is no upgrade is answered 400 even while the bucket is empty.
    let r = http_raw(sb.port, b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(r.status, 400);
    assert!(refused(&sb, "rate_limited") >= 1.0);
    // Plain HTTP is never refused by the bucket.
    for _ in 0..30 {
        for p in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(http_get(sb.port, p).unwrap().status, 200, "{p}");
        }
    }
    // The bucket refills at its rate: within ~1 s a new upgrade gets through.
    let ok = wait_for(Duration::from_secs(5), || {
        let (s, keep) = upgrade_status(sb.port, "/ws?user=c", "");
        std::thread::sleep(Duration::from_millis(200));
        (s == 101).then_some(keep)
    });
    assert!(ok.is_some(), "the bucket never refilled");
}

#[test]
fn the_accept_bucket_is_one_for_the_node_whatever_its_shards() {
    // Two shards, one token: the kernel spreads the connections over both
    // listeners, and still one upgrade in all gets through.
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "2",
        "--accept-rate",
        "1",
        "--accept-burst",
        "1",
    ]);
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for i in 0..16 {
        let (status, keep) = upgrade_status(sb.port, &format!("/ws?user=u{i}"), "");
        statuses.push(status);
        held.push(keep);
    }
    let admitted = statuses.iter().filter(|s| **s == 101).count();
    assert_eq!(admitted, 1, "one token for the node: {statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 101 || *s == 503),
        "{statuses:?}"
    );
}

#[test]
fn non_upgrade_requests_leave_the_accept_bucket_whole() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--accept-rate",
        "1",
        "--accept-burst",
        "2",
    ]);
    for i in 0..50 {
        let req = if i % 5 == 4 {
            upgrade_request("/ws?user=v", "").replace("Version: 13", "Version: 8")
        } else {
            "GET /ws HTTP/1.1\r\nHost: x\r\n\r\n".to_string()
        };
        let r = http_raw(sb.port, req.as_bytes()).unwrap();
        assert_eq!(r.status, if i % 5 == 4 { 426 } else { 400 }, "request {i}");
    }
    assert_eq!(refused(&sb, "rate_limited"), 0.0);
    // Both tokens of the burst are still there.
    let (first, _a) = upgrade_status(sb.port, "/ws?user=a", "");
    let (second, _b) = upgrade_status(sb.port, "/ws?user=b", "");
    assert_eq!((first, second), (101, 101));
}

#[test]
fn two_origin_headers_are_400_before_the_accept_bucket() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--accept-rate",
        "1",
        "--accept-burst",
        "1",
        "--allowed-origins",
        "https://a.example,https://b.example",
    ]);
    let (a, b) = (
        "Origin: https://a.example\r\n",
        "Origin: https://b.example\r\n",
    );
    let mut sent = 0.0;
    for path in [
        "/ws?user=u",
        "/ws/admin?user=u&role=admin",
        "/sse?course=CS101&user=u",
    ] {
        for extra in [format!("{a}{b}"), format!("{b}{a}"), format!("{a}{a}")] {
            let r = upgrade(sb.port, path, &extra);
            assert_eq!(r.status, 400, "{path} with {extra:?}");
            sent += 1.0;
        }
    }
    assert_eq!(refused(&sb, "repeated_origin"), sent);
    assert_eq!(refused(&sb, "rate_limited"), 0.0);
    // The bucket's one token is still there: one Origin, and it upgrades.
    let (status, _keep) = upgrade_status(sb.port, "/ws?user=v", a);
    assert_eq!(status, 101);
}

#[test]
fn malformed_upgrades_are_400_and_other_versions_426() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let good = upgrade_request("/ws?user=u", "");
    let bad: Vec<(&str, String)> = vec![
        (
            "no upgrade headers",
            "GET /ws?user=u HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        ),
        ("HTTP/1.0", good.replace("HTTP/1.1", "HTTP/1.0")),
        ("no Upgrade", good.replace("Upgrade: websocket\r\n", "")),
        (
            "Upgrade h2c",
            good.replace("Upgrade: websocket", "Upgrade: h2c"),
        ),
        ("no Connection", good.replace("Connection: Upgrade\r\n", "")),
        (
            "Connection keep-alive",
            good.replace("Connection: Upgrade", "Connection: keep-alive"),
        ),
        (
            "no key",
            good.replace(&format!("Sec-WebSocket-Key: {KEY}\r\n"), ""),
        ),
        ("short key", good.replace(KEY, "c2hvcnQ=")),
        ("17-byte key", good.replace(KEY, "AAAAAAAAAAAAAAAAAAAAAAA=")),
        (
            "non-base64 key",
            good.replace(KEY, "dGhlIHNhbXBsZSBub2!jZQ=="),
        ),
        (
            "non-canonical key",
            good.replace(KEY, "dGhlIHNhbXBsZSBub25jZR=="),
        ),
        ("empty key", good.replace(KEY, "")),
        (
            "no version",
            good.replace("Sec-WebSocket-Version: 13\r\n", ""),
        ),
    ];
    let before = refused(&sb, "bad_upgrade");
    for (what, req) in &bad {
        let r = http_raw(sb.port, req.as_bytes()).unwrap();
        assert_eq!(r.status, 400, "{what}");
    }
    assert_eq!(refused(&sb, "bad_upgrade") - before, bad.len() as f64);
    // Header names and tokens are case-insensitive; lists are fine.
    let mixed = good
        .replace("Upgrade: websocket", "upgrade: WebSocket")
        .replace("Connection: Upgrade", "connection: keep-alive, upgrade");
    let mut s = TcpStream::connect(("127.0.0.1", sb.port)).unwrap();
    s.write_all(mixed.as_bytes()).unwrap();
    let mut b = [0u8; 12];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"HTTP/1.1 101");

    for v in ["8", "12", "14", "x"] {
        let r = http_raw(
            sb.port,
            good.replace("Version: 13", &format!("Version: {v}"))
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 426, "version {v}");
        assert_eq!(r.header("Sec-WebSocket-Version"), Some("13"));
    }
    assert!(refused(&sb, "bad_version") >= 4.0);
    // An upgrade of another method is a malformed upgrade (section 4's
    // checks: GET is one), taking no token from the bucket; another method on
    // the WebSocket path that asks for no upgrade is a wrong method (section 3).
    let before = refused(&sb, "bad_upgrade");
    for method in ["POST", "PUT"] {
        let r = http_raw(sb.port, good.replacen("GET", method, 1).as_bytes()).unwrap();
        assert_eq!(r.status, 400, "{method} upgrade");
    }
    assert!(refused(&sb, "bad_upgrade") >= before + 2.0);
    let r = http_raw(
        sb.port,
        b"POST /ws HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET"));
}

#[test]
fn origin_allowlist_403() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--allowed-origins",
        "https://good.example, http://localhost:8080",
    ]);
    for o in [
        "https://evil.example",
        "http://good.example",
        "https://good.example:443",
        "https://good.example.evil",
        "null",
    ] {
        let r = upgrade(sb.port, "/ws?user=u", &format!("Origin: {o}\r\n"));
        assert_eq!(r.status, 403, "{o}");
    }
    assert_eq!(refused(&sb, "origin"), 5.0);
    for o in [
        "Origin: https://good.example\r\n",
        "Origin: http://localhost:8080\r\n",
        "",
    ] {
        assert_eq!(upgrade_status(sb.port, "/ws?user=u", o).0, 101, "{o:?}");
    }
    // Origin is checked before the token.
    let r = upgrade(sb.port, "/ws", "Origin: https://evil.example\r\n");
    assert_eq!(r.status, 403);
    // Without an allowlist any origin is fine.
    let open = Seatboard::start(&["demo", "--shards", "1"]);
    let o = "Origin: https://anything.example\r\n";
    assert_eq!(upgrade_status(open.port, "/ws?user=u", o).0, 101);
}

#[test]
fn no_identity_is_401_and_student_on_admin_feed_is_403() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for path in [
        "/ws",
        "/ws?user=",
        "/ws?role=admin",
        "/ws/admin",
        "/ws?user=u&role=root",
    ] {
        let r = upgrade(sb.port, path, "");
        assert_eq!(r.status, 401, "{path}");
    }
    assert_eq!(refused(&sb, "unauthorized"), 5.0);
    for path in ["/ws/admin?user=s", "/ws/admin?user=s&role=student"] {
        let r = upgrade(sb.port, path, "");
        assert_eq!(r.status, 403, "{path}");
    }
    assert_eq!(refused(&sb, "forbidden"), 2.0);
    let mut admin = RawWs::connect(sb.port, "/ws/admin?user=boss&role=admin");
    let hello = admin.next_json(Duration::from_secs(10)).unwrap();
    assert_eq!(hello["role"], "admin");
    // A student may use /ws, and so may an admin.
    assert_eq!(
        upgrade_status(sb.port, "/ws?user=boss&role=admin", "").0,
        101
    );
}

#[test]
fn node_cap_503_then_user_cap_429() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "2",
        "--max-connections",
        "3",
        "--max-conns-per-user",
        "2",
    ]);
    let a1 = RawWs::hello(sb.port, "ann");
    let a2 = RawWs::hello(sb.port, "ann");
    let r = upgrade(sb.port, "/ws?user=ann", "");
    assert_eq!(r.status, 429, "third connection of one user");
    assert_eq!(refused(&sb, "user_cap"), 1.0);
    let b1 = RawWs::hello(sb.port, "bob");
    // The node is full: 503 + Retry-After, checked before the user cap.
    for user in ["carl", "ann"] {
        let r = upgrade(sb.port, &format!("/ws?user={user}"), "");
        assert_eq!(r.status, 503, "{user}");
        retry_after(&r);
    }
    assert_eq!(refused(&sb, "node_full"), 2.0);
    // Closing gives the slots back.
    drop(a1);
    drop(b1);
    let got = wait_for(Duration::from_secs(10), || {
        let (s, keep) = upgrade_status(sb.port, "/ws?user=carl", "");
        (s == 101).then_some(keep)
    });
    assert!(got.is_some(), "slot never came back");
    // b1's slot may come back a moment after a1's: poll.
    let ann = wait_for(Duration::from_secs(10), || {
        let (s, keep) = upgrade_status(sb.port, "/ws?user=ann", "");
        (s == 101).then_some(keep)
    });
    assert!(ann.is_some(), "ann holds one again");
    drop(a2);
}

#[test]
fn refusal_checks_run_in_contract_order() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--allowed-origins",
        "https://good.example",
        "--max-connections",
        "1",
    ]);
    let evil = "Origin: https://evil.example\r\n";
    // Malformed beats origin.
    let r = http_raw(
        sb.port,
        format!("GET /ws HTTP/1.1\r\nHost: x\r\n{evil}\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 400);
    // Wrong version beats origin.
    let v8 = upgrade_request("/ws", evil).replace("Version: 13", "Version: 8");
    assert_eq!(http_raw(sb.port, v8.as_bytes()).unwrap().status, 426);
    // Origin beats the token.
    assert_eq!(upgrade(sb.port, "/ws", evil).status, 403);
    // The token beats the admin check.
    assert_eq!(upgrade(sb.port, "/ws/admin", "").status, 401);
    let _one = RawWs::hello(sb.port, "first");
    // The admin check beats the node cap.
    assert_eq!(upgrade(sb.port, "/ws/admin?user=s", "").status, 403);
    assert_eq!(upgrade(sb.port, "/ws?user=s", "").status, 503);
}

/// A client socket that takes at most a few KiB before it reads.
fn small_window_client(port: u16) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    s.connect(&addr.into()).unwrap();
    s.into()
}

/// The server's socket towards `client`, as `(state, tx_queue)`, if it exists.
fn server_socket(server_port: u16, client: &TcpStream) -> Option<(u8, u64)> {
    let client_port = client.local_addr().unwrap().port();
    loopback_tcp()
        .into_iter()
        .find(|s| s.local_port == server_port && s.remote_port == client_port)
        .map(|s| (s.state, s.tx_queue))
}

#[test]
fn a_client_that_never_reads_leaves_no_server_socket_after_10_s() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    // A client that reads late, but within the 10 s, gets the whole page.
    let mut late = small_window_client(sb.port);
    late.write_all(request).unwrap();
    let mut stuck = small_window_client(sb.port);
    stuck.write_all(request).unwrap();
    // The page does not fit the clients' windows: the server holds the rest.
    let held = wait_for(Duration::from_secs(5), || {
        server_socket(sb.port, &stuck).filter(|&(_, tx)| tx > 0)
    });
    assert!(held.is_some(), "the page never backed up on the server");
    std::thread::sleep(Duration::from_secs(2)); // the late client's delay
    late.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut page = Vec::new();
    late.read_to_end(&mut page)
        .expect("the whole page, then FIN");
    let r = parse_response(&page).expect("a response");
    assert_eq!(r.status, 200);
    let length: usize = r.header("Content-Length").unwrap().parse().unwrap();
    assert_eq!(r.body.len(), length, "the late client got every byte");
    // The client that never reads: its answer is abandoned with a reset, and
    // the server keeps nothing for it.
    let gone = wait_for(Duration::from_secs(20), || {
        server_socket(sb.port, &stuck).is_none().then_some(())
    });
    assert!(
        gone.is_some(),
        "server socket still there: {:?}",
        server_socket(sb.port, &stuck)
    );
    stuck
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    let read = stuck.read_to_end(&mut rest);
    assert!(
        read.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the stuck client sees a reset: {read:?}"
    );
}

#[test]
fn head_over_8_kib_is_431() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for path in ["/", "/ws?user=u", "/healthz"] {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(8 * 1024)
        );
        assert_eq!(
            http_raw(sb.port, head.as_bytes()).unwrap().status,
            431,
            "{path}"
        );
    }
    // An endless head without its blank line is cut at the limit too.
    let mut s = TcpStream::connect(("127.0.0.1", sb.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(format!("GET / HTTP/1.1\r\nX: {}", "b".repeat(20_000)).as_bytes());
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 431"));
    // A head just under the limit is fine.
    let head = format!(
        "GET /healthz HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(7 * 1024)
    );
    assert_eq!(http_raw(sb.port, head.as_bytes()).unwrap().status, 200);
    // Past 8 KiB in many short lines.
    let many: String = (0..1000).map(|i| format!("X-{i}: y\r\n")).collect();
    let head = format!("GET / HTTP/1.1\r\n{many}\r\n");
    assert!(head.len() > 8 * 1024);
    assert_eq!(http_raw(sb.port, head.as_bytes()).unwrap().status, 431);
    assert_eq!(refused(&sb, "head_too_large"), 5.0);
    // Not HTTP at all.
    let r = http_raw(sb.port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(refused(&sb, "bad_request"), 1.0);
}

#[test]
fn a_head_under_8_kib_is_parsed_whatever_its_number_of_lines() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    // Header lines of `X-N: y`, as many as fit under 8 KiB, and a few counts below.
    let lines = |n: usize| -> String { (0..n).map(|i| format!("X-{i}: y\r\n")).collect() };
    let most = (1..)
        .take_while(|&n| format!("GET /healthz HTTP/1.1\r\n{}\r\n", lines(n)).len() <= 8 * 1024)
        .last()
        .unwrap();
    assert!(most > 700, "{most}");
    for n in [63, 64, 65, 100, most] {
        let head = format!("GET /healthz HTTP/1.1\r\n{}\r\n", lines(n));
        assert_eq!(
            http_raw(sb.port, head.as_bytes()).unwrap().status,
            200,
            "{n} header lines ({} bytes)",
            head.len()
        );
    }
    // The shortest header lines there are (`a:` and a bare LF), up to 8 KiB.
    let head = format!("GET /healthz HTTP/1.1\n{}\n", "a:\n".repeat(2700));
    assert!(head.len() <= 8 * 1024, "{}", head.len());
    assert_eq!(http_raw(sb.port, head.as_bytes()).unwrap().status, 200);
    // An upgrade among many lines, its key and version at the end.
    let (status, _keep) = upgrade_status(sb.port, "/ws?user=u", &lines(200));
    assert_eq!(status, 101);
    let up = upgrade_request("/ws?user=v", "");
    let (start, rest) = up.split_once("\r\n").unwrap();
    let (status, _keep) = raw_status(sb.port, format!("{start}\r\n{}{rest}", lines(300)));
    assert_eq!(status, 101);
    assert_eq!(refused(&sb, "head_too_large"), 0.0);
}

#[test]
fn a_repeated_key_or_version_is_a_malformed_upgrade() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let other = "AAAAAAAAAAAAAAAAAAAAAA==";
    let cases = [
        format!("Sec-WebSocket-Key: {KEY}\r\n"),
        format!("Sec-WebSocket-Key: {other}\r\n"),
        format!("sec-websocket-key: {other}\r\n"),
        "Sec-WebSocket-Version: 13\r\n".to_string(),
        "Sec-WebSocket-Version: 8\r\n".to_string(),
        "SEC-WEBSOCKET-VERSION: 13\r\n".to_string(),
    ];
    let before = refused(&sb, "bad_upgrade");
    for path in ["/ws?user=u", "/ws/admin?user=u&role=admin"] {
        for extra in &cases {
            // Read the head only: a wrong 101 keeps the socket open.
            let (status, _) = upgrade_status(sb.port, path, extra);
            assert_eq!(status, 400, "{path} with another {extra:?}");
        }
    }
    assert_eq!(refused(&sb, "bad_upgrade") - before, 12.0);
    // The same key split over two lines is still two.
    let two = upgrade_request("/ws?user=u", "").replace(
        &format!("Sec-WebSocket-Key: {KEY}\r\n"),
        &format!("Sec-WebSocket-Key: {KEY}\r\nX-Between: 1\r\nSec-WebSocket-Key: {KEY}\r\n"),
    );
    assert_eq!(raw_status(sb.port, &two).0, 400);
    // Once each still upgrades.
    assert_eq!(upgrade_status(sb.port, "/ws?user=u", "").0, 101);
}

/// `seatboard <args>` with `env`: its exit code and stderr, or `None` for the
/// code when it was still running after 10 s (killed then).
fn exit_of(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut child = seatboard_command()
        .args(args)
        .args(["--listen", &listen])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run seatboard");
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_malformed_allowed_origin_exits_2_naming_the_flag() {
    for value in [
        "notanorigin",
        "http://a.com/path",
        "https://good.example,http://a.com/path",
        "a.com",
        "ftp://a.com",
        "null",
        "*",
        "https://",
        "https://user@a.com",
        "https://a.com:99999",
        "https://a.com:",
        "https://a.com?x=1",
        "https://a.com#f",
        "https:/a.com",
    ] {
        let (code, err) = exit_of(&["demo", "--shards", "1", "--allowed-origins", value], &[]);
        assert_eq!(code, Some(2), "--allowed-origins {value:?}: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains("--allowed-origins"), "{value:?}: {err}");
        // The same from the environment twin.
        let (code, err) = exit_of(
            &["demo", "--shards", "1"],
            &[("SEATBOARD_ALLOWED_ORIGINS", value)],
        );
        assert_eq!(code, Some(2), "SEATBOARD_ALLOWED_ORIGINS={value:?}: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains("--allowed-origins"), "{value:?}: {err}");
    }
}

#[test]
fn allowed_origins_match_scheme_and_host_in_any_case() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "1",
        "--allowed-origins",
        "HTTPS://Other.example.edu, http://[::1]:8080/, http://LOCALHOST:3000",
    ]);
    for o in [
        "https://other.example.edu",
        "HTTPS://OTHER.EXAMPLE.EDU",
        "http://[::1]:8080",
        "http://localhost:3000",
    ] {
        let extra = format!("Origin: {o}\r\n");
        assert_eq!(upgrade_status(sb.port, "/ws?user=u", &extra).0, 101, "{o}");
    }
    for o in [
        "http://other.example.edu",
        "https://other.example.edu:8443",
        "https://other.example.edu.evil",
        "http://localhost:3001",
    ] {
        let extra = format!("Origin: {o}\r\n");
        assert_eq!(upgrade(sb.port, "/ws?user=u", &extra).status, 403, "{o}");
    }
}

#[test]
fn only_the_contracts_paths_are_routed() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for method in ["GET", "HEAD"] {
        for path in ["/index.html", "/index.htm", "/Index.html", "/admin/"] {
            let r = http_raw(
                sb.port,
                format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
            .unwrap();
            assert_eq!(r.status, 404, "{method} {path}");
        }
        for path in ["/", "/admin", "/healthz", "/api/courses"] {
            let r = http_raw(
                sb.port,
                format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
            .unwrap();
            assert_eq!(r.status, 200, "{method} {path}");
        }
    }
    let r = http_raw(sb.port, b"POST /index.html HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn absolute_form_targets_are_routed_by_their_path() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let port = sb.port;
    let get = |target: &str| {
        http_raw(
            port,
            format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes(),
        )
        .unwrap()
    };
    for (target, status) in [
        (format!("http://127.0.0.1:{port}/healthz"), 200),
        (format!("HTTP://127.0.0.1:{port}/readyz"), 200),
        ("https://seats.example.edu/api/courses".to_string(), 200),
        (format!("http://127.0.0.1:{port}/"), 200),
        (format!("http://127.0.0.1:{port}"), 200),
        (format!("http://127.0.0.1:{port}?course=CS101"), 200),
        (format!("http://127.0.0.1:{port}/nothing-here"), 404),
        (format!("http://127.0.0.1:{port}/index.html"), 404),
        // An http URI with no host is invalid (RFC 9110 section 4.2.1).
        ("http:///healthz".to_string(), 400),
    ] {
        assert_eq!(get(&target).status, status, "{target}");
    }
    let r = get(&format!("http://127.0.0.1:{port}/healthz"));
    assert!(r.body.contains("\"status\""), "{}", r.body);
    // A WebSocket upgrade in absolute form, its query kept.
    let mut ws = RawWs::connect(port, &format!("http://127.0.0.1:{port}/ws?user=abs"));
    let hello = ws.next_json(Duration::from_secs(10)).expect("hello");
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["user"], "abs");
    // Another method on a known path in absolute form: 405.
    let r = http_raw(
        port,
        format!("POST http://127.0.0.1:{port}/healthz HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 405);
}

#[test]
fn head_not_complete_in_5_s_is_dropped() {
    let sb = Seatboard::start(&["demo", "--shards", "2"]);
    let start = Instant::now();
    // One silent client and one that trickles a byte every 300 ms (slowloris).
    let mut silent = TcpStream::connect(("127.0.0.1", sb.port)).unwrap();
    let mut trickle = TcpStream::connect(("127.0.0.1", sb.port)).unwrap();
    // One that sends nothing at all: the kernel holds it for the listener's
    // deferred accept, and that second counts against its 5 s.
    let mute = TcpStream::connect(("127.0.0.1", sb.port)).unwrap();
    let mute = std::thread::spawn(move || {
        let mut mute = mute;
        mute.set_read_timeout(Some(Duration::from_secs(12)))
            .unwrap();
        let mut buf = Vec::new();
        let n = mute.read_to_end(&mut buf);
        (n.is_ok() || buf.is_empty(), buf, start.elapsed())
    });
    let t = std::thread::spawn(move || {
        let head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        for b in head.iter() {
            if trickle.write_all(std::slice::from_ref(b)).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        trickle
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = Vec::new();
        let _ = trickle.read_to_end(&mut buf);
        buf
    });
    silent
        .set_read_timeout(Some(Duration::from_secs(12)))
        .unwrap();
    let _ = silent.write_all(b"GET / HTTP/1.1\r\n");
    let mut buf = Vec::new();
    let n = silent.read_to_end(&mut buf);
    let took = start.elapsed();
    assert!(n.is_ok() || buf.is_empty(), "{n:?}");
    assert!(
        buf.is_empty(),
        "no answer, just dropped: {:?}",
        String::from_utf8_lossy(&buf)
    );
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(9),
        "dropped after {took:?}"
    );
    let got = t.join().unwrap();
    assert!(
        got.is_empty(),
        "the trickler got an answer: {:?}",
        String::from_utf8_lossy(&got)
    );
    let (closed, got, took) = mute.join().unwrap();
    assert!(closed && got.is_empty(), "the mute client got {got:?}");
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_millis(5800),
        "the mute client was dropped after {took:?}, not 5 s after its connect"
    );
    assert!(refused(&sb, "head_timeout") >= 3.0);
    // The server still serves.
    assert_eq!(http_get(sb.port, "/healthz").unwrap().status, 200);
}

#[test]
fn every_refusal_reason_is_exported() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let m = sb.metrics();
    for reason in [
        "rate_limited",
        "bad_upgrade",
        "bad_version",
        "origin",
        "unauthorized",
        "forbidden",
        "node_full",
        "draining",
        "user_cap",
        "head_too_large",
        "head_timeout",
        "repeated_origin",
    ] {
        let line = format!("seatboard_handshakes_refused_total{{reason=\"{reason}\"}} 0");
        assert!(m.lines().any(|l| l == line), "missing {line}");
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn jwt_on_serve_401_403_and_token_sources() {
    use seatboard::auth::mint;
    use shards::Role;
    let redis = RedisServer::start();
    let sb = Seatboard::start(&[
        "serve",
        "--redis",
        &redis.uri(),
        "--shards",
        "1",
        "--auth",
        "jwt",
        "--jwt-secret",
        TEST_SECRET,
    ]);
    let exp = unix_now() + 600;
    let student = mint(TEST_SECRET.as_bytes(), "stu", Role::Student, exp);
    let admin = mint(TEST_SECRET.as_bytes(), "boss", Role::Admin, exp);
    let parts: Vec<&str> = student.split('.').collect();
    let bad: Vec<(&str, String)> = vec![
        ("no token", String::new()),
        ("garbage", "Authorization: Bearer not.a.token\r\n".into()),
        (
            "wrong secret",
            format!(
                "Authorization: Bearer {}\r\n",
                mint(b"other", "stu", Role::Student, exp)
            ),
        ),
        (
            "expired",
            format!(
                "Authorization: Bearer {}\r\n",
                mint(
                    TEST_SECRET.as_bytes(),
                    "stu",
                    Role::Student,
                    unix_now() - 300
                )
            ),
        ),
        (
            "alg none",
            // {"alg":"none","typ":"JWT"}
            format!(
                "Authorization: Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.\r\n",
                parts[1]
            ),
        ),
        (
            "over-long",
            format!("Authorization: Bearer {student}{}\r\n", "A".repeat(5000)),
        ),
        ("?user= is not auth here", String::new()),
    ];
    for (what, extra) in &bad {
        let path = if what.starts_with("?user") {
            "/ws?user=stu"
        } else {
            "/ws"
        };
        assert_eq!(upgrade(sb.port, path, extra).status, 401, "{what}");
    }
    assert_eq!(refused(&sb, "unauthorized"), bad.len() as f64);
    // A student token on the admin feed: 403.
    let r = upgrade(
        sb.port,
        "/ws/admin",
        &format!("Authorization: Bearer {student}\r\n"),
    );
    assert_eq!(r.status, 403);
    assert_eq!(refused(&sb, "forbidden"), 1.0);
    // Each token source works; the hello names the token's subject and role.
    for (path, extra) in [
        (
            "/ws".to_string(),
            format!("Authorization: Bearer {student}\r\n"),
        ),
        (format!("/ws?token={student}"), String::new()),
        (
            "/ws".to_string(),
            format!("Cookie: a=b; seatboard_token={student}\r\n"),
        ),
        (
            "/ws/admin".to_string(),
            format!("Authorization: Bearer {admin}\r\n"),
        ),
    ] {
        assert_eq!(
            upgrade_status(sb.port, &path, &extra).0,
            101,
            "{path} {extra}"
        );
    }
    let mut ws = RawWs::connect(sb.port, &format!("/ws/admin?token={admin}"));
    let hello = ws.next_json(Duration::from_secs(10)).expect("hello");
    assert_eq!(hello["user"], "boss");
    assert_eq!(hello["role"], "admin");
    let mut ws = RawWs::connect(sb.port, &format!("/ws?token={student}"));
    let hello = ws.next_json(Duration::from_secs(10)).expect("hello");
    assert_eq!(hello["user"], "stu");
    assert_eq!(hello["role"], "student");
}

/// Header bytes that are no UTF-8 change no decision: another cookie's stray
/// Latin-1 byte leaves the token's cookie readable, an `Origin` that cannot be
/// read is allowed by no rule (403 where an origin is checked), and a second
/// `Host` (which the cookie's origin rule reads) is a malformed request (400).
#[test]
fn unreadable_header_bytes_and_a_second_host() {
    use seatboard::auth::mint;
    use shards::Role;
    let redis = RedisServer::start();
    let serve = |origins: &str| {
        Seatboard::start(&[
            "serve",
            "--redis",
            &redis.uri(),
            "--shards",
            "1",
            "--jwt-secret",
            TEST_SECRET,
            "--allowed-origins",
            origins,
        ])
    };
    let any = serve("");
    let listed = serve("https://uni.example.edu");
    let token = mint(
        TEST_SECRET.as_bytes(),
        "stu",
        Role::Student,
        unix_now() + 600,
    );
    let req = |path: &str, extra: &[u8]| {
        let head = upgrade_request(path, "");
        let head = head.strip_suffix("\r\n").expect("a head");
        [head.as_bytes(), extra, b"\r\n"].concat()
    };
    let cookie = format!("seatboard_token={token}");
    for path in ["/ws", "/sse?course=CS101"] {
        let want = if path == "/ws" { 101 } else { 200 };
        for extra in [
            format!("Cookie: city=Z\u{fc}rich; {cookie}\r\n").into_bytes(),
            [
                b"Cookie: city=Z\xfcrich; ".as_slice(),
                cookie.as_bytes(),
                b"\r\n",
            ]
            .concat(),
            [
                b"Cookie: ".as_slice(),
                cookie.as_bytes(),
                b"; city=Z\xfcrich\r\n",
            ]
            .concat(),
        ] {
            let (status, _keep) = raw_status(any.port, req(path, &extra));
            assert_eq!(status, want, "{path} {:?}", String::from_utf8_lossy(&extra));
        }
        // A request from `origin` with `credential` (a header line).
        let from = |port: u16, origin: &[u8], credential: &str| {
            let extra = [b"Origin: ", origin, b"\r\n", credential.as_bytes(), b"\r\n"].concat();
            raw_status(port, req(path, &extra)).0
        };
        // The cookie's token from a page on this host: upgrades; from an
        // origin that cannot be read: 403, as from another host.
        let by_cookie = format!("Cookie: {cookie}");
        assert_eq!(
            from(any.port, b"http://localhost", &by_cookie),
            want,
            "{path}"
        );
        assert_eq!(
            from(any.port, b"http://localhost\xff", &by_cookie),
            403,
            "{path}"
        );
        assert_eq!(
            from(any.port, b"http://evil.example", &by_cookie),
            403,
            "{path}"
        );
        // A listed origin's bearer token upgrades; the same origin with a
        // stray byte is not on the list.
        let by_bearer = format!("Authorization: Bearer {token}");
        let listed_origin = b"https://uni.example.edu";
        assert_eq!(from(listed.port, listed_origin, &by_bearer), want, "{path}");
        let stray = [listed_origin.as_slice(), b"\xff"].concat();
        assert_eq!(from(listed.port, &stray, &by_bearer), 403, "{path}");
    }
    assert_eq!(refused(&any, "origin"), 4.0);
    assert_eq!(refused(&listed, "origin"), 2.0);
    // A second Host, whichever comes first, on an upgrade or any request: 400.
    let evil =
        format!("Host: evil.example\r\nOrigin: https://evil.example\r\nCookie: {cookie}\r\n");
    let (status, _) = raw_status(any.port, req("/ws", evil.as_bytes()));
    assert_eq!(status, 400);
    let (status, _) = raw_status(
        any.port,
        "GET /healthz HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\n\r\n",
    );
    assert_eq!(status, 400);
    let (status, _) = raw_status(any.port, "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n");
    assert_eq!(status, 400);
    let (status, _) = raw_status(any.port, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, 200);
    assert_eq!(refused(&any, "bad_request"), 3.0);
}
