//! `GET /api/history?session=S`: the analytics series of a session, for the
//! admin page. Shards never touch Redis for it: they read a cache that one
//! background thread keeps fresh with XRANGE (the node's `--session` always,
//! plus any session asked for recently). In `demo` the series is recorded in
//! process from the simulator's snapshots.

use crate::analytics_stream::read::{read_after, read_last, PAGE};
use crate::analytics_stream::{stream_key, Buckets, Closed, Entry};
use crate::clock;
use crate::redis::commands::Commands;
use crate::redis::Redis;
use crate::supervisor::{self, Policy};
use serde::Serialize;
use shards::Snapshot;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Entries kept per session (a day of 30 s buckets).
pub const KEEP: usize = 2880;
/// How often a tracked session is re-read.
const REFRESH: Duration = Duration::from_secs(5);
/// How often the refresher looks for sessions due while Redis answers
/// (after a failure it waits for its client's next attempt instead).
const TURN: Duration = Duration::from_secs(1);
/// A session nobody asked for in this long is no longer tracked.
const FORGET: Duration = Duration::from_secs(600);
/// Sessions tracked besides the node's own.
const MAX_ASKED: usize = 8;
/// Bucket length of the demo's in-process series.
pub const DEMO_BUCKET_MS: u64 = 5_000;
/// Courses listed per entry in `top`.
const TOP: usize = 5;
/// Most pages read for one session in one refresh.
const MAX_PAGES: usize = 10;

/// True for a usable session id: 1-128 of `[A-Za-z0-9_.:-]`.
pub fn valid_session(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
}

#[derive(Serialize)]
struct TopCourse<'a> {
    course: &'a str,
    updates: u64,
    viewers: u64,
}

#[derive(Serialize)]
struct Point<'a> {
    id: &'a str,
    bucket_start_ms: u64,
    bucket_ms: u64,
    updates: u64,
    viewers: u64,
    seats_taken: u64,
    total_seats: u64,
    courses: usize,
    top: Vec<TopCourse<'a>>,
}

