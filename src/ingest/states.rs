//! Where the state hashes are read: Redis for `serve` (through the command
//! client, one pipeline per primary in a cluster), the bus's table for
//! `demo`. Only the state reader thread (`reader.rs`) calls a store, so a read
//! that takes a round trip (or a frozen Redis's timeout) never holds up a
//! snapshot. The round-trip probe goes through the same client (standalone),
//! or asks each primary of the client's slot map its `ROLE` (cluster): the
//! map is read again when the client's connection is new or saw a redirect,
//! and by the probe itself when a primary is silent or answers as a replica,
//! so a failover no connection of the node saw (a graceful one, or a frozen
//! primary's) is found within a probe or two and handed to the ingest thread
//! ([`Topology`]).

use super::scan::{self, Reading};
use crate::channels::Topology;
use crate::redis::backoff::Backoff;
use crate::redis::commands::Commands;
use crate::redis::{Mode, Redis};
use crate::slots::{Addr, BlindSlots, SlotMap};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the probe looks at the slot map while a primary is silent.
const DOWN_PROBE: Duration = Duration::from_millis(250);

/// One round trip as measured: the node it was measured to (`None` for a
/// standalone Redis), and its seconds (`None`: no answer).
pub type RoundTrip = (Option<String>, Option<f64>);

/// Where [`StateStore::read_each`] hands what it read: the courses, and one
/// payload per section of each (`None`: the read failed).
pub type Answer<'a> = dyn FnMut(Vec<Arc<str>>, Option<Vec<Vec<Vec<u8>>>>) + 'a;

/// Where [`StateStore::read_each`] takes more courses to read between steps.
pub type More<'a> = dyn FnMut() -> Vec<Arc<str>> + 'a;

/// The state hashes and what else the state reader asks of Redis.
pub trait StateStore: Send {
    /// The state hashes of `courses` (one payload per section each), in order,
    /// read in pipelines; `None` when the read failed.
    fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>>;
    /// The state hashes of `courses`, each handed to `done` as soon as it is
    /// read, several at a time: a large hash read in steps never holds up
    /// the small ones beside it, and while one is still being read, the
    /// courses `more` gives join the next step. The courses left when a read
    /// fails are handed over with `None`. By default, one
    /// [`StateStore::read`] of `courses`.
    fn read_each(&mut self, courses: Vec<Arc<str>>, more: &mut More<'_>, done: &mut Answer<'_>) {
        let _ = more;
        let hashes = self.read(&courses);
        done(courses, hashes);
    }
    /// Every valid course code with a state hash; `None` when the scan failed.
    fn scan(&mut self) -> Option<Vec<String>>;
    /// The round trip to each node that holds state, measured now.
    fn ping(&mut self) -> Vec<RoundTrip>;
    /// How long until the next round-trip probe: `every` while the store's
    /// connections answer; after a probe that failed to connect, until the
    /// failed connection's own next attempt (its jittered backoff, capped at
    /// 2 s), so the probe never redials on a fixed tick.
    fn next_ping(&self, every: Duration) -> Duration {
        every
    }
    /// Forgets any backoff from an outage: Redis is known to answer again.
    fn retry_now(&mut self) {}
    /// What the last probes found changed in a cluster's primaries (slots
    /// moved, primaries silent or back), once; `None` when nothing did.
    fn take_topology(&mut self) -> Option<Topology> {
        None
    }
    /// Fields of the hashes read since last asked that were past a course's
    /// most sections (left unread, to be counted `too_many_sections`); asked
    /// after the reads' answers are sent, so it delays none of them.
    fn take_over_cap(&mut self) -> u64 {
        0
    }
}

/// The state hashes in Redis, through the bounded command client.
pub struct RedisStates {
    /// The command client every read, scan and standalone probe goes
    /// through; in a cluster, the probe takes the primaries from its slot map.
    link: Commands,
    /// The primaries of the last slot map read: pinged one by one when the
    /// map cannot be read now (its read may have gone to a silent primary).
    primaries: Vec<Addr>,
    /// The probe's connection to each primary of a cluster (opened by
    /// [`Redis::connect_node`], as every command connection is): one that
    /// does not answer costs only its own round trip, never the reads their
    /// connection (the cluster connection would retry a silent node, then be
    /// dropped whole).
    pings: HashMap<Addr, ::redis::Connection>,
    /// The backoff of each primary whose probe connection could not be
    /// opened (jittered, capped at 2 s like every Redis client's): it is
    /// dialed again only once that is over, not at every probe.
    ping_backoff: HashMap<Addr, Backoff>,
    prefix: String,
    /// The courses read since [`StateStore::take_over_cap`] whose hash held
    /// more fields than read, with how many were read.
    over_cap: Vec<(Arc<str>, usize)>,
    /// The slot map as the probes last knew it.
    map: Option<SlotMap>,
    /// The primaries that did not answer the last probe.
    down: Vec<Addr>,
    /// Slots changed owner since the last [`StateStore::take_topology`].
    moved: bool,
    /// `down` changed since then.
    down_changed: bool,
}

