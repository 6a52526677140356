//! The pub/sub source of `serve` and the analytics worker: classic or
//! sharded, chosen once the Redis mode is known.

use super::redis::RedisSource;
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
        /// Channel and state prefixes.
        prefixes: (String, String),
        /// Courses asked for.
        courses: BTreeSet<String>,
        /// Whether an admin watches.
        firehose: bool,
        /// Next attempt to learn the mode.
        backoff: Backoff,
    },
    /// Standalone or classic.
    Classic(RedisSource),
    /// Sharded pub/sub in a cluster.
    Sharded(ShardedSource),
}

impl AnySource {
    /// The source for `redis` with these prefixes (never fails: Redis may come later).
    pub fn new(redis: &Arc<Redis>, channel_prefix: &str, state_prefix: &str) -> AnySource {
        let mut s = AnySource::Pending {
            redis: Arc::clone(redis),
            prefixes: (channel_prefix.to_owned(), state_prefix.to_owned()),
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
            prefixes,
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
            AnySource::Sharded(ShardedSource::new(redis, &prefixes.0, &prefixes.1))
        } else {
            AnySource::Classic(RedisSource::new(redis, &prefixes.0, &prefixes.1))
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

    fn load_state(&mut self, course: &str) -> Option<Vec<Vec<u8>>> {
        match self {
            AnySource::Classic(s) => s.load_state(course),
            AnySource::Sharded(s) => s.load_state(course),
            AnySource::Pending { .. } => None,
        }
    }

    fn load_states(&mut self, courses: &[&str]) -> Option<Vec<Vec<Vec<u8>>>> {
        match self {
            AnySource::Classic(s) => s.load_states(courses),
            AnySource::Sharded(s) => s.load_states(courses),
            AnySource::Pending { .. } => None,
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

    fn known_courses(&mut self) -> Vec<String> {
        match self {
            AnySource::Classic(s) => s.known_courses(),
            AnySource::Sharded(s) => s.known_courses(),
            AnySource::Pending { .. } => Vec::new(),
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
