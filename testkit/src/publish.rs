//! The selection-API stand-in of the bench suite and the tests: writes the state hash with the
//! contract's compare-and-set script (`EVALSHA <sha> 1 <state-prefix>C
//! <section> <json> <version>`) + `PUBLISH <channel-prefix>C <json>` pipelined
//! over one plain RESP connection, as `seatboard publish` does (in a cluster:
//! the hashes first, pipelined per slot owner, then `SPUBLISH` the same way),
//! and remembers the last state it published so the runner can check what
//! clients ended up with.
//!
//! Every snapshot carries `seat_info.t`, its publish time in µs since the Unix
//! epoch (and the contract's `ts` in ms), for end-to-end latency.

use loadgen::{digest, now_us, zipf_cdf, zipf_pick};
use seatboard::publish::script;
use seatboard::redis::commands::Commands;
use seatboard::redis::slots::SlotMap;
use seatboard::redis::{Redis as SbRedis, RedisFlags, RedisMode};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One Redis node's connection and the pipeline queued for it.
struct NodePipe {
    /// The port the slot map names it by.
    port: u16,
    /// The port it is reached on.
    direct: u16,
    out: TcpStream,
    replies: BufReader<TcpStream>,
    /// Phase 1 (standalone: everything): HSET (+ PUBLISH).
    first: Vec<u8>,
    first_n: usize,
    /// Phase 2 (cluster): SPUBLISH, sent once every hash is written.
    second: Vec<u8>,
    second_n: usize,
}

impl NodePipe {
    fn connect(port: u16) -> NodePipe {
        NodePipe::connect_at(port, port)
    }

    /// The node the slot map names `port`, reached on `direct` (the same
    /// unless the cluster announces proxies).
    fn connect_at(port: u16, direct: u16) -> NodePipe {
        let out = TcpStream::connect(("127.0.0.1", direct)).expect("connect redis");
        out.set_nodelay(true).expect("nodelay");
        let replies = BufReader::new(out.try_clone().expect("clone"));
        let mut n = NodePipe {
            port,
            direct,
            out,
            replies,
            first: Vec::new(),
            first_n: 0,
            second: Vec::new(),
            second_n: 0,
        };
        load_script(&mut n.out, &mut n.replies).expect("SCRIPT LOAD");
        n
    }
}

/// `SCRIPT LOAD`s the compare-and-set, so `EVALSHA` finds it (again after a
/// restart: [`Publisher::flush`] calls this on every reconnect).
fn load_script(out: &mut TcpStream, replies: &mut BufReader<TcpStream>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    command(&mut buf, &[b"SCRIPT", b"LOAD", script::SOURCE.as_bytes()]);
    out.write_all(&buf)?;
    let mut line = String::new();
    for _ in 0..2 {
        line.clear();
        if replies.read_line(&mut line)? == 0 || line.starts_with('-') {
            return Err(std::io::Error::other(format!("SCRIPT LOAD: {line}")));
        }
    }
    Ok(())
}

/// Publishes snapshots and tracks the final state.
pub struct Publisher {
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

fn bulk(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(format!("${}\r\n", s.len()).as_bytes());
    buf.extend_from_slice(s);
    buf.extend_from_slice(b"\r\n");
}

fn command(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        bulk(buf, a);
    }
}

const TOTAL: u32 = 60;

impl Publisher {
    /// Connects to Redis on `port`, for `courses` of `sections` sections each.
    pub fn connect(port: u16, courses: Vec<String>, sections: u32) -> Publisher {
        let state = vec![vec![(0, 0); sections as usize]; courses.len()];
        Publisher {
            nodes: vec![NodePipe::connect(port)],
            cluster: None,
            courses,
            sections,
            state,
            published: 0,
        }
    }

    /// Connects to every primary of the cluster whose nodes listen on `ports`
    /// (slot map read once through seatboard's own Redis layer).
    pub fn connect_cluster(ports: &[u16], courses: Vec<String>, sections: u32) -> Publisher {
        Publisher::connect_cluster_via(ports, courses, sections, |p| p)
    }

    /// [`Publisher::connect_cluster`], reaching the primary the slot map
    /// names by port `p` on port `direct(p)` (a cluster whose nodes announce
    /// delay proxies, published to from near).
    pub fn connect_cluster_via(
        ports: &[u16],
        courses: Vec<String>,
        sections: u32,
        direct: impl Fn(u16) -> u16,
    ) -> Publisher {
        let uri = ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut flags = RedisFlags::new(&uri);
        flags.redis_mode = RedisMode::Cluster;
        let redis = SbRedis::from_flags(&flags).expect("cluster flags");
        let map = Commands::new(&redis, "bench")
            .slot_map()
            .expect("slot map")
            .expect("a cluster");
        let mut p = Publisher::connect(ports[0], courses, sections);
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
        let section = section.to_string();
        let version = version.to_string();
        let (h, p) = (self.node_of(key.as_bytes()), self.node_of(chan.as_bytes()));
        let hset: [&[u8]; 7] = [
            b"EVALSHA",
            script::sha1_hex().as_bytes(),
            b"1",
            key.as_bytes(),
            section.as_bytes(),
            json.as_bytes(),
            version.as_bytes(),
        ];
        if self.cluster.is_some() {
            let n = &mut self.nodes[h];
            command(&mut n.first, &hset);
            n.first_n += 1;
            let n = &mut self.nodes[p];
            command(
                &mut n.second,
                &[b"SPUBLISH", chan.as_bytes(), json.as_bytes()],
            );
            n.second_n += 1;
        } else {
            let n = &mut self.nodes[0];
            command(&mut n.first, &hset);
            command(
                &mut n.first,
                &[b"PUBLISH", chan.as_bytes(), json.as_bytes()],
            );
            n.first_n += 2;
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
                let (buf, count) = if second {
                    (&mut n.second, &mut n.second_n)
                } else {
                    (&mut n.first, &mut n.first_n)
                };
                if buf.is_empty() {
                    continue;
                }
                let end = Instant::now() + Duration::from_secs(60);
                while let Err(e) = try_flush(&mut n.out, &mut n.replies, buf, *count) {
                    assert!(Instant::now() < end, "redis gone for 60 s: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                    if let Ok(out) = TcpStream::connect(("127.0.0.1", n.direct)) {
                        let _ = out.set_nodelay(true);
                        if let Ok(r) = out.try_clone() {
                            n.replies = BufReader::new(r);
                            n.out = out;
                            // A restarted Redis has lost the script.
                            let _ = load_script(&mut n.out, &mut n.replies);
                        }
                    }
                }
                buf.clear();
                *count = 0;
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

fn try_flush(
    out: &mut TcpStream,
    replies: &mut BufReader<TcpStream>,
    buf: &[u8],
    pending: usize,
) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    out.write_all(buf)?;
    let mut line = String::new();
    for _ in 0..pending {
        line.clear();
        if replies.read_line(&mut line)? == 0 {
            return Err(Error::new(ErrorKind::UnexpectedEof, "redis closed"));
        }
        if line.starts_with("-LOADING") || line.starts_with("-NOSCRIPT") {
            return Err(Error::other(line.trim_end().to_string()));
        }
        assert!(!line.starts_with('-'), "redis error: {line}");
    }
    Ok(())
}
