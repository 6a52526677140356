//! `connect_cost`: the connect phase's server CPU per connection, taken
//! apart and set against two references in one run, alternated (forward,
//! then backward): seatboard answering the upgrade only (no watch), the
//! upgrade then a `watch` message, the upgrade naming the course
//! (`/ws?course=C`); the connect floor (`floor_server.rs`); and
//! uWebSockets.js upgrading and subscribing the socket to its course's topic
//! (`benches/uws/server.cjs`, on two worker threads); `--rounds N` runs
//! more rounds of the alternation (default 2). The same load
//! generator, clients and pace drive every one. For seatboard's ways each
//! row also splits the CPU by thread (shards, presence, ingest, state
//! reader) and counts the frames sent per connection, so the product's own
//! work (presence, course subscriptions) shows apart from the front door's;
//! every way's row counts its server's context switches per connection (its
//! wake-ups). `--against BIN` adds the same seatboard ways on another build,
//! so a change is measured against the build before it in the same run.

use crate::children::Fleet;
use crate::floor_server;
use crate::measure::{by_thread_text, per_each, progress};
use crate::procs;
use crate::reconnect::wait_answered;
use crate::redis_rig::RedisRig;
use crate::server::{serve, serve_bin};
use crate::setup::{course_names, fleet, server_flags};
use crate::{Opts, Outcome};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The servers' presence tick (the default `--presence-tick-ms`).
const PRESENCE_TICK_MS: u64 = 3_000;

/// One way of connecting: its name, what serves it, and what its clients do.
#[derive(Clone, Copy)]
struct Way {
    name: &'static str,
    target: Target,
    /// The clients send a `watch` or name their course (else connect only).
    watch: bool,
    /// The course rides in the upgrade.
    named: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Seatboard,
    /// The `--against` build, served beside the one under test.
    Against,
    Floor,
    Uws,
}

impl Target {
    /// A seatboard build (this one or `--against`), whose CPU splits by thread.
    fn is_seatboard(self) -> bool {
        matches!(self, Target::Seatboard | Target::Against)
    }
}

/// The ways `--against` adds: the upgrade alone and the upgrade naming its
/// course, on the other build.
const AGAINST_WAYS: [Way; 2] = [
    Way {
        name: "upgrade_only_against",
        target: Target::Against,
        watch: false,
        named: false,
    },
    Way {
        name: "upgrade_naming_course_against",
        target: Target::Against,
        watch: true,
        named: true,
    },
];

const WAYS: [Way; 5] = [
    Way {
        name: "upgrade_only",
        target: Target::Seatboard,
        watch: false,
        named: false,
    },
    Way {
        name: "upgrade_then_watch",
        target: Target::Seatboard,
        watch: true,
        named: false,
    },
    Way {
        name: "upgrade_naming_course",
        target: Target::Seatboard,
        watch: true,
        named: true,
    },
    Way {
        name: "connect_floor",
        target: Target::Floor,
        watch: true,
        named: false,
    },
    Way {
        name: "uws_upgrade_subscribe",
        target: Target::Uws,
        watch: true,
        named: true,
    },
];

/// The uWebSockets.js reference server (a child `node` process).
struct Uws {
    child: Child,
    port: u16,
}

impl Uws {
    /// Installs the package (npm ci) when missing and starts the server;
    /// panics, naming why, when it does not load or listen.
    fn start() -> Uws {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/uws");
        if !dir
            .join("node_modules/@trufflesuite/uws-js-unofficial")
            .exists()
        {
            let st = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&dir)
                .status()
                .expect("npm must be installed for connect_cost");
            assert!(st.success(), "npm ci in benches/uws failed");
        }
        let port = testkit::proc::free_port();
        let mut child = Command::new("node")
            .arg(dir.join("server.cjs"))
            .arg(port.to_string())
            .arg("2")
            .stdout(Stdio::piped())
            .spawn()
            .expect("node must be installed for connect_cost");
        let mut line = String::new();
        if let Some(so) = child.stdout.take() {
            let _ = std::io::BufReader::new(so).read_line(&mut line);
        }
        assert_eq!(
            line.trim(),
            "listening",
            "uWebSockets.js did not start (see its stderr above)"
        );
        Uws { child, port }
    }
}

impl Drop for Uws {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `pid`'s CPU time stops growing (its last connections torn
/// down), at most 5 s.
fn settle(pid: u32) {
    let end = Instant::now() + Duration::from_secs(5);
    let mut last = procs::usage(pid).cpu_us;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        let now = procs::usage(pid).cpu_us;
        if now == last {
            return;
        }
        last = now;
    }
}

