//! The pub/sub source of `serve` and the analytics worker: classic or
//! sharded, chosen once the Redis mode is known.

use super::classic::ClassicSource;
use super::sharded::ShardedSource;
use super::source::{Source, SourceEvent};
use crate::redis::backoff::Backoff;
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
    },
    /// Standalone or classic.
    Classic(ClassicSource),
    /// Sharded pub/sub in a cluster.
    Sharded(ShardedSource),
}

impl AnySource {
    /// The source for `redis` with this channel prefix (never fails: Redis may come later).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str) -> AnySource {
        let mut s = AnySource::Pending {
            redis: Arc::clone(redis),
            prefix: channel_prefix.to_owned(),
            courses: BTreeSet::new(),
            firehose: false,
            backoff: Backoff::default(),
        };
        s.settle();
        s
    }

    /// Builds the real source once the mode can be learned.
    fn settle(&mut self) -> bool {
        let AnySource::Pending {
            redis,
            prefix,
            courses,
            firehose,
            backoff,
        } = self
        else {
            return true;
        };
        if !backoff.ready() {
            return false;
        }
        if let Err(e) = redis.resolve() {
            tracing::debug!(error = %e, "Redis mode not known yet");
            backoff.failed();
            return false;
        }
        let (courses, firehose) = (std::mem::take(courses), *firehose);
        let mut real = if redis.sharded() {
            AnySource::Sharded(ShardedSource::new(redis, prefix))
        } else {
            AnySource::Classic(ClassicSource::new(redis, prefix))
        };
        real.set_firehose(firehose);
        for c in &courses {
            real.subscribe(c);
        }
        *self = real;
        true
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
                std::thread::sleep(timeout);
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
            AnySource::Pending { backoff, .. } => Some(backoff.wait()),
        }
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        match self {
            AnySource::Classic(s) => s.wait_fds(fds),
            AnySource::Sharded(s) => s.wait_fds(fds),
            AnySource::Pending { .. } => {}
        }
    }

    fn connected(&self) -> bool {
        match self {
            AnySource::Classic(s) => s.connected(),
            AnySource::Sharded(s) => s.connected(),
            AnySource::Pending { .. } => false,
        }
    }
}
