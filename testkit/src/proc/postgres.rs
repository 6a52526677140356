//! A PostgreSQL server of the test's own (Debian's `postgresql` package:
//! `initdb` and `postgres` under `/usr/lib/postgresql/*/bin`) on a free
//! port and its own directory, run as the `postgres` user when the test
//! runs as root (the server refuses root), killed on drop; `psql` runs the
//! test's SQL as the superuser.

use super::port::free_port;
use crate::wait::poll_every;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The newest PostgreSQL's `bin` folder, if the package is installed.
pub fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

fn root() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program` run as `user` when this process is root, else as itself.
pub(crate) fn as_user(user: &str, program: &std::path::Path) -> Command {
    if root() {
        let mut c = Command::new("runuser");
        c.args(["-u", user, "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A `postgres` process, killed on drop (its directory removed).
pub struct Postgres {
    /// Its port on 127.0.0.1.
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
    /// Serving TLS, and only TLS over TCP.
    tls: bool,
}

impl Postgres {
    /// A fresh cluster (trust authentication on loopback), started on a free port.
    pub fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// A fresh cluster that takes TCP connections over TLS only, serving
    /// `server.crt` (its key `server.key`) from the folder `certs`.
    pub fn start_tls(certs: &std::path::Path) -> Postgres {
        Postgres::start_with(Some(certs))
    }

    fn start_with(certs: Option<&std::path::Path>) -> Postgres {
        let bin = pg_bin().expect("PostgreSQL is not installed (tests/run.sh installs postgresql)");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("seatboard-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pg dir");
        if let Some(certs) = certs {
            copy_cert(&certs.join("server.crt"), &certs.join("server.key"), &dir);
        }
        if root() {
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(st.success(), "chown postgres {}", dir.display());
        }
        let data = dir.join("data");
        let out = as_user("postgres", &bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if certs.is_some() {
            // Over TCP, TLS only: a plain connection is refused.
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
            )
            .expect("pg_hba.conf");
        }
        let mut pg = Postgres {
            port,
            bin,
            dir,
            child: None,
            tls: certs.is_some(),
        };
        pg.run();
        pg
    }

    fn run(&mut self) {
        let mut cmd = as_user("postgres", &self.bin.join("postgres"));
        if self.tls {
            let at = |f: &str| format!("{}", self.dir.join(f).display());
            cmd.args(["-c", "ssl=on", "-c"])
                .arg(format!("ssl_cert_file={}", at("tls.crt")))
                .arg("-c")
                .arg(format!("ssl_key_file={}", at("tls.key")));
        }
        let child = cmd
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "synchronous_commit=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn postgres");
        self.child = Some(child);
        poll_every(Duration::from_millis(50), Duration::from_secs(30), || {
            self.try_psql("SELECT 1")
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ())
        })
        .expect("postgres did not come up");
    }

    /// Stops the server (SIGKILL), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // The postmaster itself (under runuser when root), fast shutdown:
            // its sessions are ended, not waited for.
            match self.postmaster() {
                // SAFETY: kill(2) on the server this value owns.
                Some(p) => unsafe {
                    libc::kill(p, libc::SIGINT);
                },
                None => {
                    let _ = c.kill();
                }
            }
            let _ = c.wait();
        }
    }

    /// Serves `crt` (its key `key`) from now on: the files replaced and the
    /// configuration reloaded, returning once a new session sees the reload.
    pub fn swap_cert(&self, crt: &std::path::Path, key: &std::path::Path) {
        assert!(self.tls, "swap_cert on a server started without TLS");
        let loaded = || self.psql("SELECT pg_conf_load_time()");
        let before = loaded();
        copy_cert(crt, key, &self.dir);
        self.psql("SELECT pg_reload_conf()");
        poll_every(Duration::from_millis(20), Duration::from_secs(10), || {
            (loaded() != before).then_some(())
        })
        .expect("postgres did not reload its configuration");
    }

    /// Starts it again on the same port with the same data.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    fn try_psql(&self, sql: &str) -> std::io::Result<Output> {
        Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `sql` as the superuser; its output (unaligned, tuples only). Panics on an error.
    pub fn psql(&self, sql: &str) -> String {
        let out = self.try_psql(sql).expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The postmaster's pid, from its `postmaster.pid`.
    fn postmaster(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
    }

    /// Freezes the whole server (`SIGSTOP` to the postmaster, then to every
    /// process it started), as a hung host or a partition looks to a
    /// client: connections stay open and nothing answers. Thawed when the
    /// guard is dropped.
    pub fn freeze(&self) -> Frozen {
        let Some(master) = self.postmaster() else {
            panic!("postgres is not running");
        };
        // Under `runuser` (the test runs as root), the wrapper stops itself
        // when its child stops, and must be continued too, last.
        let wrapper = self
            .child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .filter(|&w| w != master);
        let mut pids: Vec<i32> = wrapper.into_iter().collect();
        pids.push(master);
        signal(master, libc::SIGSTOP);
        let children = children_of(master);
        for &p in &children {
            signal(p, libc::SIGSTOP);
        }
        pids.extend(children);
        Frozen { pids }
    }

    /// A `postgres://` URL of `user` with `password` (trusted: any password
    /// is taken) on database `postgres`, TLS off.
    pub fn url(&self, user: &str, password: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

/// Copies a certificate and its key into `dir` as `tls.crt`/`tls.key`, the
/// key readable by its owner only (the server refuses one others can read),
/// both owned by `postgres` when this process is root.
fn copy_cert(crt: &std::path::Path, key: &std::path::Path, dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let (to_crt, to_key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::copy(crt, &to_crt).expect("copy certificate");
    std::fs::copy(key, &to_key).expect("copy key");
    std::fs::set_permissions(&to_key, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
    if root() {
        let st = Command::new("chown")
            .arg("postgres:postgres")
            .args([&to_crt, &to_key])
            .status()
            .expect("chown");
        assert!(st.success(), "chown postgres {}", dir.display());
    }
}

/// A frozen server ([`Postgres::freeze`]); thawed on drop.
pub struct Frozen {
    pids: Vec<i32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // The backends first, then the postmaster (it starts new ones),
        // then its wrapper.
        for &p in self.pids.iter().rev() {
            signal(p, libc::SIGCONT);
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process of the test's own server.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The processes whose parent is `pid`, from `/proc`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
