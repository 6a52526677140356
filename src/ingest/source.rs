//! Where snapshots come from: Redis pub/sub in `serve`, the embedded bus in `demo`.

use std::os::fd::RawFd;
use std::time::Duration;

/// What a source yields.
#[derive(Debug)]
pub enum SourceEvent {
    /// A payload published on `<channel-prefix><course>`.
    Message {
        /// The channel's suffix.
        course: String,
        /// The raw payload.
        payload: Vec<u8>,
    },
    /// A payload over the 64 KiB cap on `<channel-prefix><course>`, skipped unread.
    Oversize {
        /// The channel's suffix.
        course: String,
    },
    /// The connection came back: every subscription is restored, state must be reread.
    Reconnected,
}

/// A pub/sub source owned by the ingest thread.
pub trait Source: Send {
    /// Waits up to `timeout` for the next event.
    fn poll(&mut self, timeout: Duration) -> Option<SourceEvent>;
    /// Starts delivering `course` (SUBSCRIBE).
    fn subscribe(&mut self, course: &str);
    /// Stops delivering `course` (UNSUBSCRIBE).
    fn unsubscribe(&mut self, course: &str);
    /// Delivers every course (PSUBSCRIBE) or stops doing so.
    fn set_firehose(&mut self, on: bool);
    /// The course's current state (HGETALL of its state hash), one payload per section.
    /// `None` when the read failed: the router retries it rather than treat the
    /// course as loaded.
    fn load_state(&mut self, course: &str) -> Option<Vec<Vec<u8>>>;
    /// The current state of several courses, in order (the state hashes of a
    /// whole university when the admin firehose turns on: pipelined where the
    /// source can). `None` when the read failed.
    fn load_states(&mut self, courses: &[&str]) -> Option<Vec<Vec<Vec<u8>>>> {
        courses.iter().map(|c| self.load_state(c)).collect()
    }
    /// Every course with a state hash (SCAN of `<state-prefix>*`), so the admin
    /// aggregate covers the whole board, not only what changes next.
    fn known_courses(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Whether the source is connected now.
    fn connected(&self) -> bool;
    /// How long the source may go unpolled while none of its sockets
    /// ([`Source::wait_fds`]) is readable: `Some(ZERO)` when something is
    /// buffered already (a queued event, bytes TLS decrypted that the socket
    /// no longer shows) or timed work is due; otherwise until its next timed
    /// work (a reconnect after backoff, a slot-map refresh, a keepalive PING);
    /// `None`: nothing timed, only a readable socket needs it.
    fn poll_timeout(&mut self) -> Option<Duration>;
    /// Appends every socket the source reads, for the ingest thread to sleep
    /// on in `poll(2)` until one is readable.
    fn wait_fds(&self, fds: &mut Vec<RawFd>);
}
