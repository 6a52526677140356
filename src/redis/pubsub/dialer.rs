//! The blocking Redis work of a pub/sub source (learning the mode, opening a
//! connection with its TLS and AUTH, reading the slot map), done off the
//! thread that routes frames, so it never waits on Redis: a source asks, goes
//! on, and picks the answer up when [`Dialer::wait_fd`] is readable. Each dial
//! runs on a thread of its own (at most one in flight per node), so a primary
//! that hangs holds up only the channels it owns; the mode and the slot map
//! are asked of one thread that keeps its command client.

use super::conn::PubConn;
use crate::channels::wake::Wake;
use crate::redis::commands::Commands;
use crate::redis::error::{ConnectError, Error};
use crate::redis::{Mode, Redis};
use crate::slots::{Addr, SlotMap};
use crate::supervisor::{self, Policy};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashSet;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// A question for the map thread.
enum Job {
    /// The deployment's mode (`INFO cluster` under `--redis-mode auto`).
    Resolve,
    /// The cluster's slot map (`CLUSTER SLOTS`).
    SlotMap,
}

/// An answer of the dialer.
pub enum Dialed {
    /// The mode, or why it is not known yet.
    Resolved(Result<Mode, ConnectError>),
    /// A connection to the node, authenticated, or why not.
    Conn(Addr, io::Result<PubConn>),
    /// The slot map (`None`: not a cluster), or why it could not be read.
    SlotMap(Result<Option<SlotMap>, Error>),
}

/// Where answers go: a queue, and the eventfd that wakes the owner.
#[derive(Clone)]
struct Answers {
    tx: Sender<Dialed>,
    wake: Arc<Wake>,
}

impl Answers {
    /// Queues an answer, then wakes the owner (in that order, so a wake-up
    /// drained before its answer was taken is never the last one).
    fn send(&self, a: Dialed) -> bool {
        let sent = self.tx.send(a).is_ok();
        self.wake.wake();
        sent
    }
}

/// A source's handle on its dialer: what is asked and not answered yet.
pub struct Dialer {
    redis: Arc<Redis>,
    jobs: Sender<Job>,
    answers: Answers,
    rx: Receiver<Dialed>,
    resolving: bool,
    dialing: HashSet<Addr>,
    mapping: bool,
}

impl Dialer {
    /// Starts the map thread for `redis` (`what` names its client in logs: `pub/sub`).
    pub fn new(redis: &Arc<Redis>, what: &'static str) -> io::Result<Dialer> {
        let (jobs, job_rx) = unbounded();
        let (tx, rx) = unbounded();
        let answers = Answers {
            tx,
            wake: Arc::new(Wake::new()?),
        };
        let (r, a) = (Arc::clone(redis), answers.clone());
        supervisor::spawn("seatboard-dial", Policy::FailsNode, move || {
            serve(&r, what, &job_rx, &a)
        })?;
        Ok(Dialer {
            redis: Arc::clone(redis),
            jobs,
            answers,
            rx,
            resolving: false,
            dialing: HashSet::new(),
            mapping: false,
        })
    }

    /// Asks for the mode, unless that is asked already.
    pub fn resolve(&mut self) {
        if !self.resolving {
            self.resolving = self.jobs.send(Job::Resolve).is_ok();
        }
    }

    /// Asks for a connection to `addr` on a thread of its own, opened once
    /// `after` has passed (a node's own backoff, waited out on that thread so
    /// it holds up no other node), unless one is on its way (a thread that
    /// cannot start is answered as a failed dial).
    pub fn dial(&mut self, addr: &Addr, after: Duration) {
        if !self.dialing.insert(addr.clone()) {
            return;
        }
        let (redis, answers, at) = (Arc::clone(&self.redis), self.answers.clone(), addr.clone());
        let started = supervisor::spawn("seatboard-dial-node", Policy::FailsNode, move || {
            if !after.is_zero() {
                std::thread::sleep(after);
            }
            let conn = PubConn::open(&redis, &at, shards::snapshot::MAX_PAYLOAD);
            answers.send(Dialed::Conn(at, conn));
        });
        if let Err(e) = started {
            self.answers.send(Dialed::Conn(addr.clone(), Err(e)));
        }
    }

    /// Asks for the slot map, unless that is asked already; true when this
    /// call asked.
    pub fn read_map(&mut self) -> bool {
        if self.mapping {
            return false;
        }
        self.mapping = self.jobs.send(Job::SlotMap).is_ok();
        self.mapping
    }

    /// Whether anything is asked and not answered yet (its answer wakes
    /// [`Dialer::wait_fd`]).
    pub fn busy(&self) -> bool {
        self.resolving || self.mapping || !self.dialing.is_empty()
    }

