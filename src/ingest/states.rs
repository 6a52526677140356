//! Where the state hashes are read: Redis for `serve` (through the command
//! client, one pipeline per primary in a cluster), the bus's table for
//! `demo`. Only the state reader thread (`reader.rs`) calls a store, so a read
//! that takes a round trip (or a frozen Redis's timeout) never holds up a
//! snapshot. The round-trip probe goes through the same client (standalone),
//! or PINGs each primary of the client's slot map (cluster), which is read
//! again only when the client's connection is new or saw a redirect.

use super::scan::{self, Reading};
use crate::redis::commands::Commands;
use crate::redis::slots::Addr;
use crate::redis::{Mode, Redis};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

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
    /// Forgets any backoff from an outage: Redis is known to answer again.
    fn retry_now(&mut self) {}
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
    prefix: String,
    /// The courses read since [`StateStore::take_over_cap`] whose hash held
    /// more fields than read, with how many were read.
    over_cap: Vec<(Arc<str>, usize)>,
}

impl RedisStates {
    /// A store on `redis` with keys `<state_prefix><course>`; connects lazily.
    pub fn new(redis: &Arc<Redis>, state_prefix: &str) -> Self {
        RedisStates {
            link: Commands::new(redis, "state reads"),
            primaries: Vec::new(),
            pings: HashMap::new(),
            prefix: state_prefix.to_owned(),
            over_cap: Vec::new(),
        }
    }

    /// PINGs every primary at once, each on its probe connection (opened
    /// first if needed) on a thread of its own, so a silent primary costs
    /// only its own round trip (bounded by the connect and I/O timeouts); a
    /// connection that fails or stays silent is dropped (opened again next
    /// time).
    fn ping_each(&mut self, nodes: &[Addr]) -> Vec<RoundTrip> {
        let redis = self.link.redis();
        let mut held = std::mem::take(&mut self.pings);
        let took: Vec<(Option<::redis::Connection>, Option<f64>)> = std::thread::scope(|s| {
            let probes: Vec<_> = nodes
                .iter()
                .map(|node| {
                    let con = held.remove(node);
                    s.spawn(move || {
                        let t = Instant::now();
                        let mut con = con.or_else(|| redis.connect_node(node).ok());
                        let pong = con.as_mut().is_some_and(|c| {
                            ::redis::cmd("PING")
                                .query::<String>(c)
                                .is_ok_and(|r| r == "PONG")
                        });
                        let rtt = pong.then(|| t.elapsed().as_secs_f64());
                        (con.filter(|_| pong), rtt)
                    })
                })
                .collect();
            probes
                .into_iter()
                .map(|p| p.join().unwrap_or((None, None)))
                .collect()
        });
        nodes
            .iter()
            .zip(took)
            .map(|(node, (con, rtt))| {
                if let Some(c) = con {
                    self.pings.insert(node.clone(), c);
                }
                (Some(format!("{}:{}", node.0, node.1)), rtt)
            })
            .collect()
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

    fn retry_now(&mut self) {
        self.link.retry_now();
    }

    fn scan(&mut self) -> Option<Vec<String>> {
        match crate::redis::state_keys::scan_courses(&mut self.link, &self.prefix) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "course scan failed");
                None
            }
        }
    }

    fn ping(&mut self) -> Vec<RoundTrip> {
        let nodes = match self.link.known_slot_map() {
            Ok(Some(map)) => {
                self.primaries = map.primaries();
                self.primaries.clone()
            }
            Ok(None) => {
                let t = Instant::now();
                let ok = self.link.query::<String>(&::redis::cmd("PING")).is_ok();
                return vec![(None, ok.then(|| t.elapsed().as_secs_f64()))];
            }
            Err(_) if !self.primaries.is_empty() => self.primaries.clone(),
            Err(_) => {
                if self.link.redis().mode() == Some(Mode::Cluster) {
                    self.link.redis().nodes_up.store(0, Relaxed);
                }
                return Vec::new();
            }
        };
        let rtt = self.ping_each(&nodes);
        let up = rtt.iter().filter(|(_, t)| t.is_some()).count();
        self.link.redis().nodes_up.store(up as u64, Relaxed);
        rtt
    }
}
