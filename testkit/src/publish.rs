//! The selection-API stand-in of the bench suite and the tests
//! ([`SelectionApi`]): writes the state hash with the contract's
//! compare-and-set script (`EVALSHA <sha> 1 <state-prefix>C <section> <json>
//! <version>`) + `PUBLISH <channel-prefix>C <json>` pipelined through
//! seatboard's own command client (`Commands::pipeline`, the redis crate
//! underneath), as `seatboard publish` does (in a cluster: the hashes first,
//! pipelined per slot owner, then `SPUBLISH` the same way), and remembers the
//! last state it published so the runner can check what clients ended up with.
//!
//! Every snapshot carries `seat_info.t`, its publish time in µs since the Unix
//! epoch (and the contract's `ts` in ms), for end-to-end latency.

use loadgen::{digest, now_us, zipf_cdf, zipf_pick};
use redis::Cmd;
use seatboard::publish::script;
use seatboard::redis::commands::Commands;
use seatboard::redis::{Error, Redis, RedisFlags, RedisMode};
use seatboard::slots::SlotMap;
use std::time::{Duration, Instant};

/// One Redis node's command client and the pipelines queued for it.
struct NodePipe {
    /// The port the slot map names it by.
    port: u16,
    link: Commands,
    /// Phase 1 (standalone: everything): the script (+ PUBLISH).
    first: Vec<Cmd>,
    /// Phase 2 (cluster): SPUBLISH, sent once every hash is written.
    second: Vec<Cmd>,
}

impl NodePipe {
    /// The node the slot map names `port`, reached on `direct` (the same
    /// unless the cluster announces proxies), as one standalone Redis.
    fn connect_at(port: u16, direct: u16) -> NodePipe {
        let mut flags = RedisFlags::new(&format!("redis://127.0.0.1:{direct}"));
        flags.redis_mode = RedisMode::Standalone;
        let redis = Redis::from_flags(&flags).expect("node flags");
        let mut link = Commands::new(&redis, "test publisher");
        load_script(&mut link).expect("SCRIPT LOAD");
        NodePipe {
            port,
            link,
            first: Vec::new(),
            second: Vec::new(),
        }
    }
}

/// `SCRIPT LOAD`s the compare-and-set, so `EVALSHA` finds it (again after a
/// restart: [`SelectionApi::flush`] calls this after a `NOSCRIPT`).
fn load_script(link: &mut Commands) -> Result<(), Error> {
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(script::SOURCE);
    link.query::<String>(&load).map(drop)
}

/// Whether a failed flush is worth sending again: Redis away (restarting) or
/// still loading, or the script lost; any other error reply is a bug.
fn transient(e: &Error) -> bool {
    match e {
        Error::Command { source, .. } => {
            let loading = redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading);
            source.kind() == loading
                || e.is_noscript()
                || source.is_io_error()
                || source.is_connection_dropped()
        }
        _ => e.is_unreachable(),
    }
}

/// Publishes snapshots and tracks the final state.
pub struct SelectionApi {
    nodes: Vec<NodePipe>,
    /// Cluster: the slot map (`nodes` are its primaries).
    cluster: Option<SlotMap>,
    /// Course codes.
    pub courses: Vec<String>,
    sections: u32,
    /// Per course, per section: (version, seats_taken).
    state: Vec<Vec<(u64, u32)>>,
    /// Snapshots published.
    pub published: u64,
}

const TOTAL: u32 = 60;

impl SelectionApi {
    /// Connects to Redis on `port`, for `courses` of `sections` sections each.
    pub fn connect(port: u16, courses: Vec<String>, sections: u32) -> SelectionApi {
        let state = vec![vec![(0, 0); sections as usize]; courses.len()];
        SelectionApi {
            nodes: vec![NodePipe::connect_at(port, port)],
            cluster: None,
            courses,
            sections,
            state,
            published: 0,
        }
    }

    /// Connects to every primary of the cluster whose nodes listen on `ports`
    /// (slot map read once through seatboard's own Redis layer).
    pub fn connect_cluster(ports: &[u16], courses: Vec<String>, sections: u32) -> SelectionApi {
        SelectionApi::connect_cluster_via(ports, courses, sections, |p| p)
    }

    /// [`SelectionApi::connect_cluster`], reaching the primary the slot map
    /// names by port `p` on port `direct(p)` (a cluster whose nodes announce
    /// delay proxies, published to from near).
    pub fn connect_cluster_via(
        ports: &[u16],
        courses: Vec<String>,
        sections: u32,
        direct: impl Fn(u16) -> u16,
    ) -> SelectionApi {
        let uri = ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut flags = RedisFlags::new(&uri);
        flags.redis_mode = RedisMode::Cluster;
        let redis = Redis::from_flags(&flags).expect("cluster flags");
        let map = Commands::new(&redis, "bench")
            .slot_map()
            .expect("slot map")
            .expect("a cluster");
        let mut p = SelectionApi::connect(ports[0], courses, sections);
        p.nodes = map
            .primaries()
            .iter()
            .map(|a| NodePipe::connect_at(a.1, direct(a.1)))
            .collect();
        p.cluster = Some(map);
        p
    }

