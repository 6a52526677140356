//! The one place the simulator meets the product's pub/sub `Source` trait:
//! a source whose subscriptions go to the simulated Redis and whose
//! confirmations and messages the world hands to the router. Re-point this
//! file when the trait changes; nothing else in the simulator names it (the
//! shell's moving types, `SourceEvent` and `ReadRequest`, are re-exported
//! from here).

pub use seatboard::channels::ReadRequest;
use seatboard::redis::pubsub::classic_subs::ClassicSubs;
use seatboard::redis::pubsub::Source;
pub use seatboard::redis::pubsub::SourceEvent;
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
    /// The product's own subscription bookkeeping (the classic source's).
    pub subs: ClassicSubs,
    /// Commands written and not yet taken by the world.
    pub outbox: Vec<SubCmd>,
}

impl Link {
    /// Writes this turn's (un)subscriptions, in the classic source's order.
    fn write(&mut self) {
        let w = self.subs.take_writes();
        if w.psubscribe {
            self.outbox.push(SubCmd::Pattern(true));
        }
        self.outbox
            .extend(w.subscribe.into_iter().map(SubCmd::Subscribe));
        self.outbox
            .extend(w.unsubscribe.into_iter().map(SubCmd::Unsubscribe));
        if w.punsubscribe {
            self.outbox.push(SubCmd::Pattern(false));
        }
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
        self.link().subs.subscribe(course);
    }
    fn unsubscribe(&mut self, course: &str) {
        self.link().subs.unsubscribe(course);
    }
    fn set_firehose(&mut self, on: bool) {
        self.link().subs.set_firehose(on);
    }
    /// The simulated Redis is one node: no slots move.
    fn topology(
        &mut self,
        _moved: Option<&seatboard::slots::SlotMap>,
        _down: &[seatboard::slots::Addr],
    ) {
    }
    fn flush(&mut self) {
        let mut l = self.link();
        if l.subs.due() {
            l.write();
        }
    }
    fn subscribed(&self, course: &str) -> bool {
        let l = self.link();
        l.connected && l.subs.subscribed(course)
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
/// pattern's): the confirmation the router hears of, as the classic source
/// takes it.
pub fn acked(link: &Mutex<Link>, course: Option<&str>, subscribe: bool) -> Option<SourceEvent> {
    let mut l = lock(link);
    if !l.connected || !subscribe {
        return None;
    }
    match course {
        None => l.subs.pattern_confirmed(),
        Some(c) => l.subs.course_confirmed(c),
    }
}

/// Whether a state read of `course` may be asked now (the contract's
/// subscribe-then-read rule): its channel or the pattern is confirmed on the
/// live connection, or (no pattern wanted) the course is no longer wanted
/// (a read asked before its last viewer left in the same turn).
pub fn may_read(link: &Mutex<Link>, course: &str) -> bool {
    let l = lock(link);
    (!l.subs.firehose() && !l.subs.wants(course)) || (l.connected && l.subs.subscribed(course))
}

/// The connection dropped: nothing is confirmed, nothing written goes out.
pub fn reset(link: &Mutex<Link>) {
    let mut l = lock(link);
    l.connected = false;
    l.subs.dropped();
    l.outbox.clear();
}

/// The connection is back: every subscription wanted (or the pattern) is
/// written again, and the router hears of the reconnect.
pub fn reconnect(link: &Mutex<Link>) -> SourceEvent {
    let mut l = lock(link);
    l.connected = true;
    l.subs.connected();
    l.write();
    SourceEvent::Reconnected
}
