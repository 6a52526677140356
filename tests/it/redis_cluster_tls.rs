//! A TLS-only Redis Cluster (contract §1 `--redis`/`--redis-ca`, §2a): three
//! primaries that listen with TLS only, TLS on the cluster bus, a certificate
//! the test makes with openssl. `serve` with `rediss://` and `--redis-ca` in
//! cluster mode seeds and streams a course on each primary and writes presence
//! into the cluster; a CA that did not sign the nodes' certificate is refused.

use crate::cluster_util;
use crate::common;
use crate::redis_util;
use crate::tls_util;

use cluster_util::{courses_on, Cluster};
use common::*;
use redis_util::{client, read_until, watch};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tls_util::make_certs;

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        TempDir(std::env::temp_dir().join(format!(
            "seatboard-{what}-{}-{}",
            std::process::id(),
            free_port()
        )))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `seatboard publish --redis uri --redis-ca ca ...`: (exit code, stderr).
fn publish(uri: &str, ca: &Path, course: &str, taken: u32, version: u64) -> (i32, String) {
    let out = seatboard_command()
        .args(["publish", "--redis", uri, "--redis-ca"])
        .arg(ca)
        .args(["--course", course, "--section", "1", "--total", "50"])
        .args(["--taken", &taken.to_string()])
        .args(["--version", &version.to_string()])
        .output()
        .expect("publish");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tls_only_cluster_serves_a_course_on_every_primary_and_refuses_a_wrong_ca() {
    let certs = TempDir::new("cluster-certs");
    make_certs(&certs.0);
    let ca = certs.0.join("ca.pem");
    let cluster = Cluster::tls_only(&certs.0);
    let uri = cluster.uri();
    assert!(uri.starts_with("rediss://"), "{uri}");
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    // One course whose channel lives on each primary, its state written first.
    let courses: Vec<String> = primaries
        .iter()
        .map(|p| courses_on(p, 1).remove(0))
        .collect();
    for c in &courses {
        let (code, err) = publish(&uri, &ca, c, 3, 1);
        assert_eq!(code, 0, "publish over TLS: {err}");
    }
    let ca_flag = ca.display().to_string();
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--redis-ca",
        &ca_flag,
        "--redis-mode",
        "cluster",
        "--tick-ms",
        "50",
        "--shards",
        "2",
    ]);
    let mut ws = client(&sb, "user=tls1");
    for c in &courses {
        let answer = watch(&mut ws, c);
        assert_eq!(
            seats_taken(&answer, 1),
            Some(3),
            "seeded over TLS: {answer}"
        );
    }
    for (i, c) in courses.iter().enumerate() {
        let taken = 10 + i as u32;
        let (code, err) = publish(&uri, &ca, c, taken, 2);
        assert_eq!(code, 0, "{err}");
        let f = read_until(&mut ws, Duration::from_secs(10), |m| {
            m["type"] == "frame"
                && m["course"] == c.as_str()
                && seats_taken(m, 1) == Some(taken as u64)
        });
        assert!(f.is_some(), "{c}: no live frame over TLS sharded pub/sub");
    }
    // Every primary holds a sharded subscription (over TLS: the plain port is off).
    for (p, c) in primaries.iter().zip(&courses) {
        let channels = cluster.cli(p.port, &["PUBSUB", "SHARDCHANNELS"]);
        assert!(channels.contains(&format!("seats:{c}")), "{channels}");
    }
    // Presence went into the cluster through the same TLS client.
    for c in &courses {
        let zcard = wait_for(Duration::from_secs(10), || {
            let n = cluster.cli(
                cluster.any_port(),
                &["-c", "ZCARD", &format!("presence:{c}")],
            );
            (n == "1").then_some(())
        });
        assert!(zcard.is_some(), "{c}: presence not written over TLS");
    }
    let h = healthz_json(sb.port);
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["redis_mode"], "cluster", "{h}");
    assert_eq!(h["redis_nodes_up"], 3, "{h}");

    // A CA that did not sign the nodes' certificate: refused, and said so.
    let other = TempDir::new("other-ca");
    make_certs(&other.0);
    let wrong = other.0.join("ca.pem");
    let (code, err) = publish(&uri, &wrong, &courses[0], 4, 3);
    assert_eq!(code, 1, "a wrong CA was accepted: {err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let wrong_flag = wrong.display().to_string();
    let refused = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--redis-ca",
        &wrong_flag,
        "--redis-mode",
        "cluster",
        "--shards",
        "1",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    let h = healthz_json(refused.port);
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["redis"], false, "{h}");
    assert_eq!(h["redis_nodes_up"], 0, "{h}");
}
