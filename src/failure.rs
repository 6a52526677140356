//! A long-lived thread that panics fails the node on purpose: `/healthz` and
//! `/readyz` answer 503 and the process exits non-zero so systemd restarts
//! it, instead of a node that looks alive while its board is frozen. Which
//! threads count is their [`Policy`](crate::supervisor::Policy), given when
//! the supervisor starts them; here is what their panic leaves behind, and
//! the test hooks that trip one.

use crate::channels::wake::Wake;
use std::sync::{Arc, OnceLock};

/// The course whose watch trips the test hook (see [`trip`]).
pub const TRIP_COURSE: &str = "PANIC-TEST";

/// The first long-lived thread that panicked.
static FAILED: OnceLock<String> = OnceLock::new();

/// Wakes the main thread's wait (the hub's eventfd).
static WAKE: OnceLock<Arc<Wake>> = OnceLock::new();

/// Has a failure wake the hub through `wake` (one that came before is seen
/// by the hub's first look at [`failed`]).
pub fn install(wake: Arc<Wake>) {
    let _ = WAKE.set(wake);
}

/// Records that the thread `name` panicked (the first one is kept), and
/// wakes the hub. Called from the panic hook, before the panic is printed.
pub fn record(name: &str) {
    if FAILED.set(name.to_owned()).is_ok() {
        if let Some(w) = WAKE.get() {
            w.wake();
        }
    }
}

/// The thread whose panic failed the node, if one did.
pub fn failed() -> Option<&'static str> {
    FAILED.get().map(String::as_str)
}

/// The calling thread's name starts with the non-empty value of `var`.
fn named_by(var: &'static str, cell: &'static OnceLock<Option<String>>) -> Option<String> {
    let who = cell.get_or_init(|| std::env::var(var).ok());
    let thread = std::thread::current();
    match (who, thread.name()) {
        (Some(who), Some(name)) if !who.is_empty() && name.starts_with(who.as_str()) => {
            Some(name.to_owned())
        }
        _ => None,
    }
}

/// The test hook: with `SEATBOARD_TEST_PANIC` naming a thread (a prefix of
/// its name, e.g. `seatboard-ingest`), that thread panics when it handles a
/// watch of [`TRIP_COURSE`]. Unset, this is one comparison.
pub fn trip(course: &str) {
    static WHO: OnceLock<Option<String>> = OnceLock::new();
    if course != TRIP_COURSE {
        return;
    }
    if let Some(name) = named_by("SEATBOARD_TEST_PANIC", &WHO) {
        panic!("SEATBOARD_TEST_PANIC: {name} panics on a watch of {TRIP_COURSE}");
    }
}

/// The test hook for threads that handle no watch: with
/// `SEATBOARD_TEST_PANIC_AT_START` naming a thread (a prefix of its name),
/// that thread panics as soon as the supervisor starts it.
pub fn trip_at_start() {
    static WHO: OnceLock<Option<String>> = OnceLock::new();
    if let Some(name) = named_by("SEATBOARD_TEST_PANIC_AT_START", &WHO) {
        panic!("SEATBOARD_TEST_PANIC_AT_START: {name} panics at its start");
    }
}
