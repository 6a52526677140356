//! The ingest router, driven deterministically: a fake source whose
//! confirmations the test controls, and the state reader's part played by
//! the test (requests answered from a table, or left in flight).

use super::*;
use crate::channels::Discovery;
use crate::channels::ReadRequest;
use crate::channels::{Control, Inbox};
use crossbeam_channel::{unbounded, Receiver};
use std::collections::HashSet;
use std::sync::Mutex;

/// What the fake source was asked to do, and what "Redis" holds.
#[derive(Default)]
struct World {
    log: Vec<String>,
    /// State hashes: course -> payloads.
    hashes: HashMap<String, Vec<Vec<u8>>>,
    /// The next this many state reads fail.
    fail: usize,
    /// What the source answers to `poll_timeout`.
    due: Option<Duration>,
    /// Subscriptions are confirmed as soon as they are asked for.
    hold_confirms: bool,
    /// Courses whose subscription is confirmed.
    confirmed: HashSet<String>,
    /// Whether the source is connected.
    down: bool,
    /// Whether its first connection is on its way.
    connecting: bool,
}

/// A source over a shared [`World`], so a test can look and change it.
struct Fake(Arc<Mutex<World>>);

impl Source for Fake {
    fn poll(&mut self) -> Option<SourceEvent> {
        None
    }
    fn subscribe(&mut self, course: &str) {
        let mut w = self.0.lock().unwrap();
        w.log.push(format!("sub {course}"));
        if !w.hold_confirms {
            w.confirmed.insert(course.to_owned());
        }
    }
    fn unsubscribe(&mut self, course: &str) {
        let mut w = self.0.lock().unwrap();
        w.log.push(format!("unsub {course}"));
        w.confirmed.remove(course);
    }
    fn set_firehose(&mut self, on: bool) {
        self.0.lock().unwrap().log.push(format!("firehose {on}"));
    }
    fn topology(&mut self, moved: Option<&crate::slots::SlotMap>, down: &[crate::slots::Addr]) {
        let w = &mut self.0.lock().unwrap().log;
        w.push(format!(
            "topology moved={} down={}",
            moved.is_some(),
            down.len()
        ));
    }
    fn subscribed(&self, course: &str) -> bool {
        let w = self.0.lock().unwrap();
        w.confirmed.contains(course) || w.confirmed.contains("*")
    }
    fn connected(&self) -> bool {
        !self.0.lock().unwrap().down
    }
    fn connecting(&self) -> bool {
        self.0.lock().unwrap().connecting
    }
    fn poll_timeout(&mut self) -> Option<Duration> {
        self.0.lock().unwrap().due
    }
    fn wait_fds(&self, _fds: &mut Vec<std::os::fd::RawFd>) {}
}

struct Rig {
    ingest: Ingest<Fake>,
    world: Arc<Mutex<World>>,
    inboxes: Vec<Arc<Inbox>>,
    presence: Receiver<PresenceCmd>,
    reads: Receiver<ReadRequest>,
    metrics: Arc<Metrics>,
}

const T0: u64 = 1_764_420_000_000;
const ADMIN_TICK: u64 = 750;

fn rig(shards: usize) -> Rig {
    let metrics = Arc::new(Metrics::new(shards));
    let inboxes: Vec<Arc<Inbox>> = (0..shards).map(|_| Inbox::new()).collect();
    let outlets = inboxes.iter().map(|i| Outlet::new(Arc::clone(i))).collect();
    let world = Arc::new(Mutex::new(World::default()));
    let (tx, presence) = unbounded();
    let (read_tx, reads) = unbounded();
    let ingest = Ingest::new(
        Fake(Arc::clone(&world)),
        outlets,
        Arc::clone(&metrics),
        Some(tx),
        read_tx,
        ADMIN_TICK,
        T0,
    );
    Rig {
        ingest,
        world,
        inboxes,
        presence,
        reads,
        metrics,
    }
}

fn payload(course: &str, section: u32, taken: u32, version: u64) -> Vec<u8> {
    format!(
        r#"{{"course":"{course}","section":{section},"total_seats":10,"seats_taken":{taken},"version":{version}}}"#
    )
    .into_bytes()
}

fn message(course: &str, section: u32, taken: u32, version: u64) -> SourceEvent {
    SourceEvent::Message {
        course: course.into(),
        payload: payload(course, section, taken, version),
    }
}

impl Rig {
    /// A shard's interest, then the end of the loop's turn (reads answered).
    fn interest(&mut self, shard: usize, course: &str, watching: bool) {
        self.interest_only(shard, course, watching);
        self.turn();
    }

    /// A shard's interest, nothing else.
    fn interest_only(&mut self, shard: usize, course: &str, watching: bool) {
        let cmd = IngestCmd::Interest {
            shard,
            course: course.into(),
            watching,
            gate: None,
        };
        assert!(self.ingest.command(cmd, T0));
    }

    fn admin(&mut self, shard: usize, connected: bool) {
        let cmd = IngestCmd::AdminFeed { shard, connected };
        assert!(self.ingest.command(cmd, T0));
        self.turn();
    }

    /// The end of a turn of the ingest loop, and every request it sent to the
    /// state reader answered from the world's table.
    fn turn(&mut self) {
        self.ingest.flush();
        let asked: Vec<ReadRequest> = self.reads.try_iter().collect();
        for r in asked {
            self.answer(r);
        }
    }

    /// The requests sent to the state reader since the last look, unanswered.
    fn asked(&mut self) -> Vec<ReadRequest> {
        self.ingest.flush();
        self.reads.try_iter().collect()
    }

