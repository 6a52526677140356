//! TLS and AUTH against a real `redis-server`: `rediss://` verified against
//! `--redis-ca` (a CA and server certificate the test makes with openssl), an
//! ACL user from the URI (the default user is off), and the refusals: an
//! untrusted certificate, a wrong password, bad Redis flag values.

use crate::common;
use crate::redis_util;
use crate::tls_util;

use common::*;
use redis_util::{client, read_until, watch};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tls_util::make_certs;

const USER: &str = "board";
const PASS: &str = "s3cret-pass";

/// A TLS-only redis-server with an ACL user, and the CA that signed its certificate.
struct TlsRedis {
    dir: PathBuf,
    server: RedisServer,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        let dir = std::env::temp_dir().join(format!(
            "seatboard-tls-{}-{}",
            std::process::id(),
            free_port()
        ));
        make_certs(&dir);
        let file = |name: &str| dir.join(name).display().to_string();
        let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.pem"));
        let user_pass = format!(">{PASS}");
        let port = free_port().to_string();
        // TLS only: `--port 0` after the wrapper's own `--port`.
        let server = RedisServer::on_port(
            port.parse().expect("port"),
            &[
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
                "--user",
                USER,
                "on",
                &user_pass,
                "~*",
                "&*",
                "+@all",
                "--user",
                "default",
                "off",
            ],
        );
        TlsRedis { dir, server }
    }

    fn port(&self) -> u16 {
        self.server.port
    }

    fn uri(&self) -> String {
        format!("rediss://{USER}:{PASS}@127.0.0.1:{}", self.server.port)
    }

    fn ca(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        self.server.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `seatboard publish ...` with `env`: (exit code, stderr).
fn publish(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = seatboard_command()
        .arg("publish")
        .args(["--course", "TLS101", "--section", "2", "--total", "30"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("publish");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn rediss_with_ca_and_acl_user_serves_and_publishes() {
    let r = TlsRedis::start();
    let uri = r.uri();
    let ca = r.ca();
    // The CA through the environment twin.
    let (code, err) = publish(
        &["--redis", &uri, "--taken", "5", "--version", "1"],
        &[("SEATBOARD_REDIS_CA", &ca)],
    );
    assert_eq!(code, 0, "{err}");
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--redis-ca",
        &ca,
        "--tick-ms",
        "50",
        "--shards",
        "1",
    ]);
    let mut ws = client(&sb, "user=t1");
    let a = watch(&mut ws, "TLS101");
    assert_eq!(seats_taken(&a, 2), Some(5), "state hash read over TLS: {a}");
    let (code, err) = publish(
        &[
            "--redis",
            &uri,
            "--redis-ca",
            &ca,
            "--taken",
            "6",
            "--version",
            "2",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let f = read_until(&mut ws, Duration::from_secs(10), |m| {
        m["type"] == "frame" && seats_taken(m, 2) == Some(6)
    });
    assert!(f.is_some(), "no live frame over TLS pub/sub");
    let h: Value =
        serde_json::from_str(&http_get(sb.port, "/healthz").expect("healthz").body).expect("json");
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["redis_mode"], "standalone", "{h}");
    // Presence went through the same authenticated TLS client.
    let n = wait_for(Duration::from_secs(10), || {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert", &ca, "-p", &r.port().to_string()])
            .args(["--user", USER, "--pass", PASS, "--no-auth-warning"])
            .args(["ZCARD", "presence:TLS101"])
            .output()
            .ok()?;
        (String::from_utf8_lossy(&out.stdout).trim() == "1").then_some(())
    });
    assert!(n.is_some(), "presence not written over TLS");
}

#[test]
fn untrusted_certificate_wrong_password_and_bad_flags_are_refused() {
    let r = TlsRedis::start();
    let uri = r.uri();
    let ca = r.ca();
    // System roots do not know the test CA.
    let (code, err) = publish(&["--redis", &uri, "--taken", "1"], &[]);
    assert_eq!(code, 1, "untrusted certificate accepted: {err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let bad = format!("rediss://{USER}:wrong@127.0.0.1:{}", r.port());
    let (code, err) = publish(&["--redis", &bad, "--redis-ca", &ca, "--taken", "1"], &[]);
    assert_eq!(code, 1, "wrong password accepted: {err}");
    assert!(
        err.contains("WRONGPASS") || err.contains("uthentication"),
        "{err}"
    );
    let first = |e: &str| e.lines().next().unwrap_or("").to_owned();
    for (args, env, flag) in [
        (vec!["--redis-mode", "sideways"], vec![], "--redis-mode"),
        (vec!["--pubsub", "loud"], vec![], "--pubsub"),
        (
            vec!["--redis-ca", "/nonexistent/ca.pem"],
            vec![],
            "--redis-ca",
        ),
        (vec!["--redis", "http://x"], vec![], "--redis"),
        (
            vec![],
            vec![("SEATBOARD_REDIS_MODE", "sideways")],
            "--redis-mode",
        ),
        (vec![], vec![("SEATBOARD_PUBSUB", "loud")], "--pubsub"),
    ] {
        let mut a = args.clone();
        a.extend(["--taken", "1"]);
        let (code, err) = publish(&a, &env);
        assert_eq!(code, 2, "{args:?} {env:?}: {err}");
        assert!(first(&err).contains(flag), "{args:?} {env:?}: {err}");
    }
    // serve refuses bad Redis flags the same way.
    let out = seatboard_command()
        .args([
            "serve",
            "--auth",
            "none",
            "--redis-ca",
            "/nonexistent/ca.pem",
        ])
        .output()
        .expect("serve");
    assert_eq!(out.status.code(), Some(2));
    assert!(first(&String::from_utf8_lossy(&out.stderr)).contains("--redis-ca"));
}
