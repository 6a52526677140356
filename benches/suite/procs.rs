//! Processes the runner owns: `redis-server`, `seatboard serve`, the
//! load-generator children; and /proc sampling of CPU time and RSS.

use loadgen::{message, Command as LoadgenCommand, Config, Counters, Output};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use testkit::delay_proxy::DelayProxy;

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn wait_port(port: u16, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// CPU time (utime + stime, µs) and RSS (KiB) of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// CPU time in µs.
    pub cpu_us: u64,
    /// Resident set in KiB.
    pub rss_kib: u64,
    /// Its anonymous part (heap, stacks) in KiB: what connections cost,
    /// without the binary's pages first touched meanwhile.
    pub rss_anon_kib: u64,
}

/// Reads /proc/<pid>/stat and /proc/<pid>/status.
pub fn usage(pid: u32) -> Usage {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let cpu_us = (ticks(11) + ticks(12)) * 1_000_000 / hz;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Usage {
        cpu_us,
        rss_kib: kib("VmRSS:"),
        rss_anon_kib: kib("RssAnon:"),
    }
}

/// Sums `count(task dir)` over the threads of `pid`, by thread name
/// (threads of one name summed: both shards are `seatboard-shard`).
fn by_thread(
    pid: u32,
    count: impl Fn(&std::path::Path) -> u64,
) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in dir.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        *out.entry(name.trim().to_string()).or_default() += count(&path);
    }
    out
}

/// Context switches (voluntary + involuntary) of every thread of `pid`, by
/// thread name: each is a wake-up.
pub fn wakeups(pid: u32) -> std::collections::BTreeMap<String, u64> {
    by_thread(pid, |task| {
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches:")
                    || l.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    })
}

/// CPU time (utime + stime, µs) of every thread of `pid`, by thread name.
pub fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    by_thread(pid, |task| {
        let stat = std::fs::read_to_string(task.join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        (ticks(11) + ticks(12)) * 1_000_000 / hz
    })
}

/// Machine-wide CPU ticks from /proc/stat: (idle incl. iowait, total).
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (idle, v.iter().take(8).sum())
}