    /// Plays the state reader for one request.
    fn answer(&mut self, r: ReadRequest) {
        let cmd = {
            let mut w = self.world.lock().unwrap();
            match r {
                ReadRequest::States { courses, epoch } => {
                    for c in &courses {
                        w.log.push(format!("load {c}"));
                    }
                    let hashes = if w.fail > 0 {
                        w.fail -= 1;
                        None
                    } else {
                        Some(
                            courses
                                .iter()
                                .map(|c| w.hashes.get(&**c).cloned().unwrap_or_default())
                                .collect(),
                        )
                    };
                    IngestCmd::States {
                        courses,
                        hashes,
                        epoch,
                    }
                }
                ReadRequest::Discover { have } => {
                    let mut courses: Vec<String> = w.hashes.keys().cloned().collect();
                    courses.sort();
                    let mut states = Vec::new();
                    for c in courses.iter().filter(|c| !have.contains(c.as_str())) {
                        w.log.push(format!("load {c}"));
                        states.push((Arc::from(c.as_str()), w.hashes[c].clone()));
                    }
                    IngestCmd::Discovered(Some(Discovery { courses, states }))
                }
                ReadRequest::Shutdown | ReadRequest::Reconnected => return,
            }
        };
        assert!(self.ingest.command(cmd, T0));
    }

    /// Writes a state hash into "Redis".
    fn hash(&self, course: &str, payloads: Vec<Vec<u8>>) {
        self.world
            .lock()
            .unwrap()
            .hashes
            .insert(course.into(), payloads);
    }

    fn log(&self) -> Vec<String> {
        std::mem::take(&mut self.world.lock().unwrap().log)
    }

    /// Snapshots routed to `shard` since the last look, as (course, section, taken).
    fn routed(&mut self, shard: usize) -> Vec<(String, u32, u32)> {
        self.ingest.flush();
        let mut out = Vec::new();
        while let Some(batch) = self.inboxes[shard].try_snapshots() {
            out.extend(
                batch
                    .iter()
                    .map(|s| (s.course.to_string(), s.section, s.seats_taken)),
            );
        }
        out
    }

    /// Control messages to `shard` since the last look.
    fn control(&self, shard: usize) -> Vec<Control> {
        std::iter::from_fn(|| self.inboxes[shard].try_control()).collect()
    }

    fn presence_cmds(&self) -> Vec<PresenceCmd> {
        self.presence.try_iter().collect()
    }
}

/// The JSON of an admin aggregate frame (one unmasked text frame).
fn admin_json(frame: &bytes::Bytes) -> serde_json::Value {
    let start = match frame[1] {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    serde_json::from_slice(&frame[start..]).expect("admin JSON")
}

fn seed_sections(c: &Control) -> Option<usize> {
    match c {
        Control::Seed { sections, .. } => Some(sections.len()),
        _ => None,
    }
}

#[test]
fn one_subscription_per_course_however_many_shards_watch() {
    let mut r = rig(2);
    r.hash("C", vec![payload("C", 1, 3, 1)]);
    r.interest(0, "C", true);
    // Subscribe first, then read the state hash.
    assert_eq!(r.log(), ["sub C", "load C"]);
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(1)]
    );
    assert_eq!(r.metrics.subscriptions.load(Relaxed), 1);
    // A second shard: no second subscription, no reread; its seed holds the board.
    r.interest(1, "C", true);
    assert!(r.log().is_empty());
    assert_eq!(
        r.control(1).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(1)]
    );
    // The first shard leaving keeps the subscription; the last one ends it.
    r.interest(0, "C", false);
    assert!(r.log().is_empty());
    r.interest(1, "C", false);
    assert_eq!(r.log(), ["unsub C"]);
    assert_eq!(r.metrics.subscriptions.load(Relaxed), 0);
    // Watched again: subscribed and read again (the board was forgotten).
    r.interest(1, "C", true);
    assert_eq!(r.log(), ["sub C", "load C"]);
}

#[test]
fn snapshots_go_only_to_watching_shards_once_and_never_backwards() {
    let mut r = rig(3);
    r.interest(0, "A", true);
    r.interest(2, "A", true);
    r.interest(1, "B", true);
    r.control(0);
    r.ingest.event(message("A", 1, 5, 2), T0, T0);
    r.ingest.event(message("B", 1, 6, 1), T0, T0);
    r.ingest.event(message("Z", 1, 7, 1), T0, T0); // nobody watches Z
    assert_eq!(r.routed(0), [("A".into(), 1, 5)]);
    assert_eq!(r.routed(2), [("A".into(), 1, 5)]);
    assert_eq!(r.routed(1), [("B".into(), 1, 6)]);
    // The same publish seen twice, and an older version: neither is routed.
    let dups = r.metrics.ingest_duplicates.load(Relaxed);
    r.ingest.event(message("A", 1, 5, 2), T0, T0);
    r.ingest.event(message("A", 1, 4, 1), T0, T0);
    assert!(r.routed(0).is_empty());
    assert_eq!(r.metrics.ingest_duplicates.load(Relaxed), dups + 2);
    // A message whose course does not match its channel is rejected.
    r.ingest.event(
        SourceEvent::Message {
            course: "A".into(),
            payload: payload("B", 1, 9, 9),
        },
        T0,
        T0,
    );
    assert!(r.routed(0).is_empty() && r.routed(1).is_empty());
}

#[test]
fn an_admin_swaps_per_course_subscriptions_for_the_firehose_and_back() {
    let mut r = rig(2);
    {
        let mut w = r.world.lock().unwrap();
        w.hashes.insert("A".into(), vec![payload("A", 1, 2, 1)]);
        w.hashes.insert("B".into(), vec![payload("B", 1, 10, 1)]);
    }
    r.interest(0, "A", true);
    r.log();
    assert_eq!(r.routed(0), [("A".into(), 1, 2)]);
    r.admin(1, true);
    // The pattern replaces the per-course subscription; every course with
    // a state hash is read so the admin sees the whole board.
    assert_eq!(r.log(), ["firehose true", "load B"]);
    assert!(matches!(
        r.presence_cmds()[..],
        [PresenceCmd::CountAll(true)]
    ));
    assert_eq!(r.metrics.firehose.load(Relaxed), 1);
    assert_eq!(r.metrics.subscriptions.load(Relaxed), 0);
    // A second admin shard changes nothing.
    r.admin(0, true);
    assert!(r.log().is_empty());
    // Unwatched courses are followed but routed to no shard.
    r.ingest.event(message("B", 2, 1, 1), T0, T0);
    assert!(r.routed(0).is_empty() && r.routed(1).is_empty());
    // Back to per-course subscriptions when the last admin leaves, for the
    // watched course only.
    r.admin(0, false);
    assert!(r.log().is_empty());
    r.admin(1, false);
    assert_eq!(r.log(), ["firehose false", "sub A"]);
    assert!(matches!(
        r.presence_cmds()[..],
        [PresenceCmd::CountAll(false)]
    ));
    assert_eq!(r.ingest.known_courses(), [Arc::<str>::from("A")]);
    assert_eq!(r.metrics.subscriptions.load(Relaxed), 1);
}

