//! Redis SIGKILLed and restarted on the same port: the hub stays up, reports
//! `degraded`, clients stay connected, and after Redis returns every watched
//! course is resubscribed and reseeded from its state hash.

use crate::common;
use crate::redis_util;
use common::*;
use redis_util::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn health(port: u16) -> serde_json::Value {
    http_get(port, "/healthz")
        .ok()
        .and_then(|r| serde_json::from_str(&r.body).ok())
        .unwrap_or_default()
}

#[test]
fn clients_survive_a_redis_restart_and_get_fresh_state() {
    let dir = std::env::temp_dir().join(format!("seatboard-reconnect-{}", std::process::id()));
    // Its data directory is `dir`, so a restart reloads `SAVE`d data.
    let mut redis = RedisServer::start_in(&dir, &[]);
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        &payload("CS101", 1, 40, 5, 1),
    ]);
    let sb = serve(&redis, &[]);
    let mut ws = client(&sb, "user=alice");
    let f = watch(&mut ws, "CS101");
    assert_eq!(section(&f, 1).unwrap()["version"], 1);
    eventually(T, "subscribed", || channels(&redis) == ["seats:CS101"]);

    // The state moves on in the hash only (no PUBLISH reaches the hub), and is
    // saved so the restarted Redis has it: only a reseed can deliver it.
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "1",
        &payload("CS101", 1, 40, 33, 7),
    ]);
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "2",
        &payload("CS101", 2, 20, 20, 3),
    ]);
    assert_eq!(redis.cli(&["SAVE"]), "OK");
    redis.kill();

    eventually(T, "degraded while Redis is down", || {
        let h = health(sb.port);
        h["status"] == "degraded" && h["redis"] == false
    });
    // Down for a while: several backoff rounds.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(health(sb.port)["status"], "degraded");

    redis.restart();
    let back = Instant::now();
    let fresh = read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 1).is_some_and(|s| s["version"] == 7)
    })
    .expect("fresh state on the same connection after Redis returned");
    let took = back.elapsed();
    println!("reconnect freshness: fresh frame {took:?} after Redis accepted connections again");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(section(&fresh, 1).unwrap()["seats_taken"], 33);
    eventually(T, "ok again", || health(sb.port)["status"] == "ok");
    eventually(T, "resubscribed", || channels(&redis) == ["seats:CS101"]);
    assert!(sb.metric("seatboard_redis_reconnects_total") >= 1.0);
    // Live frames flow again.
    publish(&redis, "CS101", &payload("CS101", 2, 20, 19, 4));
    read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 2).is_some_and(|s| s["version"] == 4)
    })
    .expect("live frame after the restart");
}

#[test]
fn serve_starts_without_redis_and_catches_up() {
    let mut redis = RedisServer::start();
    redis.kill();
    let sb = serve(&redis, &[]);
    let h = health(sb.port);
    assert_eq!(h["status"], "degraded");
    // `auto` with no seed answering yet: the field is there, not a cluster (yet).
    assert_eq!(h["redis_mode"], "standalone", "{h}");
    let mut ws = client(&sb, "user=alice");
    let f = watch(&mut ws, "CS101");
    assert_eq!(f["sections"], serde_json::json!([]));
    redis.restart();
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "0",
        &payload("CS101", 0, 10, 1, 1),
    ]);
    eventually(T, "ok", || health(sb.port)["status"] == "ok");
    assert_eq!(health(sb.port)["redis_mode"], "standalone");
    eventually(T, "subscribed", || channels(&redis) == ["seats:CS101"]);
    publish(&redis, "CS101", &payload("CS101", 0, 10, 2, 2));
    read_until(&mut ws, T, |m| {
        m["type"] == "frame" && section(m, 0).is_some_and(|s| s["version"] == 2)
    })
    .expect("frames once Redis is there");
}
