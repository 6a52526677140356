//! Sharded pub/sub on a Redis Cluster whose node user must `AUTH`, with two of
//! its three primaries hung (each behind a blackholed proxy: the connection
//! is accepted, `AUTH` never answered, so a dial to it waits out its 500 ms
//! connect deadline): a new channel of the third primary (whose connection
//! is open) is subscribed while those dials hang and after they failed (their
//! retries and the slot-map reread hold up nothing), and its course gets its
//! first board and its live snapshots.

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
    let (warm, live) = {
        let mut on_near = courses_on(near, 2);
        let live = on_near.remove(1);
        (on_near.remove(0), live)
    };
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
    // (that each dial runs on its own is the dialer's unit tests').
    send_json(&mut ws, json!({"op":"watch","course":warm}));
    wait_for(T, || subscribed_on_near(&warm).then_some(()))
        .expect("a course of the live primary subscribed before the others hang");
    for h in holes {
        pc.proxies
            .iter()
            .find(|p| p.port() == h.port)
            .expect("the hole's proxy")
            .blackhole(true);
    }
    // The hung primaries' courses first: their dials are on their way (and
    // hang) when the live course is watched (the ingest thread dials at the
    // end of the turn that counts the subscriptions).
    for c in &gone {
        send_json(&mut ws, json!({"op":"watch","course":c}));
    }
    wait_for(T, || {
        (sb.metric("seatboard_subscriptions") == 3.0).then_some(())
    })
    .expect("the hung primaries' courses watched");
    // A hung dial has failed (the source counts itself down while a watched
    // channel has no primary): from here its retries and the slot-map reread
    // it asked for are under way, and none of them may hold up the live
    // primary's channel.
    wait_for(T, || {
        (sb.metric("seatboard_redis_connected") == 0.0).then_some(())
    })
    .expect("a hung primary's dial failed");
    let watched = Instant::now();
    send_json(&mut ws, json!({"op":"watch","course":live}));
    let channel = format!("seats:{live}");
    let subscribed = wait_for(T, || subscribed_on_near(&live).then(|| watched.elapsed()))
        .expect("the live course's channel subscribed on its primary");
    println!("{live} subscribed {subscribed:?} after its watch, two primaries hung");
    // Placed only after a hung dial (500 ms each), or after the slot-map
    // reread it asks for, it would wait at least that long.
    assert!(
        subscribed < Duration::from_millis(800),
        "{live}'s SSUBSCRIBE waited {subscribed:?} behind the hung primaries' dials"
    );
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