/// The one admin message sent to `shard` since the last look.
fn one_admin(r: &Rig, shard: usize) -> shards::AdminMsg {
    let sent = r.control(shard);
    match &sent[..] {
        [Control::Admin(m)] => m.clone(),
        _ => panic!("one admin message, got {sent:?}"),
    }
}

fn courses_of(frame: &bytes::Bytes) -> Vec<String> {
    let v = admin_json(frame);
    v["courses"]
        .as_array()
        .expect("courses")
        .iter()
        .map(|c| c["course"].as_str().expect("code").to_owned())
        .collect()
}

#[test]
fn a_new_admin_gets_every_state_hash_at_once_then_deltas_each_tick_while_something_changed() {
    let mut r = rig(2);
    r.hash("A", vec![payload("A", 1, 10, 1), payload("A", 2, 3, 1)]);
    r.hash("B", vec![payload("B", 1, 1, 1)]);
    r.admin(1, true);
    r.presence_cmds();
    // At once, not at the next tick: a full message with every course.
    let first = one_admin(&r, 1);
    // (The entries as a delta too, for a feed there that holds a full one
    // already; a new feed takes the full one.)
    assert_eq!(
        courses_of(&first.delta.expect("the new entries")),
        ["A", "B"]
    );
    assert_eq!(admin_json(&first.full)["full"], true);
    assert_eq!(courses_of(&first.full), ["A", "B"]);
    assert_eq!(r.ingest.poll_timeout(), Some(T0 + ADMIN_TICK));
    // One publish seen through two subscriptions counts once.
    r.ingest.event(message("A", 2, 4, 2), T0 + 10, T0 + 10);
    r.ingest.event(message("A", 2, 4, 2), T0 + 11, T0 + 11);
    r.ingest.handle_timeout(T0 + ADMIN_TICK - 1);
    assert!(r.control(1).is_empty(), "not before the tick");
    r.ingest.handle_timeout(T0 + ADMIN_TICK);
    let msg = one_admin(&r, 1);
    let delta = msg.delta.expect("a delta");
    let v = admin_json(&delta);
    assert_eq!(v["full"], false);
    assert_eq!(courses_of(&delta), ["A"], "only the changed entry");
    let row = &v["courses"][0];
    assert_eq!(
        (row["sections"].as_u64(), row["full_sections"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (row["total_seats"].as_u64(), row["seats_taken"].as_u64()),
        (Some(20), Some(14))
    );
    assert_eq!(row["updates_per_s"], 1.3, "1 update in 0.75 s");
    // The full message shards keep for newcomers is current too.
    assert_eq!(courses_of(&msg.full), ["A", "B"]);
    assert_eq!(admin_json(&msg.full)["courses"][0]["seats_taken"], 14);
    assert!(r.control(0).is_empty(), "no admin on shard 0");
    // The presence worker is told which courses to count for admins.
    assert!(matches!(&r.presence_cmds()[..], [PresenceCmd::Extra(c)] if c.len() == 2));
    // A rate that fell to 0 is a change; then silence.
    r.ingest.handle_timeout(T0 + 2 * ADMIN_TICK);
    let delta = one_admin(&r, 1).delta.expect("the rate's way down");
    assert_eq!(courses_of(&delta), ["A"]);
    assert_eq!(admin_json(&delta)["courses"][0]["updates_per_s"], 0.0);
    r.ingest.handle_timeout(T0 + 3 * ADMIN_TICK);
    assert!(r.control(1).is_empty(), "nothing changed");
    // Viewer counts from the presence worker change an entry too.
    let counts = Arc::new(vec![(Arc::<str>::from("B"), 7)]);
    r.ingest.command(IngestCmd::Viewers(counts), T0);
    r.ingest.handle_timeout(T0 + 4 * ADMIN_TICK);
    let delta = one_admin(&r, 1).delta.expect("viewers changed");
    assert_eq!(courses_of(&delta), ["B"]);
    assert_eq!(admin_json(&delta)["courses"][0]["viewers"], 7);
    // A second admin shard gets the full message at once; the first one
    // nothing (no entry changed).
    r.admin(0, true);
    let full = one_admin(&r, 0);
    assert!(full.delta.is_none());
    assert_eq!(admin_json(&full.full)["courses"][1]["viewers"], 7);
    assert!(r.control(1).is_empty());
}

#[test]
fn courses_with_a_state_hash_are_rescanned_every_5s_while_an_admin_is_connected() {
    let mut r = rig(1);
    r.admin(0, true);
    assert!(courses_of(&one_admin(&r, 0).full).is_empty());
    r.hash("NEW1", vec![payload("NEW1", 1, 2, 1)]);
    r.ingest.handle_timeout(T0 + 4_999);
    r.control(0);
    r.log();
    r.ingest.handle_timeout(T0 + 5_000);
    r.turn();
    assert_eq!(r.log(), ["load NEW1"]);
    r.ingest.handle_timeout(T0 + 4_999 + ADMIN_TICK);
    let delta = one_admin(&r, 0).delta.expect("the new course");
    assert_eq!(courses_of(&delta), ["NEW1"]);
}

#[test]
fn a_made_up_course_watched_while_an_admin_is_connected_leaves_nothing_behind() {
    let mut r = rig(1);
    r.hash("REAL", vec![payload("REAL", 1, 2, 1)]);
    r.admin(0, true);
    r.control(0);
    for i in 0..300 {
        r.interest(0, &format!("FAKE{i}"), true);
    }
    let counts = Arc::new(vec![(Arc::<str>::from("FAKE1"), 1)]);
    r.ingest.command(IngestCmd::Viewers(counts), T0);
    r.ingest.handle_timeout(T0 + ADMIN_TICK);
    r.presence_cmds();
    for i in 0..300 {
        r.interest(0, &format!("FAKE{i}"), false);
    }
    assert_eq!(r.ingest.boards.len(), 1, "only the real course is kept");
    assert!(r.ingest.viewers.is_empty());
    assert_eq!(r.ingest.known_courses(), [Arc::<str>::from("REAL")]);
    r.control(0);
    r.admin(0, false);
    r.admin(0, true);
    assert_eq!(courses_of(&one_admin(&r, 0).full), ["REAL"]);
    // A watched course that a snapshot names stays after its viewer left.
    r.interest(0, "LATE", true);
    r.ingest.event(message("LATE", 1, 1, 1), T0, T0);
    r.interest(0, "LATE", false);
    assert!(r.ingest.boards.contains_key("LATE"));
}

#[test]
fn a_reconnect_rereads_every_watched_course() {
    let mut r = rig(1);
    r.hash("A", vec![payload("A", 1, 2, 1)]);
    r.interest(0, "A", true);
    r.interest(0, "B", true);
    r.log();
    r.routed(0);
    // While the link was down, A moved on.
    r.hash("A", vec![payload("A", 1, 9, 5)]);
    r.ingest.event(SourceEvent::Reconnected, T0 + 5, T0 + 5);
    r.turn();
    let mut log = r.log();
    log.sort();
    assert_eq!(log, ["load A", "load B"]);
    assert_eq!(r.routed(0), [("A".into(), 1, 9)]);
    // Reading the same state again routes nothing (versions keep it idempotent).
    r.ingest.event(SourceEvent::Reconnected, T0 + 6, T0 + 6);
    r.turn();
    assert!(r.routed(0).is_empty());
}

#[test]
fn a_reread_takes_a_repair_the_node_missed_then_live_snapshots_newer_than_it_but_keeps_a_lost_write(
) {
    const POISON: u64 = 1 << 53;
    let repair = |section: u32, taken: u32, version: u64| {
        let p = String::from_utf8(payload("A", section, taken, version)).expect("UTF-8");
        format!("{},\"replace\":true}}", &p[..p.len() - 1]).into_bytes()
    };
    let mut r = rig(1);
    r.hash(
        "A",
        vec![
            payload("A", 1, 3, POISON),
            payload("A", 2, 4, POISON),
            payload("A", 3, 5, 5),
            payload("A", 4, 9, 9),
        ],
    );
    r.interest(0, "A", true);
    r.routed(0);
    // While the link was down the reconciler repaired sections 1 and 2 (the
    // field written with the flag, then a `replace` publish this node never
    // saw), and a failover lost section 4's last write.
    r.hash(
        "A",
        vec![
            repair(1, 9, 100),
            repair(2, 8, 100),
            payload("A", 3, 5, 5),
            payload("A", 4, 4, 4),
        ],
    );
    r.ingest.event(SourceEvent::Reconnected, T0 + 5, T0 + 5);
    let asked = r.asked();
    // While the reread is in flight section 2 moves on (refused: below the
    // poisoned version the node still holds) and so does section 3.
    r.ingest.event(message("A", 2, 7, 101), T0 + 6, T0 + 6);
    r.ingest.event(message("A", 3, 6, 6), T0 + 6, T0 + 6);
    for a in asked {
        r.answer(a);
    }
    r.ingest.flush();
    let mut seen = Vec::new();
    while let Some(batch) = r.inboxes[0].try_snapshots() {
        seen.extend(
            batch
                .iter()
                .map(|s| (s.section, s.seats_taken, s.version, s.replace)),
        );
    }
    // The shard core takes a repair below the version it holds only as a replace.
    assert_eq!(
        seen,
        [
            (3, 6, Some(6), false),
            (1, 9, Some(100), true),
            (2, 8, Some(100), true),
            (2, 7, Some(101), false),
        ]
    );
    assert_eq!(r.metrics.state_stale.load(Relaxed), 4);
    let held = |s: u32| r.ingest.boards["A"].sections[&s].seats_taken;
    assert_eq!((held(1), held(2), held(3), held(4)), (9, 7, 6, 9));
    // Read again as Redis now holds it: nothing moves.
    r.hash(
        "A",
        vec![
            repair(1, 9, 100),
            payload("A", 2, 7, 101),
            payload("A", 3, 6, 6),
            payload("A", 4, 4, 4),
        ],
    );
    r.ingest.event(SourceEvent::Reconnected, T0 + 7, T0 + 7);
    r.turn();
    assert!(r.routed(0).is_empty());
}

#[test]
fn a_replacement_refused_during_a_read_as_already_held_undoes_the_forged_field_the_read_brings() {
    // The read ran before the reconciler's replacement reached the field:
    // it brings the forged version. Meanwhile the live publish of the row's
    // version came, then the replacement itself (the same state: refused as
    // held). Offered again after the read, the replacement must win.
    let mut r = rig(1);
    r.hash("A", vec![payload("A", 1, 8, 1 << 53)]);
    r.interest_only(0, "A", true);
    let asked = r.asked();
    r.ingest.event(message("A", 1, 4, 3), T0 + 1, T0 + 1);
    let p = String::from_utf8(payload("A", 1, 4, 3)).expect("UTF-8");
    let replacement = SourceEvent::Message {
        course: "A".into(),
        payload: format!("{},\"replace\":true}}", &p[..p.len() - 1]).into_bytes(),
    };
    r.ingest.event(replacement, T0 + 2, T0 + 2);
    for a in asked {
        r.answer(a);
    }
    r.ingest.flush();
    let held = &r.ingest.boards["A"].sections[&1];
    assert_eq!((held.seats_taken, held.version), (4, Some(3)));
}

#[test]
fn slots_that_move_or_are_served_again_reread_every_watched_course_and_a_blind_one_is_degraded() {
    use crate::channels::Topology;
    use crate::slots::{key_slot, BlindSlots};
    let mut r = rig(1);
    r.hash("A", vec![payload("A", 1, 2, 1)]);
    r.interest(0, "A", true);
    r.log();
    r.routed(0);
    assert!(r.ingest.redis_up());
    // A failover no connection saw: the hash moved on, nothing was published.
    r.hash("A", vec![payload("A", 1, 7, 2)]);
    let t = Topology {
        moved: Some(crate::slots::SlotMap::default()),
        ..Topology::default()
    };
    assert!(r.ingest.command(IngestCmd::Topology(t), T0 + 1));
    r.turn();
    // The source moves its channels by the map; the course is read again.
    assert_eq!(r.log(), ["topology moved=true down=0", "load A"]);
    assert_eq!(r.routed(0), [("A".into(), 1, 7)]);
    // A silent primary: degraded only while it serves a watched course's key.
    let slot = key_slot(b"seatstate:A");
    let blind = |ranges| BlindSlots {
        prefix: "seatstate:".into(),
        ranges,
    };
    let elsewhere = if slot > 0 {
        vec![(0, slot - 1)]
    } else {
        vec![(1, 16383)]
    };
    // (blind slots, Redis up, read again): a slot blind before and served
    // now means its primary answers again, and publishes were refused
    // while it was silent.
    let steps = [
        (elsewhere, true, false),
        (vec![(slot, slot)], false, true),
        (vec![(slot, slot)], false, false),
        (vec![], true, true),
    ];
    for (ranges, up, reread) in steps {
        let t = Topology {
            moved: None,
            down: vec![("127.0.0.1".into(), 7000)],
            blind: blind(ranges),
        };
        assert!(r.ingest.command(IngestCmd::Topology(t), T0 + 2));
        assert_eq!(r.ingest.redis_up(), up);
        r.turn();
        let mut want = vec!["topology moved=false down=1"];
        if reread {
            want.push("load A");
        }
        assert_eq!(r.log(), want);
    }
}

#[test]
fn a_failed_state_read_is_retried_every_second_not_taken_as_loaded() {
    let mut r = rig(1);
    {
        let mut w = r.world.lock().unwrap();
        w.fail = 1;
        w.hashes.insert("C1".into(), vec![payload("C1", 2, 4, 3)]);
    }
    r.interest(0, "C1", true);
    // The seed went out empty: the read failed.
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(0)]
    );
    r.log();
    assert_eq!(r.ingest.poll_timeout(), Some(T0 + 1_000));
    r.ingest.handle_timeout(T0 + 999);
    assert!(r.log().is_empty(), "not before a second");
    r.ingest.handle_timeout(T0 + 1_000);
    r.turn();
    assert_eq!(r.log(), ["load C1"]);
    assert_eq!(r.routed(0), [("C1".into(), 2, 4)]);
    // Loaded now: no further reads, and no timer while there is no work.
    assert_eq!(r.ingest.poll_timeout(), None);
    r.ingest.handle_timeout(T0 + 2_000);
    assert!(r.log().is_empty());
}

