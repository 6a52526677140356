//! A MariaDB server of the test's own (Debian's `mariadb-server` package:
//! `mariadb-install-db` and `mariadbd`) on a free port, its own data
//! directory and socket, killed on drop; the `mariadb` client runs the
//! test's SQL as root over the socket.

use super::port::free_port;
use crate::wait::poll_every;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Whether MariaDB is installed.
pub fn mariadb_installed() -> bool {
    ["/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"]
        .iter()
        .all(|p| std::path::Path::new(p).exists())
}

/// A `mariadbd` process, killed on drop (its directory removed).
pub struct Mariadb {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// Serving TLS, and only TLS over TCP.
    tls: bool,
}

impl Mariadb {
    /// A fresh server on a free port.
    pub fn start() -> Mariadb {
        Mariadb::start_with(None)
    }

    /// A fresh server that takes TCP connections over TLS only
    /// (`require_secure_transport`), serving `server.crt` (its key
    /// `server.key`) from the folder `certs`.
    pub fn start_tls(certs: &std::path::Path) -> Mariadb {
        Mariadb::start_with(Some(certs))
    }

    fn start_with(certs: Option<&std::path::Path>) -> Mariadb {
        assert!(
            mariadb_installed(),
            "MariaDB is not installed (tests/run.sh installs mariadb-server)"
        );
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("seatboard-maria-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("mariadb dir");
        let user = whoami();
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--user={user}"))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .stdout(Stdio::null())
            .output()
            .expect("mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut m = Mariadb {
            port,
            dir,
            child: None,
            tls: certs.is_some(),
        };
        if let Some(certs) = certs {
            m.copy_cert(&certs.join("server.crt"), &certs.join("server.key"));
        }
        m.run();
        m
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    fn run(&mut self) {
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults");
        if self.tls {
            cmd.arg(format!("--ssl-cert={}", self.dir.join("tls.crt").display()))
                .arg(format!("--ssl-key={}", self.dir.join("tls.key").display()))
                .arg("--require-secure-transport=ON");
        }
        let child = cmd
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--user={}", whoami()))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args(["--innodb-flush-log-at-trx-commit=0", "--skip-log-bin"])
            .args(["--innodb-buffer-pool-size=32M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mariadbd");
        self.child = Some(child);
        poll_every(Duration::from_millis(50), Duration::from_secs(30), || {
            self.try_sql("SELECT 1")
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ())
        })
        .expect("mariadbd did not come up");
    }

    /// Stops the server, keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Serves `crt` (its key `key`) from now on (`FLUSH SSL`).
    pub fn swap_cert(&self, crt: &std::path::Path, key: &std::path::Path) {
        assert!(self.tls, "swap_cert on a server started without TLS");
        self.copy_cert(crt, key);
        self.sql("FLUSH SSL");
    }

    fn copy_cert(&self, crt: &std::path::Path, key: &std::path::Path) {
        std::fs::copy(crt, self.dir.join("tls.crt")).expect("copy certificate");
        std::fs::copy(key, self.dir.join("tls.key")).expect("copy key");
    }

    fn try_sql(&self, sql: &str) -> std::io::Result<Output> {
        Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-u", "root", "-N", "-B", "-e", sql])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `sql` as root; its output (tab-separated, no headers). Panics on an error.
    pub fn sql(&self, sql: &str) -> String {
        let out = self.try_sql(sql).expect("mariadb client");
        assert!(
            out.status.success(),
            "mariadb {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A `mysql://` URL of `user` with `password` on database `db`.
    pub fn url(&self, user: &str, password: &str, db: &str) -> String {
        format!("mysql://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }
}

fn whoami() -> String {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        "root".into()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "nobody".into())
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
