//! The security refusals: weak JWT secrets at start, cookie tokens
//! from another site's page (cross-site WebSocket hijacking), and the headers
//! on pages and JSON answers (contract sections 1, 3 and 4).

use crate::common;
use common::*;
use seatboard::auth::mint;
use shards::Role;
use std::io::{Read, Write};
use std::net::TcpStream;
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

/// Sends an upgrade with this `Host` and extra header lines; the answer's status
/// (only the head is read: a 101 keeps the socket open).
fn upgrade_as(port: u16, path: &str, host: &str, extra: &str) -> u16 {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("send");
    let mut buf = Vec::new();
    let mut b = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    parse_response(&buf).expect("a response head").status
}

fn origin_refusals(sb: &Seatboard) -> f64 {
    sb.metric("seatboard_handshakes_refused_total{reason=\"origin\"}")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A `serve --auth jwt` node (no Redis needed for handshakes) plus an admin and
/// a student token.
fn jwt_node(extra: &[&str]) -> (Seatboard, String, String) {
    let redis = nowhere();
    let mut args = vec![
        "serve",
        "--redis",
        &redis,
        "--shards",
        "1",
        "--auth",
        "jwt",
        "--jwt-secret",
        TEST_SECRET,
    ];
    args.extend_from_slice(extra);
    let sb = Seatboard::start(&args);
    let exp = unix_now() + 600;
    let admin = mint(TEST_SECRET.as_bytes(), "boss", Role::Admin, exp);
    let student = mint(TEST_SECRET.as_bytes(), "stu", Role::Student, exp);
    (sb, admin, student)
}

#[test]
fn cookie_token_from_a_foreign_page_is_403_on_both_feeds() {
    let (sb, admin, student) = jwt_node(&[]);
    let host = format!("127.0.0.1:{}", sb.port);
    let evil = "Origin: https://evil.example\r\n";
    // The attack: an admin's cookie riding a foreign page's upgrade.
    let cases = [
        (
            "/ws/admin",
            format!("{evil}Cookie: seatboard_token={admin}\r\n"),
        ),
        ("/ws", format!("{evil}Cookie: seatboard_token={admin}\r\n")),
        (
            "/ws",
            format!("{evil}Cookie: a=1; seatboard_token={student}\r\n"),
        ),
        // Same host name, another port: another origin.
        (
            "/ws",
            format!(
                "Origin: http://127.0.0.1:{}\r\nCookie: seatboard_token={student}\r\n",
                sb.port + 1
            ),
        ),
        // Sandboxed frames and the like send the opaque origin.
        (
            "/ws",
            format!("Origin: null\r\nCookie: seatboard_token={student}\r\n"),
        ),
        // Refused at the origin step, before the token is even looked at.
        (
            "/ws",
            format!("{evil}Cookie: seatboard_token=not.a.token\r\n"),
        ),
    ];
    for (path, extra) in &cases {
        assert_eq!(
            upgrade_as(sb.port, path, &host, extra),
            403,
            "{path} {extra}"
        );
    }
    assert_eq!(origin_refusals(&sb), cases.len() as f64);
    assert_eq!(
        sb.metric("seatboard_handshakes_refused_total{reason=\"unauthorized\"}"),
        0.0
    );
}

#[test]
fn cookie_token_from_the_own_page_or_without_origin_is_101() {
    let (sb, admin, student) = jwt_node(&[]);
    let port = sb.port;
    for (path, host, origin, token) in [
        (
            "/ws/admin",
            format!("127.0.0.1:{port}"),
            format!("http://127.0.0.1:{port}"),
            &admin,
        ),
        (
            "/ws",
            format!("127.0.0.1:{port}"),
            format!("http://127.0.0.1:{port}"),
            &student,
        ),
        // Behind a TLS proxy that keeps Host: scheme ignored, default port implied.
        (
            "/ws",
            "seats.example.edu".into(),
            "https://seats.example.edu".into(),
            &student,
        ),
        (
            "/ws/admin",
            "Seats.Example.EDU:443".into(),
            "https://seats.example.edu".into(),
            &admin,
        ),
        (
            "/ws",
            format!("LOCALHOST:{port}"),
            format!("http://localhost:{port}"),
            &student,
        ),
    ] {
        let extra = format!("Origin: {origin}\r\nCookie: seatboard_token={token}\r\n");
        assert_eq!(
            upgrade_as(port, path, &host, &extra),
            101,
            "{path} Host {host} Origin {origin}"
        );
    }
    // No Origin: not a browser page; the cookie is honoured.
    let extra = format!("Cookie: seatboard_token={admin}\r\n");
    assert_eq!(upgrade_as(port, "/ws/admin", "anything", &extra), 101);
    assert_eq!(origin_refusals(&sb), 0.0);
}

#[test]
fn explicit_tokens_are_honoured_from_any_origin_when_the_list_is_empty() {
    let (sb, admin, student) = jwt_node(&[]);
    let host = format!("127.0.0.1:{}", sb.port);
    let evil = "Origin: https://evil.example\r\n";
    // Bearer wins over a cookie in the lookup order, so the cookie rule does not apply.
    for (path, extra) in [
        (
            "/ws/admin".to_string(),
            format!("{evil}Authorization: Bearer {admin}\r\n"),
        ),
        (
            "/ws".to_string(),
            format!("{evil}Authorization: Bearer {student}\r\n"),
        ),
        (format!("/ws?token={student}"), evil.to_string()),
        (
            format!("/ws/admin?token={admin}"),
            format!("{evil}Cookie: seatboard_token={student}\r\n"),
        ),
    ] {
        assert_eq!(
            upgrade_as(sb.port, &path, &host, &extra),
            101,
            "{path} {extra}"
        );
    }
    assert_eq!(origin_refusals(&sb), 0.0);
}

#[test]
fn an_empty_bearer_or_query_token_falls_through_to_the_cookie() {
    let (sb, admin, student) = jwt_node(&[]);
    let host = format!("127.0.0.1:{}", sb.port);
    let cookie = format!("Cookie: seatboard_token={admin}\r\n");
    for (path, extra) in [
        ("/ws/admin?token=", cookie.clone()),
        ("/ws/admin?x=1&token=&y=2", cookie.clone()),
        (
            "/ws/admin?token=",
            format!("Authorization: Bearer \r\n{cookie}"),
        ),
    ] {
        assert_eq!(
            upgrade_as(sb.port, path, &host, &extra),
            101,
            "{path} {extra}"
        );
    }
    // The token is the cookie's, so the cookie's origin rule applies to it.
    let evil = format!("Origin: https://evil.example\r\nCookie: seatboard_token={student}\r\n");
    assert_eq!(upgrade_as(sb.port, "/ws?token=", &host, &evil), 403);
    assert_eq!(
        sb.metric("seatboard_handshakes_refused_total{reason=\"unauthorized\"}"),
        0.0
    );
}

#[test]
fn a_non_empty_list_is_exact_for_every_token() {
    let (sb, admin, _) = jwt_node(&["--allowed-origins", "https://seats.example.edu"]);
    let host = format!("127.0.0.1:{}", sb.port);
    let own = format!("Origin: http://{host}\r\n");
    for extra in [
        format!("Origin: https://evil.example\r\nAuthorization: Bearer {admin}\r\n"),
        // The own host is not enough when a list is set.
        format!("{own}Cookie: seatboard_token={admin}\r\n"),
        format!("{own}Authorization: Bearer {admin}\r\n"),
    ] {
        assert_eq!(
            upgrade_as(sb.port, "/ws/admin", &host, &extra),
            403,
            "{extra}"
        );
    }
    assert_eq!(origin_refusals(&sb), 3.0);
    for extra in [
        format!("Origin: https://seats.example.edu\r\nCookie: seatboard_token={admin}\r\n"),
        format!("Origin: https://seats.example.edu\r\nAuthorization: Bearer {admin}\r\n"),
        format!("Cookie: seatboard_token={admin}\r\n"),
    ] {
        assert_eq!(
            upgrade_as(sb.port, "/ws/admin", &host, &extra),
            101,
            "{extra}"
        );
    }
}

/// The inline blocks of `tag` in `html`, exactly as served (the pages write tags in lower case).
fn blocks<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    html.split(open.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once(close.as_str()).map(|(body, _)| body))
        .collect()
}