impl RedisStates {
    /// A store on `redis` with keys `<state_prefix><course>`; connects lazily.
    pub fn new(redis: &Arc<Redis>, state_prefix: &str) -> Self {
        RedisStates {
            link: Commands::new(redis, "state reads"),
            primaries: Vec::new(),
            pings: HashMap::new(),
            ping_backoff: HashMap::new(),
            prefix: state_prefix.to_owned(),
            over_cap: Vec::new(),
            map: None,
            down: Vec::new(),
            moved: false,
            down_changed: false,
        }
    }

    /// Asks every primary its `ROLE` at once, each on its probe connection
    /// (opened first if needed) on a thread of its own, so a silent primary
    /// costs only its own round trip (bounded by the connect and I/O
    /// timeouts); a connection that fails or stays silent is dropped, and
    /// opened again once the node's own backoff (jittered, capped at 2 s) is
    /// over. Each round trip comes with whether its node answered as a
    /// replica (a failover demoted it).
    fn ping_each(&mut self, nodes: &[Addr]) -> Vec<(RoundTrip, bool)> {
        let redis = self.link.redis();
        let mut held = std::mem::take(&mut self.pings);
        self.ping_backoff.retain(|a, _| nodes.contains(a));
        let backoff = &self.ping_backoff;
        // (its connection if one was held or opened, its round trip, whether
        // it was probed, whether it answered as a replica)
        type Took = (Option<::redis::Connection>, Option<f64>, bool, bool);
        let took: Vec<Took> = std::thread::scope(|s| {
            let probes: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let con = held.remove(node);
                    if con.is_none() && backoff.get(node).is_some_and(|b| !b.ready()) {
                        // Down, and its next attempt is not due yet.
                        return None;
                    }
                    Some(s.spawn(move || {
                        let t = Instant::now();
                        let mut con = con.or_else(|| redis.connect_node(node).ok());
                        let role = con
                            .as_mut()
                            .and_then(|c| ::redis::cmd("ROLE").query::<::redis::Value>(c).ok());
                        let rtt = role.as_ref().map(|_| t.elapsed().as_secs_f64());
                        let demoted = role.is_some_and(|r| !is_primary(&r));
                        (con.filter(|_| rtt.is_some()), rtt, true, demoted)
                    }))
                })
                .collect();
            probes
                .into_iter()
                .map(|p| match p {
                    Some(p) => p.join().unwrap_or((None, None, true, false)),
                    None => (None, None, false, false),
                })
                .collect()
        });
        nodes
            .iter()
            .zip(took)
            .map(|(node, (con, rtt, probed, demoted))| {
                match con {
                    Some(c) => {
                        self.ping_backoff.remove(node);
                        self.pings.insert(node.clone(), c);
                    }
                    None if probed => self.ping_backoff.entry(node.clone()).or_default().failed(),
                    None => {}
                }
                ((Some(format!("{}:{}", node.0, node.1)), rtt), demoted)
            })
            .collect()
    }

    /// The courses with a state hash over every primary at once, each
    /// scanned on its probe connection on a thread of its own: a primary
    /// that went silent since the last probe costs one read timeout, not
    /// the command client's retries, so the reads behind the scan wait
    /// little. `None` unless every primary answered.
    fn scan_each(&mut self) -> Option<Vec<String>> {
        let nodes = self.primaries.clone();
        let prefix = &self.prefix;
        let mut held = std::mem::take(&mut self.pings);
        // Each primary's connection and keys, if it answered.
        type Scanned = Option<(::redis::Connection, Vec<Vec<u8>>)>;
        let scanned: Vec<Scanned> = std::thread::scope(|s| {
            let scans: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let con = held.remove(node);
                    s.spawn(move || {
                        let mut con = con?;
                        let keys = crate::redis::state_keys::scan_node(&mut con, prefix).ok()?;
                        Some((con, keys))
                    })
                })
                .collect();
            scans
                .into_iter()
                .map(|scan| scan.join().ok().flatten())
                .collect()
        });
        let mut keys = Vec::new();
        let mut whole = true;
        for (node, found) in nodes.into_iter().zip(scanned) {
            match found {
                Some((con, k)) => {
                    self.pings.insert(node, con);
                    keys.extend(k);
                }
                // Its connection is dropped; the next probe opens it again.
                None => whole = false,
            }
        }
        whole.then(|| crate::redis::state_keys::courses_of(&keys, &self.prefix))
    }

    /// Reads the slot map from a primary that just answered the probe (not
    /// through the command client, which may be waiting on a silent one).
    fn reread_map(&mut self) {
        let Some((node, con)) = self.pings.iter_mut().next() else {
            return;
        };
        let host = node.0.clone();
        match ::redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<::redis::Value>(con)
        {
            Ok(reply) => {
                if let Some(map) = SlotMap::parse(&reply, &host) {
                    self.note_map(map);
                }
            }
            Err(e) => tracing::debug!(error = %e, "slot map not read by the probe"),
        }
    }

    /// A slot map the probe learned: a change of any slot's primary since
    /// the last one is a move (the command client then routes afresh).
    fn note_map(&mut self, map: SlotMap) {
        if self.map.as_ref().is_some_and(|old| !old.same_owners(&map)) {
            self.moved = true;
            self.link.reroute();
            self.link.redis().learn(&map);
        }
        self.primaries = map.primaries();
        self.map = Some(map);
    }

    /// The primaries found silent by this probe.
    fn note_down(&mut self, mut down: Vec<Addr>) {
        down.sort();
        if down != self.down {
            self.down = down;
            self.down_changed = true;
        }
    }
}

