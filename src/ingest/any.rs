//! The pub/sub source of `serve` and the analytics worker: classic or
//! sharded, chosen once the Redis mode is known.

use super::classic::ClassicSource;
use super::sharded::ShardedSource;
use super::source::{Source, SourceEvent};
use crate::redis::backoff::Backoff;
use crate::redis::dialer::{Dialed, Dialer};
use crate::redis::Redis;
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// The pub/sub source for the deployment: classic (standalone, or a cluster
/// with `--pubsub classic`) or sharded; chosen once the mode is known, which
/// under `--redis-mode auto` may be after start if Redis was down then.
pub enum AnySource {
    /// The mode is not known yet: what the router asked for, to replay.
    Pending {
        /// The deployment.
        redis: Arc<Redis>,
        /// The channel prefix.
        prefix: String,
        /// Courses asked for.
        courses: BTreeSet<String>,
        /// Whether an admin watches.
        firehose: bool,
        /// Next attempt to learn the mode.
        backoff: Backoff,
        /// Learns the mode off the ingest thread; the real source keeps it.
        dialer: Option<Dialer>,
        /// An attempt to learn the mode failed.
        failed: bool,
    },
    /// Standalone or classic.
    Classic(ClassicSource),
    /// Sharded pub/sub in a cluster.
    Sharded(ShardedSource),
}

impl AnySource {
    /// The source for `redis` with this channel prefix (Redis may come
    /// later; only a thread that cannot start is an error).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str) -> std::io::Result<AnySource> {
        let mut s = AnySource::Pending {
            redis: Arc::clone(redis),
            prefix: channel_prefix.to_owned(),
            courses: BTreeSet::new(),
            firehose: false,
            backoff: Backoff::default(),
            dialer: Some(Dialer::new(redis, "pub/sub")?),
            failed: false,
        };
        s.settle();
        Ok(s)
    }

    /// Builds the real source once the mode is learned (asked of the dialer,
    /// after the backoff when the last answer was no).
    fn settle(&mut self) -> bool {
        let AnySource::Pending {
            redis,
            courses,
            firehose,
            backoff,
            dialer: Some(dialer),
            failed,
            ..
        } = self
        else {
            return !matches!(self, AnySource::Pending { .. });
        };
        let mut known = redis.mode().is_some();
        while let Some(a) = dialer.answer() {
            match a {
                Dialed::Resolved(Ok(_)) => known = true,
                Dialed::Resolved(Err(e)) => {
                    tracing::debug!(error = %e, "Redis mode not known yet");
                    backoff.failed();
                    *failed = true;
                }
                Dialed::Conn(..) | Dialed::SlotMap(_) => {}
            }
        }
        if !known {
            if backoff.ready() {
                dialer.resolve();
            }
            return false;
        }
        let (courses, firehose) = (std::mem::take(courses), *firehose);
        let Some(dialer) = self.take_dialer() else {
            return false;
        };
        let AnySource::Pending { redis, prefix, .. } = &*self else {
            return true;
        };
        let mut real = if redis.sharded() {
            AnySource::Sharded(ShardedSource::new(prefix, dialer))
        } else {
            AnySource::Classic(ClassicSource::new(redis, prefix, dialer))
        };
        real.set_firehose(firehose);
        for c in &courses {
            real.subscribe(c);
        }
        *self = real;
        true
    }

    fn take_dialer(&mut self) -> Option<Dialer> {
        match self {
            AnySource::Pending { dialer, .. } => dialer.take(),
            _ => None,
        }
    }
}

impl Source for AnySource {
    fn poll(&mut self, timeout: Duration) -> Option<SourceEvent> {
        match self {
            AnySource::Classic(s) => s.poll(timeout),
            AnySource::Sharded(s) => s.poll(timeout),
            AnySource::Pending { .. } => {
                if self.settle() {
                    // Whatever was watched meanwhile is read now.
                    return Some(SourceEvent::Reconnected);
                }
                if let AnySource::Pending {
                    dialer: Some(d), ..
                } = self
                {
                    d.wait(timeout);
                }
                None
            }
        }
    }

    fn subscribe(&mut self, course: &str) {
        match self {
            AnySource::Classic(s) => s.subscribe(course),
            AnySource::Sharded(s) => s.subscribe(course),
            AnySource::Pending { courses, .. } => {
                courses.insert(course.to_owned());
            }
        }
    }

    fn unsubscribe(&mut self, course: &str) {
        match self {
            AnySource::Classic(s) => s.unsubscribe(course),
            AnySource::Sharded(s) => s.unsubscribe(course),
            AnySource::Pending { courses, .. } => {
                courses.remove(course);
            }
        }
    }

    fn set_firehose(&mut self, on: bool) {
        match self {
            AnySource::Classic(s) => s.set_firehose(on),
            AnySource::Sharded(s) => s.set_firehose(on),
            AnySource::Pending { firehose, .. } => *firehose = on,
        }
    }

    fn cover(&mut self, courses: &[String]) {
        match self {
            AnySource::Classic(s) => s.cover(courses),
            AnySource::Sharded(s) => s.cover(courses),
            AnySource::Pending { .. } => {}
        }
    }

    fn flush(&mut self) {
        match self {
            AnySource::Classic(s) => s.flush(),
            AnySource::Sharded(s) => s.flush(),
            AnySource::Pending { .. } => {}
        }
    }

    fn subscribed(&self, course: &str) -> bool {
        match self {
            AnySource::Classic(s) => s.subscribed(course),
            AnySource::Sharded(s) => s.subscribed(course),
            AnySource::Pending { .. } => false,
        }
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        match self {
            AnySource::Classic(s) => s.poll_timeout(),
            AnySource::Sharded(s) => s.poll_timeout(),
            // The dialer's answer wakes the thread.
            AnySource::Pending {
                dialer: Some(d), ..
            } if d.busy() => None,
            AnySource::Pending { backoff, .. } => Some(backoff.wait()),
        }
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        match self {
            AnySource::Classic(s) => s.wait_fds(fds),
            AnySource::Sharded(s) => s.wait_fds(fds),
            AnySource::Pending { dialer, .. } => fds.extend(dialer.as_ref().map(Dialer::fd)),
        }
    }

    fn connected(&self) -> bool {
        match self {
            AnySource::Classic(s) => s.connected(),
            AnySource::Sharded(s) => s.connected(),
            AnySource::Pending { .. } => false,
        }
    }

    fn connecting(&self) -> bool {
        match self {
            AnySource::Classic(s) => s.connecting(),
            AnySource::Sharded(s) => s.connecting(),
            AnySource::Pending { failed, .. } => !failed,
        }
    }
}
