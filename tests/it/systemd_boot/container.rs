//! A Debian root booted under its own systemd with `systemd-nspawn`: the root
//! from `tests/boot_root.sh` (cached), mounted read-only under a throwaway
//! overlay (`--volatile=overlay`, so every run starts from the same root),
//! sharing the host's network (a Redis the test starts on loopback is the
//! container's too), reached with `nsenter` into its PID 1's namespaces.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A booted container, powered off and reaped on drop.
pub struct Container {
    nspawn: Child,
    /// The container's PID 1 (its systemd), as the host numbers it.
    leader: i32,
    /// The nspawn output so far, for a failure's message.
    log: PathBuf,
}

/// Why this machine cannot boot a container, if it cannot: the test is then
/// skipped with that message (it needs root, `systemd-nspawn` and
/// `debootstrap`, which `tests/run.sh` installs, and `CAP_SYS_ADMIN`).
pub fn cannot_boot() -> Option<String> {
    if let Some(why) = root_without(&["systemd-nspawn", "debootstrap", "nsenter"]) {
        return Some(why);
    }
    // CAP_SYS_ADMIN (bit 21) in the effective set: mounts and namespaces.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap_eff & (1 << 21) == 0 {
        return Some("no CAP_SYS_ADMIN (an unprivileged container cannot boot another)".into());
    }
    None
}

/// The cached Debian root (`tests/boot_root.sh` makes it on the first run).
pub fn root() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/boot_root.sh");
    let out = Command::new(&script)
        .stderr(Stdio::piped())
        .output()
        .expect("tests/boot_root.sh");
    assert!(
        out.status.success(),
        "tests/boot_root.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

impl Container {
    /// Boots `root` with `pkg` bound read-only at `/pkg`; returns once its
    /// systemd says the boot is done (`running`, or `degraded` with a failed
    /// unit named in the panic of a later step if that matters).
    pub fn boot(root: &Path, pkg: &Path) -> Container {
        let log = std::env::temp_dir().join(format!(
            "seatboard-nspawn-{}-{}.log",
            std::process::id(),
            free_port()
        ));
        let out = std::fs::File::create(&log).expect("nspawn log");
        let mut cmd = Command::new("systemd-nspawn");
        cmd.arg("-D")
            .arg(root)
            .args(["--volatile=overlay", "--boot", "--register=no"])
            .args(["--console=pipe", "--quiet"])
            .arg(format!("--machine=seatboard-test-{}", std::process::id()))
            .arg(format!("--bind-ro={}:/pkg", pkg.display()));
        // Without a systemd of its own on the host there is no scope to
        // create: the container runs in the test's cgroup.
        if !Path::new("/run/systemd/system").is_dir() {
            cmd.arg("--keep-unit");
        }
        let nspawn = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("systemd-nspawn");
        let mut c = Container {
            nspawn,
            leader: 0,
            log,
        };
        let pid = c.nspawn.id() as i32;
        c.leader = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(st)) = c.nspawn.try_wait() {
                panic!("systemd-nspawn exited {st}:\n{}", c.log_text());
            }
            init_under(pid)
        })
        .unwrap_or_else(|| panic!("no systemd in the container:\n{}", c.log_text()));
        let booted = wait_for(Duration::from_secs(90), || {
            let o = c.run("systemctl is-system-running");
            let state = String::from_utf8_lossy(&o.stdout).trim().to_string();
            matches!(state.as_str(), "running" | "degraded").then_some(state)
        });
        assert!(
            booted.is_some(),
            "the container did not finish booting: {}\n{}",
            c.sh("systemctl list-jobs; systemctl --failed"),
            c.log_text()
        );
        c
    }

    /// Runs `script` with `/bin/sh -c` inside the container, as root, with a
    /// clean environment.
    pub fn run(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--"])
            .args(["/usr/bin/env", "-i"])
            .args(["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"])
            .args(["SYSTEMD_PAGER=", "DEBIAN_FRONTEND=noninteractive"])
            .args(["/bin/sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("nsenter")
    }

    /// Runs `script` and returns its stdout; panics with its output unless it
    /// exits 0.
    pub fn sh(&self, script: &str) -> String {
        let o = self.run(script);
        assert!(
            o.status.success(),
            "in the container: {script}\nexit {}\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// One property of a unit (`systemctl show -p <prop> --value`).
    pub fn prop(&self, unit: &str, prop: &str) -> String {
        self.sh(&format!("systemctl show -p {prop} --value {unit}"))
            .trim()
            .to_string()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The host PID of the systemd that nspawn `pid` started (its child's child
/// or its child, depending on the nspawn version).
fn init_under(pid: i32) -> Option<i32> {
    let children = |p: i32| -> Vec<i32> {
        let mut out = Vec::new();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            return out;
        };
        for t in tasks.flatten() {
            let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
        out
    };
    let mut frontier = children(pid);
    for _ in 0..3 {
        for &c in &frontier {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() == "systemd" {
                return Some(c);
            }
        }
        frontier = frontier.iter().flat_map(|&c| children(c)).collect();
    }
    None
}

impl Drop for Container {
    fn drop(&mut self) {
        // SIGTERM to nspawn powers the container off in order; SIGKILL if
        // that takes too long.
        let pid = self.nspawn.id() as i32;
        // SAFETY: kill(2) on the nspawn this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
