//! Pinning is visible: the startup log names each shard's core, `/metrics`
//! exports the core per shard (-1 when not pinned), the driver in use and a
//! counter of failed pins. A failed pin is provoked the way a unit's
//! `SystemCallFilter=` would (EPERM from `sched_setaffinity`), with strace's
//! fault injection.

use crate::common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A hub started from `cmd` (its stderr piped), with the log lines it writes.
pub(crate) struct Logged {
    child: Child,
    pub(crate) port: u16,
    lines: mpsc::Receiver<String>,
}

impl Logged {
    /// Starts `cmd` with `extra` and `--shards 2`, up once both shards report a driver.
    pub(crate) fn start(mut cmd: Command, extra: &[&str]) -> Logged {
        let port = free_port();
        // Its own process group, so a wrapper (strace) and the server under it
        // go together at the end.
        let mut child = cmd
            .process_group(0)
            .args(extra)
            .args(["--shards", "2", "--log-level", "info", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        // Up once every shard has reported its driver (each pins before it
        // reports); /healthz alone can answer from shard 0 a moment earlier.
        let up = wait_for(Duration::from_secs(30), || {
            let m = http_get(port, "/metrics")
                .ok()
                .filter(|r| r.status == 200)?;
            (metric_value(&m.body, "seatboard_driver_shards{") == 2.0).then_some(())
        });
        let mut l = Logged { child, port, lines };
        assert!(up.is_some(), "hub did not start; log: {:?}", l.log());
        l
    }

    /// The log lines so far.
    pub(crate) fn log(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// One sample of `/metrics`, which must be exported.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        let text = http_get(self.port, "/metrics").expect("metrics").body;
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "/metrics has no {name}"
        );
        metric_value(&text, name)
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test started; no pointers.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cores this process may run on (what the hub pins to, in order).
fn usable_cores() -> Vec<i64> {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string();
    let mut cores = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cores.extend(a.parse::<i64>().unwrap()..=b.parse::<i64>().unwrap()),
            None => cores.push(part.parse().unwrap()),
        }
    }
    cores
}

#[test]
fn each_shard_logs_and_exports_its_core() {
    let mut hub = Logged::start(seatboard_command(), &["demo", "--driver", "epoll"]);
    let cores = usable_cores();
    for shard in 0..2usize {
        let want = cores[shard % cores.len()];
        assert_eq!(
            hub.metric(&format!("seatboard_shard_core{{shard=\"{shard}\"}}")),
            want as f64,
            "shard {shard} pinned to the {shard}th usable core"
        );
    }
    let log = hub.log();
    for shard in 0..2usize {
        let want = cores[shard % cores.len()];
        assert!(
            log.iter().any(|l| l.contains("shard pinned to core")
                && l.contains(&format!("shard={shard}"))
                && l.contains(&format!("core={want}"))),
            "no startup line names shard {shard}'s core {want}: {log:#?}"
        );
    }
    assert_eq!(hub.metric("seatboard_pin_failures_total"), 0.0);
    assert_eq!(hub.metric("seatboard_driver_shards{driver=\"epoll\"}"), 2.0);
    assert_eq!(
        hub.metric("seatboard_driver_shards{driver=\"io_uring\"}"),
        0.0
    );
}

#[test]
fn a_denied_pin_is_counted_and_exported_as_minus_one() {
    let mut strace = Command::new("strace");
    strace
        .args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=sched_setaffinity",
            "-e",
            "inject=sched_setaffinity:error=EPERM",
            "--",
        ])
        .arg(bin());
    let mut hub = Logged::start(strace, &["demo", "--driver", "epoll"]);
    assert_eq!(hub.metric("seatboard_pin_failures_total"), 2.0);
    for shard in 0..2 {
        assert_eq!(
            hub.metric(&format!("seatboard_shard_core{{shard=\"{shard}\"}}")),
            -1.0
        );
    }
    let log = hub.log();
    assert!(
        log.iter()
            .filter(|l| l.contains("shard not pinned"))
            .count()
            == 2,
        "each failed pin is logged: {log:#?}"
    );
    // Serving goes on unpinned.
    assert_eq!(http_get(hub.port, "/readyz").expect("readyz").status, 200);
}

#[test]
fn auto_reports_the_driver_it_chose() {
    let mut hub = Logged::start(seatboard_command(), &["demo", "--driver", "auto"]);
    let uring = hub.metric("seatboard_driver_shards{driver=\"io_uring\"}");
    let epoll = hub.metric("seatboard_driver_shards{driver=\"epoll\"}");
    assert_eq!(uring + epoll, 2.0, "every shard counted once");
    let log = hub.log().join("\n");
    let said = if log.contains("shards run on io_uring") {
        "io_uring"
    } else {
        "epoll"
    };
    assert_eq!(
        hub.metric(&format!("seatboard_driver_shards{{driver=\"{said}\"}}")),
        2.0,
        "the metric agrees with the log: {log}"
    );
}

#[test]
fn idle_shards_keep_a_fresh_heartbeat() {
    let redis = RedisServer::start();
    let uri = redis.uri();
    let hub = Logged::start(
        seatboard_command(),
        &[
            "serve", "--auth", "none", "--redis", &uri, "--driver", "epoll",
        ],
    );
    // No viewer, no snapshot: only the hub's probes wake the shards. They
    // come every 5 s; without them an idle shard's loop would not run at all.
    std::thread::sleep(Duration::from_secs(12));
    for shard in 0..2 {
        let age = hub.metric(&format!(
            "seatboard_shard_heartbeat_age_seconds{{shard=\"{shard}\"}}"
        ));
        assert!(
            (0.0..11.0).contains(&age),
            "shard {shard} heartbeat {age} s old"
        );
    }
}