/// Runs `connect_cost`.
pub fn run(o: &Opts) -> Outcome {
    let mut out = Outcome::new("connect_cost");
    let courses = course_names(o.courses);
    let redis = RedisRig::start();
    let flags = server_flags(o, &["--max-conns-per-user", "64"]);
    let server = serve(&redis, &flags);
    let against = o
        .against
        .as_deref()
        .map(|bin| serve_bin(Some(bin), &redis, &flags));
    let mut ways = WAYS.to_vec();
    if against.is_some() {
        ways.extend(AGAINST_WAYS);
    }
    let mut publisher =
        testkit::publish::SelectionApi::connect(redis.port, courses.clone(), o.sections);
    publisher.seed();
    let floor_cfg = floor_server::ConnectConfig {
        port: testkit::proc::free_port(),
        max_secs: 3600,
    };
    let mut floor = floor_server::spawn("__connect_floor", &floor_cfg);
    let uws = Uws::start();
    let where_ = |t: Target| match (t, &against) {
        (Target::Seatboard, _) | (Target::Against, None) => (server.child.id(), server.port),
        (Target::Against, Some(a)) => (a.child.id(), a.port),
        (Target::Floor, _) => (floor.id(), floor_cfg.port),
        (Target::Uws, _) => (uws.child.id(), uws.port),
    };
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    let mut split: Vec<Split> = vec![Split::default(); ways.len()];
    for round in 0..o.rounds {
        let mut order: Vec<usize> = (0..ways.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let way = ways[i];
            let (pid, port) = where_(way.target);
            let sb = match (way.target, &against) {
                (Target::Seatboard, _) => Some(&server),
                (Target::Against, a) => a.as_ref(),
                _ => None,
            };
            let (per, s) = one_way(o, &courses, way, (pid, port), sb, &mut out);
            split[i].add(&s);
            progress(
                o,
                format!("[connect_cost] {}: {per:.0} µs per connection", way.name),
            );
            cpu[i].push(per);
        }
    }
    report(&mut out, &ways, &cpu, &split, against.is_some());
    let _ = floor.kill();
    let _ = floor.wait();
    out
}

/// The rows of a run: each way's mean CPU per connection (its runs, its
/// ratios to the floor and to uWebSockets.js, by thread for seatboard's
/// ways), and with `--against` this build's ways over the other build's.
fn report(out: &mut Outcome, ways: &[Way], cpu: &[Vec<f64>], split: &[Split], against: bool) {
    let mean: Vec<f64> = cpu
        .iter()
        .map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64)
        .collect();
    let (floor_us, uws_us) = (mean[3], mean[4]);
    for (i, way) in ways.iter().enumerate() {
        let Split {
            threads,
            frames,
            switches,
            got_frames,
            got_presence,
            ..
        } = split[i].mean();
        let mut detail = format!("; {switches:.2} context switches per connection");
        if way.target.is_seatboard() {
            detail += &format!(
                "; by thread {}; {frames:.2} frames sent per connection ({got_frames:.2} `frame` and {got_presence:.2} `presence` messages received)",
                by_thread_text(&threads, 1)
            );
        }
        out.row(
            &format!("{}_cpu_us_per_conn", way.name),
            format!(
                "{:.0} µs per connection ({}), {:.2}x the connect floor, {:.2}x uWebSockets.js{detail}",
                mean[i],
                cpu[i].iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", "),
                mean[i] / floor_us.max(1e-9),
                mean[i] / uws_us.max(1e-9)
            ),
            json!({"mean_us": mean[i], "runs_us": cpu[i], "to_floor": mean[i] / floor_us.max(1e-9), "to_uws": mean[i] / uws_us.max(1e-9), "by_thread_us": threads, "frames_per_conn": frames, "frame_msgs_per_conn": got_frames, "presence_msgs_per_conn": got_presence, "switches_per_conn": switches}),
        );
    }
    if against {
        // This build's ways over the same ways of the other one, in this run.
        for (this, other) in [(0, WAYS.len()), (2, WAYS.len() + 1)] {
            let ratio = mean[this] / mean[other].max(1e-9);
            out.row(
                &format!("{}_to_against", WAYS[this].name),
                format!(
                    "{:.2}x the --against build ({:.0} against {:.0} µs per connection)",
                    ratio, mean[this], mean[other]
                ),
                json!({"ratio": ratio, "this_us": mean[this], "against_us": mean[other]}),
            );
        }
    }
}