fn point<'a>(id: &'a str, e: &'a Entry) -> Point<'a> {
    let mut top: Vec<&_> = e.courses.iter().collect();
    top.sort_by(|a, b| {
        (b.updates, b.viewers)
            .cmp(&(a.updates, a.viewers))
            .then_with(|| a.course.cmp(&b.course))
    });
    Point {
        id,
        bucket_start_ms: e.bucket_start_ms,
        bucket_ms: e.bucket_ms,
        updates: e.courses.iter().map(|c| c.updates).sum(),
        viewers: e.courses.iter().map(|c| c.viewers).sum(),
        seats_taken: e.courses.iter().map(|c| c.seats_taken).sum(),
        total_seats: e.courses.iter().map(|c| c.total_seats).sum(),
        courses: e.courses.len(),
        top: top
            .into_iter()
            .take(TOP)
            .map(|c| TopCourse {
                course: &c.course,
                updates: c.updates,
                viewers: c.viewers,
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct Body<'a> {
    session: &'a str,
    source: &'a str,
    updated_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pending: bool,
    entries: Vec<Point<'a>>,
}

/// The JSON body of `/api/history` for a series.
pub fn render(
    session: &str,
    source: &str,
    series: &VecDeque<(String, Entry)>,
    error: Option<&str>,
    pending: bool,
) -> String {
    let body = Body {
        session,
        source,
        updated_ms: clock::unix_ms(),
        error,
        pending,
        entries: series.iter().map(|(id, e)| point(id, e)).collect(),
    };
    serde_json::to_string(&body).unwrap_or_else(|_| "{}".into())
}

/// The demo's in-process series: the analytics bucket machine fed by the simulator.
struct DemoSeries {
    buckets: Buckets,
    series: VecDeque<(String, Entry)>,
}

impl DemoSeries {
    fn roll(&mut self, now_ms: u64) {
        if self.buckets.due(now_ms) {
            if let (Closed::Write, Some(e)) = self.buckets.close(now_ms, &HashMap::new()) {
                self.series
                    .push_back((format!("{}-0", e.bucket_start_ms), e));
                while self.series.len() > KEEP {
                    self.series.pop_front();
                }
            }
        }
    }
}

/// The history cache a node's shards answer from.
pub struct History {
    own: String,
    /// Rendered bodies by session (what the shards serve).
    bodies: RwLock<HashMap<String, Arc<str>>>,
    /// Sessions asked for, with when they were last asked.
    asked: Mutex<HashMap<String, Instant>>,
    /// Wakes the refresher when a new session is asked for.
    wake: Mutex<Option<crossbeam_channel::Sender<()>>>,
    demo: Mutex<Option<DemoSeries>>,
    running: AtomicBool,
}

impl History {
    /// An empty cache for a node whose own session is `own`.
    pub fn new(own: &str) -> Self {
        History {
            own: own.to_owned(),
            bodies: RwLock::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
            wake: Mutex::new(None),
            demo: Mutex::new(None),
            running: AtomicBool::new(false),
        }
    }

    /// Ends the refresher's wait at once (at shutdown, after
    /// [`supervisor::stop`]): its wake-up channel is dropped.
    pub fn stop(&self) {
        self.wake.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Records one demo snapshot into the in-process series (demo only).
    pub fn record_demo(&self, snap: &Snapshot) {
        let now = clock::unix_ms();
        let mut d = self.demo.lock().unwrap_or_else(|e| e.into_inner());
        let d = d.get_or_insert_with(|| DemoSeries {
            buckets: Buckets::new(DEMO_BUCKET_MS, now),
            series: VecDeque::new(),
        });
        d.roll(now);
        let _ = d.buckets.on_snapshot(snap);
    }

    /// The body of `GET /api/history?session=S` (a cheap read on the shard thread).
    pub fn answer(&self, session: &str) -> String {
        {
            let mut d = self.demo.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(d) = d.as_mut() {
                if session != self.own {
                    return render(session, "demo", &VecDeque::new(), None, false);
                }
                d.roll(clock::unix_ms());
                return render(session, "demo", &d.series, None, false);
            }
        }
        if !self.running.load(Relaxed) {
            return render(session, "none", &VecDeque::new(), None, false);
        }
        if session != self.own {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            let known = asked.contains_key(session);
            if known || asked.len() < MAX_ASKED {
                asked.insert(session.to_owned(), Instant::now());
            }
            if !known {
                if let Some(tx) = &*self.wake.lock().unwrap_or_else(|e| e.into_inner()) {
                    let _ = tx.try_send(());
                }
            }
        }
        let bodies = self.bodies.read().unwrap_or_else(|e| e.into_inner());
        match bodies.get(session) {
            Some(b) => b.to_string(),
            None => render(session, "redis", &VecDeque::new(), None, true),
        }
    }

    fn store(&self, session: &str, body: String) {
        self.bodies
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(session.to_owned(), body.into());
    }

    /// Sessions to refresh now: the node's own and the recently asked ones.
    fn tracked(&self) -> Vec<String> {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.retain(|_, t| t.elapsed() < FORGET);
        let mut v: Vec<String> = asked.keys().cloned().collect();
        v.push(self.own.clone());
        let mut bodies = self.bodies.write().unwrap_or_else(|e| e.into_inner());
        bodies.retain(|s, _| v.contains(s));
        v
    }
}

/// One session's cached series on the refresher thread.
#[derive(Default)]
struct Series {
    entries: VecDeque<(String, Entry)>,
    last_id: Option<String>,
    refreshed: Option<Instant>,
}

fn refresh(con: &mut Commands, key: &str, s: &mut Series) -> Result<bool, crate::redis::Error> {
    let mut changed = false;
    match s.last_id.clone() {
        None => {
            let (page, last) = read_last(con, key, KEEP)?;
            changed = !page.is_empty();
            s.entries = page.into();
            s.last_id = last;
        }
        Some(mut after) => {
            for _ in 0..MAX_PAGES {
                let (page, last) = read_after(con, key, Some(&after), PAGE)?;
                let full = page.len() >= PAGE;
                changed |= !page.is_empty();
                s.entries.extend(page);
                match last {
                    Some(id) => after = id,
                    None => break,
                }
                if !full {
                    break;
                }
            }
            s.last_id = Some(after);
        }
    }
    while s.entries.len() > KEEP {
        s.entries.pop_front();
    }
    Ok(changed)
}

/// Starts the refresher thread of a Redis-backed node (not for `demo`): it
/// fills `history` from the streams `<prefix><session>` until `stop` says so.
pub fn start(
    history: Arc<History>,
    redis: Arc<Redis>,
    prefix: String,
    stop: impl Fn() -> bool + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    *history.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    history.running.store(true, Relaxed);
    supervisor::spawn("seatboard-history", Policy::FailsNode, move || {
        let con = Commands::new(&redis, "history");
        let stop = move || stop() || supervisor::stopping();
        run(&history, &prefix, &stop, con, &rx)
    })
}

fn run(
    history: &History,
    prefix: &str,
    stop: &dyn Fn() -> bool,
    mut con: Commands,
    wake: &crossbeam_channel::Receiver<()>,
) {
    let mut series: HashMap<String, Series> = HashMap::new();
    let mut last_error: Option<String> = None;
    // Since when reads fail: an outage is logged once as it starts and once
    // as it ends, whatever the texts of its failures (a failed connect, then
    // "waiting to reconnect" between attempts).
    let mut failing_since: Option<Instant> = None;
    loop {
        if stop() {
            return;
        }
        let mut failed = false;
        let sessions = history.tracked();
        series.retain(|s, _| sessions.contains(s));
        for session in &sessions {
            let s = series.entry(session.clone()).or_default();
            if s.refreshed.is_some_and(|t| t.elapsed() < REFRESH) {
                continue;
            }
            let key = stream_key(prefix, session);
            match refresh(&mut con, &key, s) {
                Ok(changed) => {
                    if changed || s.refreshed.is_none() || last_error.is_some() {
                        history.store(session, render(session, "redis", &s.entries, None, false));
                    }
                    s.refreshed = Some(Instant::now());
                    last_error = None;
                    if let Some(t) = failing_since.take() {
                        tracing::info!(
                            down_ms = t.elapsed().as_millis() as u64,
                            session,
                            "history: XRANGE answers again"
                        );
                    }
                }
                Err(e) => {
                    // Its text, shown on the page; the outage logged once.
                    let e = e.to_string();
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        tracing::warn!(error = %e, session, "history: XRANGE failed");
                    }
                    history.store(
                        session,
                        render(session, "redis", &s.entries, Some(&e), false),
                    );
                    last_error = Some(e);
                    failed = true;
                    break;
                }
            }
        }
        // After a failure, the next read is the client's next attempt (its
        // own jittered backoff), not the next whole second.
        let _ = wake.recv_timeout(con.next_turn(failed, TURN));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytics_stream::CourseRow;

    fn row(course: &str, updates: u64, viewers: u64) -> CourseRow {
        CourseRow {
            course: course.into(),
            updates,
            viewers,
            seats_taken: 1,
            total_seats: 2,
        }
    }

    #[test]
    fn after_a_failure_redis_is_dialed_again_on_the_clients_backoff_not_each_second() {
        use crate::channels::poll::wait_readable;
        use std::os::fd::AsRawFd;
        // A "Redis" that takes each connection and closes it at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let redis = Redis::from_flags(&crate::redis::RedisFlags::new(&format!(
            "redis://127.0.0.1:{port}"
        )))
        .expect("flags");
        let history = Arc::new(History::new("s"));
        history.running.store(true, Relaxed);
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let refresher = {
            let (history, stop) = (Arc::clone(&history), Arc::clone(&stop));
            std::thread::spawn(move || {
                let con = Commands::new(&redis, "history");
                run(&history, "a:", &move || stop.load(Relaxed), con, &rx)
            })
        };
        let start = Instant::now();
        let window = Duration::from_millis(1_500);
        let mut attempts = Vec::new();
        while let Some(left) = window.checked_sub(start.elapsed()) {
            wait_readable(&[listener.as_raw_fd()], left);
            while let Ok((c, _)) = listener.accept() {
                attempts.push(start.elapsed());
                drop(c);
            }
        }
        stop.store(true, Relaxed);
        drop(tx);
        refresher.join().expect("refresher");
        // The client's backoff (25-50 ms, then 50-100, 100-200, 200-400 ...)
        // makes at least five attempts in 1.5 s; a loop that retries when
        // its one-second tick comes makes two.
        assert!(
            attempts.len() >= 4,
            "attempts only at the loop's tick: {attempts:?}"
        );
        let body: serde_json::Value = serde_json::from_str(&history.answer("s")).expect("json");
        assert!(body["error"].is_string(), "{body}");
    }

    #[test]
    fn session_ids() {
        assert!(valid_session("fall-2025:main_1.a"));
        assert!(!valid_session(""));
        assert!(!valid_session("a b"));
        assert!(!valid_session(&"x".repeat(129)));
    }

    #[test]
    fn body_sums_courses_and_lists_the_busiest() {
        let courses = (0..7).map(|i| row(&format!("C{i}"), i, 10 - i)).collect();
        let series: VecDeque<(String, Entry)> = [(
            "5-0".to_string(),
            Entry {
                bucket_start_ms: 0,
                bucket_ms: 1000,
                courses,
            },
        )]
        .into();
        let v: serde_json::Value =
            serde_json::from_str(&render("s", "redis", &series, Some("down"), false))
                .expect("json");
        let e = &v["entries"][0];
        assert_eq!(e["updates"], 21);
        assert_eq!(e["viewers"], 70 - 21);
        assert_eq!(e["seats_taken"], 7);
        assert_eq!(e["total_seats"], 14);
        assert_eq!(e["courses"], 7);
        let top: Vec<&str> = e["top"]
            .as_array()
            .expect("top")
            .iter()
            .filter_map(|t| t["course"].as_str())
            .collect();
        assert_eq!(top, ["C6", "C5", "C4", "C3", "C2"]);
        assert_eq!(v["error"], "down");
        assert!(v.get("pending").is_none());
    }

    #[test]
    fn demo_series_and_no_source() {
        let h = History::new("default");
        let empty: serde_json::Value = serde_json::from_str(&h.answer("default")).expect("json");
        assert_eq!(empty["source"], "none");
        h.record_demo(&Snapshot::build(
            "CS101".into(),
            0,
            10,
            3,
            None,
            Some(1),
            None,
        ));
        let v: serde_json::Value = serde_json::from_str(&h.answer("default")).expect("json");
        assert_eq!(v["source"], "demo");
        assert!(v["entries"].is_array());
    }
}
