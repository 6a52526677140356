//! A Redis that stops answering without closing anything (contract section 2):
//! a `redis-server` frozen with SIGSTOP, and one behind a network namespace
//! whose link goes down (no RST, no FIN). Under watching viewers, a publisher
//! and viewers churning in and out, the node notices within 10 s (`/healthz`
//! degraded with `redis:false`), keeps answering `/healthz` and `/metrics`,
//! keeps every viewer connected, keeps its memory bounded, and once Redis
//! answers again every viewer's board equals the state hashes and every
//! viewer's presence is scored again.

use crate::common;
use common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tungstenite::Message;

const T: Duration = Duration::from_secs(30);
const COURSES: [&str; 4] = ["CS101", "MATH201", "PHYS110", "ART150"];
const SECTIONS: u32 = 3;
const VIEWERS_PER_COURSE: usize = 5;
/// How long the fault lasts.
const FAULT: Duration = Duration::from_secs(15);

/// The truth: section -> (version, seats_taken), per course.
type Truth = BTreeMap<String, BTreeMap<u64, (u64, u64)>>;

fn payload(course: &str, section: u32, taken: u64, version: u64) -> String {
    json!({"course":course,"section":section,"total_seats":1000,"seats_taken":taken,
           "seat_info":{"room":"B12"},"version":version})
    .to_string()
}

fn resp(args: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    v
}

/// Writes the state hash and publishes, like the selection API, a few hundred
/// snapshots a second over every course until stopped. Its writes wait in the
/// socket while Redis does not read; Redis executes them when it answers again.
struct Publisher {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    /// Set once Redis answered the PING sent after the last write: every
    /// write before it is executed.
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    fn start(addr: (String, u16)) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let mut s = TcpStream::connect((addr.0.as_str(), addr.1)).expect("publisher connect");
        let mut replies = s.try_clone().expect("clone");
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        // Replies are read and thrown away so Redis never blocks on them; the
        // only `+PONG` is the answer to the PING after the last write.
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            let mut tail = Vec::new();
            while let Ok(n) = replies.read(&mut buf) {
                if n == 0 {
                    return;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.windows(5).any(|w| w == b"+PONG") {
                    d.store(true, Relaxed);
                    return;
                }
                let keep = tail.len().saturating_sub(4);
                tail.drain(..keep);
            }
        });
        let (st, se) = (Arc::clone(&stop), Arc::clone(&sent));
        let thread = std::thread::spawn(move || {
            let mut version = 1u64;
            while !st.load(Relaxed) {
                version += 1;
                let mut batch = Vec::new();
                for c in COURSES {
                    let sec = (version % SECTIONS as u64) as u32;
                    let p = payload(c, sec, version % 1000, version);
                    let state = format!("seatstate:{c}");
                    let field = sec.to_string();
                    batch.extend(resp(&["HSET", &state, &field, &p]));
                    batch.extend(resp(&["PUBLISH", &format!("seats:{c}"), &p]));
                }
                if s.write_all(&batch).is_err() {
                    return;
                }
                se.fetch_add(COURSES.len() as u64, Relaxed);
                // Pacing of the load, not synchronisation.
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = s.write_all(&resp(&["PING"]));
        });
        Publisher {
            stop,
            sent,
            done,
            thread: Some(thread),
        }
    }

    /// Stops, and returns once Redis has executed every write.
    fn stop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("publisher");
        }
        wait_for(T, || self.done.load(Relaxed).then_some(()))
            .expect("Redis executed the publisher's writes");
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// One watching viewer: its board of one course, and whether its connection lives.
struct Viewer {
    user: String,
    course: &'static str,
    board: Arc<Mutex<Board>>,
    alive: Arc<AtomicBool>,
}

