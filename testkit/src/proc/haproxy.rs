//! The HAProxy wrapper: processes sharing one port on a configuration file,
//! owned by the test or bench and killed on drop.

use crate::http::get_status;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `procs` HAProxy processes sharing one port (HAProxy binds with
/// `SO_REUSEPORT` on Linux; each process holds two descriptors per viewer, so
/// several processes keep each under the open-file limit). Killed on drop.
pub struct Haproxy {
    /// Where the frontend listens.
    pub port: u16,
    children: Vec<Child>,
    /// The rendered configuration file.
    pub config: PathBuf,
}

impl Haproxy {
    /// Writes `config` into `dir`, checks it with `haproxy -c`, starts `procs`
    /// processes and waits until the port accepts.
    pub fn start(dir: &Path, port: u16, config: &str, procs: usize) -> Haproxy {
        std::fs::create_dir_all(dir).expect("haproxy dir");
        let path = dir.join(format!("haproxy-{port}.cfg"));
        std::fs::write(&path, config).expect("write haproxy.cfg");
        let check = Command::new("haproxy")
            .args(["-c", "-q", "-f"])
            .arg(&path)
            .output()
            .expect("haproxy must be installed (tests/run.sh installs it)");
        assert!(
            check.status.success(),
            "haproxy -c refused {}: {}",
            path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
        let mut h = Haproxy {
            port,
            children: Vec::new(),
            config: path,
        };
        for i in 0..procs.max(1) {
            let log = std::fs::File::create(h.log(i)).expect("haproxy log file");
            let child = Command::new("haproxy")
                .args(["-db", "-f"])
                .arg(&h.config)
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .expect("spawn haproxy");
            h.children.push(child);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "haproxy did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        h
    }

    /// Process `i`'s output: warnings (a node going down or up), and each
    /// request when the configuration went through `lb::log_to_stdout`.
    pub fn log(&self, i: usize) -> PathBuf {
        self.config.with_extension(format!("{i}.log"))
    }

    /// Pids of the processes.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    /// Waits until a plain-HTTP `GET path` through the proxy answers 200
    /// (every process's health checks have seen a node up).
    pub fn wait_ready(&self, path: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut streak = 0;
        while Instant::now() < end {
            if get_status(self.port, path) == Some(200) {
                streak += 1;
                // Several answers in a row: each process (and each check) saw it.
                if streak >= 8 {
                    return true;
                }
            } else {
                streak = 0;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
