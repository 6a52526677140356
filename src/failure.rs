//! A long-lived thread that panics fails the node on purpose: `/healthz` and
//! `/readyz` answer 503 and the process exits non-zero so systemd restarts
//! it, instead of a node that looks alive while its board is frozen.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

/// Threads named so are the node's long-lived ones (ingest, presence, shards,
/// and the helpers beside them); a panic in any of them fails the node.
const LONG_LIVED: &str = "seatboard-";

/// The course whose watch trips the test hook (see [`trip`]).
pub const TRIP_COURSE: &str = "PANIC-TEST";

/// The first long-lived thread that panicked.
static FAILED: OnceLock<String> = OnceLock::new();

/// Wakes the main thread's wait (the hub's signal socket).
static WAKE: OnceLock<UnixStream> = OnceLock::new();

/// Installs the panic hook that records a long-lived thread's panic and wakes
/// the main thread through `wake`. The panic is recorded before the default
/// hook prints it, so a stalled stderr cannot hide it.
pub fn install(wake: UnixStream) {
    if WAKE.set(wake).is_err() {
        return;
    }
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or_default();
        if name.starts_with(LONG_LIVED) && FAILED.set(name.to_owned()).is_ok() {
            if let Some(mut w) = WAKE.get() {
                let _ = w.write(&[1]);
            }
        }
        print(info);
    }));
}

/// The thread whose panic failed the node, if one did.
pub fn failed() -> Option<&'static str> {
    FAILED.get().map(String::as_str)
}

/// The test hook: with `SEATBOARD_TEST_PANIC` naming a thread (a prefix of
/// its name, e.g. `seatboard-ingest`), that thread panics when it handles a
/// watch of [`TRIP_COURSE`]. Unset, this is one comparison.
pub fn trip(course: &str) {
    static WHO: OnceLock<Option<String>> = OnceLock::new();
    if course != TRIP_COURSE {
        return;
    }
    let who = WHO.get_or_init(|| std::env::var("SEATBOARD_TEST_PANIC").ok());
    let thread = std::thread::current();
    if let (Some(who), Some(name)) = (who, thread.name()) {
        if !who.is_empty() && name.starts_with(who.as_str()) {
            panic!("SEATBOARD_TEST_PANIC: {name} panics on a watch of {TRIP_COURSE}");
        }
    }
}
