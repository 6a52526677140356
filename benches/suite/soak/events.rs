//! The soak's faults and their schedule: a hub killed or rolled, Redis
//! restarted or frozen, a cluster primary killed or frozen.

use super::{Store, DRAIN_MS};
use crate::cluster_util::{self, Cluster};
use crate::node::ServeNode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::scrape;

/// One scheduled fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    NodeKill,
    Rolling,
    RedisRestart,
    RedisFreeze,
    PrimaryKill,
    PrimaryFreeze,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::NodeKill => "node_kill",
            Kind::Rolling => "rolling_restart",
            Kind::RedisRestart => "redis_restart",
            Kind::RedisFreeze => "redis_freeze",
            Kind::PrimaryKill => "primary_kill",
            Kind::PrimaryFreeze => "primary_freeze",
        }
    }
}

/// The events and when (s from the start): the hub's restarts in the warm-up
/// quarter, then Redis restart + freeze pairs (in a cluster: primary kill +
/// freeze pairs) evenly over the other three.
pub(super) fn schedule(total_s: f64, cluster: bool) -> Vec<(f64, Kind)> {
    let (restart, freeze) = if cluster {
        (Kind::PrimaryKill, Kind::PrimaryFreeze)
    } else {
        (Kind::RedisRestart, Kind::RedisFreeze)
    };
    let q = total_s / 4.0;
    let mut v = vec![(q * 0.25, Kind::NodeKill), (q * 0.6, Kind::Rolling)];
    let pairs = ((total_s / 60.0 / 20.0 * 3.0).round() as usize).clamp(1, 12);
    let span = total_s - q;
    for i in 0..pairs {
        let at = q + span * i as f64 / pairs as f64;
        v.push((at + span / pairs as f64 * 0.1, restart));
        v.push((at + span / pairs as f64 * 0.5, freeze));
    }
    v
}

/// Whether the hub reports Redis down.
pub(super) fn degraded(port: u16) -> bool {
    scrape::get_ok(port, "/healthz", Duration::from_secs(3))
        .and_then(|b| serde_json::from_str::<Value>(&b).ok())
        .is_some_and(|h| h["redis"] == false && h["status"] == "degraded")
}

/// The primary to fault: the one serving the hottest course's channel when
/// it has a live replica to take over, else any primary that has one.
pub(super) fn victim(c: &Cluster, hottest: &str) -> Option<(cluster_util::NodeLine, u16)> {
    let lines = c.nodes_now();
    let live_replica = |id: &str| {
        lines
            .iter()
            .filter(|l| l.primary_id.as_deref() == Some(id))
            .find(|l| cluster_util::cli(l.port, &["PING"]) == "PONG")
            .map(|l| l.port)
    };
    let hot = c.owner(&format!("seats:{hottest}"));
    let mut primaries: Vec<_> = lines.iter().filter(|l| l.primary).cloned().collect();
    primaries.sort_by_key(|l| l.id != hot.id);
    primaries
        .into_iter()
        .find_map(|p| live_replica(&p.id).map(|r| (p, r)))
}

/// A cluster node's process id (`INFO server`).
pub(super) fn node_pid(port: u16) -> Option<i32> {
    cluster_util::cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:")?.parse().ok())
}

/// `primary_kill` and `primary_freeze`: SIGKILL (left dead for the rest of
/// the run) or SIGSTOP for `freeze` then SIGCONT; both wait for the replica's
/// promotion.
pub(super) fn cluster_event(kind: Kind, c: &mut Cluster, hottest: &str, freeze: Duration) -> Value {
    let t = Instant::now();
    let Some((primary, replica)) = victim(c, hottest) else {
        return json!({"skipped": "no primary has a live replica"});
    };
    let owns_hottest = c.owner(&format!("seats:{hottest}")).id == primary.id;
    // When the replica reports itself primary (ms from the fault).
    let promoted = || {
        testkit::wait::wait_for(Duration::from_secs(30), || {
            let role = cluster_util::cli(replica, &["ROLE"]);
            (role.lines().next().map(str::trim) == Some("master"))
                .then(|| t.elapsed().as_millis() as u64)
        })
    };
    if kind == Kind::PrimaryKill {
        c.kill(primary.port);
        let ms = promoted();
        return json!({"killed": primary.port, "owned_hottest": owns_hottest,
                      "promoted": replica, "promoted_ms": ms});
    }
    let pid = node_pid(primary.port).unwrap_or(0);
    // SAFETY: kill(2) on a redis-server of this run's cluster.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let ms = promoted();
    let rest = freeze.saturating_sub(t.elapsed());
    std::thread::sleep(rest);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    json!({"frozen": primary.port, "owned_hottest": owns_hottest, "frozen_ms": t.elapsed().as_millis() as u64,
           "promoted": replica, "promoted_ms": ms})
}

/// Runs one event; returns the moment the fault was over and notes.
pub(super) fn run_event(
    kind: Kind,
    hubs: &mut [ServeNode],
    store: &mut Store,
    hottest: &str,
    freeze: Duration,
) -> (Instant, Value) {
    let t = Instant::now();
    let notes = match (kind, store) {
        (Kind::NodeKill, _) => {
            let up = hubs[0].restart(libc::SIGKILL, Duration::from_millis(DRAIN_MS));
            json!({"ready_again": up, "restart_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::Rolling, _) => {
            let mut up = true;
            for (i, hub) in hubs.iter_mut().enumerate() {
                if i > 0 {
                    // Until the proxy's checks saw the last one up (rise 2 at 1 s).
                    std::thread::sleep(Duration::from_millis(2500));
                }
                up &= hub.restart(libc::SIGTERM, Duration::from_millis(DRAIN_MS));
            }
            json!({"ready_again": up, "drain_and_restart_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::PrimaryKill | Kind::PrimaryFreeze, Store::Cluster(c)) => {
            cluster_event(kind, c, hottest, freeze)
        }
        (Kind::RedisRestart, Store::Single(redis)) => {
            redis.restart_saved();
            json!({"redis_down_ms": t.elapsed().as_millis() as u64})
        }
        (Kind::RedisFreeze, Store::Single(redis)) => {
            redis.signal(libc::SIGSTOP);
            let mut noticed = None;
            let mut answered = 0u32;
            let mut unanswered = 0u32;
            while t.elapsed() < freeze {
                match scrape::get_ok(hubs[0].port, "/metrics", Duration::from_secs(3)) {
                    Some(_) => answered += 1,
                    None => unanswered += 1,
                }
                if noticed.is_none() && degraded(hubs[0].port) {
                    noticed = Some(t.elapsed().as_millis() as u64);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            redis.signal(libc::SIGCONT);
            json!({"frozen_ms": freeze.as_millis() as u64, "noticed_ms": noticed,
                   "metrics_answered": answered, "metrics_unanswered": unanswered})
        }
        (k, _) => json!({"skipped": format!("{} needs the other Redis setup", k.name())}),
    };
    (Instant::now(), notes)
}
