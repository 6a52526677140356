//! The state hash never goes backwards (PROTOCOL section 2): `seatboard
//! publish` and the `Publisher` write it with the compare-and-set script, so
//! out-of-order publishers leave the newest version, equal versions are not
//! rewritten, entries without a version or not JSON are replaced, and a server
//! that lost the script (`SCRIPT FLUSH`, restart) gets it again without losing
//! a queued snapshot.

use crate::common::*;
use crate::redis_util::*;
use seatboard::publisher::{Publisher, PublisherConfig};
use serde_json::Value;
use shards::Snapshot;
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// `seatboard publish` of CS101 section 1 with `taken` seats and `version`.
fn publish(uri: &str, taken: u32, version: Option<u64>) -> Command {
    let mut c = seatboard_command();
    c.args([
        "publish",
        "--redis",
        uri,
        "--course",
        "CS101",
        "--section",
        "1",
    ])
    .args(["--total", "40", "--taken", &taken.to_string()])
    .stdout(Stdio::null());
    if let Some(v) = version {
        c.args(["--version", &v.to_string()]);
    }
    c
}

fn run(mut c: Command) {
    assert!(c.status().expect("seatboard publish").success());
}

/// The stored entry of CS101 section 1, parsed.
fn stored(r: &RedisServer) -> Value {
    serde_json::from_str(&r.cli(&["HGET", "seatstate:CS101", "1"])).expect("stored JSON")
}

#[test]
fn out_of_order_publishers_leave_the_newest_version() {
    let r = RedisServer::start();
    let uri = r.uri();
    run(publish(&uri, 40, Some(18)));
    run(publish(&uri, 39, Some(17)));
    let v = stored(&r);
    assert_eq!(
        (v["version"].as_u64(), v["seats_taken"].as_u64()),
        (Some(18), Some(40))
    );
    // Equal version: kept, not rewritten.
    run(publish(&uri, 1, Some(18)));
    assert_eq!(stored(&r)["seats_taken"].as_u64(), Some(40));
    // Forty shuffled concurrent publishers of versions 1..40.
    r.cli(&["DEL", "seatstate:CS101"]);
    let mut versions: Vec<u64> = (1..=40).collect();
    fastrand::shuffle(&mut versions);
    let children: Vec<_> = versions
        .iter()
        .map(|&v| publish(&uri, v as u32, Some(v)).spawn().expect("spawn"))
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    assert_eq!(stored(&r)["version"].as_u64(), Some(40));
    // A new viewer on a freshly started node sees version 40.
    let sb = serve(&r, &[]);
    let mut ws = client(&sb, "user=alice");
    let f = watch(&mut ws, "CS101");
    let s1 = section(&f, 1).expect("section 1");
    assert_eq!(
        (s1["version"].as_u64(), s1["seats_taken"].as_u64()),
        (Some(40), Some(40))
    );
}

#[test]
fn entries_without_an_integer_version_or_not_json_are_replaced() {
    let r = RedisServer::start();
    let uri = r.uri();
    for old in [
        "not json",
        "[1,2]",
        r#"{"seats_taken":3}"#,
        r#"{"version":"99"}"#,
        r#"{"version":99.5}"#,
    ] {
        r.cli(&["HSET", "seatstate:CS101", "1", old]);
        run(publish(&uri, 7, Some(5)));
        assert_eq!(stored(&r)["version"].as_u64(), Some(5), "over {old}");
    }
    // The Go field name counts as a version.
    r.cli(&["HSET", "seatstate:CS101", "1", r#"{"Version":9}"#]);
    run(publish(&uri, 7, Some(5)));
    assert_eq!(stored(&r)["Version"].as_u64(), Some(9));
    // Without a version: always replaces.
    run(publish(&uri, 8, None));
    let v = stored(&r);
    assert_eq!(
        (v["seats_taken"].as_u64(), v.get("version")),
        (Some(8), None)
    );
    // Exact at 2^53.
    r.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        r#"{"version":9007199254740992}"#,
    ]);
    run(publish(&uri, 7, Some(9007199254740991)));
    assert_eq!(stored(&r)["version"].as_u64(), Some(9007199254740992));
}

/// Runs the script as any selection API would (`EVAL`), for CS101 section 1
/// with `version` (decimal text); its reply.
fn eval(r: &RedisServer, version: &str) -> String {
    let payload = format!(
        r#"{{"course":"CS101","section":1,"total_seats":40,"seats_taken":1,"version":{version}}}"#
    );
    let source = seatboard::publish::script::SOURCE;
    r.cli(&[
        "EVAL",
        source,
        "1",
        "seatstate:CS101",
        "1",
        &payload,
        version,
    ])
}