#[test]
fn the_thread_sleeps_until_the_first_timed_work_of_router_or_source() {
    let mut r = rig(1);
    let secs = Duration::from_secs;
    // Nothing timed anywhere: sleep until a socket or a command wakes it.
    assert_eq!(r.ingest.sleep_for(T0), None);
    // The source's own timed work (a keepalive PING, a slot-map refresh).
    r.world.lock().unwrap().due = Some(secs(5));
    assert_eq!(r.ingest.sleep_for(T0), Some(secs(5)));
    // An admin's tick comes first; then whichever is sooner.
    r.admin(0, true);
    assert_eq!(
        r.ingest.sleep_for(T0 + 50),
        Some(Duration::from_millis(ADMIN_TICK - 50))
    );
    r.world.lock().unwrap().due = Some(Duration::from_millis(20));
    assert_eq!(r.ingest.sleep_for(T0 + 50), Some(Duration::from_millis(20)));
    r.admin(0, false);
    // Something buffered in the source (a queued event, TLS bytes): no sleep.
    r.world.lock().unwrap().due = Some(Duration::ZERO);
    assert_eq!(r.ingest.sleep_for(T0), Some(Duration::ZERO));
    // A failed state read is retried in a second, even with no source timer.
    {
        let mut w = r.world.lock().unwrap();
        w.due = None;
        w.fail = 1;
    }
    r.interest(0, "A", true);
    assert_eq!(
        r.ingest.sleep_for(T0 + 400),
        Some(Duration::from_millis(600))
    );
    r.ingest.handle_timeout(T0 + 1_000);
    r.turn();
    assert_eq!(r.ingest.sleep_for(T0 + 1_000), None);
    // A shard whose channel is full: retried every millisecond, at once
    // when the source has something.
    for v in 1..=200 {
        r.ingest.event(message("A", 1, 1, v), T0, T0);
        r.ingest.flush();
    }
    assert!(r.ingest.backlog());
    assert_eq!(r.ingest.sleep_for(T0), Some(BACKLOG_RETRY));
    r.world.lock().unwrap().due = Some(Duration::ZERO);
    assert_eq!(r.ingest.sleep_for(T0), Some(Duration::ZERO));
}

