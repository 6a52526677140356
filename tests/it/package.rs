//! The packages (`packaging/deb.sh`, `packaging/rpm.sh`): what they hold, and a
//! hub run from the unpacked Debian package.
//!
//! In the normal suite the packages are built here from the test build of the
//! binary (no release build in the suite) and the unpacked `serve` runs against
//! a Redis the test starts, configured by the packaged env file. `tests/arm64.sh`
//! builds the arm64 packages from the cross-built release binary and points
//! `SEATBOARD_DEB` / `SEATBOARD_RPM` at them: then only their contents are
//! checked here and the packaged binary runs under qemu; the same script runs
//! the serve smoke against it.

use crate::common;
use common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn root_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (tests/run.sh installs the tools)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "seatboard-{tag}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The Debian and RPM names of this machine's architecture.
fn native_arch() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", "x86_64"),
        "aarch64" => ("arm64", "aarch64"),
        other => panic!("no package architecture for {other}"),
    }
}

/// Builds a package with `packaging/<script>` from the test build of the binary.
fn build(script: &str, arch: &str, out: &Path) -> PathBuf {
    let path = stdout(
        Command::new(root_dir().join("packaging").join(script))
            .args([arch, env!("CARGO_BIN_EXE_seatboard")])
            .arg(out)
            .env("DEB_COMPRESS", "gzip"),
    );
    PathBuf::from(path.trim())
}

/// Files every package must hold: path, then the mode `ls -l` shows.
const DEB_FILES: &[(&str, &str)] = &[
    ("./usr/bin/seatboard", "-rwxr-xr-x"),
    ("./lib/systemd/system/seatboard.service", "-rw-r--r--"),
    (
        "./lib/systemd/system/seatboard-analytics.service",
        "-rw-r--r--",
    ),
    ("./lib/systemd/system/seatboard@.service", "-rw-r--r--"),
    ("./lib/systemd/system/seatboard-relay.service", "-rw-r--r--"),
    (
        "./lib/systemd/system/seatboard-reconcile.service",
        "-rw-r--r--",
    ),
    (
        "./lib/systemd/system/seatboard-analytics@.service",
        "-rw-r--r--",
    ),
    (
        "./usr/share/doc/seatboard/instances/prod.env.example",
        "-rw-r--r--",
    ),
    (
        "./usr/share/doc/seatboard/haproxy/seatboard-environments.cfg",
        "-rw-r--r--",
    ),
    ("./etc/seatboard/seatboard.env", "-rw-------"),
    ("./etc/sysctl.d/99-seatboard.conf", "-rw-r--r--"),
    ("./usr/share/doc/seatboard/README.md", "-rw-r--r--"),
    ("./usr/share/doc/seatboard/OVERVIEW.md", "-rw-r--r--"),
    ("./usr/share/doc/seatboard/copyright", "-rw-r--r--"),
    (
        "./usr/share/doc/seatboard/monitoring/seatboard-dashboard.json",
        "-rw-r--r--",
    ),
    (
        "./usr/share/doc/seatboard/monitoring/seatboard-alerts.yml",
        "-rw-r--r--",
    ),
    (
        "./usr/share/doc/seatboard/haproxy/seatboard.cfg",
        "-rw-r--r--",
    ),
];

