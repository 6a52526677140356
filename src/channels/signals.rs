//! SIGTERM and SIGINT, caught one way by every command that runs until told
//! to stop (`serve` and `demo`, `relay`, `reconcile`): the handler counts the
//! signal, keeps which one came last and writes the eventfd [`Wake`] the
//! waiting thread sleeps on in `poll(2)`.

use super::wake::Wake;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The stop signals caught since [`Stop::catch`], and the wake-up they write.
pub struct Stop {
    count: AtomicUsize,
    last: AtomicI32,
    wake: Arc<Wake>,
}

impl Stop {
    /// Catches SIGTERM and SIGINT from now on: a signal that arrives while
    /// the command starts is a stop, not the default death.
    pub fn catch() -> io::Result<Arc<Stop>> {
        let stop = Arc::new(Stop {
            count: AtomicUsize::new(0),
            last: AtomicI32::new(0),
            wake: Arc::new(Wake::new()?),
        });
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            let s = Arc::clone(&stop);
            let handler = move || {
                s.last.store(sig, Relaxed);
                s.count.fetch_add(1, Relaxed);
                s.wake.wake();
            };
            // SAFETY: the handler only stores to atomics and writes to an
            // eventfd (`write(2)`), all async-signal-safe; it allocates nothing.
            unsafe { signal_hook::low_level::register(sig, handler) }?;
        }
        Ok(stop)
    }

    /// The eventfd the handler writes: others may wake the waiter with it too
    /// (a failing thread, for a node).
    pub fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }

    /// How many signals arrived since last taken, and the last one's number.
    pub fn take(&self) -> (usize, i32) {
        (self.count.swap(0, Relaxed), self.last.load(Relaxed))
    }

    /// Sleeps until a signal or another wake-up arrives, or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        self.wake.wait(timeout);
    }

    /// Sleeps until a signal arrives; its number.
    pub fn next(&self) -> i32 {
        loop {
            let (n, sig) = self.take();
            if n > 0 {
                return sig;
            }
            self.wake.wait(Duration::from_secs(3600));
        }
    }
}