/// Whether a `ROLE` reply is a primary's (`master`).
fn is_primary(role: &::redis::Value) -> bool {
    match role {
        ::redis::Value::Array(v) => matches!(
            v.first(),
            Some(::redis::Value::BulkString(b)) if b.as_slice() == b"master"
        ),
        _ => false,
    }
}

impl StateStore for RedisStates {
    fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>> {
        // Each course's reads (a name asked twice is read twice), moved out
        // in order, never copied.
        let mut read: HashMap<Arc<str>, Vec<Vec<Vec<u8>>>> = HashMap::new();
        let mut failed = false;
        self.read_each(
            courses.to_vec(),
            &mut Vec::new,
            &mut |names, hashes| match hashes {
                Some(h) => {
                    for (name, payloads) in names.into_iter().zip(h) {
                        read.entry(name).or_default().push(payloads);
                    }
                }
                None => failed = true,
            },
        );
        if failed {
            return None;
        }
        courses
            .iter()
            .map(|c| read.get_mut(c).and_then(Vec::pop))
            .collect()
    }

    fn read_each(&mut self, courses: Vec<Arc<str>>, more: &mut More<'_>, done: &mut Answer<'_>) {
        let mut open: Vec<(Arc<str>, Reading)> = courses
            .into_iter()
            .map(|c| (c, Reading::default()))
            .collect();
        while !open.is_empty() {
            if !scan::read_step(&mut self.link, &self.prefix, &mut open) {
                return done(open.into_iter().map(|(c, _)| c).collect(), None);
            }
            let (finished, left): (Vec<_>, Vec<_>) = open.into_iter().partition(|(_, r)| r.done());
            open = left;
            if !finished.is_empty() {
                let (mut names, mut hashes) = (Vec::new(), Vec::new());
                for (course, r) in finished {
                    let r = r.finish();
                    if r.more {
                        self.over_cap.push((Arc::clone(&course), r.payloads.len()));
                    }
                    names.push(course);
                    hashes.push(r.payloads);
                }
                done(names, Some(hashes));
            }
            if !open.is_empty() {
                open.extend(more().into_iter().map(|c| (c, Reading::default())));
            }
        }
    }

    fn take_over_cap(&mut self) -> u64 {
        let over = std::mem::take(&mut self.over_cap);
        if over.is_empty() {
            return 0;
        }
        let names: Vec<&str> = over.iter().map(|(c, _)| &**c).collect();
        match super::scan::lengths(&mut self.link, &self.prefix, &names) {
            Some(lens) => over
                .iter()
                .zip(lens)
                .map(|((_, read), len)| len.saturating_sub(*read as u64))
                .sum(),
            None => {
                tracing::debug!("state hash lengths not read; fields past the cap not counted");
                0
            }
        }
    }

    fn next_ping(&self, every: Duration) -> Duration {
        // Every probe goes through the link first (its mode, its slot map).
        let link = self.link.next_turn(!self.link.is_connected(), every);
        // While a primary is silent, its replica's promotion is looked for
        // in the slot map four times a second (the silent one is asked only
        // when its own backoff says).
        let watch = if self.down.is_empty() {
            every
        } else {
            DOWN_PROBE
        };
        self.ping_backoff
            .values()
            .map(Backoff::wait)
            .fold(link.min(watch), Duration::min)
    }