/// Checks a .deb's control fields, file list, conffiles and maintainer
/// scripts, unpacks it, and returns the scratch root.
fn check_deb(deb: &Path, arch: &str) -> PathBuf {
    let fields = stdout(Command::new("dpkg-deb").arg("-f").arg(deb).args([
        "Package",
        "Architecture",
        "Version",
        "Depends",
    ]));
    let fields: BTreeMap<&str, &str> = fields.lines().filter_map(|l| l.split_once(": ")).collect();
    assert_eq!(fields.get("Package"), Some(&"seatboard"));
    assert_eq!(fields.get("Architecture"), Some(&arch));
    assert_eq!(fields.get("Version"), Some(&env!("CARGO_PKG_VERSION")));
    assert!(
        fields
            .get("Depends")
            .is_some_and(|d| d.starts_with("libc6 (>= 2.")),
        "{fields:?}"
    );

    let listing = stdout(Command::new("dpkg-deb").arg("-c").arg(deb));
    for (path, mode) in DEB_FILES {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {path}")))
            .unwrap_or_else(|| panic!("{} lacks {path}:\n{listing}", deb.display()));
        assert!(
            line.starts_with(mode) && line.contains("root/root"),
            "{path}: {line}"
        );
    }

    let dir = scratch("deb");
    let control = dir.join("DEBIAN");
    run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        [
            "/etc/seatboard/seatboard.env",
            "/etc/sysctl.d/99-seatboard.conf"
        ]
    );
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh").arg("-n").arg(control.join(script)));
    }

    let root = dir.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root));
    // The units start the binary the package installs.
    for unit in [
        "seatboard.service",
        "seatboard-analytics.service",
        "seatboard-relay.service",
        "seatboard-reconcile.service",
    ] {
        let text = std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let path = exec.split_whitespace().next().unwrap();
        assert!(
            root.join(path.trim_start_matches('/')).is_file(),
            "{unit} starts {path}, which the package does not install"
        );
    }
    // Shipped stripped.
    let sections = stdout(
        Command::new("readelf")
            .args(["-S", "-W"])
            .arg(root.join("usr/bin/seatboard")),
    );
    assert!(
        !sections.contains(".debug_info"),
        "the binary is not stripped"
    );
    root
}

/// Checks an .rpm's architecture, file list and config files.
fn check_rpm(rpm: &Path, arch: &str) {
    let arch_got = stdout(
        Command::new("rpm")
            .args(["-qp", "--qf", "%{ARCH} %{NAME}"])
            .arg(rpm),
    );
    assert_eq!(arch_got, format!("{arch} seatboard"));
    let files = stdout(Command::new("rpm").arg("-qlp").arg(rpm));
    for path in [
        "/usr/bin/seatboard",
        "/usr/lib/systemd/system/seatboard.service",
        "/usr/lib/systemd/system/seatboard-analytics.service",
        "/usr/lib/systemd/system/seatboard@.service",
        "/usr/lib/systemd/system/seatboard-analytics@.service",
        "/usr/lib/systemd/system/seatboard-relay.service",
        "/usr/lib/systemd/system/seatboard-reconcile.service",
        "/usr/share/doc/seatboard/instances/dev.env.example",
        "/usr/share/doc/seatboard/haproxy/seatboard-environments.cfg",
        "/etc/seatboard/seatboard.env",
        "/etc/sysctl.d/99-seatboard.conf",
        "/usr/share/doc/seatboard/README.md",
        "/usr/share/doc/seatboard/monitoring/seatboard-dashboard.json",
        "/usr/share/doc/seatboard/monitoring/seatboard-alerts.yml",
        "/usr/share/doc/seatboard/haproxy/seatboard.cfg",
    ] {
        assert!(
            files.lines().any(|l| l == path),
            "{} lacks {path}:\n{files}",
            rpm.display()
        );
    }
    let config = stdout(Command::new("rpm").arg("-qpc").arg(rpm));
    assert_eq!(
        config.lines().collect::<Vec<_>>(),
        [
            "/etc/seatboard/seatboard.env",
            "/etc/sysctl.d/99-seatboard.conf"
        ]
    );
    let requires = stdout(Command::new("rpm").args(["-qp", "--requires"]).arg(rpm));
    assert!(
        requires.lines().any(|l| l.starts_with("glibc >= 2.")),
        "{requires}"
    );
}

