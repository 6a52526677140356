//! Versions are integers 0..2^53 everywhere (PROTOCOL section 2): a hub
//! rejects a larger one as `schema`; `seatboard publish` and `simulate`
//! refuse one (and `publish` a payload over 64 KiB) with exit 2 naming the
//! flag, and the `Publisher` refuses and counts one, all before Redis.

use crate::common::*;
use crate::redis_util::*;
use seatboard::publisher::{Publisher, PublisherConfig};
use shards::snapshot::MAX_VERSION;
use shards::{Reject, Snapshot};
use std::process::Output;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn first_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines().next().unwrap_or("").to_string()
}

/// `seatboard publish` of CS101 section 1 with `extra` flags.
fn publish_cmd(uri: &str, extra: &[&str]) -> Output {
    seatboard_command()
        .args(["publish", "--redis", uri, "--course", "CS101"])
        .args(["--section", "1", "--total", "40", "--taken", "3"])
        .args(extra)
        .output()
        .expect("seatboard publish")
}

#[test]
fn publish_refuses_versions_past_2_pow_53_and_payloads_over_64_kib_before_redis() {
    let r = RedisServer::start();
    let uri = r.uri();
    for v in [
        "9007199254740993",
        "4611686018427387904",
        "-1",
        "1.5",
        "1e3",
    ] {
        let joined = format!("--version={v}");
        for args in [vec!["--version", v], vec![joined.as_str()]] {
            let out = publish_cmd(&uri, &args);
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            let line = first_line(&out);
            assert!(line.contains("'--version"), "{args:?}: {line}");
        }
    }
    let pad = format!(r#"{{"pad":"{}"}}"#, "x".repeat(64 * 1024));
    let out = publish_cmd(&uri, &["--seat-info", &pad, "--version", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let line = first_line(&out);
    assert!(line.contains("'--seat-info'"), "{line}");
    assert!(
        line.len() < 300,
        "the value is not echoed: {} bytes",
        line.len()
    );
    assert_eq!(r.cli(&["DBSIZE"]), "0", "nothing reached Redis");
    // A seat_info nested deeper than a hub takes, named for what it is.
    let nested = |d: usize| format!("{}1{}", r#"{"a":"#.repeat(d), "}".repeat(d));
    let out = publish_cmd(&uri, &["--seat-info", &nested(129), "--version", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let line = first_line(&out);
    assert!(
        line.contains("'--seat-info'") && line.contains("nested deeper than 128"),
        "{line}"
    );
    assert_eq!(r.cli(&["DBSIZE"]), "0", "nothing reached Redis");
    let out = publish_cmd(&uri, &["--seat-info", &nested(128), "--version", "5"]);
    assert!(out.status.success(), "{}", first_line(&out));
    r.cli(&["FLUSHALL"]);
    // The largest version there is, and a seat_info just under the limit.
    let out = publish_cmd(&uri, &["--version", "9007199254740992"]);
    assert!(out.status.success(), "{}", first_line(&out));
    let v: serde_json::Value =
        serde_json::from_str(&r.cli(&["HGET", "seatstate:CS101", "1"])).expect("JSON");
    assert_eq!(v["version"].as_u64(), Some(MAX_VERSION));
}

#[test]
fn simulate_refuses_a_run_whose_versions_would_pass_2_pow_53() {
    let r = RedisServer::start();
    let out = seatboard_command()
        .args(["simulate", "--redis", &r.uri(), "--courses", "2"])
        .args(["--rate", "1000000000", "--duration", "10000000"])
        .output()
        .expect("seatboard simulate");
    assert_eq!(out.status.code(), Some(2));
    let line = first_line(&out);
    assert!(line.contains("'--duration'"), "{line}");
    assert_eq!(r.cli(&["DBSIZE"]), "0", "nothing reached Redis");
}

#[test]
fn simulate_refuses_a_rate_or_duration_no_clock_can_hold() {
    let r = RedisServer::start();
    for (flag, value) in [("--rate", "1e-300"), ("--duration", "1e20")] {
        let out = seatboard_command()
            .args([
                "simulate",
                "--redis",
                &r.uri(),
                "--courses",
                "2",
                flag,
                value,
            ])
            .output()
            .expect("seatboard simulate");
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let line = first_line(&out);
        assert!(line.contains(&format!("for '{flag}")), "{line}");
    }
    assert_eq!(r.cli(&["DBSIZE"]), "0", "nothing reached Redis");
}

fn snap(section: u32, version: u64, seat_info: Option<&str>) -> Snapshot {
    Snapshot::build(
        "CS101".into(),
        section,
        40,
        3,
        seat_info,
        Some(version),
        None,
    )
}

#[test]
fn the_publisher_refuses_and_counts_what_a_hub_would_reject() {
    let r = RedisServer::start();
    let p = Publisher::start(PublisherConfig {
        redis: seatboard::redis::RedisFlags::new(&r.uri()),
        channel_prefix: "seats:".into(),
        state_prefix: "seatstate:".into(),
        queue: 64,
        state_ttl: None,
    })
    .expect("publisher");
    assert!(!p.publish(snap(1, MAX_VERSION + 1, None)));
    assert!(!p.publish(snap(1, u64::MAX, None)));
    let pad = format!(r#"{{"pad":"{}"}}"#, "x".repeat(64 * 1024));
    assert!(!p.publish(snap(2, 1, Some(&pad))));
    assert_eq!(
        (p.refused(Reject::Schema), p.refused(Reject::TooLarge)),
        (2, 1)
    );
    assert_eq!(p.refused_total(), 3);
    assert!(p.publish(snap(3, MAX_VERSION, None)));
    assert!(p.flush(T));
    assert_eq!((p.published(), p.dropped()), (1, 0));
    assert_eq!(r.cli(&["HKEYS", "seatstate:CS101"]), "3");
}

#[test]
fn a_hub_rejects_versions_past_2_pow_53_as_schema() {
    let r = RedisServer::start();
    let sb = serve(&r, &[]);
    let mut ws = client(&sb, "user=alice");
    watch(&mut ws, "CS101");
    let schema = "seatboard_ingest_rejected_total{reason=\"schema\"}";
    let before = sb.metric(schema);
    for v in ["9007199254740993", "-1", "2.5"] {
        let p = format!(
            r#"{{"course":"CS101","section":1,"total_seats":40,"seats_taken":3,"version":{v}}}"#
        );
        publish(&r, "CS101", &p);
    }
    publish(&r, "CS101", &payload("CS101", 2, 40, 3, MAX_VERSION));
    let mut saw_section_1 = false;
    read_until(&mut ws, T, |f| {
        saw_section_1 |= section(f, 1).is_some();
        section(f, 2).is_some()
    })
    .expect("section 2 on the board");
    assert!(!saw_section_1, "a version past 2^53 reached the board");
    eventually(T, "three schema rejects", || {
        sb.metric(schema) >= before + 3.0
    });
}
