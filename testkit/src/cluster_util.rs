//! A real Redis Cluster for tests: three primaries, with one replica each or
//! none, on free ports (`redis-server --cluster-enabled yes`, then `redis-cli
//! --cluster create`), plain or TLS-only; with functions to find a key's owner,
//! kill a primary and wait for its replica's promotion, and move a slot (at
//! once, in steps that leave it half-migrated, or finished node by node a
//! pause apart); and a cluster whose
//! nodes announce a delay proxy each (`ProxiedCluster`).
#![allow(dead_code)]

use crate::delay_proxy::DelayProxy;
use crate::proc::{cluster_port, RedisServer};
use crate::wait::wait_for;
use seatboard::slots::key_slot;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Course names whose channel lives on `primary`.
pub fn courses_on(primary: &NodeLine, n: usize) -> Vec<String> {
    (0..10_000)
        .map(|i| format!("CL{i}"))
        .filter(|c| {
            let slot = key_slot(format!("seats:{c}").as_bytes());
            primary.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
        })
        .take(n)
        .collect()
}

/// One cluster node process.
pub struct ClusterNode {
    /// Its client port.
    pub port: u16,
    child: Option<RedisServer>,
    /// Flags of its own (what it announces, in a [`ProxiedCluster`]).
    extra: Vec<String>,
}

/// Three primaries, and a replica of each unless started with `primaries_only`.
pub struct Cluster {
    /// Every node.
    pub nodes: Vec<ClusterNode>,
    dir: PathBuf,
    /// For a TLS-only cluster: the directory of `ca.pem`, `server.crt`, `server.key`.
    tls: Option<PathBuf>,
}

/// `redis-cli -p port args...`, stdout trimmed.
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_tls(None, port, args)
}