fn sha256_source(text: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// One directive's value of a policy.
fn directive<'a>(csp: &'a str, name: &str) -> &'a str {
    csp.split(';')
        .map(str::trim)
        .find_map(|d| d.strip_prefix(name).map(str::trim))
        .unwrap_or_else(|| panic!("no {name} in {csp}"))
}

#[test]
fn pages_carry_a_hash_based_policy_and_no_framing() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for path in ["/", "/admin", "/?course=CS101"] {
        let r = http_get(sb.port, path).expect("page");
        assert_eq!(r.status, 200, "{path}");
        let csp = r
            .header("Content-Security-Policy")
            .unwrap_or_else(|| panic!("{path}: no Content-Security-Policy"));
        assert!(!csp.contains("unsafe-"), "{path}: {csp}");
        assert_eq!(directive(csp, "default-src"), "'none'");
        assert_eq!(directive(csp, "connect-src"), "'self'");
        assert_eq!(directive(csp, "frame-ancestors"), "'none'");
        assert_eq!(directive(csp, "base-uri"), "'none'");
        // Exactly the page's own inline blocks, each by its hash, next to 'self'.
        for (tag, name) in [("script", "script-src"), ("style", "style-src")] {
            let mut want: Vec<String> = vec!["'self'".into()];
            want.extend(blocks(&r.body, tag).into_iter().map(sha256_source));
            assert!(want.len() > 1, "{path}: no inline <{tag}> found");
            let got: Vec<&str> = directive(csp, name).split_whitespace().collect();
            assert_eq!(got, want, "{path}: {name}");
        }
        assert_eq!(
            r.header("X-Content-Type-Options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("Referrer-Policy"), Some("no-referrer"), "{path}");
        // HEAD gets the same policy.
        let head = http_raw(
            sb.port,
            format!("HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .expect("HEAD");
        assert_eq!(
            head.header("Content-Security-Policy"),
            Some(csp),
            "HEAD {path}"
        );
    }
}

#[test]
fn json_and_text_answers_are_nosniff_and_no_store() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for path in [
        "/healthz",
        "/api/courses",
        "/api/history?role=admin",
        "/metrics",
        "/readyz",
    ] {
        let r = http_get(sb.port, path).expect("answer");
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(
            r.header("X-Content-Type-Options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("Cache-Control"), Some("no-store"), "{path}");
        // No CORS: another site's page cannot read any answer.
        assert!(
            !r.headers
                .iter()
                .any(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-")),
            "{path}: {:?}",
            r.headers
        );
    }
    for path in ["/healthz", "/api/courses", "/api/history?role=admin"] {
        let r = http_get(sb.port, path).expect("answer");
        assert_eq!(r.header("Content-Type"), Some("application/json"), "{path}");
        serde_json::from_str::<serde_json::Value>(&r.body).expect("JSON body");
    }
    // Refusals too.
    let r = http_get(sb.port, "/nope").expect("404");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
}