    fn retry_now(&mut self) {
        self.link.retry_now();
    }

    fn scan(&mut self) -> Option<Vec<String>> {
        if !self.down.is_empty() {
            // Every primary is scanned: a silent one would only hold up the
            // reads behind this scan until it times out.
            tracing::debug!(
                down = self.down.len(),
                "course scan skipped while a primary is silent"
            );
            return None;
        }
        if !self.primaries.is_empty() {
            // A cluster whose primaries the probe knows.
            return self.scan_each();
        }
        match crate::redis::state_keys::scan_courses(&mut self.link, &self.prefix) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "course scan failed");
                None
            }
        }
    }

    fn take_topology(&mut self) -> Option<Topology> {
        if !(self.moved || self.down_changed) {
            return None;
        }
        let ranges = self
            .map
            .as_ref()
            .map_or_else(Vec::new, |m| m.slots_of(&self.down));
        let t = Topology {
            moved: std::mem::take(&mut self.moved)
                .then(|| self.map.clone())
                .flatten(),
            down: self.down.clone(),
            blind: BlindSlots {
                prefix: self.prefix.clone(),
                ranges,
            },
        };
        self.down_changed = false;
        Some(t)
    }

    fn ping(&mut self) -> Vec<RoundTrip> {
        let nodes = match self.link.known_slot_map() {
            Ok(Some(map)) => {
                self.note_map(map);
                self.primaries.clone()
            }
            Ok(None) => {
                self.ping_backoff.clear();
                let t = Instant::now();
                let ok = self.link.query::<String>(&::redis::cmd("PING")).is_ok();
                return vec![(None, ok.then(|| t.elapsed().as_secs_f64()))];
            }
            Err(_) if !self.primaries.is_empty() => self.primaries.clone(),
            Err(_) => {
                self.ping_backoff.clear();
                if self.link.redis().mode() == Some(Mode::Cluster) {
                    self.link.redis().nodes_up.store(0, Relaxed);
                }
                return Vec::new();
            }
        };
        let probes = self.ping_each(&nodes);
        let up = probes.iter().filter(|((_, t), _)| t.is_some()).count();
        self.link.redis().nodes_up.store(up as u64, Relaxed);
        let down: Vec<Addr> = nodes
            .iter()
            .zip(&probes)
            .filter(|(_, ((_, t), _))| t.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        // A primary silent or demoted: its replica may have been promoted,
        // which no connection of this node would otherwise learn before its
        // own keepalive gives up on the old one.
        if !down.is_empty() || probes.iter().any(|(_, demoted)| *demoted) {
            self.reread_map();
        }
        self.note_down(down);
        probes.into_iter().map(|(rtt, _)| rtt).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::RedisFlags;
    use std::net::TcpListener;

    /// Whether a connection came to `l` (non-blocking) since the last look.
    fn dialed(l: &TcpListener) -> bool {
        let mut any = false;
        while let Ok((c, _)) = l.accept() {
            any = true;
            drop(c);
        }
        any
    }

    #[test]
    fn a_primary_whose_probe_failed_is_dialed_again_only_when_its_backoff_says() {
        // A primary that takes each connection and closes it: every probe fails.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let redis = Redis::from_flags(&RedisFlags::new(&format!("redis://127.0.0.1:{port}")))
            .expect("flags");
        let mut store = RedisStates::new(&redis, "s:");
        let node: Addr = ("127.0.0.1".into(), port);
        let nodes = [node.clone()];
        assert_eq!(store.ping_each(&nodes)[0].0 .1, None);
        assert!(dialed(&l), "the first probe dials");
        // Failed more: its next attempt is far (at least 800 ms) off.
        let b = store.ping_backoff.get_mut(&node).expect("a backoff");
        for _ in 0..5 {
            b.failed();
        }
        assert!(!b.ready());
        assert_eq!(store.ping_each(&nodes)[0].0 .1, None);
        assert!(!dialed(&l), "dialed again before its backoff was over");
        // The link failed too: the reader's next probe is when a failed
        // connection's backoff is over (at most 2 s off), not its tick.
        assert!(store.link.query::<String>(&::redis::cmd("PING")).is_err());
        dialed(&l);
        let probe = store.ping_backoff[&node].wait();
        let next = store.next_ping(Duration::from_secs(60));
        assert!(next <= Duration::from_secs(2), "{next:?}");
        assert!(next <= probe, "{next:?} after the probe's {probe:?}");
        // A node no longer probed is forgotten.
        store.ping_each(&[]);
        assert!(store.ping_backoff.is_empty());
    }
}