/// Percent of the machine's CPU that was idle between two `machine_ticks`.
pub fn idle_pct(a: (u64, u64), b: (u64, u64)) -> f64 {
    let total = b.1.saturating_sub(a.1).max(1) as f64;
    b.0.saturating_sub(a.0) as f64 / total * 100.0
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

/// A `redis-server` on a free port (or a Redis Cluster of several), killed
/// on drop; with `--redis-rtt-ms`, a delay proxy in front of each node for
/// the server (publishers and checks keep the direct ports).
pub struct Redis {
    /// Its port (the first node's in a cluster).
    pub port: u16,
    /// Every node's port.
    pub ports: Vec<u16>,
    children: Vec<Child>,
    dir: Option<std::path::PathBuf>,
    /// One per node, in the order of `ports`, when the server's Redis is at a distance.
    proxies: Vec<DelayProxy>,
}

fn spawn_redis(port: u16, extra: &[String]) -> Child {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--client-output-buffer-limit", "pubsub", "0", "0", "0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (tests/run.sh installs it)");
    assert!(
        wait_port(port, Duration::from_secs(10)),
        "redis-server did not come up"
    );
    child
}

impl Redis {
    /// Starts one without persistence.
    pub fn start() -> Redis {
        let port = free_port();
        Redis {
            port,
            ports: vec![port],
            children: vec![spawn_redis(port, &[])],
            dir: None,
            proxies: Vec::new(),
        }
    }

    /// The same server `rtt_ms` away from the node under test: a proxy
    /// delaying each direction by half of it, which [`Redis::server_uri`] names.
    pub fn at_distance(mut self, rtt_ms: f64) -> Redis {
        assert_eq!(self.ports.len(), 1, "one proxy per standalone server");
        let one_way = Duration::from_secs_f64(rtt_ms / 2e3);
        self.proxies = vec![DelayProxy::start(
            SocketAddr::from(([127, 0, 0, 1], self.port)),
            one_way,
        )];
        self
    }

    /// The node's own port behind `port` (a proxy's, as a cluster at a
    /// distance announces it); `port` itself otherwise.
    pub fn direct_port(&self, port: u16) -> u16 {
        self.proxies
            .iter()
            .position(|p| p.port() == port)
            .map_or(port, |i| self.ports[i])
    }

    /// What `seatboard serve --redis` gets: [`Redis::uri`], or the proxies'
    /// addresses when the server's Redis is at a distance.
    pub fn server_uri(&self) -> String {
        if self.proxies.is_empty() {
            return self.uri();
        }
        self.proxies
            .iter()
            .map(|p| format!("redis://127.0.0.1:{}", p.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts a Redis Cluster of `primaries` primaries (no replicas) and
    /// waits until it is ok; with `rtt_ms > 0` each node announces a delay
    /// proxy of half that each way as its address (the cluster bus stays
    /// direct), so the server reaches every node through it (publishers go
    /// direct: see [`Redis::direct_port`]).
    pub fn start_cluster(primaries: usize, rtt_ms: f64) -> Redis {
        let dir =
            std::env::temp_dir().join(format!("seatboard-bench-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let mut ports = Vec::new();
        while ports.len() < primaries {
            let p = free_port();
            if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
                ports.push(p);
            }
        }
        let one_way = Duration::from_secs_f64(rtt_ms / 2e3);
        let proxies: Vec<DelayProxy> = ports
            .iter()
            .filter(|_| rtt_ms > 0.0)
            .map(|&p| DelayProxy::start(SocketAddr::from(([127, 0, 0, 1], p)), one_way))
            .collect();
        let children = ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut extra: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{p}.conf"),
                    "--dir",
                    &dir.display().to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if let Some(proxy) = proxies.get(i) {
                    extra.extend([
                        "--cluster-announce-ip".into(),
                        "127.0.0.1".into(),
                        "--cluster-announce-port".into(),
                        proxy.port().to_string(),
                        "--cluster-announce-bus-port".into(),
                        (p + 10_000).to_string(),
                    ]);
                }
                spawn_redis(*p, &extra)
            })
            .collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let ok = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "redis-cli --cluster create failed");
        let end = Instant::now() + Duration::from_secs(20);
        while !ports.iter().all(|p| {
            Command::new("redis-cli")
                .args(["-p", &p.to_string(), "CLUSTER", "INFO"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < end, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        Redis {
            port: ports[0],
            ports,
            children,
            dir: Some(dir),
            proxies,
        }
    }

    /// `redis://127.0.0.1:<port>` (every node, comma-separated, for a cluster).
    pub fn uri(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every node's pid.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The bench's JWT secret.
pub const SECRET: &str = "bench-secret-not-for-production-0123456789";

/// A `seatboard serve` process, killed on drop.
pub struct Server {
    /// Its port.
    pub port: u16,
    child: Child,
}

impl Server {
    /// Starts `seatboard serve` on a free port with `extra` flags and waits for `/healthz`.
    pub fn start(redis: &Redis, extra: &[String]) -> Server {
        let port = free_port();
        // SEATBOARD_BIN: another build of the server (before/after comparisons).
        let bin = std::env::var("SEATBOARD_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_seatboard").to_owned());
        let child = Command::new(bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--redis", &redis.server_uri()])
            .args(["--auth", "jwt", "--jwt-secret", SECRET])
            .args(["--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn seatboard");
        let mut s = Server { port, child };
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("seatboard serve exited at start: {st}");
            }
            if let Some(h) = s.get("/healthz") {
                if h.contains("\"ok\"") {
                    break;
                }
            }
            assert!(Instant::now() < end, "seatboard did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A GET's body (the server closes after answering).
    pub fn get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.starts_with("HTTP/1.1 200")
            .then(|| text.split_once("\r\n\r\n").map(|x| x.1.to_owned()))
            .flatten()
    }

    /// One metric's value (sum over label sets when `name` ends with `{`).
    pub fn metric(&self, name: &str) -> f64 {
        let body = self.get("/metrics").unwrap_or_default();
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                (k == name || (name.ends_with('{') && k.starts_with(name)))
                    .then(|| v.parse::<f64>().ok())?
            })
            .sum()
    }

    /// CPU and RSS now.
    pub fn usage(&self) -> Usage {
        usage(self.pid())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The load-generator children and their messages.
pub struct Fleet {
    children: Vec<(Child, Option<ChildStdin>)>,
    rx: mpsc::Receiver<(usize, Output)>,
    /// Latest progress counters per child.
    pub progress: Vec<Counters>,
}

impl Fleet {
    /// Starts one child per config.
    pub fn start(configs: Vec<Config>) -> Fleet {
        let exe = std::env::current_exe().expect("current exe");
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        for (i, cfg) in configs.iter().enumerate() {
            let mut child = Command::new(&exe)
                .arg("__loadgen")
                .arg(serde_json::to_string(cfg).expect("config json"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn load generator");
            let out = child.stdout.take().expect("stdout");
            let stdin = child.stdin.take();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    // A line that is no output is a broken child: say so.
                    let o = message::parse::<Output>(&line)
                        .unwrap_or_else(|e| panic!("load generator {i}: {e}"));
                    if tx.send((i, o)).is_err() {
                        break;
                    }
                }
            });
            children.push((child, stdin));
        }
        let n = children.len();
        Fleet {
            children,
            rx,
            progress: vec![Counters::default(); n],
        }
    }

    /// Pids of the children.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.0.id()).collect()
    }

    /// Summed CPU time of the children, µs.
    pub fn cpu_us(&self) -> u64 {
        self.pids().into_iter().map(|p| usage(p).cpu_us).sum()
    }

    /// Drains pending outputs (progress kept); returns, per child, the
    /// answer `want_answer` picks (a mark or a report) as JSON.
    fn pump(
        &mut self,
        want_answer: fn(Output) -> Option<Value>,
        wait: Duration,
        want: usize,
    ) -> Vec<Value> {
        let mut got = vec![Value::Null; self.children.len()];
        let mut n = 0;
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let msg = if n >= want {
                match self.rx.try_recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            } else {
                match self.rx.recv_timeout(left) {
                    Ok(m) => m,
                    Err(_) => break,
                }
            };
            let (i, o) = msg;
            match o {
                Output::Progress(p) => self.progress[i] = p.counters,
                Output::Rejected(e) => panic!("load generator {i}: {e}"),
                answer => {
                    if let Some(a) = want_answer(answer) {
                        if got[i].is_null() {
                            n += 1;
                        }
                        got[i] = a;
                    }
                }
            }
        }
        got
    }

    /// Refreshes `progress` and returns the summed value of one counter.
    pub fn sum(&mut self, counter: impl Fn(&Counters) -> u64) -> u64 {
        self.pump(|_| None, Duration::ZERO, 0);
        loadgen::counters::sum(&self.progress, counter)
    }

    /// The summed value of the counter called `name` (as the reports name
    /// it: scenarios that print or pick counters by name); a name that is
    /// no counter panics, naming it.
    pub fn sum_named(&mut self, name: &str) -> u64 {
        self.sum(|c| {
            let v = serde_json::to_value(c).unwrap_or_default();
            v[name]
                .as_u64()
                .unwrap_or_else(|| panic!("no load-generator counter named {name:?}"))
        })
    }

    /// Sends one command to every child (see `loadgen::Command`).
    pub fn command(&mut self, cmd: LoadgenCommand) {
        let line = message::line(&cmd);
        for (_, stdin) in &mut self.children {
            if let Some(s) = stdin {
                let _ = writeln!(s, "{line}");
                let _ = s.flush();
            }
        }
    }

    /// Counters of every child right now (summed).
    pub fn mark(&mut self) -> Value {
        self.command(LoadgenCommand::Mark);
        let marks = self.pump(
            |o| match o {
                Output::Mark(c) => serde_json::to_value(c).ok(),
                _ => None,
            },
            Duration::from_secs(10),
            self.children.len(),
        );
        sum_objects(&marks)
    }

    /// Final reports; the children exit.
    pub fn report(mut self) -> Vec<Value> {
        self.command(LoadgenCommand::Report);
        let reports = self.pump(
            |o| match o {
                Output::Report(r) => serde_json::to_value(r).ok(),
                _ => None,
            },
            Duration::from_secs(30),
            self.children.len(),
        );
        for (c, stdin) in &mut self.children {
            stdin.take();
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
        reports
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Field-wise sum of JSON objects of numbers.
pub fn sum_objects(objs: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for o in objs {
        for (k, v) in o.as_object().into_iter().flatten() {
            let cur = out.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            out.insert(k.clone(), Value::from(cur + v.as_u64().unwrap_or(0)));
        }
    }
    Value::Object(out)
}
