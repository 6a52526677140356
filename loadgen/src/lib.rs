//! seatboard's load generator, the viewers: one mio (epoll) loop on one
//! thread driving thousands of WebSocket (or SSE) clients, each watching one to
//! `max_courses` courses. `seatboard rehearse` runs several of them (threads,
//! and child processes past one process's open files); the bench suite runs
//! the same loop (its binary re-executed as `__loadgen`). Both start child
//! processes through one parent, [`children`], the config on the child's
//! stdin, never on argv; both read `/metrics` with one scraper, [`scrape`]. Each is
//! driven by [`Command`]s and answers with [`Output`]s (typed values on a
//! thread, one JSON line each on stdin/stdout for a child process; see
//! [`message`]):
//!
//! - every 500 ms: [`Output::Progress`] (counters, refusals by status so far,
//!   latency since the last);
//! - [`Command::Mark`]: answers [`Output::Mark`] at once (window boundaries);
//! - [`Command::Report`]: answers [`Output::Report`] and stops;
//! - [`Command::Ref`]: a reference board (per course, per section, the
//!   version the publisher had written; see "Recovery" below);
//! - [`Command::Arm`]: from now on a lost connection starts a blind interval;
//! - [`Command::Blind`]: every viewer is blind from now until it holds the
//!   next reference (Redis went away: boards are frozen though sockets stay
//!   open);
//! - [`Command::Lat`]: later latency samples go to that phase's histogram;
//! - [`Command::Drop`]: arms, resets (RST) every open connection at once, as
//!   when a node dies and its viewers are sent on, and forgets the refusals
//!   counted so far (the report's `refusals` are then those of the
//!   reconnection).
//!
//! A child's line that is not a command is answered with
//! [`Output::Rejected`], naming it. A loop also stops by itself after
//! `max_secs` (sending its report), and when a child's stdin closes.
//!
//! With `tls` (an `https://` target) each connection is TLS over the same
//! non-blocking socket ([`transport`]): the handshake runs in the loop, the
//! WebSocket upgrade or SSE request goes out once it is done. A failed
//! handshake counts in `tls_failed` and the report's `tls_error` says why.
//!
//! Reconnects ([`backoff`]), like the board page (`src/web/index.html`): a viewer whose
//! connection closes, or whose upgrade is refused or fails, opens again after
//! the server's `reconnect` hint (`after_ms`) if it got one, 250-1500 ms after
//! a close 1012 or 4001, else a full-jitter exponential backoff (500 ms
//! doubling to a 30 s cap, reset by a connection that stayed open 10 s);
//! a refused upgrade's `Retry-After` is a floor (plus up to 1 s of jitter).
//! It then watches its course again.
//!
//! Recovery ([`recovery`]): after `arm`, a viewer that loses its connection is blind until
//! its board (merged from the watch answer and later frames) holds, for every
//! section, at least the version of the reference that was current when it
//! lost it; after `blind`, until it holds the next reference. Each blind
//! interval is reported as (start, end) in Unix ms. Clients bind before connect
//! to one of `source_addrs` (else `127.0.0.<2..2+sources>`, else nothing) with
//! `IP_BIND_ADDRESS_NO_PORT`, so ports are picked per destination 4-tuple and
//! far more than 28k connections fit.
//!
//! Latency: the bench publisher writes its publish time (µs since the Unix
//! epoch) into each snapshot's `seat_info.t` (passed through untouched by the
//! server); a client takes `now - t` for every section of a non-`full` frame
//! whose version is newer than what it holds. Both ends read the same
//! `CLOCK_REALTIME` on one machine. With `version_ts` (the rehearsal), a
//! section without `seat_info.t` takes its publish time from its version,
//! `ts * 1000 + k` (ms since the epoch, then a counter).

#![deny(missing_docs)]

pub mod backoff;
pub mod board;
pub mod children;
mod config;
pub mod counters;
mod gen;
pub mod hist;
pub mod http_head;
pub mod message;
mod nofile;
pub mod recovery;
pub mod report;
mod run;
pub mod scrape;
pub mod seeding;
pub mod sse;
mod token;
pub mod transport;
pub mod ws;

pub use board::{digest, now_us, zipf_cdf, zipf_pick};
pub use children::{child_main, ChildLoop};
pub use config::Config;
pub use counters::Counters;
pub use hist::Hist;
pub use message::{Command, MessageError, Output, Progress};
pub use nofile::raise_nofile;
pub use report::Report;
pub use run::{run, run_with};
