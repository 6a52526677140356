//! A redis-server for the fleet and soak scenarios: on a fixed port and
//! directory, restartable there with its dump (`SHUTDOWN SAVE`), freezable
//! with signals, and gone with its directory when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One redis-server process a scenario starts, restarts and freezes.
pub(crate) struct RedisProc {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisProc {
    /// Starts it on a free port with `dir` as its directory (any dump there is removed).
    pub(crate) fn start(dir: &Path) -> RedisProc {
        let _ = std::fs::remove_file(dir.join("dump.rdb"));
        let mut r = RedisProc {
            port: crate::lb::stable_port(),
            dir: dir.to_path_buf(),
            child: None,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.dir).expect("redis dir");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--client-output-buffer-limit", "pubsub", "0", "0", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (tests/run.sh installs it)");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(20);
        while !self.ping() {
            assert!(Instant::now() < end, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// True when Redis answers `PING` with `+PONG` (not `-LOADING`).
    fn ping(&self) -> bool {
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

    /// `SHUTDOWN SAVE` (a planned restart: the dump keeps the state hashes),
    /// then the same port and directory again. Returns when Redis answers.
    pub(crate) fn restart(&mut self) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"SHUTDOWN SAVE\r\n");
            let mut sink = Vec::new();
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.read_to_end(&mut sink);
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.spawn();
    }

    /// Its URI for `--redis`.
    pub(crate) fn uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its process id (0 while it is not running).
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Sends `sig` to it (`SIGSTOP`/`SIGCONT` freeze and thaw it).
    pub(crate) fn signal(&self, sig: i32) {
        let pid = self.pid();
        if pid != 0 {
            // SAFETY: kill(2) on the redis-server this run started.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The dump of this run's restarts is of no use afterwards.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