    /// The next answer, without waiting.
    pub fn answer(&mut self) -> Option<Dialed> {
        // Nothing asked: no read of the eventfd on every turn of the loop (a
        // late wake-up left set is not polled: see `wait_fd`).
        if !self.busy() {
            return None;
        }
        self.answers.wake.drain();
        let a = self.rx.try_recv().ok()?;
        match &a {
            Dialed::Resolved(_) => self.resolving = false,
            Dialed::Conn(addr, _) => {
                self.dialing.remove(addr);
            }
            Dialed::SlotMap(_) => self.mapping = false,
        }
        Some(a)
    }

    /// Readable once an answer waits, for the owner's `poll(2)`; `None` while
    /// nothing is asked (a wake-up of an answer already taken may be left set).
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.busy().then(|| self.answers.wake.fd())
    }
}

/// The map thread: one job at a time until its [`Dialer`] is dropped.
fn serve(redis: &Arc<Redis>, what: &'static str, jobs: &Receiver<Job>, answers: &Answers) {
    let mut cmds: Option<Commands> = None;
    while let Ok(job) = jobs.recv() {
        let answer = match job {
            Job::Resolve => Dialed::Resolved(redis.resolve()),
            Job::SlotMap => {
                let cmds = cmds.get_or_insert_with(|| Commands::new(redis, what));
                Dialed::SlotMap(cmds.slot_map())
            }
        };
        if !answers.send(answer) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::poll::wait_readable;
    use crate::redis::RedisFlags;
    use std::net::TcpListener;
    use std::time::Instant;

    fn next_answer(d: &mut Dialer) -> Dialed {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(a) = d.answer() {
                return a;
            }
            let fd = d.wait_fd().expect("asked");
            assert!(Instant::now() < end, "no answer");
            wait_readable(&[fd], Duration::from_secs(1));
        }
    }

    #[test]
    fn an_answer_wakes_the_owner_and_nothing_is_polled_once_all_are_taken() {
        // Nothing listens on port 1: the dial fails at once.
        let redis = Redis::from_flags(&RedisFlags::new("redis://127.0.0.1:1")).expect("flags");
        let mut d = Dialer::new(&redis, "unit").expect("thread");
        assert!(
            d.answer().is_none() && d.wait_fd().is_none(),
            "nothing asked"
        );
        let addr: Addr = ("127.0.0.1".into(), 1);
        d.dial(&addr, Duration::ZERO);
        d.dial(&addr, Duration::ZERO);
        assert!(d.busy());
        let a = next_answer(&mut d);
        assert!(matches!(a, Dialed::Conn(ref at, Err(_)) if at == &addr));
        assert!(!d.busy(), "one dial for two asks");
        assert!(d.wait_fd().is_none(), "no descriptor to sleep on");
    }

    #[test]
    fn a_dial_waits_out_its_nodes_backoff_and_no_other_node_waits_with_it() {
        // Nothing listens on port 1 or 2: each dial fails as soon as it is made.
        let redis = Redis::from_flags(&RedisFlags::new("redis://127.0.0.1:1")).expect("flags");
        let mut d = Dialer::new(&redis, "unit").expect("thread");
        let (backing_off, fresh): (Addr, Addr) = (("127.0.0.1".into(), 1), ("127.0.0.1".into(), 2));
        let asked = Instant::now();
        d.dial(&backing_off, Duration::from_millis(300));
        d.dial(&fresh, Duration::ZERO);
        let first = next_answer(&mut d);
        assert!(
            matches!(first, Dialed::Conn(ref at, Err(_)) if at == &fresh),
            "the node with no backoff answered first"
        );
        assert!(matches!(next_answer(&mut d), Dialed::Conn(ref at, Err(_)) if at == &backing_off));
        assert!(
            asked.elapsed() >= Duration::from_millis(300),
            "dialed before its backoff ended: {:?}",
            asked.elapsed()
        );
    }

    #[test]
    fn a_dial_that_hangs_holds_up_no_other_node() {
        // A node that accepts and never answers AUTH: its dial waits out the
        // connect deadline. The one on port 1 fails at once, meanwhile.
        let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = silent.local_addr().expect("addr").port();
        let redis = Redis::from_flags(&RedisFlags::new(&format!(
            "redis://:secret@127.0.0.1:{port}"
        )))
        .expect("flags");
        let mut d = Dialer::new(&redis, "unit").expect("thread");
        let (hung, quick): (Addr, Addr) = (("127.0.0.1".into(), port), ("127.0.0.1".into(), 1));
        d.dial(&hung, Duration::ZERO);
        d.dial(&quick, Duration::ZERO);
        let first = next_answer(&mut d);
        assert!(
            matches!(first, Dialed::Conn(ref at, Err(_)) if at == &quick),
            "the quick node's answer came first"
        );
        assert!(matches!(next_answer(&mut d), Dialed::Conn(ref at, Err(_)) if at == &hung));
    }
}
