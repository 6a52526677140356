//! Where snapshots come from: Redis pub/sub in `serve` and `analytics`, the
//! embedded bus in `demo`.
//!
//! A source never waits on Redis and never sleeps: subscriptions are written
//! and their confirmations come back later as [`SourceEvent::Subscribed`], so
//! the ingest thread keeps routing every other course's snapshots meanwhile.
//! Its owner sleeps in `poll(2)` on [`Source::wait_fds`] (and its own
//! wake-ups) for at most [`Source::poll_timeout`], then takes what is ready
//! with [`Source::poll`]. The state hashes are read elsewhere
//! (`src/ingest/states.rs`, on the state reader thread).

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
    /// A subscription is confirmed: that course's channel (`Some`), or the
    /// pattern that covers every course (`None`). Its state may be read now.
    Subscribed(Option<String>),
    /// The connection came back (or channels lost their place): every course
    /// must be read again once [`Source::subscribed`] says it is covered.
    Reconnected,
}

/// A pub/sub source owned by the ingest thread.
pub trait Source: Send {
    /// The next event ready now (buffered, or on a readable socket), without
    /// waiting; also runs the source's timed work when due.
    fn poll(&mut self) -> Option<SourceEvent>;
    /// Starts delivering `course` (SUBSCRIBE, written without waiting for the
    /// confirmation: that arrives as [`SourceEvent::Subscribed`]).
    fn subscribe(&mut self, course: &str);
    /// Stops delivering `course` (UNSUBSCRIBE).
    fn unsubscribe(&mut self, course: &str);
    /// Delivers every course (PSUBSCRIBE) or stops doing so.
    fn set_firehose(&mut self, on: bool);
    /// Every course with a state hash, as the state reader last found them:
    /// a source without a pattern form (sharded pub/sub) subscribes each of
    /// them while the firehose is on.
    fn cover(&mut self, _courses: &[String]) {}
    /// The cluster's slots changed owner (`moved`: the map now), or `down`
    /// stopped answering the state reader's probe: a source placed by slot
    /// moves its channels by that map, a source held on a node found down
    /// moves to another now rather than at its own keepalive's deadline.
    fn topology(&mut self, moved: Option<&crate::slots::SlotMap>, down: &[crate::slots::Addr]);
    /// Writes what this turn of the ingest loop asked for ((un)subscriptions
    /// gathered into as few commands as possible), without waiting.
    fn flush(&mut self) {}
    /// Whether `course`'s channel is confirmed subscribed now, so a state read
    /// cannot miss a publish (the contract's subscribe-then-read rule).
    fn subscribed(&self, course: &str) -> bool;
    /// Whether the source is connected now.
    fn connected(&self) -> bool;
    /// Whether the source's first connection is on its way and nothing has
    /// failed yet: a new viewer waits (up to its patience) for its course's
    /// read instead of taking what is held, as it would with Redis down.
    fn connecting(&self) -> bool {
        false
    }
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