fn viewer(port: u16, user: String, course: &'static str, stop: &Arc<AtomicBool>) -> Viewer {
    let mut ws = ws_connect(port, &format!("/ws?user={user}")).expect("viewer connect");
    assert_eq!(next_json(&mut ws).expect("hello")["type"], "hello");
    send_json(&mut ws, json!({"op":"watch","course":course}));
    let first = next_of_type(&mut ws, "frame", T).expect("watch answer");
    let board = Arc::new(Mutex::new(Board::default()));
    board.lock().unwrap().apply(&first);
    let alive = Arc::new(AtomicBool::new(true));
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
    }
    let (b, a, stop) = (Arc::clone(&board), Arc::clone(&alive), Arc::clone(stop));
    std::thread::spawn(move || loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                let Ok(m) = serde_json::from_str::<serde_json::Value>(&t) else {
                    continue;
                };
                if m["type"] == "frame" && m["course"] == course {
                    b.lock().unwrap().apply(&m);
                }
            }
            Ok(Message::Close(_)) => {
                a.store(false, Relaxed);
                return;
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Relaxed) {
                    return;
                }
            }
            Err(_) => {
                a.store(false, Relaxed);
                return;
            }
        }
    });
    Viewer {
        user,
        course,
        board,
        alive,
    }
}

/// Whether every viewer's board holds exactly the truth of its course.
fn boards_true(viewers: &[Viewer], truth: &Truth) -> bool {
    viewers.iter().all(|v| {
        let want = &truth[v.course];
        let b = v.board.lock().unwrap();
        b.0.len() == want.len()
            && want.iter().all(|(s, (ver, taken))| {
                b.version(*s) == *ver
                    && b.0.get(s).and_then(|x| x["seats_taken"].as_u64()) == Some(*taken)
            })
    })
}

/// Viewers connecting, watching (known and never-seen courses) and leaving,
/// half with a close and half by dropping the socket, until stopped.
fn churn(port: u16, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let Ok(mut ws) = ws_connect(port, &format!("/ws?user=churn{n}")) else {
                continue;
            };
            let course = match n % 4 {
                0 => format!("NEW{n}"),
                i => COURSES[i as usize].to_string(),
            };
            let _ = next_json(&mut ws);
            send_json(&mut ws, json!({"op":"watch","course":course}));
            if n % 2 == 0 {
                let _ = ws.close(None);
            }
            // A few hundred a second: pacing of the load, not synchronisation.
            std::thread::sleep(Duration::from_millis(5));
        }
        n
    })
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn health(port: u16) -> serde_json::Value {
    http_get(port, "/healthz")
        .ok()
        .and_then(|r| serde_json::from_str(&r.body).ok())
        .unwrap_or_default()
}

/// How the test reaches Redis, and how it breaks and mends it.
trait Fault {
    /// The address the node and the test use for Redis.
    fn addr(&self) -> (String, u16);
    /// Redis stops answering, nothing is closed.
    fn break_it(&mut self);
    /// Redis answers again.
    fn mend(&mut self);
    /// Runs `f` where the publisher reaches Redis (a partition cuts only the node).
    fn publisher_side<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R;
}

/// Reads every course's state hash: the last published state.
fn truth(addr: (String, u16)) -> Truth {
    let c = redis::Client::open(format!("redis://{}:{}/", addr.0, addr.1)).expect("client");
    let mut con = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("truth connection");
    let mut t = Truth::new();
    for course in COURSES {
        let h: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("seatstate:{course}"))
            .query(&mut con)
            .expect("HGETALL");
        let m = h
            .values()
            .map(|p| {
                let v: serde_json::Value = serde_json::from_str(p).expect("state json");
                (
                    v["section"].as_u64().unwrap(),
                    (
                        v["version"].as_u64().unwrap(),
                        v["seats_taken"].as_u64().unwrap(),
                    ),
                )
            })
            .collect();
        t.insert(course.to_string(), m);
    }
    t
}