/// One way's CPU per connection by thread and frames sent per connection,
/// summed over its runs (seatboard's ways only).
#[derive(Clone, Default)]
struct Split {
    threads: BTreeMap<String, f64>,
    frames: f64,
    /// Messages the clients received, per connection: `frame` (the watch
    /// answer and any later frame) and `presence` (the count with the answer
    /// and each change after it).
    got_frames: f64,
    got_presence: f64,
    switches: f64,
    runs: usize,
}

impl Split {
    fn add(&mut self, s: &Split) {
        for (k, v) in &s.threads {
            *self.threads.entry(k.clone()).or_insert(0.0) += v;
        }
        self.frames += s.frames;
        self.got_frames += s.got_frames;
        self.got_presence += s.got_presence;
        self.switches += s.switches;
        self.runs += s.runs;
    }

    /// The mean over the runs, as one run: CPU µs per connection by thread
    /// (threads under 0.05 µs left out), and per connection the frames
    /// sent, context switches, and `frame` and `presence` messages received.
    fn mean(&self) -> Split {
        let n = self.runs.max(1) as f64;
        Split {
            threads: self
                .threads
                .iter()
                .map(|(k, v)| (k.clone(), v / n))
                .filter(|(_, v)| *v >= 0.05)
                .collect(),
            frames: self.frames / n,
            got_frames: self.got_frames / n,
            got_presence: self.got_presence / n,
            switches: self.switches / n,
            runs: 1,
        }
    }
}

/// One connect phase of `--clients` new clients on `port`: the CPU `pid`
/// spent per connection until every one is open (and answered, when it
/// watches a seatboard or the floor); then they leave and `pid` settles.
/// With `sb` (a seatboard way) also the CPU by thread and the frames sent.
fn one_way(
    o: &Opts,
    courses: &[String],
    way: Way,
    (pid, port): (u32, u16),
    sb: Option<&testkit::proc::Seatboard>,
    out: &mut Outcome,
) -> (f64, Split) {
    let po = Opts {
        no_watch: !way.watch,
        upgrade_courses: way.named,
        ..o.clone()
    };
    settle(pid);
    // Each phase starts at a random point of the servers' presence tick
    // (3 s by default): the count updates a phase's viewers get depend on
    // how many ticks fall in it, and a fixed order of ways would otherwise
    // line one build's phases up with its ticks the same way every round.
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..PRESENCE_TICK_MS)));
    let frames = || sb.map_or(0.0, |s| s.metric("seatboard_frames_sent_total"));
    let (frames0, th0) = (frames(), procs::cpu_by_thread(pid));
    let sw0: u64 = procs::wakeups(pid).values().sum();
    let before = procs::usage(pid);
    let profiled = way.named && way.target == Target::Seatboard;
    let perf = |cmd: &str| perf_ctl(o.perf_ctl.as_deref().filter(|_| profiled), cmd);
    perf("enable");
    let mut f: Fleet = fleet(&po, port, courses, o.skew, false, 600.0);
    let answered = way.watch && way.target != Target::Uws;
    let ok = wait_answered(&mut f, o.clients as u64, answered, Duration::from_secs(120));
    perf("disable");
    let after = procs::usage(pid);
    let sw1: u64 = procs::wakeups(pid).values().sum();
    let (th1, frames1) = (procs::cpu_by_thread(pid), frames());
    let (got_frames, got_presence) = (f.sum(|c| c.frames), f.sum(|c| c.presence));
    out.check(
        ok,
        &format!("{}: not every client connected (and answered)", way.name),
    );
    drop(f);
    let n = o.clients.max(1) as u64;
    let split = Split {
        threads: sb.map_or_else(BTreeMap::new, |_| per_each(&th0, &th1, n)),
        frames: (frames1 - frames0).max(0.0) / n as f64,
        got_frames: got_frames as f64 / n as f64,
        got_presence: got_presence as f64 / n as f64,
        switches: sw1.saturating_sub(sw0) as f64 / n as f64,
        runs: 1,
    };
    (
        after.cpu_us.saturating_sub(before.cpu_us) as f64 / n as f64,
        split,
    )
}

/// Writes `cmd` to a `perf record --control fifo:` path (`--perf-ctl`);
/// without a perf reading it (the open fails at once, never waits) the
/// phase runs unprofiled and says so.
fn perf_ctl(fifo: Option<&str>, cmd: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(path) = fifo else { return };
    let sent = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{cmd}\n").as_bytes()));
    if let Err(e) = sent {
        eprintln!("--perf-ctl {path}: {cmd} not sent: {e}");
    }
}