/// `redis-cli` over TLS (verified against `<certs>/ca.pem`) when `certs` is given.
fn cli_tls(certs: Option<&Path>, port: u16, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    if let Some(d) = certs {
        cmd.arg("--tls").arg("--cacert").arg(d.join("ca.pem"));
    }
    let out = cmd
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
    /// Starts six nodes (three primaries, a replica each) and joins them into
    /// a cluster; waits until it is ok.
    pub fn start() -> Cluster {
        Cluster::launch(true, None)
    }

    /// Three primaries and no replica: quicker where no failover is tested.
    pub fn primaries_only() -> Cluster {
        Cluster::launch(false, None)
    }

    /// Three primaries that listen with TLS only (`--port 0`), TLS on the
    /// cluster bus too, with the certificate in `certs` (see `tls_util`).
    pub fn tls_only(certs: &Path) -> Cluster {
        Cluster::launch(false, Some(certs.to_path_buf()))
    }

    fn launch(replicas: bool, tls: Option<PathBuf>) -> Cluster {
        let nodes = (0..if replicas { 6 } else { 3 })
            .map(|_| ClusterNode {
                port: cluster_port(),
                child: None,
                extra: Vec::new(),
            })
            .collect();
        Cluster::form(nodes, replicas, tls)
    }

    /// Starts `nodes` (each with its own extra flags) and joins them.
    fn form(mut nodes: Vec<ClusterNode>, replicas: bool, tls: Option<PathBuf>) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "seatboard-cluster-{}-{}",
            std::process::id(),
            fastrand_u64()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for n in &mut nodes {
            n.spawn(&dir, tls.as_deref());
        }
        let c = Cluster { nodes, dir, tls };
        let addrs: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some(d) = &c.tls {
            create.arg("--tls").arg("--cacert").arg(d.join("ca.pem"));
        }
        let out = create
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", if replicas { "1" } else { "0" }])
            .arg("--cluster-yes")
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
                let repl = self.cli(n.port, &["INFO", "replication"]);
                self.cli(n.port, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
                    && self.lines_from(n.port).iter().filter(|l| l.primary).count() == 3
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
            ok.then_some(())
        })
        .expect("cluster did not become ok");
    }

    /// `redis-cli -p port args...` (over TLS for a TLS cluster), stdout trimmed.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_tls(self.tls.as_deref(), port, args)
    }

    /// Seed URIs for `--redis` (`rediss://` for a TLS cluster).
    pub fn uri(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.nodes
            .iter()
            .map(|n| format!("{scheme}://127.0.0.1:{}", n.port))
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

    /// The primaries, as a live node sees them now.
    pub fn primaries(&self) -> Vec<NodeLine> {
        self.nodes_now().into_iter().filter(|l| l.primary).collect()
    }

    /// `CLUSTER NODES` as a live node sees it now.
    pub fn nodes_now(&self) -> Vec<NodeLine> {
        self.lines_from(self.any_port())
    }

    /// `CLUSTER NODES` as seen from `port`.
    pub fn lines_from(&self, port: u16) -> Vec<NodeLine> {
        self.cli(port, &["CLUSTER", "NODES"])
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
        self.cli(self.any_port(), &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("keyslot")
    }

    /// The primary serving `slot` now.
    pub fn owner_of_slot(&self, slot: u16) -> NodeLine {
        self.nodes_now()
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
        self.nodes_now()
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

    /// SIGSTOPs the node on `port`: it still takes connections (its kernel
    /// does) but answers nothing, until the cluster promotes its replica.
    pub fn freeze(&self, port: u16) {
        if let Some(c) = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
        {
            c.signal(libc::SIGSTOP);
        }
    }

    /// Waits until the node on `port` reports itself primary; when it did.
    pub fn wait_promoted(&self, port: u16, timeout: Duration) -> Instant {
        wait_for(timeout, || {
            self.cli(port, &["ROLE"])
                .lines()
                .next()
                .is_some_and(|l| l.trim() == "master")
                .then(Instant::now)
        })
        .expect("replica not promoted")
    }

    /// Moves `slot` (and its keys) from its owner to the primary `to`.
    pub fn move_slot(&self, slot: u16, to: &NodeLine) {
        let from = self.begin_migration(slot, to);
        loop {
            let keys = self.keys_in_slot(&from, slot);
            if keys.is_empty() {
                break;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.migrate_keys(&from, to, &keys);
        }
        self.finish_migration(slot, to);
    }

    /// Marks `slot` IMPORTING on `to` and MIGRATING on its owner, which it
    /// returns: from now on a key of the slot that the owner no longer holds
    /// is answered with `-ASK`.
    pub fn begin_migration(&self, slot: u16, to: &NodeLine) -> NodeLine {
        let from = self.owner_of_slot(slot);
        let s = slot.to_string();
        assert_eq!(
            self.cli(to.port, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id]),
            "OK"
        );
        assert_eq!(
            self.cli(from.port, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id]),
            "OK"
        );
        from
    }

    /// Keys of `slot` still held by `from` (up to 100).
    pub fn keys_in_slot(&self, from: &NodeLine, slot: u16) -> Vec<String> {
        let s = slot.to_string();
        self.cli(from.port, &["CLUSTER", "GETKEYSINSLOT", &s, "100"])
            .lines()
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// MIGRATEs `keys` from `from` to `to`.
    pub fn migrate_keys(&self, from: &NodeLine, to: &NodeLine, keys: &[&str]) {
        let port = to.port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        assert_eq!(self.cli(from.port, &args), "OK", "MIGRATE {keys:?}");
    }

    /// Gives `slot` to `to` on every node (`SETSLOT NODE`) and waits until the
    /// cluster agrees.
    pub fn finish_migration(&self, slot: u16, to: &NodeLine) {
        let live: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect();
        self.finish_migration_in(slot, to, &live, Duration::ZERO);
    }

    /// Gives `slot` to `to` with `SETSLOT NODE` on the nodes of `order`
    /// (ports), one at a time and `pause` apart, as an operator typing them
    /// would (e.g. the old owner first); waits until the cluster agrees and
    /// returns when the last `SETSLOT` was answered.
    pub fn finish_migration_in(
        &self,
        slot: u16,
        to: &NodeLine,
        order: &[u16],
        pause: Duration,
    ) -> Instant {
        let s = slot.to_string();
        let mut last = Instant::now();
        for (i, &port) in order.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            self.cli(port, &["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
            last = Instant::now();
        }
        wait_for(Duration::from_secs(10), || {
            (self.owner_of_slot(slot).id == to.id).then_some(())
        })
        .expect("slot did not move");
        last
    }
}

impl ClusterNode {
    fn spawn(&mut self, dir: &Path, tls: Option<&Path>) {
        let p = self.port.to_string();
        let conf = format!("nodes-{p}.conf");
        let dir = dir.display().to_string();
        let file = |name: &str| tls.map(|d| d.join(name).display().to_string());
        let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.pem"));
        let mut tls_args: Vec<&str> = Vec::new();
        if let (Some(cert), Some(key), Some(ca)) = (&cert, &key, &ca) {
            // TLS only: the plain port is off; the cluster bus (port + 10000)
            // and replication speak TLS too.
            tls_args.extend(["--port", "0", "--tls-port", &p]);
            tls_args.extend(["--tls-cert-file", cert, "--tls-key-file", key]);
            tls_args.extend(["--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]);
            tls_args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        }
        let mut args = vec![
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
        ];
        args.extend(tls_args);
        args.extend(self.extra.iter().map(String::as_str));
        self.child = Some(RedisServer::on_port(self.port, &args));
    }

    fn stop(&mut self) {
        self.child = None;
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

/// Three primaries, each behind a [`DelayProxy`] that it announces as its
/// address (`cluster-announce-ip 127.0.0.1`, `cluster-announce-port <proxy
/// port>`, `cluster-announce-bus-port <its real bus port>`: the cluster bus
/// itself is not delayed). `CLUSTER SLOTS`, `CLUSTER NODES`, `MOVED` and
/// `ASK` all name proxy ports, so every client that learns the topology from
/// the cluster goes through the proxies, a publisher given the direct seeds
/// of [`ProxiedCluster::near_uri`] too once it follows a redirect; only a
/// client that never does (`redis-cli` without `-c`, on a node's own keys)
/// stays near. The [`NodeLine`] ports of [`Cluster`]'s methods are proxy
/// ports here ([`ProxiedCluster::direct_port`] maps them back).
pub struct ProxiedCluster {
    /// The cluster (its `nodes` carry the real ports).
    pub cluster: Cluster,
    /// One proxy per node, in the order of `cluster.nodes`.
    pub proxies: Vec<DelayProxy>,
}

impl ProxiedCluster {
    /// Three primaries and no replica, each `one_way` away through its proxy.
    pub fn primaries_only(one_way: Duration) -> ProxiedCluster {
        let mut proxies = Vec::new();
        let nodes = (0..3)
            .map(|_| {
                let port = cluster_port();
                let proxy = DelayProxy::start(SocketAddr::from(([127, 0, 0, 1], port)), one_way);
                let extra = [
                    "--cluster-announce-ip",
                    "127.0.0.1",
                    "--cluster-announce-port",
                    &proxy.port().to_string(),
                    "--cluster-announce-bus-port",
                    &(port + 10_000).to_string(),
                ]
                .map(String::from)
                .to_vec();
                proxies.push(proxy);
                ClusterNode {
                    port,
                    child: None,
                    extra,
                }
            })
            .collect();
        ProxiedCluster {
            cluster: Cluster::form(nodes, false, None),
            proxies,
        }
    }

    /// Seed URIs through the proxies, for the node under test.
    pub fn far_uri(&self) -> String {
        self.proxies
            .iter()
            .map(|p| format!("redis://127.0.0.1:{}", p.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Seed URIs of the nodes themselves (redirects still name proxies).
    pub fn near_uri(&self) -> String {
        self.cluster.uri()
    }

    /// The real port of the node behind proxy port `port` (`port` itself
    /// when it is no proxy's).
    pub fn direct_port(&self, port: u16) -> u16 {
        self.proxies
            .iter()
            .position(|p| p.port() == port)
            .map_or(port, |i| self.cluster.nodes[i].port)
    }

    /// Sets every proxy's one-way delay.
    pub fn set_delay(&self, one_way: Duration) {
        self.proxies.iter().for_each(|p| p.set_delay(one_way));
    }

    /// Turns every proxy into a black hole, or back.
    pub fn blackhole(&self, on: bool) {
        self.proxies.iter().for_each(|p| p.blackhole(on));
    }
}

fn fastrand_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_cluster_answers_through_the_proxies_it_announces() {
        let pc = ProxiedCluster::primaries_only(Duration::from_millis(5));
        let proxy_ports: Vec<u16> = pc.proxies.iter().map(DelayProxy::port).collect();
        let owner = pc.cluster.owner("seats:CL1");
        assert!(
            proxy_ports.contains(&owner.port),
            "{owner:?} not announced by a proxy"
        );
        assert_ne!(pc.direct_port(owner.port), owner.port);
        assert_eq!(pc.cluster.cli(owner.port, &["SET", "seats:CL1", "v"]), "OK");
        assert_eq!(pc.cluster.cli(owner.port, &["GET", "seats:CL1"]), "v");
        let slots = pc.cluster.cli(owner.port, &["CLUSTER", "SLOTS"]);
        for p in &proxy_ports {
            assert!(
                slots.lines().any(|l| l.trim() == p.to_string()),
                "{p} not in {slots}"
            );
        }
    }
}