#[test]
fn a_course_is_read_once_its_subscription_is_confirmed_and_other_courses_flow_meanwhile() {
    let mut r = rig(1);
    r.interest(0, "B", true);
    r.control(0);
    r.log();
    r.world.lock().unwrap().hold_confirms = true;
    r.hash("A", vec![payload("A", 1, 4, 2)]);
    r.interest_only(0, "A", true);
    assert_eq!(r.log(), ["sub A"]);
    assert!(r.asked().is_empty(), "no read before the confirmation");
    assert!(r.control(0).is_empty(), "no seed before the read");
    // B's snapshots are routed while A's subscription is on its way.
    r.ingest.event(message("B", 1, 7, 1), T0, T0);
    assert_eq!(r.routed(0), [("B".into(), 1, 7)]);
    // Confirmed: the read goes out, and its answer seeds the shard.
    r.world.lock().unwrap().confirmed.insert("A".into());
    r.ingest
        .event(SourceEvent::Subscribed(Some("A".into())), T0 + 3, T0 + 3);
    let asked = r.asked();
    assert!(
        matches!(&asked[..], [ReadRequest::States { courses, .. }] if courses.len() == 1 && &*courses[0] == "A"),
        "{asked:?}"
    );
    for a in asked {
        r.answer(a);
    }
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(1)]
    );
    assert_eq!(
        r.metrics.seed.count(),
        2,
        "B and A seeded, each observed once"
    );
}

