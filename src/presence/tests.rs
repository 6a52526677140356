//! The presence worker's timing, refcounts and store failures, on a fake store.

use super::*;
use bytes::Bytes;
use std::sync::Mutex;

/// What the fake store was asked, and whether it fails.
#[derive(Default)]
struct Calls {
    log: Vec<String>,
    down: bool,
    /// While down, when the store's connection makes its next attempt.
    retry_in: Option<Duration>,
}

/// What the fake store fails with while down.
fn down() -> StoreError {
    StoreError::Redis(crate::redis::Error::Backoff { what: "presence" })
}

/// A store that records every call (`op course user expiry`) and answers
/// counts with the number of live members it was told about.
struct Fake(Arc<Mutex<Calls>>, super::memory::MemoryPresence);

/// `C u1, C u2, D u3`: members as the fake store logs them.
fn listed(members: &Members) -> String {
    let each: Vec<String> = members.iter().map(|(c, u)| format!("{c} {u}")).collect();
    each.join(", ")
}

impl PresenceStore for Fake {
    fn retry_in(&self) -> Option<Duration> {
        let c = self.0.lock().unwrap();
        c.retry_in.filter(|_| c.down)
    }
    fn add(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        let mut c = self.0.lock().unwrap();
        c.log.push(format!("add {} {expiry_ms}", listed(members)));
        if c.down {
            return Err(down());
        }
        self.1.add(members, expiry_ms)
    }
    fn remove(&mut self, members: &Members) -> StoreResult<()> {
        let mut c = self.0.lock().unwrap();
        c.log.push(format!("remove {}", listed(members)));
        if c.down {
            return Err(down());
        }
        self.1.remove(members)
    }
    fn refresh(&mut self, members: &Members, expiry_ms: u64) -> StoreResult<()> {
        let mut c = self.0.lock().unwrap();
        c.log.push(format!("refresh {} {expiry_ms}", members.len()));
        if c.down {
            return Err(down());
        }
        self.1.refresh(members, expiry_ms)
    }
    fn count(&mut self, courses: &[Arc<str>], now_ms: u64) -> StoreResult<Vec<u64>> {
        let mut c = self.0.lock().unwrap();
        c.log.push(format!("count {} {now_ms}", courses.len()));
        if c.down {
            return Err(down());
        }
        self.1.count(courses, now_ms)
    }
    fn roster(
        &mut self,
        course: &str,
        now_ms: u64,
        limit: usize,
    ) -> StoreResult<(u64, Vec<String>)> {
        if self.0.lock().unwrap().down {
            return Err(down());
        }
        self.1.roster(course, now_ms, limit)
    }
}

const T0: u64 = 1_764_420_000_000;
const TICK: u64 = 3_000;
const TTL: u64 = 30_000;

struct Rig {
    w: Worker<Fake>,
    calls: Arc<Mutex<Calls>>,
    inboxes: Vec<Arc<Inbox>>,
    ingest: crate::channels::wake::IngestRx,
}

fn rig() -> Rig {
    let metrics = Arc::new(crate::metrics::Metrics::new(2));
    let calls = Arc::new(Mutex::new(Calls::default()));
    let inboxes: Vec<Arc<Inbox>> = (0..2).map(|_| Inbox::new()).collect();
    let (tx, ingest) = crate::channels::wake::channel().expect("eventfd");
    let timing = PresenceTiming {
        tick_ms: TICK,
        ttl_ms: TTL,
    };
    let store = Fake(Arc::clone(&calls), Default::default());
    let w = Worker::new(store, timing, inboxes.clone(), Some(tx), metrics, T0);
    Rig {
        w,
        calls,
        inboxes,
        ingest,
    }
}

