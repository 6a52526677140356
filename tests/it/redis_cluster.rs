//! Redis Cluster (contract §2a) against a real cluster: three primaries with a
//! replica each. Boards are served through sharded pub/sub with one pub/sub
//! connection per primary that owns a watched channel; a SIGKILLed primary's
//! courses are true again within 5 s of the replica's promotion with no viewer
//! disconnected; a watched course's slot moved to another primary stays live.

use crate::cluster_util;
use crate::common;
use crate::redis_util;

use cluster_util::{cli, courses_on, Cluster};
use common::*;
use redis_util::{client, read_until, serve_on, watch};
use serde_json::Value;
use std::time::{Duration, Instant};

fn serve(cluster: &Cluster) -> Seatboard {
    serve_on(&cluster.uri(), &[])
}

/// A `--pubsub classic` node on one shard, seeded with `uri`.
fn serve_classic(uri: &str) -> Seatboard {
    serve_on(uri, &["--pubsub", "classic", "--shards", "1"])
}

/// `seatboard publish` into the cluster (SPUBLISH); true on exit 0.
fn publish(cluster: &Cluster, course: &str, taken: u32, version: u64) -> bool {
    publish_with(&cluster.uri(), &[], course, taken, version)
}

/// `seatboard publish --redis uri extra...`; true on exit 0.
fn publish_with(uri: &str, extra: &[&str], course: &str, taken: u32, version: u64) -> bool {
    seatboard_command()
        .args(["publish", "--redis", uri, "--course", course])
        .args(extra)
        .args([
            "--section",
            "1",
            "--total",
            "50",
            "--taken",
            &taken.to_string(),
        ])
        .args(["--version", &version.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Publishes until it succeeds (a cluster mid-failover refuses for a moment).
fn publish_retrying(cluster: &Cluster, course: &str, taken: u32, version: u64) {
    wait_for(Duration::from_secs(20), || {
        publish(cluster, course, taken, version).then_some(())
    })
    .expect("publish never succeeded");
}

/// One viewer per course, each shown the course's first board (section 1 at
/// `taken` seats).
fn viewers_of(sb: &Seatboard, courses: &[String], taken: u32) -> Vec<(String, common::Ws)> {
    courses
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut ws = client(sb, &format!("user=v{i}"));
            let a = watch(&mut ws, c);
            assert_eq!(seats_taken(&a, 1), Some(u64::from(taken)), "{a}");
            (c.clone(), ws)
        })
        .collect()
}

/// Publishes section 1 at 7 seats taken (version 3) to every course until
/// the cluster takes it, waits until each viewer shows it, and checks the
/// last one did within 5 s of the promotion at `promoted` (`what` names the
/// failover in the output).
fn all_true_within_5s(
    cluster: &Cluster,
    viewers: &mut [(String, common::Ws)],
    promoted: Instant,
    what: &str,
) {
    for (c, _) in viewers.iter() {
        publish_retrying(cluster, c, 7, 3);
    }
    for (c, ws) in viewers.iter_mut() {
        let f = read_until(ws, Duration::from_secs(15), |m| {
            m["type"] == "frame" && m["course"] == c.as_str() && seats_taken(m, 1) == Some(7)
        });
        assert!(
            f.is_some(),
            "{c}: board not true after the failover (or viewer closed)"
        );
    }
    let took = promoted.elapsed();
    println!(
        "{what}: every board true {:.2} s after the promotion",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn cluster_boards_sharded_subscriptions_and_health() {
    let cluster = Cluster::start();
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    let mut on_a = courses_on(&primaries[0], 2);
    let on_b = courses_on(&primaries[1], 1);
    let idle = &primaries[2];
    // Published before anyone watches: the watch answer must carry it (the
    // hash and the channel live on different slots).
    assert!(publish(&cluster, &on_a[0], 3, 1));
    let sb = serve(&cluster);
    let mut ws = client(&sb, "user=u1");
    let answer = watch(&mut ws, &on_a[0]);
    assert_eq!(seats_taken(&answer, 1), Some(3), "{answer}");
    on_a.extend(on_b.iter().cloned());
    for c in &on_a[1..] {
        watch(&mut ws, c);
    }
    for (i, c) in on_a.iter().enumerate() {
        assert!(publish(&cluster, c, 10 + i as u32, 2));
        let f = read_until(&mut ws, Duration::from_secs(10), |m| {
            m["type"] == "frame" && m["course"] == c.as_str()
        })
        .expect("live frame");
        assert_eq!(seats_taken(&f, 1), Some(10 + i as u64), "{f}");
    }
    // Sharded subscriptions only on the owners, no pub/sub connection to the other primary.
    let shard_channels = |p: u16| cli(p, &["PUBSUB", "SHARDCHANNELS"]);
    assert!(shard_channels(primaries[0].port).contains(&format!("seats:{}", on_a[0])));
    assert!(shard_channels(primaries[1].port).contains(&format!("seats:{}", on_b[0])));
    assert_eq!(shard_channels(idle.port), "");
    assert_eq!(cli(idle.port, &["CLIENT", "LIST", "TYPE", "pubsub"]), "");
    // Presence lands in the cluster (a sorted set on its own slot).
    let zcard = wait_for(Duration::from_secs(10), || {
        let n = cli(
            cluster.any_port(),
            &["-c", "ZCARD", &format!("presence:{}", on_a[0])],
        );
        (n == "1").then_some(n)
    });
    assert!(zcard.is_some(), "presence not written in the cluster");
    let h = healthz_json(sb.port);
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["redis"], true, "{h}");
    assert_eq!(h["redis_mode"], "cluster", "{h}");
    assert_eq!(h["redis_nodes_up"], 3, "{h}");
    // /api/courses: SCAN on every primary (the first scan ran at start).
    let courses = http_get(sb.port, "/api/courses").expect("courses").body;
    assert!(courses.contains(&on_a[0]), "{courses}");
    // A state key that is no hash: the course read in the same pipeline
    // beside it is answered whole (the cluster's reads one at a time).
    let stray = "STRAY1";
    cli(
        cluster.any_port(),
        &["-c", "SET", &format!("seatstate:{stray}"), "x"],
    );
    let fresh = courses_on(&primaries[1], 2).pop().expect("a second course");
    assert!(publish(&cluster, &fresh, 7, 1));
    let named = format!("user=u9&course={stray}&course={fresh}");
    let mut beside = client(&sb, &named);
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 2 {
        let f = read_until(&mut beside, Duration::from_secs(10), |m| {
            m["type"] == "frame"
        })
        .expect("both watch answers");
        answers.insert(f["course"].as_str().unwrap_or_default().to_string(), f);
    }
    assert_eq!(answers[stray]["sections"], serde_json::json!([]));
    assert_eq!(seats_taken(&answers[&fresh], 1), Some(7), "{answers:?}");

    // The admin firehose: every course with a state hash, on every primary, is
    // shard-subscribed and shown at once; updates keep coming.
    let mut admin = ws_connect(sb.port, "/ws/admin?user=a&role=admin").expect("admin");
    let shows_all = |m: &Value| {
        m["type"] == "admin"
            && on_a.iter().all(|c| {
                m["courses"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x["course"] == c.as_str()))
            })
    };
    assert!(read_until(&mut admin, Duration::from_secs(10), shows_all).is_some());
    assert!(publish(&cluster, &on_b[0], 44, 3));
    let updated = read_until(&mut admin, Duration::from_secs(10), |m| {
        m["type"] == "admin"
            && m["courses"].as_array().is_some_and(|v| {
                v.iter()
                    .any(|x| x["course"] == on_b[0].as_str() && x["seats_taken"] == 44)
            })
    });
    assert!(updated.is_some(), "admin view not live in sharded mode");
    drop(admin);

    // The analytics worker in the cluster: SCAN + SSUBSCRIBE, XADD on the stream's slot;
    // the hub's /api/history reads it back through the cluster.
    let uri = cluster.uri();
    let mut worker = seatboard_command()
        .args([
            "analytics",
            "--redis",
            &uri,
            "--bucket-ms",
            "500",
            "--session",
            "clu",
        ])
        .args(["--log-level", "warn"])
        .spawn()
        .expect("analytics");
    let written = wait_for(Duration::from_secs(15), || {
        publish(&cluster, &on_a[0], 20, 10 + fastrand_version());
        let n = cli(cluster.any_port(), &["-c", "XLEN", "analytics:clu"]);
        (n.parse::<u64>().unwrap_or(0) > 0).then_some(())
    });
    let _ = worker.kill();
    let _ = worker.wait();
    assert!(
        written.is_some(),
        "analytics wrote nothing into the cluster"
    );
    let history = wait_for(Duration::from_secs(15), || {
        let r = http_get(sb.port, "/api/history?session=clu&user=a&role=admin").ok()?;
        r.body.contains(&on_a[0]).then_some(())
    });
    assert!(
        history.is_some(),
        "/api/history did not read the cluster stream"
    );
}

/// A version newer than any before it in this process.
fn fastrand_version() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[test]
fn failover_keeps_viewers_and_boards_true_within_5s() {
    let mut cluster = Cluster::start();
    let seed = cluster.uri();
    let victim = cluster.owner("seats:CL0");
    let victim = cluster
        .nodes_now()
        .into_iter()
        .find(|l| l.id == victim.id)
        .expect("victim");
    let replica = cluster.replica_of(&victim.id);
    let courses = courses_on(&victim, 3);
    for c in &courses {
        assert!(publish(&cluster, c, 1, 1));
    }
    let sb = serve(&cluster);
    // A --pubsub classic node whose first seed is the victim: it must move on.
    let classic_uri = format!("redis://127.0.0.1:{},{}", victim.port, cluster.uri());
    let classic = serve_classic(&classic_uri);
    let mut classic_ws = client(&classic, "user=c1");
    watch(&mut classic_ws, "CX0");
    assert!(publish_with(
        &classic_uri,
        &["--pubsub", "classic"],
        "CX0",
        2,
        2
    ));
    assert!(
        read_until(&mut classic_ws, Duration::from_secs(10), |m| {
            m["type"] == "frame" && seats_taken(m, 1) == Some(2)
        })
        .is_some(),
        "classic pub/sub in a cluster"
    );
    let mut viewers = viewers_of(&sb, &courses, 1);
    cluster.kill(victim.port);
    let promoted = cluster.wait_promoted(replica.port, Duration::from_secs(30));
    let what = format!("failover ({} courses, seeds {seed})", courses.len());
    all_true_within_5s(&cluster, &mut viewers, promoted, &what);
    // The classic node moved to another node and hears PUBLISH again.
    let moved = wait_for(Duration::from_secs(15), || {
        publish_with(&classic_uri, &["--pubsub", "classic"], "CX0", 8, 4).then_some(())?;
        read_until(&mut classic_ws, Duration::from_millis(500), |m| {
            m["type"] == "frame" && seats_taken(m, 1) == Some(8)
        })
    });
    assert!(moved.is_some(), "classic node did not move to a live node");
    // Nobody was disconnected: every viewer still answers a watch.
    for (i, (_, ws)) in viewers.iter_mut().enumerate() {
        watch(ws, &format!("OTHER{i}"));
    }
    let h = wait_for(Duration::from_secs(10), || {
        let h = healthz_json(sb.port);
        (h["status"] == "ok").then_some(h)
    });
    assert!(h.is_some(), "node still degraded after the failover");
}

#[test]
fn a_frozen_primarys_courses_are_true_within_5s_of_its_replicas_promotion() {
    let cluster = Cluster::start();
    let victim = cluster.primaries().remove(1);
    let replica = cluster.replica_of(&victim.id);
    let courses = courses_on(&victim, 2);
    for c in &courses {
        assert!(publish(&cluster, c, 1, 1));
    }
    let sb = serve(&cluster);
    let mut viewers = viewers_of(&sb, &courses, 1);
    // Frozen, not dead: no connection of the node breaks until a keepalive
    // gives up on it, long after the promotion.
    cluster.freeze(victim.port);
    let promoted = cluster.wait_promoted(replica.port, Duration::from_secs(30));
    all_true_within_5s(&cluster, &mut viewers, promoted, "frozen primary");
}

#[test]
fn slot_migration_keeps_a_watched_course_live() {
    let cluster = Cluster::start();
    let course = "CL1";
    let channel = format!("seats:{course}");
    let slot = cluster.slot(&channel);
    let from = cluster.owner_of_slot(slot);
    let to = cluster
        .nodes_now()
        .into_iter()
        .find(|l| l.primary && l.id != from.id)
        .expect("another primary");
    assert!(publish(&cluster, course, 2, 1));
    let sb = serve(&cluster);
    let mut ws = client(&sb, "user=m1");
    watch(&mut ws, course);
    let started = Instant::now();
    cluster.move_slot(slot, &to);
    // The node follows the slot (the server unsubscribed it from the old owner).
    let moved = wait_for(Duration::from_secs(10), || {
        cli(to.port, &["PUBSUB", "SHARDCHANNELS"])
            .contains(&channel)
            .then_some(())
    });
    assert!(
        moved.is_some(),
        "shard subscription did not follow the slot"
    );
    assert!(!cli(from.port, &["PUBSUB", "SHARDCHANNELS"]).contains(&channel));
    assert!(publish(&cluster, course, 9, 2));
    let f = read_until(&mut ws, Duration::from_secs(10), |m| {
        m["type"] == "frame" && m["course"] == course && seats_taken(m, 1) == Some(9)
    });
    assert!(f.is_some(), "course not live after the slot moved");
    println!(
        "slot {slot} moved and course live again in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn slot_moved_old_owner_first_at_typing_speed_is_live_within_5s() {
    // Three primaries, as an operator finishing a migration by hand sees
    // them: `SETSLOT NODE` on the old owner first, then on the new owner and
    // the third, a second apart. Between the first two the old owner has
    // dropped the channel (and answers `-MOVED` to the new owner) while the
    // new owner still answers `-MOVED` back to the old one.
    let cluster = Cluster::primaries_only();
    let course = "CL1";
    let channel = format!("seats:{course}");
    let slot = cluster.slot(&channel);
    let primaries = cluster.primaries();
    let from = cluster.owner_of_slot(slot);
    let others: Vec<_> = primaries.iter().filter(|l| l.id != from.id).collect();
    let (to, third) = (others[0].clone(), others[1].clone());
    assert!(publish(&cluster, course, 2, 1));
    let sb = serve(&cluster);
    let mut ws = client(&sb, "user=h1");
    watch(&mut ws, course);
    assert_eq!(cluster.begin_migration(slot, &to).id, from.id);
    assert!(cluster.keys_in_slot(&from, slot).is_empty());
    let last = cluster.finish_migration_in(
        slot,
        &to,
        &[from.port, to.port, third.port],
        Duration::from_secs(1),
    );
    // A newer snapshot every round, until one reaches the viewer live; each
    // round reads what came for up to 200 ms.
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
    }
    let deadline = last + Duration::from_secs(5);
    let mut version = 1;
    let mut seen = None;
    while seen.is_none() && Instant::now() < deadline {
        version += 1;
        assert!(publish(&cluster, course, 10 + version as u32, version));
        while let Some(m) = next_json(&mut ws) {
            if m["type"] == "frame" && m["course"] == course && seats_taken(&m, 1) >= Some(12) {
                seen = Some(m);
                break;
            }
        }
    }
    let took = last.elapsed();
    assert!(
        seen.is_some(),
        "no live frame within 5 s of the last SETSLOT NODE ({took:?})"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(cli(to.port, &["PUBSUB", "SHARDCHANNELS"]).contains(&channel));
    println!(
        "slot {slot} given to its new owner old-owner-first: live again {:.2} s after the last SETSLOT",
        took.as_secs_f64()
    );
}

/// `ASKING` then `command` on one connection to `port`: what a client sends
/// after `-ASK` (redis-cli runs the lines of its stdin on one connection).
fn asking(port: u16, command: &str) -> String {
    let mut child = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli");
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = write!(stdin, "ASKING\n{command}\n");
    }
    let out = child.wait_with_output().expect("redis-cli output");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ask_redirects_are_followed_while_a_state_slot_migrates() {
    let cluster = Cluster::primaries_only();
    let course = "CL7";
    let state = format!("seatstate:{course}");
    // Written before the migration: the state hash is on its slot's owner.
    assert!(publish(&cluster, course, 2, 1));
    let slot = cluster.slot(&state);
    let to = cluster
        .nodes_now()
        .into_iter()
        .find(|l| l.primary && l.id != cluster.owner_of_slot(slot).id)
        .expect("another primary");
    // Another key of the slot stays behind: the slot is half-migrated.
    let filler = format!("{{{state}}}:filler");
    assert_eq!(cli(cluster.any_port(), &["-c", "SET", &filler, "x"]), "OK");
    let from = cluster.begin_migration(slot, &to);
    cluster.migrate_keys(&from, &to, &[&state]);
    assert_eq!(cluster.keys_in_slot(&from, slot), vec![filler.clone()]);
    // The owner of record now answers the state hash with -ASK.
    let ask = cli(from.port, &["HGETALL", &state]);
    assert!(ask.contains("ASK"), "expected an ASK redirect: {ask}");

    // Seeding: the watch answer is read through the redirect.
    let sb = serve(&cluster);
    let mut ws = client(&sb, "user=k1");
    let answer = watch(&mut ws, course);
    assert_eq!(
        seats_taken(&answer, 1),
        Some(2),
        "seeded through ASK: {answer}"
    );
    // `seatboard publish` (the Publisher's write): HSET follows the redirect
    // to the importing node, SPUBLISH reaches the viewer.
    assert!(publish(&cluster, course, 5, 2), "publish mid-migration");
    let f = read_until(&mut ws, Duration::from_secs(10), |m| {
        m["type"] == "frame" && m["course"] == course && seats_taken(m, 1) == Some(5)
    });
    assert!(f.is_some(), "no live frame mid-migration");
    let on_target = asking(to.port, &format!("HGETALL {state}"));
    assert!(
        on_target.contains("\"version\":2"),
        "the state write did not land on the importing node: {on_target}"
    );
    assert_eq!(cluster.keys_in_slot(&from, slot), vec![filler.clone()]);

    // Finish the migration: the course stays live and its hash readable directly.
    cluster.migrate_keys(&from, &to, &[&filler]);
    cluster.finish_migration(slot, &to);
    assert!(
        publish(&cluster, course, 7, 3),
        "publish after the migration"
    );
    let f = read_until(&mut ws, Duration::from_secs(10), |m| {
        m["type"] == "frame" && m["course"] == course && seats_taken(m, 1) == Some(7)
    });
    assert!(f.is_some(), "course not live after the migration finished");
    let direct = cli(to.port, &["HGETALL", &state]);
    assert!(direct.contains("\"version\":3"), "{direct}");
    // A viewer that comes later is seeded from the new owner.
    let mut late = client(&sb, "user=k2");
    let answer = watch(&mut late, course);
    assert_eq!(seats_taken(&answer, 1), Some(7), "{answer}");
}

/// The last command and idle seconds of the pub/sub client on `port`.
fn pubsub_client(port: u16) -> (String, u64) {
    let list = cli(port, &["CLIENT", "LIST", "TYPE", "pubsub"]);
    let field = |k: &str| {
        list.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap_or("")
            .to_owned()
    };
    (field("cmd="), field("idle=").parse().unwrap_or(u64::MAX))
}

#[test]
fn a_quiet_sharded_source_sleeps_on_its_sockets() {
    let cluster = Cluster::primaries_only();
    let primaries = cluster.primaries();
    let a = courses_on(&primaries[0], 1).remove(0);
    let b = courses_on(&primaries[1], 1).remove(0);
    let sb = serve(&cluster);
    let mut ws = client(&sb, "user=q1");
    // Two sharded subscriptions: two pub/sub connections to sleep on.
    watch(&mut ws, &a);
    watch(&mut ws, &b);
    let subscribed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let w0 = thread_wakeups(sb.pid(), "seatboard-inges");
    std::thread::sleep(Duration::from_secs(3));
    let woke = thread_wakeups(sb.pid(), "seatboard-inges") - w0;
    println!("ingest thread: {woke} wake-ups in 3 s with two quiet shard subscriptions");
    // Polling every 5 ms would be ~600.
    assert!(woke < 40, "{woke} wake-ups in 3 s");
    // Asleep, yet a publish reaches the viewer at once.
    let t = Instant::now();
    assert!(publish(&cluster, &a, 6, 1));
    let f = read_until(&mut ws, Duration::from_secs(10), |m| {
        m["type"] == "frame" && m["course"] == a.as_str()
    })
    .expect("live frame");
    assert_eq!(seats_taken(&f, 1), Some(6), "{f}");
    println!("published and on the viewer in {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The connection that stayed silent is still pinged after 5 s of silence.
    std::thread::sleep(Duration::from_millis(6_500).saturating_sub(subscribed.elapsed()));
    let (cmd, idle) = pubsub_client(primaries[1].port);
    assert_eq!(cmd, "ping", "no keepalive on the quiet connection by 6.5 s");
    assert!(idle <= 2, "last command {idle} s ago");
}

/// A course whose state hash lives on `primary` (`seatstate:<course>`).
fn state_course_on(cluster: &Cluster, primary: &cluster_util::NodeLine) -> String {
    (0..10_000)
        .map(|i| format!("CQ{i}"))
        .find(|c| cluster.owner(&format!("seatstate:{c}")).id == primary.id)
        .expect("a course on that primary")
}

#[test]
fn a_classic_node_rereads_after_a_failover_it_did_not_see_and_is_degraded_without_a_primary() {
    let mut cluster = Cluster::start();
    let primaries = cluster.primaries();
    // The node subscribes on its first seed, which the failover leaves alone.
    let (held, victim) = (&primaries[0], &primaries[1]);
    let replica = cluster.replica_of(&victim.id);
    let course = state_course_on(&cluster, victim);
    let uri = format!("redis://127.0.0.1:{},{}", held.port, cluster.uri());
    let classic = ["--pubsub", "classic"];
    assert!(publish_with(&uri, &classic, &course, 1, 1));
    let sb = serve_classic(&uri);
    let mut ws = client(&sb, "user=f1");
    let a = watch(&mut ws, &course);
    assert_eq!(seats_taken(&a, 1), Some(1), "{a}");
    // A publish lost on the way: the hash moves on, nothing is published.
    let lost = format!(
        r#"{{"course":"{course}","section":1,"total_seats":50,"seats_taken":5,"version":2}}"#
    );
    let key = format!("seatstate:{course}");
    assert_eq!(cluster.cli(victim.port, &["HSET", &key, "1", &lost]), "0");
    cluster.cli(replica.port, &["WAIT", "1", "2000"]);
    // A graceful failover: no connection of the node breaks.
    assert_eq!(cluster.cli(replica.port, &["CLUSTER", "FAILOVER"]), "OK");
    let promoted = cluster.wait_promoted(replica.port, Duration::from_secs(30));
    let f = read_until(&mut ws, Duration::from_secs(15), |m| {
        m["type"] == "frame" && seats_taken(m, 1) == Some(5)
    });
    assert!(
        f.is_some(),
        "the board was not read again after the failover"
    );
    let took = promoted.elapsed();
    println!(
        "classic: board true {:.2} s after the promotion",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(healthz_json(sb.port)["status"], "ok");
    // The course's slot loses every copy: the node says so.
    cluster.kill(replica.port);
    cluster.kill(victim.port);
    let h = wait_for(Duration::from_secs(15), || {
        let h = healthz_json(sb.port);
        (h["status"] == "degraded").then_some(h)
    });
    assert!(
        h.is_some(),
        "still ok with the watched course's slot unserved"
    );
}
