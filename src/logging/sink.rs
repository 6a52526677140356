//! Where log lines go: a bounded queue drained onto stderr by one writer
//! thread, so a log reader that stalls or goes away (a closed pipe, a full
//! disk, a restarting log daemon) never panics or blocks a thread that serves
//! viewers. A line that cannot be queued or written is dropped and counted
//! (`seatboard_log_dropped_total`).

use crate::supervisor::{self, Policy};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::io::Write;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Lines held while the writer waits on stderr; past it lines are dropped.
const QUEUE_LINES: usize = 8192;

/// Log lines dropped since start: the queue was full, or stderr refused them.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lines queued and not yet handed to stderr (what [`flush`] waits for).
static PENDING: AtomicU64 = AtomicU64::new(0);

/// The writer thread's queue, once [`start`] ran.
static QUEUE: OnceLock<Sender<Vec<u8>>> = OnceLock::new();

/// Log lines dropped since start (`seatboard_log_dropped_total`).
pub fn dropped() -> u64 {
    DROPPED.load(Relaxed)
}

/// Starts the writer thread (once); until then, lines are written in place.
pub fn start() {
    QUEUE.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE_LINES);
        // Never joined: it writes the process's last lines ([`flush`]).
        let spawned = supervisor::spawn("log-writer", Policy::Logged, move || write_lines(rx));
        if spawned.is_err() {
            // No thread: the queue fills and lines are counted as dropped.
            DROPPED.fetch_add(1, Relaxed);
        }
        tx
    });
}

fn write_lines(rx: Receiver<Vec<u8>>) {
    let mut err = std::io::stderr();
    for line in rx {
        if err.write_all(&line).is_err() {
            DROPPED.fetch_add(1, Relaxed);
        }
        PENDING.fetch_sub(1, Relaxed);
    }
}

/// Hands one whole line to the writer, never waiting; a full queue drops it.
pub fn send(line: Vec<u8>) {
    let Some(tx) = QUEUE.get() else {
        write_now(&line);
        return;
    };
    PENDING.fetch_add(1, Relaxed);
    match tx.try_send(line) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            PENDING.fetch_sub(1, Relaxed);
            DROPPED.fetch_add(1, Relaxed);
        }
    }
}

/// Writes `line` to stderr from the calling thread, dropping it (counted) on
/// an error; for lines written before the writer starts or after [`flush`].
pub fn write_now(line: &[u8]) {
    if std::io::stderr().write_all(line).is_err() {
        DROPPED.fetch_add(1, Relaxed);
    }
}

/// Waits up to `limit` for the queued lines to reach stderr, so a process's
/// last lines are not lost when it exits (a stalled stderr waits no longer).
pub fn flush(limit: Duration) {
    let start = Instant::now();
    while PENDING.load(Relaxed) > 0 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The `tracing` writer: each event is formatted into one buffer and queued
/// whole when the formatter lets go of it.
pub struct Sink;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line(Vec::new())
    }
}

/// One event's text, queued when dropped.
pub struct Line(Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            send(std::mem::take(&mut self.0));
        }
    }
}
