//! Presence in Redis sorted sets: distinct users per course, prompt drops,
//! one global count across nodes, and a killed node's viewers expiring by TTL.

use crate::common;
use crate::redis_util;
use common::*;
use redis_util::*;
use serde_json::json;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// Reads presence messages for `course` until one says `n`.
fn viewers_become(ws: &mut Ws, course: &str, n: u64, timeout: Duration) -> bool {
    read_until(ws, timeout, |m| {
        m["type"] == "presence" && m["course"] == course && m["viewers"] == n
    })
    .is_some()
}

#[test]
fn same_user_counts_once_second_user_twice_leaving_drops() {
    let redis = RedisServer::start();
    let sb = serve(&redis, &["--presence-tick-ms", "200"]);
    let mut a1 = client(&sb, "user=alice");
    let mut a2 = client(&sb, "user=alice");
    watch(&mut a1, "CS101");
    watch(&mut a2, "CS101");
    assert!(viewers_become(&mut a1, "CS101", 1, T));
    // (That first count is the node's own, sent with the watch answer: the
    // member's write lands within a presence batch.)
    let card = wait_for(T, || {
        let n = redis.cli(&["ZCARD", "presence:CS101"]);
        (n != "0").then_some(n)
    });
    assert_eq!(card.as_deref(), Some("1"), "one member for two sockets");
    let mut b = client(&sb, "user=bob");
    watch(&mut b, "CS101");
    assert!(viewers_become(&mut a1, "CS101", 2, T), "second user counts");
    assert!(viewers_become(&mut b, "CS101", 2, T));

    // Roster for an admin: global ids.
    let mut admin = ws_connect(sb.port, "/ws/admin?user=adm&role=admin").expect("admin");
    next_json(&mut admin).expect("hello");
    send_json(&mut admin, json!({"op":"roster","course":"CS101"}));
    let r = next_of_type(&mut admin, "roster", T).expect("roster");
    assert_eq!(r["total"], 2);
    assert_eq!(r["viewers"], json!(["alice", "bob"]));
    drop(admin);

    // Bob leaves: the drop shows within about a presence tick.
    let left = Instant::now();
    let _ = b.close(None);
    drop(b);
    assert!(viewers_become(&mut a1, "CS101", 1, T));
    let took = left.elapsed();
    println!("presence drop seen after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // One of alice's sockets leaving does not remove her.
    send_json(&mut a2, json!({"op":"unwatch","course":"CS101"}));
    std::thread::sleep(Duration::from_millis(600)); // three presence ticks: nothing may change
    assert_eq!(redis.cli(&["ZSCORE", "presence:CS101", "bob"]), "");
    assert!(!redis.cli(&["ZSCORE", "presence:CS101", "alice"]).is_empty());
}

#[test]
fn two_nodes_share_the_count_and_a_killed_node_expires() {
    let redis = RedisServer::start();
    let flags = ["--presence-tick-ms", "200", "--presence-ttl-ms", "1500"];
    let a = serve(&redis, &flags);
    let mut b = serve(&redis, &flags);
    let mut wa = client(&a, "user=alice");
    let mut wb = client(&b, "user=bob");
    watch(&mut wa, "CS101");
    watch(&mut wb, "CS101");
    assert!(viewers_become(&mut wa, "CS101", 2, T), "node A sees both");
    assert!(viewers_become(&mut wb, "CS101", 2, T), "node B sees both");
    // Both still 2 after several refreshes (TTL/2 = 750 ms).
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(redis.cli(&["ZCARD", "presence:CS101"]), "2");

    // SIGKILL node B: no cleanup runs; bob falls out after the TTL.
    let killed = Instant::now();
    b.signal(libc::SIGKILL);
    b.wait_exit(T).expect("B died");
    assert!(viewers_become(&mut wa, "CS101", 1, T), "bob expired");
    let took = killed.elapsed();
    println!("killed node's viewer gone after {took:?} (ttl 1.5 s)");
    assert!(took < Duration::from_secs(4), "{took:?}");
}

#[test]
fn a_killed_nodes_presence_key_carries_a_ttl_and_is_gone_one_ttl_later() {
    let redis = RedisServer::start();
    let flags = ["--presence-tick-ms", "200", "--presence-ttl-ms", "2000"];
    let mut sb = serve(&redis, &flags);
    let mut ws = client(&sb, "user=carol");
    watch(&mut ws, "CS303");
    assert!(viewers_become(&mut ws, "CS303", 1, T));
    let pttl = |redis: &RedisServer| -> i64 {
        redis
            .cli(&["PTTL", "presence:CS303"])
            .trim()
            .parse()
            .unwrap_or(-3)
    };
    // (The first count comes with the watch answer: the member's write
    // lands within a presence batch.)
    wait_for(T, || (pttl(&redis) > 0).then_some(())).expect("the member written");
    // The key's TTL is the presence TTL, renewed with every re-score (every
    // TTL/2): over three renewals it never falls to 0 nor goes past the TTL.
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        let t = pttl(&redis);
        assert!(t > 0 && t <= 2000, "PTTL {t}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed = Instant::now();
    sb.signal(libc::SIGKILL);
    sb.wait_exit(T).expect("killed");
    assert!(
        pttl(&redis) > 0,
        "the key outlives its node only by its TTL"
    );
    let gone = wait_for(T, || {
        (redis.cli(&["EXISTS", "presence:CS303"]) == "0").then_some(())
    });
    let took = killed.elapsed();
    println!("a killed node's presence key gone after {took:?} (TTL 2 s)");
    assert!(
        gone.is_some(),
        "the presence key stayed: PTTL {}",
        pttl(&redis)
    );
    assert!(took < Duration::from_secs(4), "{took:?}");
}

/// A viewer and the count it was last shown.
struct Shown {
    ws: Ws,
    count: u64,
}

/// Connects `user` to `sb`, watches `course` and returns it with the count
/// of its watch answer.
fn watch_answer(sb: &Seatboard, user: &str, course: &str) -> Shown {
    let mut ws = client(sb, &format!("user={user}"));
    watch(&mut ws, course);
    let p = read_until(&mut ws, T, |m| {
        m["type"] == "presence" && m["course"] == course
    })
    .expect("the watch answer's count");
    let count = p["viewers"].as_u64().expect("a count");
    Shown { ws, count }
}

/// Reads until the viewer has been shown `n` (at once if it was).
fn shown_becomes(v: &mut Shown, course: &str, n: u64) -> bool {
    if v.count == n {
        return true;
    }
    read_until(&mut v.ws, T, |m| {
        if m["type"] == "presence" && m["course"] == course {
            v.count = m["viewers"].as_u64().unwrap_or(u64::MAX);
        }
        v.count == n
    })
    .is_some()
}

#[test]
fn a_watch_answer_counts_the_watching_user_with_the_other_nodes_and_shards_viewers() {
    let redis = RedisServer::start();
    let flags = ["--presence-tick-ms", "200", "--shards", "2"];
    let nodes = [serve(&redis, &flags), serve(&redis, &flags)];
    let course = "PW101";
    // One viewer on each node, so both nodes count the course.
    let mut viewers = vec![watch_answer(&nodes[0], "u1", course)];
    assert_eq!(viewers[0].count, 1);
    viewers.push(watch_answer(&nodes[1], "u2", course));
    for v in &mut viewers {
        assert!(shown_becomes(v, course, 2), "both nodes count both");
    }
    // Each new user, on one node then the other (and on either shard), is
    // answered with every distinct user watching then, itself included,
    // though the others watch on the other node or shard. Before each, every
    // viewer has been shown the number then (so each node's last count has
    // every earlier user).
    for n in 3..=10u64 {
        let sb = &nodes[n as usize % 2];
        let v = watch_answer(sb, &format!("u{n}"), course);
        assert_eq!(v.count, n, "u{n}'s watch answer");
        viewers.push(v);
        for (i, v) in viewers.iter_mut().enumerate() {
            assert!(shown_becomes(v, course, n), "viewer u{} shown {n}", i + 1);
        }
    }
}

#[test]
fn a_watch_answer_counts_the_node_s_other_shard_without_waiting_for_a_tick() {
    // No presence tick in the test's time: what a watch answer knows of the
    // other shard's viewers comes with the node's join writes, each of which
    // counts the course again.
    let redis = RedisServer::start();
    let sb = serve(&redis, &["--presence-tick-ms", "60000", "--shards", "2"]);
    let course = "SH101";
    let writes = |sb: &Seatboard| sb.metric("seatboard_presence_pipeline_seconds_count");
    let mut viewers = Vec::new();
    for n in 1..=10u64 {
        let before = writes(&sb);
        let v = watch_answer(&sb, &format!("u{n}"), course);
        // Each user on whichever shard the kernel picked: the answer counts
        // every earlier one, on this shard or the other.
        assert_eq!(v.count, n, "u{n}'s watch answer");
        viewers.push(v);
        // Its join written and counted, the counts with both shards.
        let written = wait_for(T, || (writes(&sb) > before).then_some(()));
        assert!(written.is_some(), "u{n}'s join was not written");
    }
    assert_eq!(redis.cli(&["ZCARD", &format!("presence:{course}")]), "10");
}

#[test]
fn a_course_s_first_viewer_on_a_node_is_answered_with_the_other_node_s_viewers() {
    // The count of a course new to a node is read with its first viewer's
    // write; the course's seed (subscribe, then read) races it, and the
    // answer waits for the count. Redis here is no distance away, so the
    // seed often comes first.
    let redis = RedisServer::start();
    let nodes = [serve(&redis, &[]), serve(&redis, &[])];
    for k in 0..5 {
        let course = format!("FIRSTN{k}");
        let first = watch_answer(&nodes[0], "u1", &course);
        assert_eq!(first.count, 1);
        let second = watch_answer(&nodes[1], "u2", &course);
        assert_eq!(
            second.count, 2,
            "{course}: u2, the course's first viewer on the second node, and u1"
        );
    }
}

#[test]
fn a_watch_answer_counts_a_user_watching_elsewhere_once_and_no_viewer_who_left() {
    // The count a watch answer shows is read from Redis after the viewer's
    // own join was written: a user already counted on another shard or node
    // is not one more, and viewers who left since the last presence tick
    // (a minute here) are not in it.
    let redis = RedisServer::start();
    let flags = ["--presence-tick-ms", "60000", "--shards", "2"];
    let nodes = [serve(&redis, &flags), serve(&redis, &flags)];
    let course = "ONCE101";
    let first = watch_answer(&nodes[0], "dave", course);
    assert_eq!(first.count, 1);
    // Dave's other tabs on both nodes, whichever shard each lands on.
    let mut tabs = vec![first];
    for i in 0..6 {
        let tab = watch_answer(&nodes[i % 2], "dave", course);
        assert_eq!(tab.count, 1, "dave's tab {i}: dave once");
        tabs.push(tab);
    }
    // Five users come on the first node and leave; the node has counted
    // them (each answer read with its join), and no tick counts again.
    let mut gone: Vec<Shown> = (0..5)
        .map(|i| watch_answer(&nodes[0], &format!("g{i}"), course))
        .collect();
    assert_eq!(gone.last().map(|v| v.count), Some(6));
    for v in &mut gone {
        let _ = v.ws.close(None);
    }
    drop(gone);
    let key = format!("presence:{course}");
    let left = wait_for(T, || (redis.cli(&["ZCARD", &key]) == "1").then_some(()));
    assert!(left.is_some(), "the leaves were not written");
    for node in &nodes {
        let erin = watch_answer(node, "erin", course);
        assert_eq!(erin.count, 2, "dave and erin, on either node");
    }
}

#[test]
fn a_presence_key_that_is_no_sorted_set_leaves_the_other_courses_counted() {
    let redis = RedisServer::start();
    redis.cli(&["SET", "presence:PSTR1", "x"]);
    let flags = ["--presence-tick-ms", "200"];
    let nodes = [serve(&redis, &flags), serve(&redis, &flags)];
    // a watches the stray course and a real one on the first node; b the
    // real one on the second: the first node's counts must still move.
    let mut a = client(&nodes[0], "user=a");
    watch(&mut a, "PSTR1");
    let mut a = Shown { count: 0, ws: a };
    watch(&mut a.ws, "POK1");
    let mut b = watch_answer(&nodes[1], "b", "POK1");
    assert!(shown_becomes(&mut a, "POK1", 2), "the first node counts b");
    assert!(shown_becomes(&mut b, "POK1", 2));
    let members = redis.cli(&["ZRANGE", "presence:POK1", "0", "-1"]);
    assert_eq!(members.lines().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(
        redis.cli(&["TYPE", "presence:PSTR1"]),
        "string",
        "left alone"
    );
    // Each refused write is counted (the first node writes a's join there).
    let errors = metric_value(&nodes[0].metrics(), "seatboard_presence_errors_total");
    assert!(errors >= 1.0, "the refused write is counted: {errors}");
}
