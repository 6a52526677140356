//! The pub/sub source of `serve` and the analytics worker: one [`PubSub`]
//! with a placement chosen once the Redis mode is known (classic: one node,
//! plus the pattern while admins watch; sharded: each channel on its slot's
//! owner). Its connections are [`conn::PubConn`]s read by the hand-written
//! streaming RESP reader (`resp.rs`): a payload over 64 KiB is skipped unread,
//! reads never block, and many connections are polled from one thread, which
//! the `redis` crate's connections cannot do. [`dialer::Dialer`] opens them
//! and reads the slot map off the owner's thread.

mod classic;
pub mod classic_subs;
pub mod conn;
pub mod dialer;
pub mod resp;
mod sharded;
mod source;

pub use source::{Source, SourceEvent};

use crate::redis::backoff::Backoff;
use crate::redis::Redis;
use crate::slots::{Addr, SlotMap};
use classic::Classic;
use dialer::{Dialed, Dialer};
use sharded::Sharded;
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// The Redis pub/sub source: what it was asked for, delivered by its placement.
pub struct PubSub {
    placement: Placement,
}

/// Where channels are subscribed: not known yet (the mode is being learned,
/// which under `--redis-mode auto` may be after start if Redis was down
/// then), on one node (standalone, or a cluster with `--pubsub classic`), or
/// on each slot's owner.
enum Placement {
    Learning(Learning),
    Classic(Classic),
    Sharded(Sharded),
}

/// What the router asked for while the mode is not known, to replay.
struct Learning {
    redis: Arc<Redis>,
    prefix: String,
    courses: BTreeSet<String>,
    firehose: bool,
    /// Next attempt to learn the mode.
    backoff: Backoff,
    /// Learns the mode; the placement takes it.
    dialer: Option<Dialer>,
    /// An attempt to learn the mode failed.
    failed: bool,
}

impl PubSub {
    /// The source for `redis` with this channel prefix (Redis may come
    /// later; only a thread that cannot start is an error).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str) -> std::io::Result<PubSub> {
        let mut s = PubSub {
            placement: Placement::Learning(Learning {
                redis: Arc::clone(redis),
                prefix: channel_prefix.to_owned(),
                courses: BTreeSet::new(),
                firehose: false,
                backoff: Backoff::default(),
                dialer: Some(Dialer::new(redis, "pub/sub")?),
                failed: false,
            }),
        };
        s.settle();
        Ok(s)
    }

    /// Chooses the placement once the mode is learned (asked of the dialer,
    /// after the backoff when the last answer was no), and replays what was
    /// asked meanwhile; true if it was chosen now.
    fn settle(&mut self) -> bool {
        let Placement::Learning(l) = &mut self.placement else {
            return false;
        };
        let Some(dialer) = &mut l.dialer else {
            return false;
        };
        let mut known = l.redis.mode().is_some();
        while let Some(a) = dialer.answer() {
            match a {
                Dialed::Resolved(Ok(_)) => known = true,
                Dialed::Resolved(Err(e)) => {
                    tracing::debug!(error = %e, "Redis mode not known yet");
                    l.backoff.failed();
                    l.failed = true;
                }
                Dialed::Conn(..) | Dialed::SlotMap(_) => {}
            }
        }
        if !known {
            if l.backoff.ready() {
                dialer.resolve();
            }
            return false;
        }
        let Some(dialer) = l.dialer.take() else {
            return false;
        };
        let (courses, firehose) = (std::mem::take(&mut l.courses), l.firehose);
        let (redis, prefix) = (Arc::clone(&l.redis), std::mem::take(&mut l.prefix));
        self.placement = if redis.sharded() {
            Placement::Sharded(Sharded::new(&prefix, dialer))
        } else {
            Placement::Classic(Classic::new(&redis, &prefix, dialer))
        };
        let placed = self.inner();
        placed.set_firehose(firehose);
        for c in &courses {
            placed.subscribe(c);
        }
        true
    }

    fn inner(&mut self) -> &mut dyn Source {
        match &mut self.placement {
            Placement::Learning(l) => l,
            Placement::Classic(c) => c,
            Placement::Sharded(s) => s,
        }
    }

    fn inner_ref(&self) -> &dyn Source {
        match &self.placement {
            Placement::Learning(l) => l,
            Placement::Classic(c) => c,
            Placement::Sharded(s) => s,
        }
    }
}

impl Source for PubSub {
    fn poll(&mut self) -> Option<SourceEvent> {
        if self.settle() {
            // Whatever was watched meanwhile is read now.
            return Some(SourceEvent::Reconnected);
        }
        self.inner().poll()
    }
    fn subscribe(&mut self, course: &str) {
        self.inner().subscribe(course);
    }
    fn unsubscribe(&mut self, course: &str) {
        self.inner().unsubscribe(course);
    }
    fn set_firehose(&mut self, on: bool) {
        self.inner().set_firehose(on);
    }
    fn cover(&mut self, courses: &[String]) {
        self.inner().cover(courses);
    }
    fn topology(&mut self, moved: Option<&SlotMap>, down: &[Addr]) {
        self.inner().topology(moved, down);
    }
    fn flush(&mut self) {
        self.inner().flush();
    }
    fn subscribed(&self, course: &str) -> bool {
        self.inner_ref().subscribed(course)
    }
    fn connected(&self) -> bool {
        self.inner_ref().connected()
    }
    fn connecting(&self) -> bool {
        self.inner_ref().connecting()
    }
    fn poll_timeout(&mut self) -> Option<Duration> {
        self.inner().poll_timeout()
    }
    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        self.inner_ref().wait_fds(fds);
    }
}

/// Before the mode is known: nothing delivered, what is asked kept to replay.
impl Source for Learning {
    fn poll(&mut self) -> Option<SourceEvent> {
        None
    }
    fn subscribe(&mut self, course: &str) {
        self.courses.insert(course.to_owned());
    }
    fn unsubscribe(&mut self, course: &str) {
        self.courses.remove(course);
    }
    fn set_firehose(&mut self, on: bool) {
        self.firehose = on;
    }
    fn topology(&mut self, _moved: Option<&SlotMap>, _down: &[Addr]) {}
    fn subscribed(&self, _course: &str) -> bool {
        false
    }
    fn connected(&self) -> bool {
        false
    }
    fn connecting(&self) -> bool {
        !self.failed
    }
    fn poll_timeout(&mut self) -> Option<Duration> {
        // The dialer's answer wakes the thread; otherwise the next attempt.
        match &self.dialer {
            Some(d) if d.busy() => None,
            _ => Some(self.backoff.wait()),
        }
    }
    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.extend(self.dialer.as_ref().and_then(Dialer::wait_fd));
    }
}