/// Every viewer's presence member scored beyond now.
fn presence_scored(addr: (String, u16), viewers: &[(String, &'static str)]) -> bool {
    let Ok(c) = redis::Client::open(format!("redis://{}:{}/", addr.0, addr.1)) else {
        return false;
    };
    let Ok(mut con) = c.get_connection_with_timeout(Duration::from_secs(2)) else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    viewers.iter().all(|(user, course)| {
        redis::cmd("ZSCORE")
            .arg(format!("presence:{course}"))
            .arg(user)
            .query::<Option<f64>>(&mut con)
            .ok()
            .flatten()
            .is_some_and(|s| s > now)
    })
}

/// Whether none of these users holds a presence member any more.
fn presence_gone(addr: (String, u16), users: &[(String, &'static str)]) -> bool {
    let Ok(c) = redis::Client::open(format!("redis://{}:{}/", addr.0, addr.1)) else {
        return false;
    };
    let Ok(mut con) = c.get_connection_with_timeout(Duration::from_secs(2)) else {
        return false;
    };
    users.iter().all(|(user, course)| {
        redis::cmd("ZSCORE")
            .arg(format!("presence:{course}"))
            .arg(user)
            .query::<Option<f64>>(&mut con)
            .is_ok_and(|s| s.is_none())
    })
}

/// The whole scenario against one kind of fault.
fn frozen_redis_scenario(mut fault: impl Fault) {
    let addr = fault.addr();
    let seed = addr.clone();
    fault.publisher_side(move || {
        let mut s = TcpStream::connect((seed.0.as_str(), seed.1)).expect("seed");
        for c in COURSES {
            for sec in 0..SECTIONS {
                let p = payload(c, sec, 0, 1);
                s.write_all(&resp(&[
                    "HSET",
                    &format!("seatstate:{c}"),
                    &sec.to_string(),
                    &p,
                ]))
                .unwrap();
            }
        }
        s.write_all(&resp(&["PING"])).unwrap();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("PONG") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    });
    let uri = format!("redis://{}:{}", addr.0, addr.1);
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &uri,
        "--shards",
        "2",
        "--tick-ms",
        "50",
        "--presence-tick-ms",
        "500",
        // Longer than the test: a member left behind is not rescued by expiry.
        "--presence-ttl-ms",
        "120000",
    ]);
    wait_for(T, || (health(sb.port)["redis"] == true).then_some(()))
        .expect("the node's Redis connection did not come up");
    let stop = Arc::new(AtomicBool::new(false));
    let viewers: Vec<Viewer> = COURSES
        .iter()
        .flat_map(|c| (0..VIEWERS_PER_COURSE).map(move |i| (format!("v{c}{i}"), *c)))
        .map(|(u, c)| viewer(sb.port, u, c, &stop))
        .collect();
    let members: Vec<(String, &'static str)> =
        viewers.iter().map(|v| (v.user.clone(), v.course)).collect();
    let paddr = addr.clone();
    let mut publisher = fault.publisher_side(move || Publisher::start(paddr));
    wait_for(T, || (publisher.sent.load(Relaxed) > 400).then_some(())).expect("publishing");
    // Viewers who leave while Redis is silent: their removal must still reach it.
    let leavers: Vec<(String, &'static str)> = (0..8)
        .map(|i| (format!("leaver{i}"), COURSES[i % COURSES.len()]))
        .collect();
    let mut leaving: Vec<Ws> = leavers
        .iter()
        .map(|(u, c)| {
            let mut ws = ws_connect(sb.port, &format!("/ws?user={u}")).expect("leaver");
            next_json(&mut ws).expect("hello");
            send_json(&mut ws, json!({"op":"watch","course":c}));
            next_of_type(&mut ws, "frame", T).expect("leaver's watch answer");
            ws
        })
        .collect();
    let l = leavers.clone();
    let laddr = addr.clone();
    let present = fault.publisher_side(move || {
        wait_for(T, || presence_scored(laddr.clone(), &l).then_some(())).is_some()
    });
    assert!(present, "the leavers' presence was written");
    let rss_before = rss_kib(sb.pid());

    let churn_stop = Arc::new(AtomicBool::new(false));
    let churner = churn(sb.port, Arc::clone(&churn_stop));
    fault.break_it();
    let broken = Instant::now();
    for mut ws in leaving.drain(..) {
        let _ = ws.close(None);
        let _ = ws.flush();
    }
    let mut noticed = None;
    let mut answers = 0u32;
    while broken.elapsed() < FAULT {
        let h = http_get(sb.port, "/healthz").expect("/healthz answers while Redis is silent");
        assert_eq!(h.status, 200);
        let m = http_get(sb.port, "/metrics").expect("/metrics answers while Redis is silent");
        assert_eq!(m.status, 200);
        assert!(m.body.contains("seatboard_redis_connected"));
        answers += 1;
        let h: serde_json::Value = serde_json::from_str(&h.body).expect("healthz json");
        if noticed.is_none() && h["status"] == "degraded" && h["redis"] == false {
            noticed = Some(broken.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    churn_stop.store(true, Relaxed);
    let churned = churner.join().expect("churn");
    let rss_during = rss_kib(sb.pid());
    let noticed = noticed.expect("the node never reported Redis down while it was silent");
    println!(
        "silent Redis noticed after {noticed:?}; {answers} /healthz+/metrics answers; \
         {churned} viewers churned; RSS {rss_before} -> {rss_during} KiB"
    );
    assert!(
        viewers.iter().all(|v| v.alive.load(Relaxed)),
        "a viewer was disconnected while Redis was silent"
    );
    // Bounded: a few MB for the churn, not the backlog of everything queued.
    assert!(
        rss_during < rss_before + 48 * 1024,
        "RSS grew {rss_before} -> {rss_during} KiB while Redis was silent"
    );

    fault.mend();
    let mended = Instant::now();
    fault.publisher_side(move || publisher.stop());
    let taddr = addr.clone();
    let truth = fault.publisher_side(move || truth(taddr));
    assert!(truth.values().all(|m| m.len() == SECTIONS as usize));
    if wait_for(T, || boards_true(&viewers, &truth).then_some(())).is_none() {
        let wrong: Vec<String> = viewers
            .iter()
            .filter(|v| !boards_true(std::slice::from_ref(v), &truth))
            .map(|v| format!("{} {}: {:?}", v.user, v.course, v.board.lock().unwrap().0))
            .collect();
        panic!(
            "boards not true after Redis answered again; truth {truth:?}; wrong {}: {wrong:?}",
            wrong.len()
        );
    }
    let boards = mended.elapsed();
    wait_for(T, || (health(sb.port)["status"] == "ok").then_some(())).expect("ok again");
    let paddr = addr.clone();
    let scored = fault.publisher_side(move || {
        wait_for(T, || presence_scored(paddr.clone(), &members).then_some(())).is_some()
    });
    assert!(scored, "every viewer's presence is scored again");
    let paddr = addr.clone();
    let gone = fault.publisher_side(move || {
        wait_for(T, || presence_gone(paddr.clone(), &leavers).then_some(())).is_some()
    });
    assert!(
        gone,
        "viewers who left while Redis was silent are removed from presence once it answers"
    );
    println!(
        "after Redis answered again: every board true after {boards:?}, ok after {:?}",
        mended.elapsed()
    );
    assert!(viewers.iter().all(|v| v.alive.load(Relaxed)));
    stop.store(true, Relaxed);
}

/// A local redis-server frozen with SIGSTOP, thawed with SIGCONT.
struct Stopped(RedisServer);

impl Fault for Stopped {
    fn addr(&self) -> (String, u16) {
        ("127.0.0.1".into(), self.0.port)
    }
    fn break_it(&mut self) {
        self.0.signal(libc::SIGSTOP);
    }
    fn mend(&mut self) {
        self.0.signal(libc::SIGCONT);
    }
    fn publisher_side<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        f()
    }
}

#[test]
fn a_frozen_redis_is_noticed_and_every_board_is_true_once_it_thaws() {
    frozen_redis_scenario(Stopped(RedisServer::start()));
}

/// Redis in a network namespace of its own, the node (and the test's clients)
/// in another, one veth pair between them; the Redis end of the link goes
/// down, so the node's packets vanish without a reset.
struct Partitioned {
    node_ns: String,
    redis_ns: String,
    redis_if: String,
    redis: Option<Child>,
}

const REDIS_IP: &str = "10.213.0.2";
const NODE_IP: &str = "10.213.0.1";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Moves the calling thread into the named network namespace.
fn enter_ns(name: &str) {
    let f = std::fs::File::open(format!("/run/netns/{name}")).expect("netns file");
    use std::os::fd::AsRawFd;
    // SAFETY: setns(2) on an open namespace file; it only changes this thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

impl Partitioned {
    fn new() -> Partitioned {
        let id = std::process::id();
        let p = Partitioned {
            node_ns: format!("sbn{id}"),
            redis_ns: format!("sbr{id}"),
            redis_if: format!("sbr{id}r"),
            redis: None,
        };
        let node_if = format!("sbr{id}n");
        ip(&["netns", "add", &p.node_ns]);
        ip(&["netns", "add", &p.redis_ns]);
        ip(&[
            "-n",
            &p.node_ns,
            "link",
            "add",
            &node_if,
            "type",
            "veth",
            "peer",
            "name",
            &p.redis_if,
            "netns",
            &p.redis_ns,
        ]);
        for (ns, dev, addr) in [
            (&p.node_ns, &node_if, NODE_IP),
            (&p.redis_ns, &p.redis_if, REDIS_IP),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        p
    }
}

impl Fault for Partitioned {
    fn addr(&self) -> (String, u16) {
        (REDIS_IP.into(), 6379)
    }
    fn break_it(&mut self) {
        ip(&["-n", &self.redis_ns, "link", "set", &self.redis_if, "down"]);
    }
    fn mend(&mut self) {
        ip(&["-n", &self.redis_ns, "link", "set", &self.redis_if, "up"]);
    }
    fn publisher_side<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let ns = self.redis_ns.clone();
        std::thread::spawn(move || {
            enter_ns(&ns);
            // The publisher's own address of Redis: the namespace's loopback
            // stays up while the node's link is down.
            f()
        })
        .join()
        .expect("publisher side")
    }
}

impl Drop for Partitioned {
    fn drop(&mut self) {
        if let Some(mut c) = self.redis.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.node_ns])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.redis_ns])
            .status();
    }
}

/// Whether this machine lets a test make network namespaces and veth pairs.
fn netns_allowed() -> bool {
    let name = format!("sbprobe{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
    }
    ok
}

#[test]
fn a_partitioned_redis_is_noticed_and_every_board_is_true_once_the_link_is_back() {
    assert!(
        netns_allowed(),
        "this test needs root (CAP_NET_ADMIN) to make network namespaces; \
         run it as root or leave it out with --skip partitioned"
    );
    let mut p = Partitioned::new();
    let node_ns = p.node_ns.clone();
    p.redis = Some(
        Command::new("ip")
            .args(["netns", "exec", &p.redis_ns, "redis-server"])
            .args(["--port", "6379", "--bind", REDIS_IP, "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server in its namespace"),
    );
    let up =
        p.publisher_side(|| wait_for(T, || TcpStream::connect(("127.0.0.1", 6379)).ok()).is_some());
    assert!(up, "redis-server in its namespace did not come up");
    // The node and every client of the test live in the node's namespace.
    std::thread::spawn(move || {
        enter_ns(&node_ns);
        frozen_redis_scenario(p);
    })
    .join()
    .expect("scenario");
}

/// The command client's pipelines on a frozen Redis: one read timeout, not
/// one per reply (the redis crate's own pipeline read goes on reading every
/// reply after the first timed out: 1,000 commands took 1,000 s).
#[test]
fn a_pipeline_to_a_frozen_redis_fails_within_one_timeout_not_one_per_reply() {
    use seatboard::redis::commands::Commands;
    use seatboard::redis::{Redis, RedisFlags};
    let redis = RedisServer::start();
    let r = Redis::from_flags(&RedisFlags::new(&redis.uri())).expect("flags");
    let mut link = Commands::new(&r, "test");
    let cmds: Vec<::redis::Cmd> = (0..1000)
        .map(|i| {
            let mut c = ::redis::cmd("SET");
            c.arg(format!("k{i}")).arg(i);
            c
        })
        .collect();
    link.pipeline::<()>(&cmds).expect("Redis answers");
    redis.signal(libc::SIGSTOP);
    let t = Instant::now();
    let piped = link.pipeline::<()>(&cmds);
    let took = t.elapsed();
    redis.signal(libc::SIGCONT);
    println!("1,000 commands to a frozen Redis failed after {took:?}");
    assert!(piped.is_err());
    // A read timeout (1 s), the connection made again and one more (the
    // client's one retry on a fresh connection): never a timeout per reply.
    assert!(took < Duration::from_secs(5), "{took:?}");
    link.retry_now();
    eventually_ok(|| link.pipeline::<()>(&cmds).is_ok());
}

/// Waits (15 s at most) until `f` holds.
fn eventually_ok(mut f: impl FnMut() -> bool) {
    assert!(
        wait_for(Duration::from_secs(15), || f().then_some(())).is_some(),
        "never held"
    );
}