#[test]
fn many_courses_watched_in_one_turn_are_read_in_one_request() {
    let mut r = rig(2);
    for i in 0..1_000 {
        r.interest_only(i % 2, &format!("C{i}"), true);
    }
    let asked = r.asked();
    assert!(
        matches!(&asked[..], [ReadRequest::States { courses, .. }] if courses.len() == 1_000),
        "one request for the whole turn"
    );
    for a in asked {
        r.answer(a);
    }
    assert_eq!(r.control(0).len(), 500);
    assert_eq!(r.control(1).len(), 500);
    assert!(!r.ingest.has_unloaded());
}

#[test]
fn a_read_that_comes_back_after_live_snapshots_never_takes_a_section_backwards() {
    let mut r = rig(1);
    let unversioned = |taken: u32| {
        format!(r#"{{"course":"A","section":2,"total_seats":10,"seats_taken":{taken}}}"#)
            .into_bytes()
    };
    // What the hash held when it was read: section 1 at v3, section 2 unversioned.
    r.hash("A", vec![payload("A", 1, 3, 3), unversioned(5)]);
    r.interest_only(0, "A", true);
    let asked = r.asked();
    // Newer snapshots arrive on the channel before the read's answer.
    r.ingest.event(message("A", 1, 9, 5), T0 + 1, T0 + 1);
    r.ingest.event(
        SourceEvent::Message {
            course: "A".into(),
            payload: unversioned(8),
        },
        T0 + 1,
        T0 + 1,
    );
    for a in asked {
        r.answer(a);
    }
    let seeds = r.control(0);
    let Some(Control::Seed { sections, .. }) = seeds.first() else {
        panic!("a seed, got {seeds:?}");
    };
    let taken: Vec<(u32, u32)> = sections
        .iter()
        .map(|s| (s.section, s.seats_taken))
        .collect();
    assert_eq!(taken, [(1, 9), (2, 8)], "the live snapshots stay");
    assert_eq!(r.metrics.state_stale.load(Relaxed), 1);
    // Once loaded, an unversioned live snapshot replaces as always.
    r.ingest.event(
        SourceEvent::Message {
            course: "A".into(),
            payload: unversioned(2),
        },
        T0 + 2,
        T0 + 2,
    );
    assert!(r.routed(0).contains(&("A".into(), 2, 2)));
}

#[test]
fn a_seed_waits_for_its_read_at_most_its_patience_then_gets_what_is_held() {
    let mut r = rig(1);
    r.world.lock().unwrap().hold_confirms = true;
    r.interest_only(0, "A", true);
    r.ingest.flush();
    // (The retry of unread courses comes first: it finds A still unconfirmed.)
    assert_eq!(r.ingest.poll_timeout(), Some(T0 + RETRY_LOAD_MS));
    r.ingest.handle_timeout(T0 + RETRY_LOAD_MS);
    assert_eq!(r.ingest.poll_timeout(), Some(T0 + seed::SEED_PATIENCE_MS));
    r.ingest.handle_timeout(T0 + seed::SEED_PATIENCE_MS - 1);
    assert!(r.control(0).is_empty());
    r.ingest.handle_timeout(T0 + seed::SEED_PATIENCE_MS);
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(0)]
    );
    // With Redis down a viewer is answered at once with what is held.
    r.world.lock().unwrap().down = true;
    r.interest_only(0, "B", true);
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(0)]
    );
}

#[test]
fn a_waiting_seed_gets_what_is_held_once_redis_turns_out_down() {
    let mut r = rig(1);
    // Starting: the first connection is on its way, so A's viewer waits.
    {
        let mut w = r.world.lock().unwrap();
        (w.down, w.connecting, w.hold_confirms) = (true, true, true);
    }
    r.interest_only(0, "A", true);
    r.ingest.handle_timeout(T0 + 1);
    assert!(r.control(0).is_empty(), "waits while connecting");
    // The dial failed: A's viewer is answered now, not at its deadline.
    r.world.lock().unwrap().connecting = false;
    r.ingest.handle_timeout(T0 + 2);
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(0)]
    );
    // Connected, B's viewer waits for its read; the link drops: answered now.
    r.world.lock().unwrap().down = false;
    r.interest_only(0, "B", true);
    r.ingest.handle_timeout(T0 + 3);
    assert!(r.control(0).is_empty(), "waits while connected");
    r.world.lock().unwrap().down = true;
    r.ingest.handle_timeout(T0 + 4);
    assert_eq!(
        r.control(0).iter().map(seed_sections).collect::<Vec<_>>(),
        [Some(0)]
    );
}

#[test]
fn a_read_asked_before_a_reconnect_does_not_count_as_loaded_after_it() {
    let mut r = rig(1);
    r.hash("A", vec![payload("A", 1, 2, 1)]);
    r.interest_only(0, "A", true);
    let before = r.asked();
    // The link drops and comes back; A is not confirmed again yet.
    r.world.lock().unwrap().confirmed.clear();
    r.ingest.event(SourceEvent::Reconnected, T0 + 1, T0 + 1);
    for a in before {
        r.answer(a);
    }
    assert!(
        r.ingest.has_unloaded(),
        "the old read's answer is not the reread"
    );
    // Its data is not lost meanwhile, and the shard is not left waiting past its patience.
    assert_eq!(r.routed(0), [("A".into(), 1, 2)]);
    r.world.lock().unwrap().confirmed.insert("A".into());
    r.ingest
        .event(SourceEvent::Subscribed(Some("A".into())), T0 + 2, T0 + 2);
    r.turn();
    assert!(!r.ingest.has_unloaded());
    assert_eq!(r.log(), ["sub A", "load A", "load A"]);
}

#[test]
fn a_discovery_cut_short_leaves_the_unread_courses_to_the_next_rescan() {
    let mut r = rig(1);
    let cmd = IngestCmd::AdminFeed {
        shard: 0,
        connected: true,
    };
    assert!(r.ingest.command(cmd, T0));
    let asked = r.asked();
    assert!(matches!(&asked[..], [ReadRequest::Discover { have }] if have.is_empty()));
    // The scan found three courses; a failed read left B and C unread. A live
    // snapshot of C arrives before the next rescan.
    let cut = Discovery {
        courses: vec!["A".into(), "B".into(), "C".into()],
        states: vec![(Arc::from("A"), vec![payload("A", 1, 2, 1)])],
    };
    assert!(r.ingest.command(IngestCmd::Discovered(Some(cut)), T0));
    r.ingest.event(message("C", 2, 1, 1), T0, T0);
    // The next rescan reads B and C (C's other sections are still unknown),
    // not A again.
    let later = T0 + super::admin::RESCAN_MS;
    r.ingest.handle_timeout(later);
    let asked = r.asked();
    let [ReadRequest::Discover { have }] = &asked[..] else {
        panic!("no rescan asked: {asked:?}");
    };
    let have: Vec<&str> = have.iter().map(|c| &**c).collect();
    assert_eq!(have, ["A"]);
}

