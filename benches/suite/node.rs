//! A `seatboard serve` node of the long scenarios (fleet, soak): on a fixed
//! port, killed or drained and started again there.

use crate::server::SECRET;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::proc::Seatboard;

/// One node: its flags, and its process while it runs.
pub struct ServeNode {
    /// The port it listens on, over every restart.
    pub port: u16,
    args: Vec<String>,
    /// Where its stderr goes (appended over restarts); `None`: the runner's.
    pub log: Option<PathBuf>,
    process: Option<Seatboard>,
    /// Its current pid (0 while it is down), for a sampler on another thread.
    pid: Arc<AtomicU32>,
}

impl ServeNode {
    /// Starts `seatboard serve` on `port` with the bench's secret and
    /// `flags`: at level `warn` on the runner's stderr, or with `log` at the
    /// default level into that file (a fresh one); panics unless it is ready.
    pub fn start(port: u16, flags: Vec<String>, log: Option<PathBuf>) -> ServeNode {
        let mut args: Vec<String> = ["serve", "--auth", "jwt", "--jwt-secret", SECRET]
            .map(String::from)
            .to_vec();
        if log.is_none() {
            args.extend(["--log-level".into(), "warn".into()]);
        }
        args.extend(flags);
        if let Some(l) = &log {
            let _ = std::fs::remove_file(l);
        }
        let mut n = ServeNode {
            port,
            args,
            log,
            process: None,
            pid: Arc::new(AtomicU32::new(0)),
        };
        assert!(n.spawn(), "seatboard node did not become ready");
        n
    }

    /// Starts the process; false if `/readyz` does not answer 200 within 30 s.
    pub fn spawn(&mut self) -> bool {
        let env: &[(&str, &str)] = if self.log.is_some() {
            &[("NO_COLOR", "1")]
        } else {
            &[]
        };
        let sb = Seatboard::spawn_on(self.port, &self.args, env, self.log.as_deref());
        self.pid.store(sb.child.id(), Relaxed);
        let sb = self.process.insert(sb);
        sb.wait_answer("/readyz", Duration::from_secs(30), |r| r.status == 200)
    }

    /// Sends `sig` to the process, if it runs.
    pub fn signal(&self, sig: i32) {
        if let Some(sb) = &self.process {
            sb.signal(sig);
        }
    }

    /// Its pid (0 while it is down).
    pub fn pid(&self) -> u32 {
        self.pid.load(Relaxed)
    }

    /// Its pid as it changes over restarts.
    pub fn pid_cell(&self) -> Arc<AtomicU32> {
        Arc::clone(&self.pid)
    }

    /// Waits for the process to exit (after a signal); false if it still
    /// runs after `timeout`.
    pub fn reap(&mut self, timeout: Duration) -> bool {
        let Some(sb) = self.process.as_mut() else {
            return true;
        };
        if sb.wait_exit(timeout).is_none() {
            return false;
        }
        self.process = None;
        true
    }

    /// A restart: `sig` (SIGKILL, or SIGTERM and its drain of up to
    /// `drain`), SIGKILL if it outlives that, then start again.
    pub fn restart(&mut self, sig: i32, drain: Duration) -> bool {
        self.signal(sig);
        if !self.reap(drain + Duration::from_secs(30)) {
            self.signal(libc::SIGKILL);
            self.reap(Duration::from_secs(5));
        }
        self.spawn()
    }
}
