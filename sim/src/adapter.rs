//! The one place the simulator meets the product's pub/sub `Source` trait:
//! a source whose subscriptions go to the simulated Redis and whose
//! confirmations and messages the world hands to the router. Re-point this
//! file when the trait changes; nothing else in the simulator names it (the
//! shell's moving types, `SourceEvent` and `ReadRequest`, are re-exported
//! from here).

pub use seatboard::channels::ReadRequest;
use seatboard::redis::pubsub::Source;
pub use seatboard::redis::pubsub::SourceEvent;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// What the router asked the source to write to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubCmd {
    /// SUBSCRIBE one course.
    Subscribe(String),
    /// UNSUBSCRIBE one course.
    Unsubscribe(String),
    /// PSUBSCRIBE (true) or PUNSUBSCRIBE (false) the pattern.
    Pattern(bool),
}

/// The source's side of one node's pub/sub connection, shared with the world.
#[derive(Debug, Default)]
pub struct Link {
    /// The connection is up.
    pub connected: bool,
    /// Channels whose subscription Redis confirmed on this connection.
    pub confirmed: BTreeSet<String>,
    /// The pattern's subscription is confirmed.
    pub pattern_confirmed: bool,
    /// Courses the router wants (resubscribed after a reconnect).
    pub wanted: BTreeSet<String>,
    /// The router wants the pattern.
    pub pattern: bool,
    /// Commands written and not yet taken by the world.
    pub outbox: Vec<SubCmd>,
    /// Per channel, (un)subscriptions written whose acknowledgement has not
    /// come back: a channel counts as confirmed only once the last one has.
    pub pending: BTreeMap<String, u32>,
}

impl Link {
    /// Writes one command, counting it against its channel's acknowledgements.
    pub fn write(&mut self, cmd: SubCmd) {
        if let SubCmd::Subscribe(c) | SubCmd::Unsubscribe(c) = &cmd {
            *self.pending.entry(c.clone()).or_default() += 1;
        }
        self.outbox.push(cmd);
    }
}

/// The simulated source the router owns.
pub struct SimSource(pub Arc<Mutex<Link>>);

/// Locks a link; a poisoned lock (a panic elsewhere) is still read.
pub fn lock(l: &Mutex<Link>) -> MutexGuard<'_, Link> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimSource {
    fn link(&self) -> MutexGuard<'_, Link> {
        lock(&self.0)
    }
}

impl Source for SimSource {
    fn poll(&mut self) -> Option<SourceEvent> {
        // The world hands events to the router itself.
        None
    }
    fn subscribe(&mut self, course: &str) {
        let mut l = self.link();
        l.wanted.insert(course.to_owned());
        // A classic source under the pattern writes no narrow subscription.
        if !l.pattern {
            l.write(SubCmd::Subscribe(course.to_owned()));
        }
    }
    fn unsubscribe(&mut self, course: &str) {
        let mut l = self.link();
        l.wanted.remove(course);
        l.confirmed.remove(course);
        if !l.pattern {
            l.write(SubCmd::Unsubscribe(course.to_owned()));
        }
    }
    fn set_firehose(&mut self, on: bool) {
        let mut l = self.link();
        l.pattern = on;
        l.write(SubCmd::Pattern(on));
        if on {
            // The classic source drops its narrow subscriptions under the pattern.
            let narrow: Vec<String> = l.confirmed.iter().cloned().collect();
            for c in narrow {
                l.write(SubCmd::Unsubscribe(c));
            }
            l.confirmed.clear();
        } else {
            l.pattern_confirmed = false;
        }
    }
    fn subscribed(&self, course: &str) -> bool {
        let l = self.link();
        l.connected && (l.confirmed.contains(course) || l.pattern_confirmed)
    }
    fn connected(&self) -> bool {
        self.link().connected
    }
    fn poll_timeout(&mut self) -> Option<Duration> {
        None
    }
    fn wait_fds(&self, _fds: &mut Vec<RawFd>) {}
}

/// The event a pub/sub delivery becomes for the router.
pub fn message(course: &str, payload: &[u8]) -> SourceEvent {
    SourceEvent::Message {
        course: course.to_owned(),
        payload: payload.to_vec(),
    }
}

/// A confirmation: of a course's channel, or of the pattern (`None`).
pub fn confirmed(course: Option<&str>) -> SourceEvent {
    SourceEvent::Subscribed(course.map(str::to_owned))
}

/// The connection came back.
pub fn reconnected() -> SourceEvent {
    SourceEvent::Reconnected
}

/// An acknowledgement from Redis of a (un)subscription (`None`: the
/// pattern's): the confirmation the router hears of, once the channel's last
/// command is acknowledged and it is still wanted.
pub fn acked(link: &Mutex<Link>, course: Option<&str>, subscribe: bool) -> Option<SourceEvent> {
    let mut l = lock(link);
    match course {
        None => {
            if subscribe && l.pattern && l.connected {
                l.pattern_confirmed = true;
                return Some(SourceEvent::Subscribed(None));
            }
            None
        }
        Some(c) => {
            let left = match l.pending.get_mut(c) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n
                }
                None => 0,
            };
            if left == 0 {
                l.pending.remove(c);
            }
            if left == 0 && subscribe && l.wanted.contains(c) && l.connected {
                l.confirmed.insert(c.to_owned());
                return Some(SourceEvent::Subscribed(Some(c.to_owned())));
            }
            None
        }
    }
}

/// Whether a state read of `course` may be asked now (the contract's
/// subscribe-then-read rule): its channel or the pattern is confirmed on the
/// live connection, or the course is no longer wanted (a read asked before
/// its last viewer left in the same turn).
pub fn may_read(link: &Mutex<Link>, course: &str) -> bool {
    let l = lock(link);
    !l.wanted.contains(course)
        || (l.connected && (l.confirmed.contains(course) || l.pattern_confirmed))
}

/// The connection dropped: nothing is confirmed, nothing written goes out.
pub fn reset(link: &Mutex<Link>) {
    let mut l = lock(link);
    l.connected = false;
    l.confirmed.clear();
    l.pattern_confirmed = false;
    l.pending.clear();
    l.outbox.clear();
}

/// The connection is back: every wanted channel (or the pattern) is written
/// again, and the router hears of the reconnect.
pub fn reconnect(link: &Mutex<Link>) -> SourceEvent {
    let mut l = lock(link);
    l.connected = true;
    if l.pattern {
        l.write(SubCmd::Pattern(true));
    } else {
        let wanted: Vec<String> = l.wanted.iter().cloned().collect();
        for c in wanted {
            l.write(SubCmd::Subscribe(c));
        }
    }
    SourceEvent::Reconnected
}
