//! The counters a viewer loop keeps, sent in its progress, marks and report.

use serde::{Deserialize, Serialize};

/// Counters reported in progress lines and marks.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// Connections open (upgraded) now.
    pub open: u64,
    /// Connections connecting or in their handshake now.
    pub connecting: u64,
    /// Upgrades (or SSE heads) answered with success.
    pub upgrades: u64,
    /// Upgrades refused by status.
    pub refused: u64,
    /// Connects or handshakes that failed.
    pub failed: u64,
    /// Open connections the server (or the network) ended.
    pub closed_by_server: u64,
    /// `frame` messages.
    pub frames: u64,
    /// `full` frames among them.
    pub full_frames: u64,
    /// Sections read in frames.
    pub sections: u64,
    /// `presence` messages.
    pub presence: u64,
    /// Messages that did not parse, `error` replies, frames of courses not watched.
    pub errors: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Messages that came compressed (RSV1).
    pub compressed: u64,
    /// Refused upgrades that carried `Retry-After`.
    pub refused_retry_after: u64,
    /// `reconnect` hints received.
    pub hints: u64,
    /// Connections opened again after a loss.
    pub reconnects: u64,
    /// Viewers blind right now (after `arm`/`blind`).
    pub blind: u64,
    /// Blind intervals that ended (board true again).
    pub recovered: u64,
    /// The largest `tick_ms` a `hello` named.
    pub tick_ms: u64,
    /// Connections whose TLS handshake (or a later record) failed.
    pub tls_failed: u64,
    /// Milliseconds spent outside `epoll_wait` (working, or runnable and
    /// waiting for a core): near the wall time, the process is not keeping up.
    pub busy_ms: u64,
}

/// The sum of one counter over several loops' counters.
pub fn sum<'a>(
    all: impl IntoIterator<Item = &'a Counters>,
    field: impl Fn(&Counters) -> u64,
) -> u64 {
    all.into_iter().map(field).sum()
}

/// The largest value of one counter over several loops' counters (0 for none).
pub fn max<'a>(
    all: impl IntoIterator<Item = &'a Counters>,
    field: impl Fn(&Counters) -> u64,
) -> u64 {
    all.into_iter().map(field).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_over_loops_and_read_back_with_defaults() {
        let a = Counters {
            open: 3,
            tick_ms: 200,
            ..Counters::default()
        };
        let b = Counters {
            open: 4,
            ..Counters::default()
        };
        assert_eq!(sum([&a, &b], |c| c.open), 7);
        assert_eq!(sum([&a, &b], |c| c.tick_ms), 200);
        let c = Counters {
            tick_ms: 200,
            ..Counters::default()
        };
        assert_eq!(max([&a, &b, &c], |c| c.tick_ms), 200, "one tick, not two");
        assert_eq!(max([], |c: &Counters| c.tick_ms), 0);
        let back: Counters = serde_json::from_str(r#"{"open":2}"#).expect("partial counters");
        assert_eq!(back.open, 2);
        let json = serde_json::to_value(&a).expect("json");
        assert_eq!(json["tick_ms"], 200);
    }
}
