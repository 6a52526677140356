//! A real Redis Cluster for tests: three primaries with one replica each on
//! free ports (`redis-server --cluster-enabled yes`, then `redis-cli --cluster
//! create ... --cluster-replicas 1`), with helpers to find a key's owner,
//! kill a primary and wait for its replica's promotion, and move a slot.
#![allow(dead_code)]

use crate::common::{free_port, spawn_redis, wait_for};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One cluster node process.
pub struct ClusterNode {
    /// Its client port.
    pub port: u16,
    child: Option<Child>,
}

/// Six nodes: three primaries, three replicas.
pub struct Cluster {
    /// Every node.
    pub nodes: Vec<ClusterNode>,
    dir: PathBuf,
}

/// A free port whose cluster bus port (+10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 55_000 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// `redis-cli -p port args...`, stdout trimmed.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli must be installed (the README's test command installs it)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeLine {
    /// Node id.
    pub id: String,
    /// Client port.
    pub port: u16,
    /// Whether it is a primary (and not failed).
    pub primary: bool,
    /// The primary's id for a replica.
    pub primary_id: Option<String>,
    /// Slot ranges served.
    pub slots: Vec<(u16, u16)>,
}

impl Cluster {
    /// Starts six nodes and joins them into a cluster; waits until it is ok.
    pub fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "seatboard-cluster-{}-{}",
            std::process::id(),
            fastrand_u64()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let mut n = ClusterNode {
                port: cluster_port(),
                child: None,
            };
            n.spawn(&dir);
            nodes.push(n);
        }
        let c = Cluster { nodes, dir };
        let addrs: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        c.wait_ok(Duration::from_secs(20));
        c
    }

    /// Waits until every live node reports `cluster_state:ok` and agrees on
    /// three primaries, and every replica's link to its primary is up.
    pub fn wait_ok(&self, timeout: Duration) {
        wait_for(timeout, || {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let repl = cli(n.port, &["INFO", "replication"]);
                cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && self.lines_from(n.port).iter().filter(|l| l.primary).count() == 3
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
            ok.then_some(())
        })
        .expect("cluster did not become ok");
    }

    /// Seed URIs for `--redis`.
    pub fn uri(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A live node's port.
    pub fn any_port(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .map(|n| n.port)
            .expect("a live node")
    }

    /// `CLUSTER NODES` as seen from `port`.
    pub fn lines_from(&self, port: u16) -> Vec<NodeLine> {
        cli(port, &["CLUSTER", "NODES"])
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let id = f.first()?.to_string();
                let port: u16 = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let flags = f.get(2)?;
                let primary = flags.contains("master") && !flags.contains("fail");
                let primary_id = (f.get(3)? != &"-").then(|| f[3].to_string());
                let slots = f
                    .iter()
                    .skip(8)
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| {
                        let mut it = s.split('-');
                        let a: u16 = it.next()?.parse().ok()?;
                        let b: u16 = it.next().map_or(Some(a), |b| b.parse().ok())?;
                        Some((a, b))
                    })
                    .collect();
                Some(NodeLine {
                    id,
                    port,
                    primary,
                    primary_id,
                    slots,
                })
            })
            .collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot(&self, key: &str) -> u16 {
        cli(self.any_port(), &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("keyslot")
    }

    /// The primary serving `slot` now.
    pub fn owner_of_slot(&self, slot: u16) -> NodeLine {
        self.lines_from(self.any_port())
            .into_iter()
            .find(|l| l.primary && l.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .expect("slot owner")
    }

    /// The primary serving `key` now.
    pub fn owner(&self, key: &str) -> NodeLine {
        self.owner_of_slot(self.slot(key))
    }

    /// The replica of the primary `id`.
    pub fn replica_of(&self, id: &str) -> NodeLine {
        self.lines_from(self.any_port())
            .into_iter()
            .find(|l| l.primary_id.as_deref() == Some(id))
            .expect("replica")
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port) {
            n.stop();
        }
    }

    /// Waits until the node on `port` reports itself primary; when it did.
    pub fn wait_promoted(&self, port: u16, timeout: Duration) -> Instant {
        wait_for(timeout, || {
            cli(port, &["ROLE"])
                .lines()
                .next()
                .is_some_and(|l| l.trim() == "master")
                .then(Instant::now)
        })
        .expect("replica not promoted")
    }

    /// Moves `slot` (and its keys) from its owner to the primary `to`.
    pub fn move_slot(&self, slot: u16, to: &NodeLine) {
        let from = self.owner_of_slot(slot);
        let s = slot.to_string();
        cli(to.port, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id]);
        cli(from.port, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id]);
        loop {
            let keys = cli(from.port, &["CLUSTER", "GETKEYSINSLOT", &s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            cli(from.port, &args);
        }
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            cli(n.port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
        }
        wait_for(Duration::from_secs(10), || {
            (self.owner_of_slot(slot).id == to.id).then_some(())
        })
        .expect("slot did not move");
    }
}

impl ClusterNode {
    fn spawn(&mut self, dir: &std::path::Path) {
        let p = self.port.to_string();
        let conf = format!("nodes-{p}.conf");
        let dir = dir.display().to_string();
        self.child = Some(spawn_redis(
            self.port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "1000",
                "--cluster-replica-validity-factor",
                "0",
                "--dir",
                &dir,
            ],
        ));
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fastrand_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