impl Rig {
    fn log(&self) -> Vec<String> {
        std::mem::take(&mut self.calls.lock().unwrap().log)
    }
    /// The log without the counts read for courses new to the node (see
    /// `a_course_new_to_the_node_is_counted_with_its_first_write`).
    fn writes(&self) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| !l.starts_with("count"))
            .collect()
    }
    fn join(&mut self, course: &str, user: &str, now: u64) {
        let cmd = PresenceCmd::Join {
            course: course.into(),
            user: user.into(),
            from: BatchTag::default(),
        };
        assert!(self.w.command(cmd, now));
    }
    fn leave(&mut self, course: &str, user: &str, now: u64) {
        let cmd = PresenceCmd::Leave {
            course: course.into(),
            user: user.into(),
            from: BatchTag::default(),
        };
        assert!(self.w.command(cmd, now));
    }
    /// Counts pushed to shard 0 since the last look.
    fn counts(&self) -> Vec<Vec<(String, u64)>> {
        std::iter::from_fn(|| self.inboxes[0].try_control())
            .filter_map(|c| match c {
                Control::Presence { counts: v, .. } => {
                    Some(v.iter().map(|(c, n)| (c.to_string(), *n)).collect())
                }
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_member_is_added_once_and_removed_when_its_last_shard_leaves() {
    let mut r = rig();
    // The same user watching from two shards: each shard reports its own
    // first join, the store sees one member, written at once.
    r.join("C", "u1", T0 + 1);
    r.join("C", "u1", T0 + 2);
    r.join("C", "u2", T0 + 3);
    assert_eq!(
        r.writes(),
        [
            format!("add C u1 {}", T0 + 1 + TTL),
            format!("add C u2 {}", T0 + 3 + TTL)
        ]
    );
    r.leave("C", "u1", T0 + 4);
    assert_eq!(
        r.w.poll_timeout(),
        T0 + TICK,
        "u1 still watches from the other shard"
    );
    // The last leave waits out the window, then is written.
    r.leave("C", "u1", T0 + 5);
    assert_eq!(r.writes(), Vec::<String>::new(), "the window is still open");
    assert_eq!(r.w.poll_timeout(), T0 + 5 + LEAVE_WINDOW_MS);
    r.w.handle_timeout(T0 + 5 + LEAVE_WINDOW_MS);
    assert_eq!(r.log(), ["remove C u1"]);
    // A leave that was never joined changes nothing.
    r.leave("C", "ghost", T0 + 100);
    assert_eq!(r.w.poll_timeout(), T0 + TICK, "nothing to write");
}

#[test]
fn members_who_come_and_go_together_share_one_write() {
    let mut r = rig();
    let join = |c: &str, u: &str| PresenceCmd::Join {
        course: c.into(),
        user: u.into(),
        from: BatchTag::default(),
    };
    let leave = |c: &str, u: &str| PresenceCmd::Leave {
        course: c.into(),
        user: u.into(),
        from: BatchTag::default(),
    };
    // u1 twice (two shards) is one member; a shard's batch is handled in
    // place; u1 leaving one shard keeps it; u4 joins and leaves within
    // the same batch and is never written.
    let batch = [
        join("C", "u1"),
        PresenceCmd::Batch(vec![join("C", "u1"), join("D", "u2"), join("F", "u4")]),
        leave("C", "u1"),
        join("E", "u3"),
        leave("F", "u4"),
    ];
    assert!(r.w.commands(batch, T0));
    assert_eq!(r.writes(), [format!("add C u1, D u2, E u3 {}", T0 + TTL)]);
    assert_eq!(r.w.poll_timeout(), T0 + TICK, "nothing waits");
    // Leaving (u1's last shard, u2) over the window: one write at its end.
    let later = T0 + 100;
    assert!(r.w.commands([leave("C", "u1"), leave("D", "u2")], later));
    assert!(r.w.commands([leave("E", "u3")], later + 5));
    assert!(r.writes().is_empty(), "the window is still open");
    r.w.handle_timeout(later + LEAVE_WINDOW_MS);
    assert_eq!(r.log(), ["remove C u1, D u2, E u3"]);
    // One coming back inside the window (u5) costs no write of its own, but
    // its shard's watch answer waits for a count: the removals waiting are
    // written before it, as before every count.
    let later = later + 100;
    assert!(r.w.commands([join("G", "u5"), join("H", "u6")], later));
    r.log();
    assert!(r
        .w
        .commands([leave("G", "u5"), leave("H", "u6")], later + 50));
    assert!(r.w.commands([join("G", "u5")], later + 55));
    assert_eq!(
        r.log(),
        ["remove H u6".to_string(), format!("count 1 {}", later + 55)]
    );
}

#[test]
fn a_count_tick_writes_the_removals_waiting_before_it_counts() {
    let mut r = rig();
    r.join("C", "u1", T0);
    r.join("C", "u2", T0);
    r.log();
    r.leave("C", "u1", T0 + TICK - 5);
    assert_eq!(r.w.poll_timeout(), T0 + TICK, "the tick comes first");
    r.w.handle_timeout(T0 + TICK);
    assert_eq!(
        r.log(),
        ["remove C u1".to_string(), format!("count 1 {}", T0 + TICK)]
    );
    assert_eq!(r.counts(), [vec![("C".to_string(), 1)]]);
}

#[test]
fn counts_every_tick_and_rescores_every_half_ttl() {
    let mut r = rig();
    r.join("C", "u1", T0);
    r.join("D", "u2", T0);
    r.log();
    assert_eq!(r.w.poll_timeout(), T0 + TICK);
    let mut now = T0;
    let mut refreshes = Vec::new();
    let mut counts = Vec::new();
    while now < T0 + 2 * TTL {
        now = r.w.poll_timeout();
        r.w.handle_timeout(now);
        for l in r.log() {
            if l.starts_with("refresh") {
                refreshes.push((now, l));
            } else if l.starts_with("count") {
                counts.push(now);
            }
        }
    }
    // Re-scored every TTL/2, to now + TTL.
    let want: Vec<(u64, String)> = (1..=4)
        .map(|k| {
            let at = T0 + k * TTL / 2;
            (at, format!("refresh 2 {}", at + TTL))
        })
        .collect();
    assert_eq!(refreshes, want);
    // Counted every tick, pushed to every shard and to ingest.
    assert_eq!(counts.len() as u64, 2 * TTL / TICK);
    assert!(counts.windows(2).all(|w| w[1] - w[0] == TICK));
    let pushed = r.counts();
    assert_eq!(pushed.len(), counts.len());
    let mut last = pushed.last().unwrap().clone();
    last.sort();
    assert_eq!(last, [("C".into(), 1), ("D".into(), 1)]);
    let ticks = std::iter::from_fn(|| r.inboxes[1].try_control())
        .filter(|c| matches!(c, Control::Presence { .. }))
        .count();
    assert_eq!(ticks, counts.len());
    assert_eq!(
        std::iter::from_fn(|| r.ingest.try_recv()).count(),
        counts.len()
    );
}

#[test]
fn a_failed_write_is_repaired_at_the_next_count_tick() {
    let mut r = rig();
    r.calls.lock().unwrap().down = true;
    r.join("C", "u1", T0);
    r.log();
    r.calls.lock().unwrap().down = false;
    // The next tick re-scores everything (not TTL/2 later), then counts.
    r.w.handle_timeout(T0 + TICK);
    assert_eq!(
        r.log(),
        [
            format!("refresh 1 {}", T0 + TICK + TTL),
            format!("count 1 {}", T0 + TICK)
        ]
    );
    assert_eq!(r.counts(), [vec![("C".to_string(), 1)]]);
    // Repaired: the following tick only counts.
    r.w.handle_timeout(T0 + 2 * TICK);
    assert_eq!(r.log(), [format!("count 1 {}", T0 + 2 * TICK)]);
}

#[test]
fn a_failed_write_is_made_again_at_the_stores_next_attempt_not_on_the_tick() {
    let mut r = rig();
    {
        let mut c = r.calls.lock().unwrap();
        c.down = true;
        c.retry_in = Some(Duration::from_millis(700));
    }
    r.join("C", "u1", T0);
    assert_eq!(r.log(), [format!("add C u1 {}", T0 + TTL)]);
    // The worker wakes at the connection's own next attempt, well before
    // the presence tick, and not sooner.
    assert_eq!(r.w.poll_timeout(), T0 + 700);
    r.w.handle_timeout(T0 + 500);
    assert!(r.log().is_empty());
    // Still down: the attempt is made, and the next one is the backoff's.
    r.calls.lock().unwrap().retry_in = Some(Duration::from_millis(1_300));
    r.w.handle_timeout(T0 + 700);
    assert_eq!(r.log(), [format!("refresh 1 {}", T0 + 700 + TTL)]);
    assert_eq!(r.w.poll_timeout(), T0 + 2_000);
    // Back: the members are written at that attempt, then the tick counts.
    r.calls.lock().unwrap().down = false;
    r.w.handle_timeout(T0 + 2_000);
    assert_eq!(r.log(), [format!("refresh 1 {}", T0 + 2_000 + TTL)]);
    assert_eq!(r.w.poll_timeout(), T0 + TICK);
    r.w.handle_timeout(T0 + TICK);
    assert_eq!(r.log(), [format!("count 1 {}", T0 + TICK)]);
}

#[test]
fn a_removal_that_failed_is_sent_again_once_the_store_answers() {
    let mut r = rig();
    r.join("C", "u1", T0);
    r.join("C", "u2", T0);
    r.calls.lock().unwrap().down = true;
    r.leave("C", "u1", T0 + 100);
    r.leave("C", "u2", T0 + 100);
    r.w.handle_timeout(T0 + 100 + LEAVE_WINDOW_MS);
    // u2 comes back before the store does: only u1 is removed later.
    r.join("C", "u2", T0 + 200);
    r.w.handle_timeout(T0 + TICK);
    r.log();
    r.calls.lock().unwrap().down = false;
    r.w.handle_timeout(T0 + 2 * TICK);
    assert_eq!(
        r.log(),
        [
            format!("refresh 1 {}", T0 + 2 * TICK + TTL),
            "remove C u1".to_string(),
            format!("count 1 {}", T0 + 2 * TICK)
        ]
    );
    assert_eq!(r.counts(), [vec![("C".to_string(), 1)]]);
    // Done: the next tick only counts.
    r.w.handle_timeout(T0 + 3 * TICK);
    assert_eq!(r.log(), [format!("count 1 {}", T0 + 3 * TICK)]);
}

#[test]
fn admins_get_every_known_course_counted_and_rosters_answered() {
    let mut r = rig();
    r.join("C", "u1", T0);
    r.w.command(PresenceCmd::Extra(vec!["X".into()]), T0);
    r.w.handle_timeout(T0 + TICK);
    assert_eq!(
        r.counts(),
        [vec![("C".to_string(), 1)]],
        "extras only for admins"
    );
    r.w.command(PresenceCmd::CountAll(true), T0);
    r.w.command(PresenceCmd::Extra(vec!["X".into()]), T0);
    r.w.handle_timeout(T0 + 2 * TICK);
    let mut got = r.counts().pop().unwrap();
    got.sort();
    assert_eq!(got, [("C".into(), 1), ("X".into(), 0)]);
    // Roster: answered to the asking shard, with the viewers; an
    // unreachable store answers the `unavailable` error.
    let conn = shards::Shard::new(Default::default()).connect(
        "admin",
        shards::Role::Admin,
        shards::WsOptions::VIEWER,
        0,
    );
    let ask = |r: &mut Rig| {
        let cmd = PresenceCmd::Roster {
            shard: 1,
            conn,
            course: "C".into(),
        };
        r.w.command(cmd, T0 + 1);
        let frames: Vec<Bytes> = std::iter::from_fn(|| r.inboxes[1].try_control())
            .filter_map(|c| match c {
                Control::Roster { frame, .. } => Some(frame),
                _ => None,
            })
            .collect();
        assert_eq!(frames.len(), 1);
        String::from_utf8_lossy(&frames[0][2..]).into_owned()
    };
    let roster = ask(&mut r);
    assert!(roster.contains(r#""total":1,"viewers":["u1"]"#), "{roster}");
    r.calls.lock().unwrap().down = true;
    assert!(ask(&mut r).contains(r#""code":"unavailable""#));
}

/// What the store of `serve` sends over its link: every pipeline (one round
/// trip) as its commands' words, and whether the link fails.
#[derive(Default)]
struct Sent {
    pipelines: Vec<Vec<String>>,
    down: bool,
    /// The link's clock (Unix ms), which the keys' TTLs are read from.
    now: u64,
}

/// A link that records what [`super::redis::RedisPresence`] sends, answers
/// every command `1` (a count of 1), and fails while down.
struct Wire(Arc<Mutex<Sent>>);

impl Wire {
    fn send<T: ::redis::FromRedisValue>(
        &mut self,
        cmds: &[::redis::Cmd],
    ) -> Result<T, crate::redis::Error> {
        let mut s = self.0.lock().unwrap();
        let words = |c: &::redis::Cmd| {
            let w: Vec<String> = c
                .args_iter()
                .map(|a| match a {
                    ::redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "<cursor>".into(),
                })
                .collect();
            w.join(" ")
        };
        s.pipelines.push(cmds.iter().map(words).collect());
        if s.down {
            return Err(crate::redis::Error::Backoff { what: "presence" });
        }
        let replies = vec![::redis::Value::Int(1); cmds.len()];
        Ok(T::from_redis_value(::redis::Value::Array(replies)).expect("integer replies"))
    }
}

impl super::redis::PresenceLink for Wire {
    fn query<T: ::redis::FromRedisValue>(
        &mut self,
        cmd: &::redis::Cmd,
    ) -> Result<T, crate::redis::Error> {
        self.send(std::slice::from_ref(cmd))
    }
    fn pipeline<T: ::redis::FromRedisValue + 'static>(
        &mut self,
        cmds: &[::redis::Cmd],
    ) -> Result<T, crate::redis::Error> {
        self.send(cmds)
    }
    fn unix_ms(&self) -> u64 {
        self.0.lock().unwrap().now
    }
}

/// A worker over the Redis store (keys `p:<course>`) on a [`Wire`].
fn wired() -> (Worker<super::redis::RedisPresence<Wire>>, Arc<Mutex<Sent>>) {
    let sent = Arc::new(Mutex::new(Sent {
        now: T0,
        ..Sent::default()
    }));
    let store = super::redis::RedisPresence::on(Wire(Arc::clone(&sent)), "p:");
    let timing = PresenceTiming {
        tick_ms: TICK,
        ttl_ms: TTL,
    };
    let metrics = Arc::new(crate::metrics::Metrics::new(1));
    let w = Worker::new(store, timing, vec![Inbox::new()], None, metrics, T0);
    (w, sent)
}

/// The pipelines sent since the last look, each command's members sorted
/// (a re-score names them in its map's order): `ZADD p:C 9 u2 9 u1` reads
/// `ZADD p:C 9 u1 9 u2`.
fn pipelines(sent: &Mutex<Sent>) -> Vec<Vec<String>> {
    let taken = std::mem::take(&mut sent.lock().unwrap().pipelines);
    taken
        .into_iter()
        .map(|p| {
            p.into_iter()
                .map(|cmd| {
                    let words: Vec<&str> = cmd.split(' ').collect();
                    let (head, rest) = words.split_at(2.min(words.len()));
                    let mut items: Vec<String> = match head.first() {
                        Some(&"ZADD") => rest.chunks(2).map(|p| p.join(" ")).collect(),
                        Some(&"ZREM") => rest.iter().map(|m| m.to_string()).collect(),
                        _ => return cmd,
                    };
                    items.sort();
                    format!("{} {}", head.join(" "), items.join(" "))
                })
                .collect()
        })
        .collect()
}

fn join(c: &str, u: &str) -> PresenceCmd {
    PresenceCmd::Join {
        course: c.into(),
        user: u.into(),
        from: BatchTag::default(),
    }
}

fn leave(c: &str, u: &str) -> PresenceCmd {
    PresenceCmd::Leave {
        course: c.into(),
        user: u.into(),
        from: BatchTag::default(),
    }
}

#[test]
fn a_batch_is_written_as_one_zadd_and_one_pexpire_per_course() {
    let (mut w, sent) = wired();
    let exp = T0 + TTL;
    // Several courses, several members each; u1 from two shards is one
    // member; u4 joins and leaves within the batch and is never written.
    let batch = [
        join("C", "u2"),
        join("D", "u3"),
        join("C", "u1"),
        PresenceCmd::Batch(vec![join("C", "u1"), join("E", "u4"), join("D", "u5")]),
        join("C", "u6"),
        leave("E", "u4"),
    ];
    assert!(w.commands(batch, T0));
    assert_eq!(
        pipelines(&sent),
        [vec![
            format!("ZADD p:C {exp} u1 {exp} u2 {exp} u6"),
            format!("PEXPIRE p:C {TTL}"),
            format!("ZADD p:D {exp} u3 {exp} u5"),
            format!("PEXPIRE p:D {TTL}"),
            // The courses new to the node, counted once written.
            format!("ZREMRANGEBYSCORE p:C 0 {T0}"),
            "ZCARD p:C".into(),
            format!("ZREMRANGEBYSCORE p:D 0 {T0}"),
            "ZCARD p:D".into(),
        ]],
        "one round trip, each course's key named twice, then counted"
    );
    // Leaving over the window: u1 from one shard (still a member), then its
    // last; one ZREM per course, in one round trip once the window is out.
    let later = T0 + 100;
    assert!(w.commands([leave("C", "u1"), leave("D", "u3")], later));
    assert!(w.commands([leave("C", "u1"), leave("C", "u6")], later + 5));
    assert!(pipelines(&sent).is_empty(), "the window is still open");
    w.handle_timeout(later + LEAVE_WINDOW_MS);
    assert_eq!(
        pipelines(&sent),
        [vec![
            "ZREM p:C u1 u6".to_string(),
            "ZREM p:D u3".to_string()
        ]]
    );
    // The re-score names every member left, per course, and each key's TTL.
    sent.lock().unwrap().now = T0 + TTL / 2;
    w.handle_timeout(T0 + TTL / 2);
    let mut rescore = pipelines(&sent);
    let count = rescore.pop().expect("the count");
    assert_eq!(count.len(), 4, "{count:?}");
    let mut rescore = rescore.pop().expect("the re-score");
    rescore.sort();
    let exp = T0 + TTL / 2 + TTL;
    assert_eq!(
        rescore,
        [
            format!("PEXPIRE p:C {TTL}"),
            format!("PEXPIRE p:D {TTL}"),
            format!("ZADD p:C {exp} u2"),
            format!("ZADD p:D {exp} u5"),
        ]
    );
}

#[test]
fn a_course_s_many_new_members_go_in_bounded_commands() {
    let (mut w, sent) = wired();
    let n = super::redis::MEMBERS_PER_COMMAND * 2 + 7;
    let users: Vec<String> = (0..n).map(|i| format!("u{i:05}")).collect();
    assert!(w.commands(users.iter().map(|u| join("C", u)), T0));
    let sent = pipelines(&sent);
    assert_eq!(sent.len(), 1, "one round trip");
    let cmds = &sent[0];
    assert_eq!(cmds.len(), 6, "three ZADDs, the key's TTL, then its count");
    let named: Vec<usize> = cmds[..3]
        .iter()
        .map(|c| (c.split(' ').count() - 2) / 2)
        .collect();
    assert_eq!(
        named,
        [
            super::redis::MEMBERS_PER_COMMAND,
            super::redis::MEMBERS_PER_COMMAND,
            7
        ]
    );
    assert!(cmds[..3].iter().all(|c| c.starts_with("ZADD p:C ")));
    assert_eq!(cmds[3], format!("PEXPIRE p:C {TTL}"));
    let mut all: Vec<&str> = cmds[..3]
        .iter()
        .flat_map(|c| c.split(' ').skip(2).skip(1).step_by(2))
        .collect();
    all.sort();
    assert_eq!(all, users.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn a_failed_grouped_write_is_retried_grouped() {
    let (mut w, sent) = wired();
    sent.lock().unwrap().down = true;
    assert!(w.commands([join("C", "u1"), join("C", "u2"), join("D", "u3")], T0));
    let exp = T0 + TTL;
    assert_eq!(
        pipelines(&sent),
        [vec![
            format!("ZADD p:C {exp} u1 {exp} u2"),
            format!("PEXPIRE p:C {TTL}"),
            format!("ZADD p:D {exp} u3"),
            format!("PEXPIRE p:D {TTL}"),
            format!("ZREMRANGEBYSCORE p:C 0 {T0}"),
            "ZCARD p:C".to_string(),
            format!("ZREMRANGEBYSCORE p:D 0 {T0}"),
            "ZCARD p:D".to_string(),
        ]],
        "tried once, with the new courses' count"
    );
    // Two leave while the store is still down: their removal fails too.
    assert!(w.commands([leave("C", "u1"), leave("D", "u3")], T0 + 10));
    w.handle_timeout(T0 + 10 + LEAVE_WINDOW_MS);
    assert_eq!(
        pipelines(&sent),
        [vec!["ZREM p:C u1".to_string(), "ZREM p:D u3".to_string()]]
    );
    let mut s = sent.lock().unwrap();
    (s.down, s.now) = (false, T0 + TICK);
    drop(s);
    // The next tick writes again what failed, grouped: the member left
    // re-scored with its key's TTL, the removals in one ZREM per course,
    // then the count.
    w.handle_timeout(T0 + TICK);
    let exp = T0 + TICK + TTL;
    assert_eq!(
        pipelines(&sent),
        [
            vec![format!("ZADD p:C {exp} u2"), format!("PEXPIRE p:C {TTL}")],
            vec!["ZREM p:C u1".to_string(), "ZREM p:D u3".to_string()],
            vec![
                format!("ZREMRANGEBYSCORE p:C 0 {}", T0 + TICK),
                "ZCARD p:C".to_string()
            ],
        ]
    );
    // Repaired: the following tick only counts.
    w.handle_timeout(T0 + 2 * TICK);
    assert_eq!(pipelines(&sent).len(), 1);
}

#[test]
fn a_course_is_counted_while_it_has_members_and_forgotten_with_its_last() {
    let mut r = rig();
    r.join("C", "u1", T0);
    r.join("C", "u2", T0);
    r.join("D", "u3", T0);
    r.w.handle_timeout(T0 + TICK);
    let mut got = r.counts().pop().expect("a count");
    got.sort();
    assert_eq!(got, [("C".into(), 2), ("D".into(), 1)]);
    // D's only member leaves, C keeps one of two: D is no longer counted.
    r.leave("D", "u3", T0 + TICK + 1);
    r.leave("C", "u1", T0 + TICK + 1);
    r.w.handle_timeout(T0 + 2 * TICK);
    assert_eq!(r.counts(), [vec![("C".to_string(), 1)]]);
    // C's last leaves: nothing left to count, nothing asked of the store.
    r.leave("C", "u2", T0 + 2 * TICK + 1);
    r.log();
    r.w.handle_timeout(T0 + 3 * TICK);
    assert_eq!(r.log(), ["remove C u2"]);
    assert!(r.counts().is_empty());
}

/// A waiting set emptied by its write keeps no more than twice its kept room.
fn assert_room_given_back(len: usize, capacity: usize) {
    assert_eq!(len, 0, "written");
    assert!(capacity <= WAITING_KEPT * 2, "{capacity} kept");
}

#[test]
fn a_storm_s_waiting_writes_do_not_keep_their_peak_room() {
    let mut r = rig();
    let n = WAITING_KEPT * 8;
    let users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let joins = users.iter().map(|u| PresenceCmd::Join {
        course: "C".into(),
        user: u.as_str().into(),
        from: BatchTag::default(),
    });
    assert!(r.w.commands(joins, T0));
    assert_eq!(r.writes().len(), 1, "one write");
    assert_room_given_back(r.w.adds.len(), r.w.adds.capacity());
    let leaves = users.iter().map(|u| PresenceCmd::Leave {
        course: "C".into(),
        user: u.as_str().into(),
        from: BatchTag::default(),
    });
    assert!(r.w.commands(leaves, T0 + 1));
    assert!(r.w.removes.len() == n, "the leaves wait out the window");
    r.w.handle_timeout(T0 + 1 + LEAVE_WINDOW_MS);
    assert_eq!(r.log().len(), 1, "one write");
    assert_room_given_back(r.w.removes.len(), r.w.removes.capacity());
    assert!(r.w.members.is_empty() && r.w.courses.is_empty());
}

#[test]
fn each_shard_s_counts_name_the_last_of_its_batches_written_before_them() {
    let mut r = rig();
    let tagged = |course: &str, user: &str, shard: usize, batch: u64| PresenceCmd::Join {
        course: course.into(),
        user: user.into(),
        from: BatchTag { shard, batch },
    };
    let batch = [
        tagged("D", "u1", 0, 4),
        PresenceCmd::Batch(vec![tagged("C", "u2", 1, 7), tagged("D", "u3", 1, 7)]),
    ];
    assert!(r.w.commands(batch, T0));
    r.w.handle_timeout(T0 + TICK);
    let pushed = |i: usize| -> Vec<(Vec<(String, u64)>, u64)> {
        std::iter::from_fn(|| r.inboxes[i].try_control())
            .filter_map(|c| match c {
                Control::Presence { counts, applied } => Some((
                    counts.iter().map(|(c, n)| (c.to_string(), *n)).collect(),
                    applied,
                )),
                _ => None,
            })
            .collect()
    };
    // One count, sorted by course, written after both shards' joins.
    let counts = vec![("C".to_string(), 1), ("D".to_string(), 2)];
    assert_eq!(pushed(0), [(counts.clone(), 4)]);
    assert_eq!(pushed(1), [(counts, 7)]);
}

#[test]
fn a_course_is_counted_with_every_write_that_adds_members() {
    let mut r = rig();
    // Two viewers elsewhere (another node's members, already in the store).
    let others = [("C".into(), "x1".into()), ("C".into(), "x2".into())];
    r.w.store.1.add(&others, T0 + TTL).expect("seeded");
    let tagged = |course: &str, user: &str, shard: usize, batch: u64| PresenceCmd::Join {
        course: course.into(),
        user: user.into(),
        from: BatchTag { shard, batch },
    };
    let join = tagged("C", "u1", 1, 3);
    assert!(
        r.w.brings_a_new_course(&join),
        "written at once, not gathered"
    );
    assert!(r.w.commands([join], T0));
    assert_eq!(
        r.log(),
        [format!("add C u1 {}", T0 + TTL), format!("count 1 {T0}")],
        "written, then counted"
    );
    let first = |r: &Rig, i: usize| -> Vec<(Vec<(String, u64)>, u64)> {
        std::iter::from_fn(|| r.inboxes[i].try_control())
            .filter_map(|c| match c {
                Control::JoinCounts { counts, applied } => Some((
                    counts.iter().map(|(c, n)| (c.to_string(), *n)).collect(),
                    applied,
                )),
                Control::Presence { .. } => panic!("not the tick's whole list"),
                _ => None,
            })
            .collect()
    };
    // Every shard gets it, with the last of its batches written before.
    let c3 = vec![("C".to_string(), 3)];
    assert_eq!(first(&r, 0), [(c3.clone(), 0)]);
    assert_eq!(first(&r, 1), [(c3, 3)]);
    assert!(
        r.ingest.try_recv().is_none(),
        "the admin view waits for the tick"
    );
    // A course the node already counts is gathered (not written at once),
    // and counted with the write all the same: the next watch answer on
    // any shard shows it.
    let batch = PresenceCmd::Batch(vec![tagged("C", "u2", 0, 1)]);
    assert!(!r.w.brings_a_new_course(&batch));
    assert!(r.w.commands([batch], T0 + 1));
    assert_eq!(
        r.log(),
        [
            format!("add C u2 {}", T0 + 1 + TTL),
            format!("count 1 {}", T0 + 1)
        ]
    );
    let c4 = vec![("C".to_string(), 4)];
    assert_eq!(first(&r, 0), [(c4.clone(), 1)]);
    assert_eq!(first(&r, 1), [(c4, 3)]);
    // A leave alone writes nothing yet and counts nothing.
    let leave = PresenceCmd::Leave {
        course: "C".into(),
        user: "u2".into(),
        from: BatchTag { shard: 0, batch: 2 },
    };
    assert!(r.w.commands([leave], T0 + 2));
    assert!(r.log().is_empty());
    assert!(first(&r, 0).is_empty() && first(&r, 1).is_empty());
    // A join before the leave is written: the leave goes first, so the
    // count (which covers the leave's batch) does not show u2.
    assert!(r.w.commands([tagged("C", "u4", 0, 3)], T0 + 3));
    assert_eq!(
        r.log(),
        [
            "remove C u2".to_string(),
            format!("add C u4 {}", T0 + 3 + TTL),
            format!("count 1 {}", T0 + 3)
        ]
    );
    assert_eq!(first(&r, 0), [(vec![("C".to_string(), 4)], 3)]);
    let _ = first(&r, 1);
    // u4's second tab, on shard 1: no new member and nothing to write, but
    // shard 1's watch answer waits for a count that covers its batch.
    assert!(r.w.commands([tagged("C", "u4", 1, 4)], T0 + 4));
    assert_eq!(r.log(), [format!("count 1 {}", T0 + 4)]);
    assert_eq!(first(&r, 1), [(vec![("C".to_string(), 4)], 4)]);
    let _ = first(&r, 0);
    // A write that failed is not followed by a count.
    r.calls.lock().unwrap().down = true;
    assert!(r.w.commands([tagged("D", "u3", 0, 4)], T0 + 5));
    assert_eq!(r.log(), [format!("add D u3 {}", T0 + 5 + TTL)]);
    assert!(first(&r, 0).is_empty());
}
