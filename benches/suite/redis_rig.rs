//! The Redis a scenario runs on: one `redis-server`, or a Redis Cluster of
//! several, each node optionally behind a delay proxy for the server.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::delay_proxy::DelayProxy;
use testkit::proc::{cluster_port, RedisServer};

/// A `redis-server` on a free port (or a Redis Cluster of several), killed
/// on drop; with `--redis-rtt-ms`, a delay proxy in front of each node for
/// the server (publishers and checks keep the direct ports).
pub struct RedisRig {
    /// Its port (the first node's in a cluster).
    pub port: u16,
    /// Every node's port.
    pub ports: Vec<u16>,
    servers: Vec<RedisServer>,
    dir: Option<std::path::PathBuf>,
    /// One per node, in the order of `ports`, when the server's Redis is at a distance.
    proxies: Vec<DelayProxy>,
}

/// What every server of a scenario runs with: a subscriber never cut off
/// for its output buffer.
const PUBSUB_UNLIMITED: [&str; 5] = ["--client-output-buffer-limit", "pubsub", "0", "0", "0"];

impl RedisRig {
    /// Starts one without persistence.
    pub fn start() -> RedisRig {
        let server = RedisServer::start_with(&PUBSUB_UNLIMITED);
        RedisRig {
            port: server.port,
            ports: vec![server.port],
            servers: vec![server],
            dir: None,
            proxies: Vec::new(),
        }
    }

    /// The same server `rtt_ms` away from the node under test: a proxy
    /// delaying each direction by half of it, which [`RedisRig::server_uri`] names.
    pub fn at_distance(mut self, rtt_ms: f64) -> RedisRig {
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

    /// What `seatboard serve --redis` gets: [`RedisRig::uri`], or the proxies'
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
    /// direct: see [`RedisRig::direct_port`]).
    pub fn start_cluster(primaries: usize, rtt_ms: f64) -> RedisRig {
        let dir =
            std::env::temp_dir().join(format!("seatboard-bench-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let ports: Vec<u16> = (0..primaries).map(|_| cluster_port()).collect();
        let one_way = Duration::from_secs_f64(rtt_ms / 2e3);
        let proxies: Vec<DelayProxy> = ports
            .iter()
            .filter(|_| rtt_ms > 0.0)
            .map(|&p| DelayProxy::start(SocketAddr::from(([127, 0, 0, 1], p)), one_way))
            .collect();
        let servers = ports
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
                extra.extend(PUBSUB_UNLIMITED.map(String::from));
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                RedisServer::on_port(*p, &extra)
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
        RedisRig {
            port: ports[0],
            ports,
            servers,
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
        self.servers.iter().map(RedisServer::pid).collect()
    }
}

impl Drop for RedisRig {
    fn drop(&mut self) {
        self.servers.clear();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
