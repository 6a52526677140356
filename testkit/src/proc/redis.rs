//! The `redis-server` wrapper: on a free port (or a given one), owned by the
//! test or bench and killed on drop; restartable on its port (with or
//! without its dump), freezable with signals.

use super::port::{free_port, listens_on};
use crate::wait::poll_every;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` process, killed on drop.
pub struct RedisServer {
    /// Its port (the TLS port of a TLS-only server).
    pub port: u16,
    child: Option<Child>,
    /// The flags of every start, beyond port, bind and no persistence.
    flags: Vec<String>,
    /// Its own directory ([`RedisServer::start_in`]), removed on drop.
    dir: Option<PathBuf>,
}

impl RedisServer {
    /// Starts one without persistence on a free port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts one on a free port with `flags` (another port if that one was
    /// taken meanwhile).
    pub fn start_with(flags: &[&str]) -> RedisServer {
        for _ in 0..5 {
            if let Some(r) = RedisServer::try_on(free_port(), flags) {
                return r;
            }
        }
        panic!("redis-server did not come up on 5 free ports");
    }

    /// Starts one on a free port with `dir` as its directory (a dump left
    /// there is removed first; the directory goes on drop): what
    /// [`RedisServer::restart_saved`] reloads.
    pub fn start_in(dir: &Path, flags: &[&str]) -> RedisServer {
        std::fs::create_dir_all(dir).expect("redis dir");
        let _ = std::fs::remove_file(dir.join("dump.rdb"));
        let d = dir.display().to_string();
        let mut all = vec!["--dir", d.as_str()];
        all.extend_from_slice(flags);
        let mut r = RedisServer::start_with(&all);
        r.dir = Some(dir.to_path_buf());
        r
    }

    /// Starts one on `port` with `flags`; panics unless it comes up there.
    pub fn on_port(port: u16, flags: &[&str]) -> RedisServer {
        RedisServer::try_on(port, flags)
            .unwrap_or_else(|| panic!("redis-server did not come up on port {port} (taken?)"))
    }

    /// Starts one on `port` with `flags`; `None` if it exits before it
    /// listens (the port is taken).
    pub fn try_on(port: u16, flags: &[&str]) -> Option<RedisServer> {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let child = spawn(port, &flags)?;
        Some(RedisServer {
            port,
            child: Some(child),
            flags,
            dir: None,
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port with the same flags.
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Starts (again) on the same port with its flags and `extra` (`--dir D`
    /// loads the dump a `SAVE` wrote there: a restart that keeps the data).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill();
        let mut flags = self.flags.clone();
        flags.extend(extra.iter().map(|s| s.to_string()));
        self.child = Some(
            spawn(self.port, &flags)
                .unwrap_or_else(|| panic!("redis-server did not come up again on {}", self.port)),
        );
    }

    /// A planned restart: `SHUTDOWN SAVE` (the dump keeps the data), then
    /// the same port and flags again; returns once it answers `PING` (its
    /// dump loaded).
    pub fn restart_saved(&mut self) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"SHUTDOWN SAVE\r\n");
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.read_to_end(&mut Vec::new());
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.restart();
        poll_every(Duration::from_millis(5), Duration::from_secs(20), || {
            self.ping().then_some(())
        })
        .expect("redis-server did not load its dump");
    }

    /// Whether it answers `PING` with `+PONG` (not `-LOADING`).
    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    /// Whether the server runs (not killed since its last start).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Its process id (0 while it is not running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends `sig` to it (`SIGSTOP`/`SIGCONT` freeze and thaw it).
    pub fn signal(&self, sig: i32) {
        let pid = self.pid();
        if pid != 0 {
            // SAFETY: kill(2) on the redis-server this wrapper started.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs a command and returns redis-cli's raw output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Starts `redis-server` on `port` and waits until that very process listens
/// there; `None` if it exits first (the port is taken: a free port can be
/// bound by another test in between, and a bare connect would then reach
/// that test's server instead).
fn spawn(port: u16, flags: &[String]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (tests/run.sh installs it)");
    let up = poll_every(Duration::from_millis(5), Duration::from_secs(20), || {
        if child.try_wait().ok().flatten().is_some() {
            return Some(false);
        }
        listens_on(child.id(), port).then_some(true)
    });
    if up == Some(true) {
        return Some(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}