#[test]
fn a_stored_version_past_2_pow_53_is_never_overwritten_by_a_lower_one() {
    let r = RedisServer::start();
    let raw = || r.cli(&["HGET", "seatstate:CS101", "1"]);
    // Written before versions were bounded: 2^62.
    let big = r#"{"course":"CS101","section":1,"total_seats":40,"seats_taken":40,"version":4611686018427387904}"#;
    r.cli(&["HSET", "seatstate:CS101", "1", big]);
    assert_eq!(eval(&r, "9007199254740993"), "0");
    assert_eq!(raw(), big);
    // `seatboard publish` at the largest version there is: kept as well.
    run(publish(&r.uri(), 1, Some(9007199254740992)));
    assert_eq!(raw(), big);
    // Exact, not as doubles: 2^62 + 1 is greater; 2^53 + 1 is not 2^53.
    assert_eq!(eval(&r, "4611686018427387904"), "0");
    assert_eq!(eval(&r, "4611686018427387905"), "1");
    assert_eq!(stored(&r)["version"].as_u64(), Some(4611686018427387905));
    r.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        r#"{"version":9007199254740993}"#,
    ]);
    assert_eq!(eval(&r, "9007199254740992"), "0");
    assert_eq!(raw(), r#"{"version":9007199254740993}"#);
    // The Go field name, an exponent, and a version field inside seat_info
    // that is not the section's.
    let go = r#"{"seat_info":{"version":1},"Version":18446744073709551617}"#;
    r.cli(&["HSET", "seatstate:CS101", "1", go]);
    assert_eq!(eval(&r, "18446744073709551616"), "0");
    assert_eq!(raw(), go);
    r.cli(&["HSET", "seatstate:CS101", "1", r#"{"version":1e20}"#]);
    assert_eq!(eval(&r, "99999999999999999999"), "0");
    assert_eq!(eval(&r, "100000000000000000001"), "1");
    // A version argument that is not an integer is an error, not a write.
    r.cli(&["HSET", "seatstate:CS101", "1", big]);
    // A sign with no e is no exponent ("17+5" is not 17e5), nor an e with no digits.
    for bad in ["1.5", "17+5", "17-5", "17e", "17e+"] {
        let answer = eval(&r, bad);
        assert!(answer.contains("not an integer"), "{bad}: {answer}");
    }
    assert_eq!(raw(), big);
}

#[test]
fn publish_script_prints_the_script_and_its_sha1() {
    let r = RedisServer::start();
    let out = seatboard_command()
        .arg("publish-script")
        .output()
        .expect("run");
    assert!(out.status.success());
    let sha = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(r.cli(&["SCRIPT", "LOAD", &text]), sha);
    assert_eq!(text, seatboard::publish::script::SOURCE);
}

fn snap(version: u64) -> Snapshot {
    Snapshot::build(
        "CS101".into(),
        1,
        40,
        version as u32,
        None,
        Some(version),
        None,
    )
}

#[test]
fn noscript_after_flush_and_restart_loses_no_queued_snapshot() {
    let mut r = RedisServer::start();
    let p = Publisher::start(PublisherConfig {
        redis: seatboard::redis::RedisFlags::new(&r.uri()),
        channel_prefix: "seats:".into(),
        state_prefix: "seatstate:".into(),
        queue: 64,
        state_ttl: None,
    })
    .expect("publisher");
    assert!(p.publish(snap(1)));
    assert!(p.flush(T));
    assert_eq!(stored(&r)["version"].as_u64(), Some(1));
    r.cli(&["SCRIPT", "FLUSH"]);
    assert!(p.publish(snap(2)));
    assert!(p.flush(T));
    assert_eq!((p.published(), p.dropped()), (2, 0));
    assert_eq!(stored(&r)["version"].as_u64(), Some(2));
    r.kill();
    r.restart();
    wait_for(T, || (r.cli(&["PING"]) == "PONG").then_some(())).expect("redis back");
    assert!(p.publish(snap(3)));
    assert!(p.flush(T));
    assert_eq!(stored(&r)["version"].as_u64(), Some(3));
    assert_eq!((p.published(), p.dropped()), (3, 0));
}

/// What a `MONITOR` connection to `r` saw of the state script and the
/// channel (`EVALSHA`, `EVAL`, `PUBLISH`, and the script's own `HSET`) while
/// `act` ran, in order, each as its command name.
fn monitored(r: &RedisServer, act: impl FnOnce()) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", r.port)).expect("monitor connection");
    conn.set_read_timeout(Some(T)).expect("read timeout");
    conn.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut lines = BufReader::new(conn.try_clone().expect("clone"));
    let mut ok = String::new();
    lines.read_line(&mut ok).expect("MONITOR answered");
    assert_eq!(ok.trim(), "+OK");
    act();
    // The marker's own line ends what `act` sent.
    r.cli(&["ECHO", "monitored-end"]);
    let mut seen = Vec::new();
    for line in lines.lines() {
        let line = line.expect("a MONITOR line");
        if line.contains("\"monitored-end\"") {
            break;
        }
        // +<time> [<db> <client or lua>] "NAME" "arg" ...
        let Some((_, rest)) = line.split_once("] \"") else {
            continue;
        };
        let name = rest
            .split('"')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        if ["EVALSHA", "EVAL", "PUBLISH", "HSET"].contains(&name.as_str()) {
            seen.push(name);
        }
    }
    seen
}

#[test]
fn a_lost_script_publishes_nothing_before_the_hash_holds_it_nor_twice() {
    let r = RedisServer::start();
    let uri = r.uri();
    run(publish(&uri, 1, Some(1)));
    // The server loses the script: the next publish's EVALSHA is refused.
    r.cli(&["SCRIPT", "FLUSH"]);
    let seen = monitored(&r, || run(publish(&uri, 2, Some(2))));
    assert_eq!(
        seen,
        ["EVALSHA", "EVAL", "HSET", "PUBLISH"],
        "hash before channel, once"
    );
    assert_eq!(stored(&r)["version"].as_u64(), Some(2));
    // A hash that cannot be written (a key of another type): nothing published.
    r.cli(&["DEL", "seatstate:CS101"]);
    r.cli(&["SET", "seatstate:CS101", "not a hash"]);
    let seen = monitored(&r, || {
        let status = publish(&uri, 3, Some(3))
            .stderr(Stdio::null())
            .status()
            .expect("seatboard publish");
        assert!(!status.success(), "a failed hash write fails the publish");
    });
    assert!(
        !seen.contains(&"PUBLISH".to_owned()),
        "published without its hash: {seen:?}"
    );
}

/// `seatboard publish` of CS101 section 1 into a cluster (the script on the
/// hash's slot owner, then SPUBLISH); true on exit 0.
fn cluster_publish(c: &crate::cluster_util::Cluster, taken: u32, version: u64) -> bool {
    publish(&c.uri(), taken, Some(version))
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn cluster_state_hash_never_goes_backwards() {
    let c = crate::cluster_util::Cluster::primaries_only();
    let owner = c.owner("seatstate:CS101").port;
    let read = || -> Value {
        serde_json::from_str(&c.cli(owner, &["HGET", "seatstate:CS101", "1"])).expect("JSON")
    };
    assert!(cluster_publish(&c, 40, 18));
    assert!(cluster_publish(&c, 39, 17));
    assert_eq!(read()["version"].as_u64(), Some(18));
    // The owner lost the script: loaded again, nothing lost.
    c.cli(owner, &["SCRIPT", "FLUSH"]);
    let mut versions: Vec<u64> = (19..=40).collect();
    fastrand::shuffle(&mut versions);
    let children: Vec<_> = versions
        .iter()
        .map(|&v| publish(&c.uri(), v as u32, Some(v)).spawn().expect("spawn"))
        .collect();
    for mut ch in children {
        assert!(ch.wait().expect("wait").success());
    }
    assert_eq!(read()["version"].as_u64(), Some(40));
}

#[test]
fn a_node_keeps_the_newer_version_over_an_older_state_entry_and_counts_it() {
    let r = RedisServer::start();
    let sb = serve(&r, &[]);
    assert_eq!(sb.metric("seatboard_state_stale_total"), 0.0);
    let mut ws = client(&sb, "user=alice");
    watch(&mut ws, "CS101");
    run(publish(&r.uri(), 40, Some(20)));
    wait_for(T, || {
        let f = next_of_type(&mut ws, "frame", Duration::from_millis(500))?;
        (section(&f, 1)?["version"].as_u64() == Some(20)).then_some(())
    })
    .expect("version 20 on the board");
    // An out-of-order publisher with a plain HSET, then a reread (reconnect).
    r.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        r#"{"course":"CS101","section":1,"total_seats":40,"seats_taken":39,"version":10}"#,
    ]);
    r.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    wait_for(T, || {
        (sb.metric("seatboard_state_stale_total") >= 1.0).then_some(())
    })
    .expect("the stale entry counted");
    // A new viewer on this node still sees the newer version.
    let mut ws2 = client(&sb, "user=bob");
    let f = watch(&mut ws2, "CS101");
    assert_eq!(
        section(&f, 1).expect("section 1")["version"].as_u64(),
        Some(20)
    );
}