    fn node_of(&self, key: &[u8]) -> usize {
        let Some(map) = &self.cluster else { return 0 };
        let port = map.owner_of(key).map(|a| a.1).expect("slot owner");
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("owner connected")
    }

    /// Queues the next version of one section.
    pub fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        let st = &mut self.state[course][section as usize];
        st.0 += 1;
        st.1 = (st.1 + 1 + (st.0 as u32 % 3)) % (TOTAL + 1);
        let (version, taken) = *st;
        let name = &self.courses[course];
        let json = format!(
            "{{\"course\":\"{name}\",\"section\":{section},\"total_seats\":{TOTAL},\"seats_taken\":{taken},\"seat_info\":{{\"room\":\"R{section}\",\"t\":{t_us}}},\"version\":{version},\"ts\":{}}}",
            t_us / 1000
        );
        let key = format!("seatstate:{name}");
        let chan = format!("seats:{name}");
        let (h, p) = (self.node_of(key.as_bytes()), self.node_of(chan.as_bytes()));
        let mut set = redis::cmd("EVALSHA");
        set.arg(script::sha1_hex())
            .arg(1)
            .arg(key)
            .arg(section)
            .arg(&json)
            .arg(version);
        if self.cluster.is_some() {
            self.nodes[h].first.push(set);
            let mut publish = redis::cmd("SPUBLISH");
            publish.arg(chan).arg(json);
            self.nodes[p].second.push(publish);
        } else {
            let mut publish = redis::cmd("PUBLISH");
            publish.arg(chan).arg(json);
            self.nodes[0].first.extend([set, publish]);
        }
        self.published += 1;
    }

    /// Sends what is queued and reads every reply: every node's hashes, then
    /// (cluster) every node's SPUBLISHes. When Redis goes away (a restart),
    /// connects again and sends the whole batch again (snapshots are
    /// versioned, so a repeat is harmless), for up to 60 s.
    pub fn flush(&mut self) {
        for second in [false, true] {
            for n in &mut self.nodes {
                let cmds = if second { &mut n.second } else { &mut n.first };
                if cmds.is_empty() {
                    continue;
                }
                let end = Instant::now() + Duration::from_secs(60);
                while let Err(e) = n.link.pipeline::<()>(cmds) {
                    assert!(transient(&e), "redis error: {e}");
                    assert!(Instant::now() < end, "redis gone for 60 s: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                    n.link.retry_now();
                    if e.is_noscript() {
                        // A restarted Redis has lost the script.
                        let _ = load_script(&mut n.link);
                    }
                }
                cmds.clear();
            }
        }
    }

    /// Per course, per section: the last version published (what a viewer's
    /// board must reach; see `loadgen`'s `ref`).
    pub fn versions(&self) -> Vec<Vec<u64>> {
        self.state
            .iter()
            .map(|c| c.iter().map(|s| s.0).collect())
            .collect()
    }

    /// Publishes version 1.. of every section of every course once.
    pub fn seed(&mut self) {
        for c in 0..self.courses.len() {
            for s in 0..self.sections {
                self.queue(c, s, now_us());
            }
            if c % 50 == 49 {
                self.flush();
            }
        }
        self.flush();
    }

    /// `rate` snapshots/s for `secs`, courses Zipf(`skew`), sections uniform;
    /// `progress` is called about once a second with the count so far.
    pub fn storm(
        &mut self,
        rate: f64,
        secs: f64,
        skew: f64,
        seed: u64,
        mut progress: impl FnMut(u64),
    ) {
        let cdf = zipf_cdf(self.courses.len(), skew);
        let mut rng = fastrand::Rng::with_seed(seed);
        let start = Instant::now();
        let mut sent = 0u64;
        let mut next_progress = start + Duration::from_secs(1);
        loop {
            let el = start.elapsed().as_secs_f64();
            if el >= secs {
                break;
            }
            let due = (rate * el) as u64;
            let t = now_us();
            while sent < due {
                let c = zipf_pick(&cdf, &mut rng);
                let s = rng.u32(0..self.sections);
                self.queue(c, s, t);
                sent += 1;
            }
            self.flush();
            if Instant::now() >= next_progress {
                next_progress += Duration::from_secs(1);
                progress(sent);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The digest a client's merged board of `course` must have.
    pub fn expected(&self, course: usize) -> u64 {
        let board: Vec<(u32, u64, u32)> = self.state[course]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.0 > 0)
            .map(|(i, s)| (i as u32, s.0, s.1))
            .collect();
        digest(&board)
    }
}