/// `KEY=VALUE` lines of an `EnvironmentFile=`, as systemd reads them.
fn env_file(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .expect("env file")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The unpacked binary, configured like the unit (its env file), with `over`
/// on top.
fn packaged_command(root: &Path, over: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(root.join("usr/bin/seatboard"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env_file(&root.join("etc/seatboard/seatboard.env")))
        .envs(over.iter().copied())
        .stdout(Stdio::null());
    cmd
}

#[test]
fn native_deb_unpacked_serves_from_its_env_file() {
    if std::env::var_os("SEATBOARD_DEB").is_some() {
        return; // tests/arm64.sh: the arm64 package is checked below.
    }
    let (deb_arch, _) = native_arch();
    let out = scratch("pkg");
    let deb = build("deb.sh", deb_arch, &out);
    let root = check_deb(&deb, deb_arch);

    let redis = RedisServer::start();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let uri = redis.uri();

    // As shipped, the env file's secret is a placeholder the hub refuses.
    let refused = packaged_command(&root, &[("SEATBOARD_LISTEN", &listen)])
        .arg("serve")
        .stderr(Stdio::piped())
        .output()
        .expect("run the packaged binary");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "the placeholder secret runs"
    );
    let first = String::from_utf8_lossy(&refused.stderr);
    assert!(first.contains("jwt-secret"), "{first}");

    // With a real secret and the test's Redis (the rest from the env file).
    let secret = "packaged-hub-secret-0123456789abcdefghijklmnop";
    let mut child = packaged_command(
        &root,
        &[
            ("SEATBOARD_JWT_SECRET", secret),
            ("REALTIME_REDIS_URI", &uri),
            ("SEATBOARD_LISTEN", &listen),
            ("SEATBOARD_SHARDS", "2"),
            ("SEATBOARD_LOG", "warn"),
        ],
    )
    .arg("serve")
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn the packaged binary");
    let hub = KillOnDrop(&mut child);
    let payload = json!({"course":"PKG1","section":1,"total_seats":40,"seats_taken":9,"version":1})
        .to_string();
    redis.cli(&["HSET", "seatstate:PKG1", "1", &payload]);
    let up = wait_for(Duration::from_secs(20), || {
        let h = http_get(port, "/healthz").ok()?;
        h.body.contains("\"redis\":true").then_some(())
    });
    assert!(up.is_some(), "the packaged hub never reached Redis");
    let token = seatboard::auth::mint(
        secret.as_bytes(),
        "pkg",
        shards::Role::Student,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600,
    );
    let mut ws = ws_connect(port, &format!("/ws?token={token}")).expect("connect");
    assert_eq!(next_json(&mut ws).expect("hello")["type"], "hello");
    send_json(&mut ws, json!({"op":"watch","course":"PKG1"}));
    let answer = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
    assert_eq!(answer["sections"][0]["seats_taken"], 9);
    let live = json!({"course":"PKG1","section":1,"total_seats":40,"seats_taken":10,"version":2})
        .to_string();
    redis.cli(&["PUBLISH", "seats:PKG1", &live]);
    let frame = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("a live frame");
    assert_eq!(frame["sections"][0]["seats_taken"], 10);
    // The env file configured the hub: its origin list refuses another site.
    let foreign = http_raw(
        port,
        format!(
            "GET /ws?token={token} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: https://elsewhere.example\r\n\r\n"
        )
        .as_bytes(),
    )
    .expect("refusal");
    assert_eq!(
        foreign.status, 403,
        "SEATBOARD_ALLOWED_ORIGINS from the env file"
    );
    drop(ws);
    drop(hub);
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(root.parent().unwrap());
}

#[test]
fn native_rpm_lists_its_files() {
    if std::env::var_os("SEATBOARD_RPM").is_some() {
        return;
    }
    let (_, rpm_arch) = native_arch();
    let out = scratch("rpm");
    let rpm = build("rpm.sh", rpm_arch, &out);
    check_rpm(&rpm, rpm_arch);
    let _ = std::fs::remove_dir_all(&out);
}

/// tests/arm64.sh: the arm64 .deb (and .rpm) built from the cross-built binary.
#[test]
fn given_packages_hold_a_binary_that_runs() {
    let Some(deb) = std::env::var_os("SEATBOARD_DEB") else {
        return;
    };
    let arch = std::env::var("SEATBOARD_DEB_ARCH").expect("SEATBOARD_DEB_ARCH");
    let root = check_deb(Path::new(&deb), &arch);
    let wrapper = std::env::var("SEATBOARD_BIN_WRAPPER").unwrap_or_default();
    let mut parts = wrapper.split_whitespace();
    let mut cmd = match parts.next() {
        Some(w) => {
            let mut c = Command::new(w);
            c.args(parts).arg(root.join("usr/bin/seatboard"));
            c
        }
        None => Command::new(root.join("usr/bin/seatboard")),
    };
    let version = stdout(cmd.arg("--version"));
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "the packaged binary says {version}"
    );
    if let Some(rpm) = std::env::var_os("SEATBOARD_RPM") {
        let rpm_arch = std::env::var("SEATBOARD_RPM_ARCH").expect("SEATBOARD_RPM_ARCH");
        check_rpm(Path::new(&rpm), &rpm_arch);
    }
    let _ = std::fs::remove_dir_all(root.parent().unwrap());
}

struct KillOnDrop<'a>(&'a mut std::process::Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
