//! Viewers in child processes, past what one process's open files allow: the
//! same binary re-executed as the hidden `__rehearse-viewers` subcommand, its
//! [`Config`] as the first line on its stdin (so no secret shows in `ps`),
//! then [`Command`]s, one JSON line each; it answers with that loop's
//! [`Output`]s, one a line on its stdout. A line that does not read as one
//! is logged, naming the child.

use loadgen::{message, Command, Config, Output};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The hidden subcommand a child runs.
pub const SUBCOMMAND: &str = "__rehearse-viewers";

/// One child process running one viewers loop.
pub struct ChildLoop {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl ChildLoop {
    /// Starts a child on `cfg`; its outputs come to `tx` as `(i, output)`.
    pub fn spawn(
        i: usize,
        cfg: &Config,
        tx: mpsc::Sender<(usize, Output)>,
    ) -> std::io::Result<ChildLoop> {
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new(exe)
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut stdin = child.stdin.take();
        let line = serde_json::to_string(cfg).map_err(std::io::Error::other)?;
        if let Some(s) = stdin.as_mut() {
            writeln!(s, "{line}")?;
        }
        let stdout = child.stdout.take();
        let reader = std::thread::Builder::new()
            .name(format!("rehearse-child-{i}"))
            .spawn(move || {
                let Some(out) = stdout else { return };
                for l in BufReader::new(out).lines() {
                    let Ok(l) = l else { return };
                    match message::parse::<Output>(&l) {
                        Ok(o) => {
                            if tx.send((i, o)).is_err() {
                                return;
                            }
                        }
                        Err(e) => crate::logging::line(&format!(
                            "warning: rehearse: viewers process {i}: {e}"
                        )),
                    }
                }
            })
            .ok();
        Ok(ChildLoop {
            child,
            stdin,
            reader,
        })
    }

    /// Sends one command, as its line.
    pub fn send(&mut self, cmd: &Command) {
        if let Some(s) = self.stdin.as_mut() {
            let line = message::line(cmd);
            if writeln!(s, "{line}").and_then(|()| s.flush()).is_err() {
                self.stdin = None;
            }
        }
    }

    /// Closes its stdin and waits for it to exit (killed after `grace`).
    pub fn wait(mut self, grace: Duration) {
        self.stdin = None;
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The child's main: its config from the first stdin line, then the loop
/// until `report`, stdin's end or `max_secs`. SIGINT and SIGTERM are left to
/// the parent (a Ctrl-C, or a service manager's stop, may reach the whole
/// process group): it asks for the report.
pub fn main() -> std::process::ExitCode {
    let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, std::sync::Arc::clone(&ignored));
    }
    loadgen::raise_nofile();
    let mut first = String::new();
    if std::io::stdin().read_line(&mut first).is_err() {
        return std::process::ExitCode::from(2);
    }
    match serde_json::from_str::<Config>(first.trim()) {
        Ok(cfg) => {
            loadgen::run(cfg);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            crate::logging::line(&format!("error: {SUBCOMMAND}: bad config: {e}"));
            std::process::ExitCode::from(2)
        }
    }
}
