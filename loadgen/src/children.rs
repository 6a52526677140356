//! The one parent of viewer loops in child processes (`seatboard rehearse`
//! past one process's open files, and the bench suite): a child is the
//! caller's own binary re-executed with one hidden subcommand and no other
//! argument. Its [`Config`] is the first line on its stdin, never on argv,
//! so no secret (a token key) shows in `ps`; then [`Command`]s, one JSON line
//! each. It answers with [`Output`]s, one a line on its stdout; a line from
//! it that is no output comes back as [`Output::Rejected`], naming it.
//! [`child_main`] is the child's side.

use crate::config::Config;
use crate::message::{self, Command, Output};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One child process running one viewer loop.
pub struct ChildLoop {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl ChildLoop {
    /// Starts `exe subcommand` as loop `i` on `cfg`; its outputs come to
    /// `tx` as `(i, output)`.
    pub fn spawn(
        exe: &Path,
        subcommand: &str,
        i: usize,
        cfg: &Config,
        tx: mpsc::Sender<(usize, Output)>,
    ) -> std::io::Result<ChildLoop> {
        let line = serde_json::to_string(cfg).map_err(std::io::Error::other)?;
        let mut child = std::process::Command::new(exe)
            .arg(subcommand)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut stdin = child.stdin.take();
        if let Some(s) = stdin.as_mut() {
            writeln!(s, "{line}")?;
        }
        let stdout = child.stdout.take();
        let reader = std::thread::Builder::new()
            .name(format!("loadgen-child-{i}"))
            .spawn(move || {
                let Some(out) = stdout else { return };
                for l in BufReader::new(out).lines() {
                    let Ok(l) = l else { return };
                    let o = message::parse::<Output>(&l).unwrap_or_else(Output::Rejected);
                    if tx.send((i, o)).is_err() {
                        return;
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

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command, as its line (a child that stopped reading is sent
    /// nothing more).
    pub fn send(&mut self, cmd: &Command) {
        if let Some(s) = self.stdin.as_mut() {
            let line = message::line(cmd);
            if writeln!(s, "{line}").and_then(|()| s.flush()).is_err() {
                self.stdin = None;
            }
        }
    }

    /// Closes its stdin (it reports and stops) and waits for it to exit,
    /// killed after `grace`.
    pub fn wait(mut self, grace: Duration) {
        self.stdin = None;
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildLoop {
    /// A child still running is killed; its reader ends with its stdout.
    fn drop(&mut self) {
        self.stdin = None;
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The child's main: its config from the first line on stdin, then the loop
/// ([`crate::run`]) until `report`, stdin's end or `max_secs`. A first line
/// that is no config is an error.
pub fn child_main() -> std::io::Result<()> {
    crate::raise_nofile();
    let mut first = String::new();
    std::io::stdin().read_line(&mut first)?;
    let cfg = serde_json::from_str::<Config>(first.trim())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    crate::run(cfg);
    Ok(())
}
