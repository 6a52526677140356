//! The `seatboard` process wrapper: the binary under test on a port, owned
//! by the test or bench and killed on drop.

use super::port::free_port;
use crate::http::{http_get, HttpResponse};
use crate::scrape;
use crate::wait::poll_every;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A `seatboard` process listening on 127.0.0.1:`port`, killed on drop.
pub struct Seatboard {
    /// The port it listens on.
    pub port: u16,
    /// The process.
    pub child: Child,
}

/// The binary under test: `SEATBOARD_BIN` if set (e.g. a cross-built arm64
/// binary), else the one cargo built with the running test or bench binary
/// (`target/<profile>/seatboard`, beside its `deps/`).
pub fn bin() -> String {
    std::env::var("SEATBOARD_BIN").unwrap_or_else(|_| built_bin().display().to_string())
}

/// The `seatboard` cargo built in the profile of the running binary (a test
/// or bench in `target/<profile>/deps/`); what `CARGO_BIN_EXE_seatboard`
/// names in the tests themselves.
pub fn built_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary in target/<profile>/deps");
    profile.join(format!("seatboard{}", std::env::consts::EXE_SUFFIX))
}

/// A command running the binary under test, through `SEATBOARD_BIN_WRAPPER`
/// (e.g. `qemu-aarch64-static -L /usr/aarch64-linux-gnu`) when set.
pub fn seatboard_command() -> Command {
    command_for(&bin())
}

/// A command running the `seatboard` binary at `path`, through
/// `SEATBOARD_BIN_WRAPPER` when set: another build beside the one under test.
pub fn command_for(path: &str) -> Command {
    match std::env::var("SEATBOARD_BIN_WRAPPER") {
        Ok(w) if !w.trim().is_empty() => {
            let mut parts = w.split_whitespace();
            let mut c = Command::new(parts.next().unwrap_or("env"));
            c.args(parts).arg(path);
            c
        }
        _ => Command::new(path),
    }
}

impl Seatboard {
    /// Starts `seatboard <args> --listen 127.0.0.1:<free port>` and waits for `/healthz`.
    pub fn start(args: &[&str]) -> Seatboard {
        Self::start_env(args, &[])
    }

    /// [`Seatboard::start`] with environment variables.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Seatboard {
        let mut all = args.to_vec();
        all.extend(["--log-level", "warn"]);
        let mut sb = Seatboard::spawn_on(free_port(), &all, env, None);
        assert!(
            sb.wait_answer("/healthz", Duration::from_secs(15), |r| r.status == 200),
            "seatboard did not answer /healthz"
        );
        sb
    }

    /// Spawns `seatboard <args> --listen 127.0.0.1:<port>` without waiting
    /// for it; its stderr appended to `log` when given (over restarts),
    /// else the caller's.
    pub fn spawn_on<S: AsRef<str>>(
        port: u16,
        args: &[S],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Seatboard {
        Self::spawn_cmd_on(seatboard_command(), port, args, env, log)
    }

    /// [`Seatboard::spawn_on`] with the command that runs the binary
    /// ([`command_for`] another build).
    pub fn spawn_cmd_on<S: AsRef<str>>(
        mut cmd: Command,
        port: u16,
        args: &[S],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Seatboard {
        let stderr = match log {
            Some(path) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map(Stdio::from)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            None => Stdio::inherit(),
        };
        let child = cmd
            .args(args.iter().map(AsRef::as_ref))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn seatboard");
        Seatboard { port, child }
    }

    /// Polls `GET path` until `ready` holds for the answer; false once the
    /// process exited or `timeout` passed.
    pub fn wait_answer(
        &mut self,
        path: &str,
        timeout: Duration,
        ready: impl Fn(&HttpResponse) -> bool,
    ) -> bool {
        let port = self.port;
        let child = &mut self.child;
        poll_every(Duration::from_millis(20), timeout, || {
            if child.try_wait().ok().flatten().is_some() {
                return Some(false);
            }
            http_get(port, path).ok().filter(|r| ready(r)).map(|_| true)
        })
        .unwrap_or(false)
    }

    /// Its process id, as kill(2) takes it.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal (e.g. libc::SIGTERM).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for exit; None if still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        poll_every(Duration::from_millis(20), timeout, || {
            child.try_wait().ok().flatten()
        })
    }

    /// The body of `GET path` when it answers 200.
    pub fn get(&self, path: &str) -> Option<String> {
        scrape::get_ok(self.port, path, Duration::from_secs(5))
    }

    /// Its `/metrics` text (empty when it does not answer).
    pub fn metrics(&self) -> String {
        scrape::metrics(self.port)
    }

    /// The value of one metric line, e.g. `seatboard_frames_sent_total`
    /// (summed over label sets when it ends with `{`).
    pub fn metric(&self, name_with_labels: &str) -> f64 {
        scrape::metric_value(&self.metrics(), name_with_labels)
    }
}

impl Drop for Seatboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
