//! Sharded pub/sub on a Redis Cluster whose node user must `AUTH`, with two of
//! its three primaries hung (each behind a blackholed proxy: the connection
//! is accepted, `AUTH` never answered, so a dial to it waits out its 500 ms
//! connect deadline): just after each of three hung dials gives up (the
//! proxy sees it close), a new channel of the third primary (whose
//! connection is open) is subscribed at once, held up neither by the retries
//! nor by the slot-map reread they ask for; and its course gets its first
//! board and its live snapshots.
use crate::common::*;
use crate::redis_util::*;
use serde_json::json;
use std::time::{Duration, Instant};
use testkit::cluster_util::{courses_on, ProxiedCluster};

const T: Duration = Duration::from_secs(10);
const USER: &str = "seatboard";
const PASS: &str = "dial-test-secret";

#[test]
fn a_hung_primarys_dial_holds_up_no_other_primarys_channels() {
    let pc = ProxiedCluster::primaries_only(Duration::ZERO);
    // A user that must AUTH (the default user stays open for the test's own calls).
    for n in &pc.cluster.nodes {
        let ok = pc.cluster.cli(
            n.port,
            &[
                "ACL",
                "SETUSER",
                USER,
                "on",
                &format!(">{PASS}"),
                "~*",
                "&*",
                "+@all",
            ],
        );
        assert_eq!(ok.trim(), "OK", "ACL SETUSER on {}", n.port);
    }
    let primaries = pc.cluster.primaries();
    let (near, holes) = (&primaries[0], &primaries[1..]);
    // One course of the live primary watched before the others hang, then
    // one after each of three hung dials' failures.
    let mut on_near = courses_on(near, 4);
    let warm = on_near.remove(0);
    let gone: Vec<String> = holes.iter().map(|h| courses_on(h, 1).remove(0)).collect();
    let uri = pc
        .proxies
        .iter()
        .map(|p| format!("redis://{USER}:{PASS}@127.0.0.1:{}", p.port()))
        .collect::<Vec<_>>()
        .join(",");
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--redis-mode",
        "cluster",
        "--tick-ms",
        "50",
    ]);
    wait_for(Duration::from_secs(15), || {
        (healthz_json(sb.port)["redis"] == true).then_some(())
    })
    .expect("the node's Redis connection did not come up");
    let near_port = pc.direct_port(near.port);
    let subscribed_on_near = |course: &str| {
        let channel = format!("seats:{course}");
        let n = pc
            .cluster
            .cli(near_port, &["PUBSUB", "SHARDNUMSUB", &channel]);
        n.lines().nth(1).map(str::trim) == Some("1")
    };
    let mut ws = ws_connect(sb.port, "/ws?user=v").expect("connect");
    next_json(&mut ws).expect("hello");
    // The live primary's connection is open before the others hang (a course
    // of its own watched): what is measured below is whether the hung dials
    // hold up placement, not how long one more dial takes on a loaded box
    // (that each dial runs on its own thread is the dialer's unit tests').
    send_json(&mut ws, json!({"op":"watch","course":warm}));
    wait_for(T, || subscribed_on_near(&warm).then_some(()))
        .expect("a course of the live primary subscribed before the others hang");
    let hole_proxies: Vec<_> = holes
        .iter()
        .map(|h| {
            pc.proxies
                .iter()
                .find(|p| p.port() == h.port)
                .expect("the hole's proxy")
        })
        .collect();
    for p in &hole_proxies {
        p.blackhole(true);
    }
    // Dials to the hung primaries that gave up so far.
    let failed = || hole_proxies.iter().map(|p| p.held_closed()).sum::<usize>();
    // The hung primaries' courses first: their dials are on their way (and
    // hang) when the live courses are watched.
    for c in &gone {
        send_json(&mut ws, json!({"op":"watch","course":c}));
    }
    wait_for(T, || {
        (sb.metric("seatboard_subscriptions") == 3.0).then_some(())
    })
    .expect("the hung primaries' courses watched");
    // The source counts itself down once a watched channel's dial failed.
    wait_for(T, || {
        (sb.metric("seatboard_redis_connected") == 0.0).then_some(())
    })
    .expect("a hung primary's dial failed");
    // Each live course is watched just after a hung dial gave up: from there
    // its retry and the slot-map reread it asks for are under way, and none
    // of them may hold up the live primary's new channel.
    let mut took = Vec::new();
    for course in &on_near {
        let before = failed();
        wait_for(T, || (failed() > before).then_some(()))
            .expect("a hung primary's dial gave up again");
        let watched = Instant::now();
        send_json(&mut ws, json!({"op":"watch","course":course}));
        let subscribed = wait_for(T, || subscribed_on_near(course).then(|| watched.elapsed()))
            .expect("the live course's channel subscribed on its primary");
        println!("{course} subscribed {subscribed:?} after its watch, two primaries hung");
        took.push(subscribed);
    }
    // Placed only after a hung dial (500 ms each), or after the slot-map
    // reread it asks for, it would wait at least that long.
    assert!(
        took.iter().all(|t| *t < Duration::from_millis(800)),
        "a live course's SSUBSCRIBE waited behind the hung primaries' dials: {took:?}"
    );
    let live = on_near.remove(0);
    let channel = format!("seats:{live}");
    // The viewer gets the live course's snapshots while the others hang.
    let got = wait_for(T, || {
        let p = payload(&live, 1, 100, 77, 1);
        pc.cluster.cli(near_port, &["SPUBLISH", &channel, &p]);
        loop {
            let f = next_of_type(&mut ws, "frame", Duration::from_millis(300))?;
            if f["course"] == live.as_str()
                && section(&f, 1).is_some_and(|s| s["seats_taken"] == 77)
            {
                return Some(());
            }
        }
    });
    assert!(got.is_some(), "no live frame for {live}");
}