#[test]
fn an_admin_tick_before_the_discovery_answers_leaves_the_new_admin_no_course_short() {
    let mut r = rig(1);
    r.hash("A", vec![payload("A", 1, 2, 1)]);
    r.hash("B", vec![payload("B", 1, 3, 1)]);
    let cmd = IngestCmd::AdminFeed {
        shard: 0,
        connected: true,
    };
    assert!(r.ingest.command(cmd, T0));
    let discovery = r.asked();
    assert!(matches!(&discovery[..], [ReadRequest::Discover { .. }]));
    // A slow Redis: a snapshot and a whole admin tick pass before the
    // discovery answers. The tick's message reaches the admin shard, whose new
    // feed takes its full aggregate (one course).
    r.ingest.event(message("C", 1, 1, 1), T0 + 10, T0 + 10);
    r.ingest.handle_timeout(T0 + ADMIN_TICK);
    assert_eq!(courses_of(&one_admin(&r, 0).full), ["C"]);
    // The discovery's courses then reach that feed as a delta (it is no longer
    // owed a full one, so a full one alone would never be shown to it).
    for req in discovery {
        r.answer(req);
    }
    let msg = one_admin(&r, 0);
    assert_eq!(courses_of(&msg.delta.expect("a delta")), ["A", "B"]);
    assert_eq!(courses_of(&msg.full), ["A", "B", "C"]);
}

impl Rig {
    /// The kept tally equals a recount over every board (asserted at each
    /// step of the tests below, not only where the metrics are published).
    fn tally_holds(&self) {
        let recount = watch::Tally::recount(self.ingest.boards.values().map(|b| &b.watch));
        assert_eq!(
            self.ingest.tally, recount,
            "the kept tally against a recount"
        );
    }

    /// (subscriptions, courses held, firehose) as `/metrics` shows them.
    fn gauges(&self) -> (u64, u64, u64) {
        (
            self.metrics.subscriptions.load(Relaxed),
            self.metrics.ingest_courses.load(Relaxed),
            self.metrics.firehose.load(Relaxed),
        )
    }

    /// Confirms `course`'s subscription, as Redis would.
    fn confirm(&mut self, course: &str) {
        self.world.lock().unwrap().confirmed.insert(course.into());
        let ev = SourceEvent::Subscribed(Some(course.into()));
        self.ingest.event(ev, T0, T0);
        self.tally_holds();
    }

    /// `course` confirmed and its read answered: nothing is left unread and
    /// no retry timer is on.
    fn confirm_and_read_all(&mut self, course: &str) {
        self.confirm(course);
        self.turn();
        self.tally_holds();
        assert!(!self.ingest.has_unloaded());
        assert_eq!(self.ingest.poll_timeout(), None);
    }
}

#[test]
fn an_unread_course_is_counted_across_confirmation_failure_reconnect_and_interest_off() {
    let mut r = rig(2);
    r.world.lock().unwrap().hold_confirms = true;
    let retry = Some(T0 + RETRY_LOAD_MS);
    let patience = Some(T0 + seed::SEED_PATIENCE_MS);
    // Watched, its subscription not confirmed yet: unread, the retry timer on.
    r.interest_only(0, "A", true);
    r.tally_holds();
    assert!(r.ingest.has_unloaded());
    assert_eq!(r.ingest.poll_timeout(), retry);
    // Confirmed: its read is asked, so nothing is unread; only the seed's
    // deadline is left.
    r.confirm("A");
    assert!(!r.ingest.has_unloaded());
    assert_eq!(r.ingest.poll_timeout(), patience);
    // The read fails: unread again, retried in a second.
    r.world.lock().unwrap().fail = 1;
    r.turn();
    r.tally_holds();
    assert!(r.ingest.has_unloaded());
    assert_eq!(r.ingest.poll_timeout(), retry);
    // A second unread course, then a second shard on the first: two unread.
    r.interest_only(1, "B", true);
    r.interest_only(1, "A", true);
    r.tally_holds();
    // One shard leaves A: still watched, still unread; the other leaves it
    // too: A is gone, B alone keeps the retry timer on.
    r.interest_only(0, "A", false);
    r.tally_holds();
    assert!(r.ingest.has_unloaded());
    r.interest_only(1, "A", false);
    r.tally_holds();
    assert!(r.ingest.has_unloaded(), "B is still unread");
    // B confirmed and read: nothing unread, no timer left.
    r.confirm_and_read_all("B");
    // A reconnect: B is unread until confirmed again, then read.
    r.world.lock().unwrap().confirmed.clear();
    r.ingest.event(SourceEvent::Reconnected, T0 + 1, T0 + 1);
    r.tally_holds();
    assert!(r.ingest.has_unloaded());
    r.turn();
    assert!(r.ingest.has_unloaded(), "not confirmed yet: nothing asked");
    r.confirm_and_read_all("B");
    // An unread course whose last viewer leaves takes its count with it.
    r.interest_only(0, "C", true);
    assert!(r.ingest.has_unloaded());
    r.interest_only(0, "C", false);
    r.tally_holds();
    assert!(!r.ingest.has_unloaded());
    // A read answered after its course left and came back unread counts it once.
    r.interest_only(0, "D", true);
    r.confirm("D");
    let asked = r.asked();
    r.interest_only(0, "D", false);
    r.interest_only(0, "D", true);
    for a in asked {
        r.answer(a);
    }
    r.tally_holds();
    assert!(
        r.ingest.has_unloaded(),
        "D's new subscription is not confirmed"
    );
    r.confirm("D");
    r.turn();
    r.tally_holds();
    assert!(!r.ingest.has_unloaded());
}

