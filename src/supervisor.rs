//! The one owner of a process's long-lived threads: each is started by
//! [`spawn`], named, its join handle kept with its [`Policy`] (whether its
//! panic fails the process); at shutdown the command that started them joins
//! them in its order ([`join`], each under a deadline) and says which are
//! left ([`running`]). `docs/code-map.md` has the table of them.

use crate::failure;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::Instant;

/// What a thread's panic does to its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The process fails: a node answers 503 `failed`, closes its
    /// connections and exits 70 (`src/failure.rs`).
    FailsNode,
    /// The panic is printed and the process goes on; the thread's owner sees
    /// it gone (its channel disconnects, or [`join`] finds it ended).
    Logged,
}

/// One started thread.
struct Entry {
    /// Its place in start order, never reused.
    id: u64,
    name: String,
    handle: Option<JoinHandle<()>>,
    /// Its closure returned or unwound.
    done: bool,
}

/// Every thread [`spawn`] started, and the signal that one of them ended.
static THREADS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static ENDED: Condvar = Condvar::new();

/// Set once shutdown starts: loops with no mailbox of their own look at it.
static STOPPING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The policy of the supervised thread running here (`None`: not one).
    static POLICY: Cell<Option<Policy>> = const { Cell::new(None) };
}

fn threads() -> MutexGuard<'static, Vec<Entry>> {
    THREADS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks its thread ended when dropped, returned or unwound.
struct Ended(u64);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(e) = threads().iter_mut().find(|e| e.id == self.0) {
            e.done = true;
        }
        ENDED.notify_all();
    }
}

/// Starts `f` on a thread named `name` under `policy`, and keeps its handle.
pub fn spawn(
    name: impl Into<String>,
    policy: Policy,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    install_panic_hook();
    let name = name.into();
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT_ID.fetch_add(1, Relaxed);
    let mut all = threads();
    // Threads started again and again under one name (a dial per attempt)
    // leave no trace once ended: their earlier ones are joined here.
    all.retain_mut(|e| {
        let gone = e.done && e.name == name;
        if gone {
            if let Some(h) = e.handle.take() {
                let _ = h.join();
            }
        }
        !gone
    });
    let handle = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            POLICY.with(|p| p.set(Some(policy)));
            let _ended = Ended(id);
            failure::trip_at_start();
            f();
        })?;
    all.push(Entry {
        id,
        name,
        handle: Some(handle),
        done: false,
    });
    Ok(())
}

/// Records the panic of a [`Policy::FailsNode`] thread before the default
/// hook prints it, so a stalled stderr cannot hide it.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let fails = POLICY.try_with(Cell::get).ok().flatten() == Some(Policy::FailsNode);
            if fails {
                failure::record(std::thread::current().name().unwrap_or_default());
            }
            print(info);
        }));
    });
}

/// Tells the loops that have no mailbox (the demo's simulator) to end.
pub fn stop() {
    STOPPING.store(true, Relaxed);
}

/// Whether shutdown started ([`stop`]).
pub fn stopping() -> bool {
    STOPPING.load(Relaxed)
}

/// Joins every started thread whose name starts with `prefix`, in start
/// order, waiting for them to end until `by` at most. Returns the names
/// joined; one still running at `by` stays (see [`running`]).
pub fn join(prefix: &str, by: Instant) -> Vec<String> {
    let mut all = threads();
    loop {
        let waiting = all
            .iter()
            .any(|e| e.handle.is_some() && !e.done && e.name.starts_with(prefix));
        let left = by.saturating_duration_since(Instant::now());
        if !waiting || left.is_zero() {
            break;
        }
        all = ENDED
            .wait_timeout(all, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    let ended: Vec<(String, JoinHandle<()>)> = all
        .iter_mut()
        .filter(|e| e.done && e.name.starts_with(prefix))
        .filter_map(|e| Some((e.name.clone(), e.handle.take()?)))
        .collect();
    drop(all);
    ended
        .into_iter()
        .map(|(name, handle)| {
            // A panicked thread was reported by the hook already.
            let _ = handle.join();
            name
        })
        .collect()
}

/// The started threads not joined yet.
pub fn running() -> Vec<String> {
    threads()
        .iter()
        .filter(|e| e.handle.is_some())
        .map(|e| e.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn join_waits_for_the_named_threads_and_leaves_the_others() {
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        spawn("sv-test-quick-0", Policy::Logged, || {}).expect("spawn");
        spawn("sv-test-quick-1", Policy::Logged, || panic!("unwinds")).expect("spawn");
        spawn("sv-test-held", Policy::Logged, move || {
            let _ = rx.recv();
        })
        .expect("spawn");
        let by = Instant::now() + Duration::from_secs(30);
        assert_eq!(
            join("sv-test-quick-", by),
            ["sv-test-quick-0", "sv-test-quick-1"]
        );
        // A thread that does not end is left at the deadline, and reported.
        let t = Instant::now();
        assert!(join("sv-test-held", t + Duration::from_millis(50)).is_empty());
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(running().contains(&"sv-test-held".to_owned()));
        drop(tx);
        assert_eq!(join("sv-test-held", by), ["sv-test-held"]);
        assert!(!running().iter().any(|n| n.starts_with("sv-test-")));
    }
}
