//! The blocking Redis work of a pub/sub source (learning the mode, opening a
//! connection with its TLS and AUTH, reading the slot map), done on a thread
//! of its own so the thread that routes frames never waits on Redis: a source
//! asks, goes on, and picks the answer up when its [`Dialer::fd`] is readable.

use super::commands::Commands;
use super::conn::{wait_readable, PubConn};
use super::error::{ConnectError, Error};
use super::slots::{Addr, SlotMap};
use super::{Mode, Redis};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// A question for the dialer thread.
enum Job {
    /// The deployment's mode (`INFO cluster` under `--redis-mode auto`).
    Resolve,
    /// A pub/sub connection to this node.
    Dial(Addr),
    /// The cluster's slot map (`CLUSTER SLOTS`).
    SlotMap,
}

/// An answer of the dialer thread.
pub enum Dialed {
    /// The mode, or why it is not known yet.
    Resolved(Result<Mode, ConnectError>),
    /// A connection to the node, authenticated, or why not.
    Conn(Addr, io::Result<PubConn>),
    /// The slot map (`None`: not a cluster), or why it could not be read.
    SlotMap(Result<Option<SlotMap>, Error>),
}

/// A source's handle on its dialer thread: what is asked and not answered yet.
pub struct Dialer {
    jobs: Sender<Job>,
    answers: Receiver<Dialed>,
    /// Readable when an answer is waiting (one byte per answer).
    wake: UnixStream,
    resolving: bool,
    dialing: HashSet<Addr>,
    mapping: bool,
    /// Answers taken less wake bytes read (one byte follows each answer).
    unread_wakes: i64,
}

impl Dialer {
    /// Starts the thread for `redis` (`what` names it in logs: `pub/sub`).
    pub fn new(redis: &Arc<Redis>, what: &'static str) -> io::Result<Dialer> {
        let (jobs, job_rx) = unbounded();
        let (answer_tx, answers) = unbounded();
        let (wake, wake_tx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let redis = Arc::clone(redis);
        std::thread::Builder::new()
            .name("seatboard-dial".into())
            .spawn(move || serve(&redis, what, &job_rx, &answer_tx, wake_tx))?;
        Ok(Dialer {
            jobs,
            answers,
            wake,
            resolving: false,
            dialing: HashSet::new(),
            mapping: false,
            unread_wakes: 0,
        })
    }

    /// Asks for the mode, unless that is asked already.
    pub fn resolve(&mut self) {
        if !self.resolving {
            self.resolving = self.jobs.send(Job::Resolve).is_ok();
        }
    }

    /// Asks for a connection to `addr`, unless one is on its way.
    pub fn dial(&mut self, addr: &Addr) {
        if !self.dialing.contains(addr) && self.jobs.send(Job::Dial(addr.clone())).is_ok() {
            self.dialing.insert(addr.clone());
        }
    }

    /// Asks for the slot map, unless that is asked already.
    pub fn read_map(&mut self) {
        if !self.mapping {
            self.mapping = self.jobs.send(Job::SlotMap).is_ok();
        }
    }

    /// Whether a connection to `addr` is on its way.
    pub fn dialing(&self, addr: &Addr) -> bool {
        self.dialing.contains(addr)
    }

    /// Whether the slot map is asked and not answered yet.
    pub fn mapping(&self) -> bool {
        self.mapping
    }

    /// Whether anything is asked and not answered yet (its answer wakes [`Dialer::fd`]).
    pub fn busy(&self) -> bool {
        self.resolving || self.mapping || !self.dialing.is_empty()
    }

    /// The next answer, without waiting.
    pub fn answer(&mut self) -> Option<Dialed> {
        // Nothing asked and every wake byte read: no read of the wake socket
        // on every turn of the ingest loop.
        if !self.busy() && self.unread_wakes <= 0 {
            return None;
        }
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = (&self.wake).read(&mut buf) {
            self.unread_wakes -= n as i64;
        }
        let a = self.answers.try_recv().ok()?;
        // Its byte may still be on its way: read once it is there.
        self.unread_wakes += 1;
        match &a {
            Dialed::Resolved(_) => self.resolving = false,
            Dialed::Conn(addr, _) => {
                self.dialing.remove(addr);
            }
            Dialed::SlotMap(_) => self.mapping = false,
        }
        Some(a)
    }

    /// Sleeps up to `timeout`, or until an answer waits.
    pub fn wait(&self, timeout: Duration) {
        wait_readable(&[self.fd()], timeout);
    }

    /// Readable while an answer waits: for the owner's `poll(2)`.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }
}

/// The thread: one job at a time until its [`Dialer`] is dropped.
fn serve(
    redis: &Arc<Redis>,
    what: &'static str,
    jobs: &Receiver<Job>,
    answers: &Sender<Dialed>,
    mut wake: UnixStream,
) {
    let mut cmds: Option<Commands> = None;
    while let Ok(job) = jobs.recv() {
        let answer = match job {
            Job::Resolve => Dialed::Resolved(redis.resolve()),
            Job::Dial(addr) => {
                let conn = PubConn::open(redis, &addr, shards::snapshot::MAX_PAYLOAD);
                Dialed::Conn(addr, conn)
            }
            Job::SlotMap => {
                let cmds = cmds.get_or_insert_with(|| Commands::new(redis, what));
                Dialed::SlotMap(cmds.slot_map())
            }
        };
        if answers.send(answer).is_err() {
            return;
        }
        // A full wake socket already says "answers wait".
        let _ = wake.write(&[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::RedisFlags;

    #[test]
    fn an_answer_wakes_the_owner_once_and_then_the_socket_is_quiet() {
        // Nothing listens on port 1: the dial fails at once.
        let redis = Redis::from_flags(&RedisFlags::new("redis://127.0.0.1:1")).expect("flags");
        let mut d = Dialer::new(&redis, "unit").expect("thread");
        assert!(d.answer().is_none(), "nothing asked");
        let addr: Addr = ("127.0.0.1".into(), 1);
        d.dial(&addr);
        d.dial(&addr);
        assert!(d.dialing(&addr) && d.busy());
        d.wait(Duration::from_secs(5));
        let a = loop {
            if let Some(a) = d.answer() {
                break a;
            }
            d.wait(Duration::from_secs(5));
        };
        assert!(matches!(a, Dialed::Conn(ref at, Err(_)) if at == &addr));
        assert!(!d.busy(), "one dial for two asks");
        // The answer's wake byte is read (it may land just after the answer).
        while d.unread_wakes > 0 {
            d.wait(Duration::from_secs(5));
            assert!(d.answer().is_none());
        }
        assert_eq!(wait_readable(&[d.fd()], Duration::ZERO), [false]);
    }
}