#[test]
fn the_subscription_gauges_follow_interest_on_and_off_and_the_firehose() {
    let mut r = rig(2);
    r.hash("A", vec![payload("A", 1, 2, 1)]);
    r.hash("C", vec![payload("C", 1, 2, 1)]);
    r.interest(0, "A", true);
    r.interest(1, "A", true);
    r.interest(0, "B", true);
    r.tally_holds();
    assert_eq!(r.gauges(), (2, 2, 0), "one subscription per course");
    // A shard leaving a course another shard watches changes nothing.
    r.interest(0, "A", false);
    assert_eq!(r.gauges(), (2, 2, 0));
    // An admin: the pattern instead of subscriptions, every state hash held.
    r.admin(1, true);
    r.tally_holds();
    assert_eq!(r.gauges(), (0, 3, 1), "A, B and C (discovered)");
    // Courses watched and left under the pattern: no subscription counted,
    // a made-up name held only while watched, a named one kept.
    r.interest(0, "D", true);
    assert_eq!(r.gauges(), (0, 4, 1));
    r.interest(1, "A", false);
    r.tally_holds();
    assert_eq!(r.gauges(), (0, 4, 1), "A is named by its state hash: kept");
    // A course a snapshot names under the pattern is held from the next turn.
    r.ingest.event(message("E", 1, 1, 1), T0, T0);
    assert_eq!(r.gauges(), (0, 4, 1));
    r.ingest.handle_timeout(T0 + 1);
    assert_eq!(r.gauges(), (0, 5, 1));
    // The last admin leaves: subscriptions for the watched courses only (B
    // and D), the unwatched boards dropped.
    r.admin(1, false);
    r.tally_holds();
    assert_eq!(r.gauges(), (2, 2, 0));
    r.interest(0, "B", false);
    assert_eq!(r.gauges(), (1, 1, 0));
    r.interest(0, "D", false);
    r.tally_holds();
    assert_eq!(r.gauges(), (0, 0, 0));
    // Watched again: counted again.
    r.interest(1, "B", true);
    r.tally_holds();
    assert_eq!(r.gauges(), (1, 1, 0));
}

#[test]
fn shards_waiting_for_one_read_each_get_the_whole_board() {
    let mut r = rig(3);
    r.hash("A", vec![payload("A", 1, 2, 1), payload("A", 2, 3, 1)]);
    // Three shards' first viewers in one turn: one read, three seeds.
    for shard in 0..3 {
        r.interest_only(shard, "A", true);
    }
    r.turn();
    assert_eq!(r.log(), ["sub A", "load A"]);
    for shard in 0..3 {
        assert_eq!(
            r.control(shard)
                .iter()
                .map(seed_sections)
                .collect::<Vec<_>>(),
            [Some(2)],
            "shard {shard}"
        );
    }
}

#[test]
fn a_course_whose_state_hash_is_gone_leaves_the_admin_view_at_the_next_rescan() {
    let mut r = rig(2);
    for c in ["A", "B", "C", "D"] {
        r.hash(c, vec![payload(c, 1, 2, 1)]);
    }
    r.admin(1, true);
    assert_eq!(courses_of(&one_admin(&r, 1).full), ["A", "B", "C", "D"]);
    // A viewer on shard 0 watches C.
    r.interest(0, "C", true);
    r.control(0);
    // B, C and D are deleted from Redis (a rehearsal cleaned up); D is
    // published again after the rescan is asked, before it answers.
    {
        let mut w = r.world.lock().unwrap();
        for c in ["B", "C", "D"] {
            w.hashes.remove(c);
        }
    }
    let later = T0 + super::admin::RESCAN_MS;
    r.ingest.handle_timeout(later);
    let rescan = r.asked();
    assert!(matches!(&rescan[..], [ReadRequest::Discover { .. }]));
    r.ingest.event(message("D", 1, 5, 2), later, later);
    for req in rescan {
        r.answer(req);
    }
    // B and C are gone (C's board stays for its viewer); D was named after
    // the scan was asked.
    let mut known: Vec<String> = r
        .ingest
        .known_courses()
        .iter()
        .map(|c| c.to_string())
        .collect();
    known.sort();
    assert_eq!(known, ["A", "D"]);
    assert!(
        r.ingest.boards.contains_key("C"),
        "the viewer's board is kept"
    );
    // Every admin feed gets the whole aggregate without B and C: a delta
    // could not take an entry away.
    r.ingest.handle_timeout(later + ADMIN_TICK);
    let msg = one_admin(&r, 1);
    let delta = msg.delta.expect("a message for the feeds");
    assert_eq!(admin_json(&delta)["full"], true);
    assert_eq!(courses_of(&delta), ["A", "D"]);
    assert_eq!(courses_of(&msg.full), ["A", "D"]);
    // Then deltas again, and only while something changed.
    r.ingest.event(message("A", 1, 3, 2), later + 1, later + 1);
    r.ingest.handle_timeout(later + 2 * ADMIN_TICK);
    let delta = one_admin(&r, 1).delta.expect("a delta");
    assert_eq!(admin_json(&delta)["full"], false);
    assert_eq!(
        courses_of(&delta),
        ["A", "D"],
        "A changed, D's rate fell to 0"
    );
    // A failed scan forgets nothing.
    r.world.lock().unwrap().hashes.clear();
    r.ingest.handle_timeout(later + super::admin::RESCAN_MS);
    let rescan = r.asked();
    assert!(matches!(&rescan[..], [ReadRequest::Discover { .. }]));
    assert!(r
        .ingest
        .command(IngestCmd::Discovered(None), later + super::admin::RESCAN_MS));
    assert_eq!(r.ingest.known_courses().len(), 2);
    // C's viewer still gets its snapshots; gone with that viewer, unless a
    // snapshot names it again first.
    r.routed(0);
    r.ingest.event(message("C", 1, 4, 3), later, later);
    assert_eq!(r.routed(0), [("C".into(), 1, 4)]);
    assert_eq!(r.ingest.known_courses().len(), 3, "named again");
    r.interest(0, "C", false);
    assert!(r.ingest.boards.contains_key("C"), "named: kept for admins");
}
