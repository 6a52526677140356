//! The OCI image (`packaging/Containerfile`, built by `packaging/image.sh`
//! with buildah from the test binary, no registry): its configuration (not
//! root, the entry point, the drain that fits Kubernetes' default grace, the
//! port), then one run under podman with the runtime's default seccomp
//! profile: ready and healthy, its user and `nofile` limit, the driver it
//! chose said in the log and `/metrics`, a board that updates, and
//! `podman stop` draining a viewer to exit 0; its filesystem holds the
//! binary and what it loads, no shell. The storage is the test's own
//! (`--root` in a scratch folder, the `vfs` driver: no mounts left behind).
//! Skipped, saying why, where buildah or podman is missing or not root.

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A secret `serve` takes (32 bytes or more).
const SECRET: &str = "image-test-secret-0123456789abcdefghij";

/// podman and buildah on a storage of the test's own, removed on drop.
struct Store {
    dir: PathBuf,
    runtime: &'static str,
}

impl Store {
    fn new() -> Store {
        let dir = std::env::temp_dir().join(format!(
            "seatboard-image-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("store dir");
        // crun (Debian's podman default) runs only on a unified cgroup
        // hierarchy; on a hybrid one ("cgroups in hybrid mode not
        // supported") the container runs on runc.
        let unified = Command::new("stat")
            .args(["-fc", "%T", "/sys/fs/cgroup"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "cgroup2fs");
        let runtime = if unified { "crun" } else { "runc" };
        Store { dir, runtime }
    }

    /// The global options that point a tool at this store.
    fn opts(&self) -> Vec<String> {
        vec![
            "--root".into(),
            self.dir.join("root").display().to_string(),
            "--runroot".into(),
            self.dir.join("run").display().to_string(),
            "--storage-driver".into(),
            "vfs".into(),
        ]
    }

    fn podman(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .args(self.opts())
            .args(["--runtime", self.runtime])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("podman")
    }

    fn podman_ok(&self, args: &[&str]) -> String {
        let o = self.podman(args);
        assert!(
            o.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.podman(&["rm", "--all", "--force", "--time", "0"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn missing_tool() -> Option<String> {
    root_without(&["buildah", "podman"])
}

/// This process's hard `nofile` limit: a `--ulimit` the runtime may set
/// without `CAP_SYS_RESOURCE`.
fn hard_nofile() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit into the struct we own.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
    assert_eq!(r, 0, "getrlimit");
    l.rlim_max
}

#[test]
fn the_image_builds_runs_not_root_and_drains_on_sigterm() {
    if let Some(why) = missing_tool() {
        eprintln!("SKIPPED image: cannot build or run the image here: {why}");
        return;
    }
    let store = Store::new();
    let name = format!("localhost/seatboard-test:{}", std::process::id());
    let t = Instant::now();
    let built = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/image.sh"))
        .args([env!("CARGO_BIN_EXE_seatboard"), &name])
        .env("BUILDAH_OPTS", store.opts().join(" "))
        .output()
        .expect("packaging/image.sh");
    assert!(
        built.status.success(),
        "image.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    eprintln!("image: built in {:?}", t.elapsed());

    let inspect: Value =
        serde_json::from_str(&store.podman_ok(&["image", "inspect", &name])).expect("inspect");
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532", "not root: {config}");
    assert_eq!(config["Entrypoint"], json!(["/usr/bin/seatboard"]));
    assert_eq!(config["Cmd"], json!(["serve"]));
    assert_eq!(config["StopSignal"], "SIGTERM");
    assert!(config["ExposedPorts"]["8080/tcp"].is_object(), "{config}");
    let env: Vec<&str> = config["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(env.contains(&"SEATBOARD_DRAIN_MS=25000"), "{env:?}");
    assert!(env.contains(&"SEATBOARD_LISTEN=0.0.0.0:8080"), "{env:?}");
    let size = inspect[0]["Size"].as_u64().unwrap_or(0);
    eprintln!("image: {} MB", size / 1_000_000);

    // One run, on the host's network, under the runtime's default seccomp profile.
    let redis = RedisServer::start();
    let port = free_port();
    let nofile = hard_nofile().min(1_048_576);
    let id = store.podman_ok(&[
        "run",
        "--detach",
        "--pull=never",
        "--network=host",
        &format!("--ulimit=nofile={nofile}:{nofile}"),
        // Lowered, never raised: raising needs CAP_SYS_RESOURCE.
        "--ulimit=nproc=4096:4096",
        "-e",
        &format!("REALTIME_REDIS_URI={}", redis.uri()),
        "-e",
        &format!("SEATBOARD_JWT_SECRET={SECRET}"),
        "-e",
        &format!("SEATBOARD_LISTEN=127.0.0.1:{port}"),
        "-e",
        "SEATBOARD_SHARDS=2",
        "-e",
        "SEATBOARD_DRAIN_MS=3000",
        &name,
    ]);
    let ready = wait_for(Duration::from_secs(30), || {
        http_get(port, "/readyz")
            .is_ok_and(|r| r.status == 200)
            .then_some(())
    });
    let logs = || {
        let o = store.podman(&["logs", &id]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(ready.is_some(), "not ready: {}", logs());
    assert_eq!(http_get(port, "/healthz").expect("healthz").status, 200);

    let pid = store.podman_ok(&["inspect", "--format", "{{.State.Pid}}", &id]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().skip(1).all(|u| u == "65532")),
        "{status}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("nofile");
    assert!(
        open_files.split_whitespace().nth(3) == Some(&nofile.to_string()),
        "{open_files}"
    );

    // The driver it chose, said once in the log and in /metrics.
    let m = http_get(port, "/metrics").expect("metrics").body;
    let uring = metric_value(&m, "seatboard_driver_shards{driver=\"io_uring\"}");
    let epoll = metric_value(&m, "seatboard_driver_shards{driver=\"epoll\"}");
    assert_eq!(uring + epoll, 2.0, "{m}");
    let log = logs();
    let fell_back = log
        .matches("io_uring unavailable, falling back to epoll")
        .count();
    if epoll == 2.0 {
        assert_eq!(fell_back, 1, "{log}");
        assert!(log.contains("shards run on epoll"), "{log}");
    } else {
        assert_eq!(fell_back, 0, "{log}");
        assert!(log.contains("shards run on io_uring"), "{log}");
    }
    eprintln!(
        "image: shards on {} under the runtime's default seccomp profile ({})",
        if epoll == 2.0 { "epoll" } else { "io_uring" },
        store.runtime
    );

    // A board served from the container updates.
    let exp = seatboard::clock::unix_ms() / 1000 + 600;
    let token = seatboard::auth::mint(SECRET.as_bytes(), "stu", shards::Role::Student, exp);
    let mut ws = ws_connect(port, &format!("/ws?token={token}")).expect("connect");
    send_json(&mut ws, json!({"op":"watch","course":"IMG101"}));
    let full = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
    assert_eq!(full["full"], true);
    publish_section(&redis.uri(), "IMG101", "1", "30", "4");
    let updated = wait_for(Duration::from_secs(10), || {
        let f = next_of_type(&mut ws, "frame", Duration::from_secs(10))?;
        (seats_taken(&f, 1) == Some(4)).then_some(())
    });
    assert!(updated.is_some(), "the board never updated");

    // podman stop sends SIGTERM: the viewer is told to reconnect and closed
    // 1012, and the process exits 0 well within the stop timeout.
    let t = Instant::now();
    store.podman_ok(&["stop", "--time", "30", &id]);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(15), "stop took {took:?}");
    let (told, code) = read_to_close(&mut ws);
    assert!(told, "no reconnect hint");
    assert_eq!(code, Some(1012));
    assert_eq!(
        store.podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &id]),
        "0",
        "{}",
        logs()
    );
    eprintln!("image: stopped (drained) in {took:?}");

    // Its filesystem: the binary, its loader and libraries, the CA bundle,
    // the passwd entry; no shell, no package manager.
    let tar = store.dir.join("fs.tar");
    store.podman_ok(&["export", "--output", &tar.display().to_string(), &id]);
    let listing = Command::new("tar")
        .arg("-tf")
        .arg(&tar)
        .output()
        .expect("tar");
    let files: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_string())
        .collect();
    for needed in [
        "usr/bin/seatboard",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "etc/nsswitch.conf",
    ] {
        assert!(files.iter().any(|f| f == needed), "no {needed}: {files:#?}");
    }
    assert!(files.iter().any(|f| f.contains("libc.so.6")), "{files:#?}");
    for absent in ["bin/sh", "usr/bin/sh", "usr/bin/apt", "usr/bin/dpkg"] {
        assert!(!files.iter().any(|f| f == absent), "{absent} in the image");
    }
}
