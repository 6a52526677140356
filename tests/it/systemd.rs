//! The systemd side: the units (the templated one too) pass `systemd-analyze
//! verify`, and the binary speaks the notify protocol (READY=1, WATCHDOG=1,
//! STOPPING=1).

use crate::common;
use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn units_verify_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempdir("units");
    for unit in [
        "seatboard.service",
        "seatboard-analytics.service",
        "seatboard-relay.service",
        "seatboard-reconcile.service",
    ] {
        let text = std::fs::read_to_string(root.join("systemd").join(unit)).expect("unit file");
        assert!(text.contains("ExecStart=/usr/bin/seatboard"));
        // Point ExecStart at the binary under test: verify checks it exists.
        std::fs::write(dir.join(unit), text.replace("/usr/bin/seatboard", &bin()))
            .expect("write unit");
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("seatboard.service"))
        .arg(dir.join("seatboard-analytics.service"))
        .arg(dir.join("seatboard-relay.service"))
        .arg(dir.join("seatboard-reconcile.service"))
        .output()
        .expect("systemd-analyze must be installed (tests/run.sh installs systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "verify complained:\n{stderr}"
    );
    // A refused flag or value (exit 2) is not restarted in a loop, whatever
    // the unit's Restart=.
    for unit in [
        "seatboard.service",
        "seatboard-analytics.service",
        "seatboard-relay.service",
        "seatboard-reconcile.service",
    ] {
        let text = std::fs::read_to_string(dir.join(unit)).expect("unit file");
        assert!(
            text.lines()
                .any(|l| l.trim() == "RestartPreventExitStatus=2"),
            "{unit} lacks RestartPreventExitStatus=2"
        );
    }
    let hub = std::fs::read_to_string(dir.join("seatboard.service")).unwrap();
    for needed in [
        "Type=notify",
        "TimeoutStopSec=60",
        "LimitNOFILE=",
        "Restart=on-failure",
        "DynamicUser=yes",
        "WatchdogSec=",
    ] {
        assert!(hub.contains(needed), "seatboard.service lacks {needed}");
    }
    // The relay's socket folder is made by systemd, and the socket's group
    // is the publishers' (contract §10: the file's group decides who may send).
    let relay = std::fs::read_to_string(dir.join("seatboard-relay.service")).unwrap();
    for needed in [
        "ExecStart=",
        "RuntimeDirectory=seatboard",
        "Group=seatboard-publish",
        "Restart=always",
        "DynamicUser=yes",
    ] {
        assert!(
            relay.contains(needed),
            "seatboard-relay.service lacks {needed}"
        );
    }
}

#[test]
fn templated_units_verify_and_read_their_instance_env_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let dir = tempdir("template");
    for (template, single) in [
        ("seatboard@.service", "seatboard.service"),
        (
            "seatboard-analytics@.service",
            "seatboard-analytics.service",
        ),
    ] {
        let text = std::fs::read_to_string(root.join(template)).expect("template");
        // The template itself and an instance of it (%i expanded to `prod`).
        let instance = template.replace("@.", "@prod.");
        for name in [template, instance.as_str()] {
            std::fs::write(dir.join(name), text.replace("/usr/bin/seatboard", &bin()))
                .expect("write unit");
            let out = Command::new("systemd-analyze")
                .arg("verify")
                .arg(dir.join(name))
                .output()
                .expect("systemd-analyze must be installed (tests/run.sh installs systemd)");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stderr.trim().is_empty(),
                "verify complained about {name}:\n{stderr}"
            );
        }
        assert!(text.contains("EnvironmentFile=/etc/seatboard/%i.env"));
        // Everything else the single unit says, the template says too: an
        // environment's instance is hardened and supervised the same way.
        let single = std::fs::read_to_string(root.join(single)).expect("unit");
        for line in single.lines().map(str::trim) {
            let own = line.starts_with("Description=") || line.starts_with("EnvironmentFile=");
            if line.is_empty() || line.starts_with('#') || own {
                continue;
            }
            assert!(
                text.lines().any(|l| l.trim() == line),
                "{template} lacks `{line}`"
            );
        }
    }
    // Every instance the examples configure has an env file shipped.
    for env in ["prod", "dev"] {
        assert!(root.join(format!("instances/{env}.env.example")).is_file());
    }
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "seatboard-{tag}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn recv_until(sock: &UnixDatagram, want: &str, timeout: Duration) -> Vec<String> {
    let end = Instant::now() + timeout;
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while Instant::now() < end {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = msg.lines().any(|l| l == want);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    }
    panic!("no {want} within {timeout:?}; got {seen:?}");
}

#[test]
fn notify_ready_watchdog_stopping() {
    let dir = tempdir("notify");
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let port = free_port();
    let mut child = Command::new(bin())
        .args([
            "demo",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-level",
            "warn",
            "--drain-ms",
            "500",
        ])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    recv_until(&sock, "READY=1", Duration::from_secs(15));
    // READY comes only once the listeners are bound.
    assert_eq!(http_get(port, "/readyz").unwrap().status, 200);
    // Pets arrive at about half of WATCHDOG_USEC.
    recv_until(&sock, "WATCHDOG=1", Duration::from_secs(5));
    recv_until(&sock, "WATCHDOG=1", Duration::from_secs(5));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    recv_until(&sock, "STOPPING=1", Duration::from_secs(5));
    let status = wait_for(Duration::from_secs(10), || child.try_wait().ok().flatten())
        .expect("exits after drain");
    assert_eq!(status.code(), Some(0));
}
