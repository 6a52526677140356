//! The Debian package under a real systemd, as an operator runs it: a
//! bookworm root booted with `systemd-nspawn` (`container.rs`), the `.deb`
//! built from the test binary installed with `apt`, then the hub's unit
//! (refused with the placeholder secret, `active` only once it listens,
//! pinned, on io_uring, serving a board that updates, its log lines at their
//! journal priorities), `systemctl kill -s KILL` followed by a restart, the
//! worker units refusing a bad flag without a restart loop, then started and
//! stopped with no warning, the reconciler reading a PostgreSQL on the host
//! (`database.rs`) and healing a lost publish on the hub's board, the relay's
//! socket group, an upgrade that restarts the running units and keeps the
//! edited env file, a stop that drains within `TimeoutStopSec`, and `apt
//! purge` leaving no unit, process, user, group or socket. Skipped, saying why, on a machine that cannot boot
//! a container (not root, no `CAP_SYS_ADMIN`, tools missing).

mod container;
mod database;

use crate::common;
use common::*;
use container::Container;
use database::Selection;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The worker units beside the hub, each with the one line it logs once it
/// is subscribed and working. A new worker unit is one more line here.
const WORKERS: &[(&str, &str)] = &[
    ("seatboard-analytics.service", "analytics worker subscribed"),
    ("seatboard-relay.service", "seatboard relay running"),
    ("seatboard-reconcile.service", "reconciler checking"),
];

/// The reconciler's unit.
const RECONCILE: &str = "seatboard-reconcile.service";

/// The hub's unit.
const HUB: &str = "seatboard.service";

/// The drain the test's env file sets (short, so the stop is quick).
const DRAIN_MS: u64 = 3000;

/// A secret `serve` takes (32 bytes or more).
const SECRET: &str = "boot-test-secret-0123456789abcdefghij";

/// A scratch folder, removed on drop (a failed run leaves nothing behind).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "seatboard-{tag}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the `.deb` from the test binary into `out`, at `version` if given.
fn build_deb(out: &Path, version: Option<&str>) -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no package architecture for {other}"),
    };
    let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/deb.sh"));
    cmd.args([arch, env!("CARGO_BIN_EXE_seatboard")])
        .arg(out)
        .env("DEB_COMPRESS", "gzip");
    if let Some(v) = version {
        cmd.env("DEB_VERSION", v);
    }
    let o = cmd.output().expect("packaging/deb.sh");
    assert!(
        o.status.success(),
        "deb.sh: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    path.file_name()
        .expect("deb name")
        .to_string_lossy()
        .into_owned()
}

/// The journal of one run of `unit` (its invocation) as JSON records.
fn journal(c: &Container, unit: &str, invocation: &str) -> Vec<Value> {
    let out = c.sh(&format!(
        "journalctl --no-pager -o json _SYSTEMD_UNIT={unit} _SYSTEMD_INVOCATION_ID={invocation} || true"
    ));
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// The service's own lines of one invocation: (priority, message).
fn lines(c: &Container, unit: &str, invocation: &str) -> Vec<(u8, String)> {
    journal(c, unit, invocation)
        .into_iter()
        .filter(|r| r["_SYSTEMD_UNIT"] == unit && r["_TRANSPORT"] == "stdout")
        .map(|r| {
            let p = r["PRIORITY"]
                .as_str()
                .and_then(|p| p.parse().ok())
                .unwrap_or(255);
            (p, r["MESSAGE"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// The journal's cursor now (its last entry's).
fn cursor(c: &Container) -> String {
    let out = c.sh("journalctl --no-pager -o json -n 1");
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|r| r["__CURSOR"].as_str().map(str::to_owned))
        .expect("a journal entry")
}

/// The binary's own lines after `cursor`: (priority, message). A process
/// that exits at once (a refused flag) may be gone before journald reads its
/// cgroup, so its lines can lack the unit and invocation fields; the units
/// are started one at a time, so the lines after the cursor are that unit's.
/// Filtered here, not by journalctl: bookworm's journalctl (252), given
/// matches with `--after-cursor`, was seen to skip the first entry matching.
fn lines_after(c: &Container, cursor: &str) -> Vec<(u8, String)> {
    let out = c.sh(&format!(
        "journalctl --no-pager -o json --after-cursor='{cursor}' || true"
    ));
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["SYSLOG_IDENTIFIER"] == "seatboard" && r["_TRANSPORT"] == "stdout")
        .map(|r| {
            let p = r["PRIORITY"]
                .as_str()
                .and_then(|p| p.parse().ok())
                .unwrap_or(255);
            (p, r["MESSAGE"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// Waits until a line of `unit`'s invocation contains `text`; returns them all.
fn wait_line(c: &Container, unit: &str, invocation: &str, text: &str) -> Vec<(u8, String)> {
    wait_for(Duration::from_secs(20), || {
        let l = lines(c, unit, invocation);
        l.iter().any(|(_, m)| m.contains(text)).then_some(l)
    })
    .unwrap_or_else(|| {
        panic!(
            "{unit} never logged `{text}`: {:#?}",
            lines(c, unit, invocation)
        )
    })
}

/// Asserts no line of the invocation is a warning or worse, and that
/// `journalctl -p warning` agrees.
fn assert_no_warning(c: &Container, unit: &str, invocation: &str) {
    let l = lines(c, unit, invocation);
    assert!(
        l.iter().all(|(p, _)| *p > 4),
        "{unit} logged a warning or worse: {l:#?}"
    );
    let filtered = c.sh(&format!(
        "journalctl --no-pager -o cat -p warning _SYSTEMD_INVOCATION_ID={invocation}"
    ));
    assert!(
        filtered.trim().is_empty() || filtered.trim() == "-- No entries --",
        "journalctl -p warning shows {unit}: {filtered}"
    );
}

/// Starts `unit` and returns its invocation ID.
fn start(c: &Container, unit: &str) -> String {
    c.sh(&format!("systemctl start {unit}"));
    c.prop(unit, "InvocationID")
}

/// The hub's `/metrics` sample `name`.
fn metric(port: u16, name: &str) -> f64 {
    let m = http_get(port, "/metrics").expect("metrics").body;
    assert!(
        m.lines().any(|l| l.starts_with(name)),
        "/metrics lacks {name}"
    );
    metric_value(&m, name)
}

fn viewer(port: u16, course: &str) -> Ws {
    let exp = seatboard::clock::unix_ms() / 1000 + 600;
    let token = seatboard::auth::mint(SECRET.as_bytes(), "stu", shards::Role::Student, exp);
    let mut ws = ws_connect(port, &format!("/ws?token={token}")).expect("connect to the hub");
    send_json(&mut ws, json!({"op":"watch","course":course}));
    let full = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
    assert_eq!(full["full"], true);
    ws
}

/// Reads frames until section 1 of the board shows `taken` seats taken.
fn wait_taken(ws: &mut Ws, taken: u64) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let Some(f) = next_of_type(ws, "frame", Duration::from_secs(10)) else {
            break;
        };
        if seats_taken(&f, 1) == Some(taken) {
            return;
        }
    }
    panic!("the board never showed {taken} seats taken in section 1");
}

#[test]
fn the_deb_under_a_booted_systemd() {
    if let Some(why) = container::cannot_boot() {
        eprintln!("SKIPPED systemd_boot: this machine cannot boot a container: {why}");
        return;
    }
    let began = Instant::now();
    // PostgreSQL's initdb runs while the packages are built and the root boots.
    let selection = Selection::start();
    let root = container::root();
    let pkg = Scratch::new("boot-pkg");
    let v1 = build_deb(&pkg.0, None);
    let newer = format!("{}+boot1", env!("CARGO_PKG_VERSION"));
    let v2 = build_deb(&pkg.0, Some(&newer));
    let redis = RedisServer::start();
    let hub_port = free_port();
    let relay_metrics = free_port();
    let booting = Instant::now();
    let c = Container::boot(&root, &pkg.0);
    eprintln!("systemd_boot: booted in {:?}", booting.elapsed());
    let selection = selection.join().expect("PostgreSQL");

    c.sh(&format!("apt-get install -y -q /pkg/{v1} >/dev/null"));
    c.sh("getent group seatboard-publish");

    // The shipped env file's placeholder secret is refused: exit 2, the flag
    // named at error priority, and no restart loop.
    // A process that exits at once can be filed without its unit's fields,
    // so its lines are read after a cursor, as the workers' below.
    let before = cursor(&c);
    let o = c.run(&format!("systemctl start {HUB}"));
    assert!(!o.status.success(), "the placeholder secret was taken");
    assert_eq!(c.prop(HUB, "ExecMainStatus"), "2");
    assert_eq!(c.prop(HUB, "NRestarts"), "0");
    let named = wait_for(Duration::from_secs(10), || {
        lines_after(&c, &before)
            .iter()
            .any(|(p, m)| *p == 3 && m.contains("--jwt-secret"))
            .then_some(())
    });
    assert!(
        named.is_some(),
        "the refusal is an error naming --jwt-secret: {:#?}",
        lines_after(&c, &before)
    );
    c.sh(&format!("systemctl reset-failed {HUB}"));

    // The workers refuse a bad flag the same way, whatever their Restart=:
    // the shipped env file names no database for the reconciler, and the
    // manager's environment gives the relay a UDP address off loopback.
    c.sh("systemctl set-environment SEATBOARD_RELAY_UDP=192.0.2.1:7440");
    for (unit, flag) in [(RECONCILE, "--db"), ("seatboard-relay.service", "--udp")] {
        // Type=simple: the start returns before the process refuses.
        let cursor = cursor(&c);
        c.run(&format!("systemctl start {unit}"));
        let failed = wait_for(Duration::from_secs(20), || {
            (c.prop(unit, "ActiveState") == "failed").then_some(())
        });
        assert!(
            failed.is_some(),
            "{unit} not failed: {}",
            c.prop(unit, "ActiveState")
        );
        assert_eq!(c.prop(unit, "ExecMainStatus"), "2", "{unit}");
        assert_eq!(c.prop(unit, "NRestarts"), "0", "{unit}");
        // journald may file the last lines just after the unit failed.
        let named = wait_for(Duration::from_secs(10), || {
            let l = lines_after(&c, &cursor);
            l.iter()
                .any(|(p, m)| *p == 3 && m.contains(flag))
                .then_some(())
        });
        assert!(
            named.is_some(),
            "{unit}'s refusal is an error naming {flag}: {:#?}",
            lines_after(&c, &cursor)
        );
    }
    c.sh("systemctl unset-environment SEATBOARD_RELAY_UDP");
    c.sh(&format!(
        "systemctl reset-failed {RECONCILE} seatboard-relay.service"
    ));

    // The operator's edits (the reconciler's lines come through /pkg: the
    // query's quotes and `$1` stay as an operator types them).
    std::fs::write(pkg.0.join("reconcile.env"), selection.env_lines()).expect("reconcile.env");
    c.sh(&format!(
        "set -e; f=/etc/seatboard/seatboard.env
        sed -i -e 's|^REALTIME_REDIS_URI=.*|REALTIME_REDIS_URI={uri}|' \
               -e 's|^SEATBOARD_JWT_SECRET=.*|SEATBOARD_JWT_SECRET={SECRET}|' \
               -e 's|^SEATBOARD_LISTEN=.*|SEATBOARD_LISTEN=127.0.0.1:{hub_port}|' \
               -e 's|^SEATBOARD_ALLOWED_ORIGINS=.*|SEATBOARD_ALLOWED_ORIGINS=|' $f
        printf '%s\\n' SEATBOARD_SHARDS=2 SEATBOARD_DRAIN_MS={DRAIN_MS} SEATBOARD_RELAY_UDP= \
               SEATBOARD_RELAY_METRICS=127.0.0.1:{relay_metrics} >> $f
        cat /pkg/reconcile.env >> $f",
        uri = redis.uri()
    ));

    // Type=notify: `systemctl start` returns once the hub is ready, and it
    // is ready only once it listens.
    let t = Instant::now();
    let hub = start(&c, HUB);
    let start_took = t.elapsed();
    assert_eq!(c.prop(HUB, "ActiveState"), "active");
    assert_eq!(http_get(hub_port, "/readyz").expect("readyz").status, 200);
    eprintln!("systemd_boot: {HUB} active in {start_took:?}");

    // Pinned, and on io_uring under the unit's sandbox (where the kernel allows it).
    assert_eq!(metric(hub_port, "seatboard_pin_failures_total"), 0.0);
    for shard in 0..2 {
        let core = metric(
            hub_port,
            &format!("seatboard_shard_core{{shard=\"{shard}\"}}"),
        );
        assert!(core >= 0.0, "shard {shard} not pinned");
    }
    let main_pid = c.prop(HUB, "MainPID");
    let affinity = c.sh(&format!(
        "for t in /proc/{main_pid}/task/*; do if grep -q seatboard-shard $t/comm; then grep Cpus_allowed_list $t/status; fi; done"
    ));
    let pinned: Vec<&str> = affinity.lines().collect();
    assert_eq!(pinned.len(), 2, "{affinity}");
    assert!(
        pinned.iter().all(|l| l
            .split(':')
            .nth(1)
            .is_some_and(|c| c.trim().parse::<u32>().is_ok())),
        "each shard thread on one core: {affinity}"
    );
    let uring_denied = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .is_ok_and(|v| v.trim() != "0");
    let driver = if uring_denied { "epoll" } else { "io_uring" };
    assert_eq!(
        metric(
            hub_port,
            &format!("seatboard_driver_shards{{driver=\"{driver}\"}}")
        ),
        2.0
    );

    // A board served through it updates.
    let mut ws = viewer(hub_port, "BOOT101");
    publish_section(&redis.uri(), "BOOT101", "1", "30", "5");
    wait_taken(&mut ws, 5);

    // Log lines at their priorities: info at 6, a rejected snapshot a warning
    // (4) that `journalctl -p warning` shows, and no prefix left in the text.
    let l = wait_line(&c, HUB, &hub, "shard pinned to core");
    assert!(
        l.iter()
            .any(|(p, m)| *p == 6 && m.contains("shard pinned to core")),
        "{l:#?}"
    );
    assert_no_warning(&c, HUB, &hub);
    redis.cli(&["PUBLISH", "seats:BOOT101", "{\"not\":\"a snapshot\"}"]);
    let l = wait_line(&c, HUB, &hub, "snapshot rejected");
    assert!(
        l.iter()
            .any(|(p, m)| *p == 4 && m.contains("snapshot rejected")),
        "{l:#?}"
    );
    assert!(l.iter().all(|(_, m)| !m.starts_with('<')), "{l:#?}");
    let warned = c.sh(&format!("journalctl --no-pager -o cat -p warning -u {HUB}"));
    assert!(warned.contains("snapshot rejected"), "{warned}");
    assert!(!warned.contains("shard pinned"), "{warned}");
    drop(ws);

    // Killed outright: systemd starts it again (RestartSec=2).
    let before = c.prop(HUB, "MainPID");
    c.sh(&format!("systemctl kill -s KILL {HUB}"));
    let t = Instant::now();
    let back = wait_for(Duration::from_secs(20), || {
        let pid = c.prop(HUB, "MainPID");
        let up = c.prop(HUB, "ActiveState") == "active" && pid != "0" && pid != before;
        up.then_some(())
    });
    assert!(back.is_some(), "not restarted after SIGKILL");
    assert_eq!(c.prop(HUB, "NRestarts"), "1");
    assert_eq!(http_get(hub_port, "/readyz").expect("readyz").status, 200);
    eprintln!("systemd_boot: restarted {:?} after SIGKILL", t.elapsed());

    // The workers: each starts with no warning and says once that it works.
    for (unit, working) in WORKERS {
        let inv = start(&c, unit);
        let l = wait_line(&c, unit, &inv, working);
        assert_eq!(
            l.iter().filter(|(_, m)| m.contains(working)).count(),
            1,
            "{l:#?}"
        );
        assert!(
            l.iter().any(|(p, m)| *p == 6 && m.contains(working)),
            "{l:#?}"
        );
        assert_no_warning(&c, unit, &inv);
    }

    // The reconciler heals a lost publish: a row committed in the database
    // whose publish never happened shows on the board the hub serves, read
    // under the SELECT-only role through one session.
    let mut ws = viewer(hub_port, "BOOT202");
    selection.commit("BOOT202", 1, 12, 3);
    let t = Instant::now();
    wait_taken(&mut ws, 12);
    eprintln!("systemd_boot: a lost publish healed in {:?}", t.elapsed());
    drop(ws);
    let repaired = wait_for(Duration::from_secs(10), || {
        let n = metric(
            selection.metrics,
            "seatboard_reconcile_repaired_total{reason=\"missing\"}",
        );
        (n == 1.0).then_some(())
    });
    assert!(repaired.is_some(), "the repair is not counted once");
    let health: Value = serde_json::from_str(
        &http_get(selection.metrics, "/healthz")
            .expect("reconcile /healthz")
            .body,
    )
    .expect("healthz JSON");
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(selection.sessions(), ["reader"]);

    // The relay's socket: 0660, group seatboard-publish; a member publishes,
    // anyone else is refused.
    assert_eq!(
        c.sh("stat -c '%a %G' /run/seatboard/relay.sock").trim(),
        "660 seatboard-publish"
    );
    c.sh("useradd -M -G seatboard-publish member && useradd -M outsider");
    let mut ws = viewer(hub_port, "BOOT101");
    let snapshot = |taken: u32, version: u32| {
        format!(
            "{{\"course\":\"BOOT101\",\"section\":1,\"total_seats\":30,\"seats_taken\":{taken},\"version\":{version},\"ts\":{}}}",
            seatboard::clock::unix_ms()
        )
    };
    let send = |user: &str, payload: &str| {
        c.run(&format!(
            "printf '%s' '{payload}' | runuser -u {user} -- socat -u STDIN UNIX-SENDTO:/run/seatboard/relay.sock"
        ))
    };
    let o = send("outsider", &snapshot(29, 1_000_000));
    assert!(!o.status.success(), "a non-member sent to the relay");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = send("member", &snapshot(7, 1_000_001));
    assert!(
        o.status.success(),
        "a member's send failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    wait_taken(&mut ws, 7);
    drop(ws);

    // An upgrade restarts every running unit on the new binary and keeps the
    // edited env file.
    let units: Vec<&str> = std::iter::once(HUB)
        .chain(WORKERS.iter().map(|(u, _)| *u))
        .collect();
    let before: Vec<String> = units.iter().map(|u| c.prop(u, "InvocationID")).collect();
    c.sh(&format!("apt-get install -y -q /pkg/{v2} >/dev/null"));
    assert_eq!(
        c.sh("dpkg-query -W -f '${Version}' seatboard").trim(),
        newer
    );
    for (unit, old) in units.iter().zip(&before) {
        let restarted = wait_for(Duration::from_secs(30), || {
            let inv = c.prop(unit, "InvocationID");
            (inv != *old && c.prop(unit, "ActiveState") == "active").then_some(inv)
        });
        let inv = restarted.unwrap_or_else(|| panic!("{unit} not restarted by the upgrade"));
        assert_no_warning(&c, unit, &inv);
    }
    let env = c.sh("cat /etc/seatboard/seatboard.env");
    assert!(
        env.contains(&format!("SEATBOARD_JWT_SECRET={SECRET}")),
        "{env}"
    );
    assert!(env.contains(&redis.uri()), "{env}");
    let ready = wait_for(Duration::from_secs(10), || {
        http_get(hub_port, "/readyz")
            .is_ok_and(|r| r.status == 200)
            .then_some(())
    });
    assert!(ready.is_some(), "the upgraded hub is not ready");

    // Stop drains a viewer (reconnect, close 1012) within TimeoutStopSec.
    let mut ws = viewer(hub_port, "BOOT101");
    let hub = c.prop(HUB, "InvocationID");
    let timeout_stop = c.prop(HUB, "TimeoutStopUSec");
    let t = Instant::now();
    c.sh(&format!("systemctl stop {HUB}"));
    let stop_took = t.elapsed();
    assert_eq!(c.prop(HUB, "Result"), "success");
    assert!(
        stop_took < Duration::from_millis(DRAIN_MS + 10_000),
        "stop took {stop_took:?} (drain {DRAIN_MS} ms, TimeoutStopSec {timeout_stop})"
    );
    let (told, code) = read_to_close(&mut ws);
    assert!(told, "no reconnect hint before the close");
    assert_eq!(code, Some(1012));
    let l = lines(&c, HUB, &hub);
    assert!(
        l.iter().all(|(p, _)| *p > 4),
        "the drain logged a warning: {l:#?}"
    );
    eprintln!("systemd_boot: {HUB} stopped (drained) in {stop_took:?}");

    // The workers stop cleanly, with no warning.
    for (unit, _) in WORKERS {
        let inv = c.prop(unit, "InvocationID");
        c.sh(&format!("systemctl stop {unit}"));
        assert_eq!(c.prop(unit, "Result"), "success", "{unit}");
        assert_no_warning(&c, unit, &inv);
    }

    // Purge with the relay and the reconciler running: no unit, process,
    // user, group, socket or config left, and the database session closed.
    start(&c, "seatboard-relay.service");
    start(&c, RECONCILE);
    c.sh("apt-get purge -y -q seatboard >/dev/null");
    assert!(
        !c.run("pgrep -x seatboard").status.success(),
        "a seatboard process outlived the purge: {}",
        c.sh("ps -eo pid,comm,args | grep seatboard || true")
    );
    let closed = wait_for(Duration::from_secs(5), || {
        selection.sessions().is_empty().then_some(())
    });
    assert!(closed.is_some(), "{:?}", selection.sessions());
    let left = c.sh(
        "ls /lib/systemd/system /etc/systemd/system /etc/systemd/system/*.wants 2>/dev/null | grep seatboard || true",
    );
    assert!(left.trim().is_empty(), "units left: {left}");
    let loaded = c.sh("systemctl list-units --all --no-legend --plain 'seatboard*' || true");
    assert!(!loaded.contains(" loaded "), "units still loaded: {loaded}");
    assert!(!c.run("getent group seatboard-publish").status.success());
    assert!(!c.run("getent passwd seatboard").status.success());
    assert!(!c.run("test -e /run/seatboard/relay.sock").status.success());
    assert!(!c.run("test -e /etc/seatboard").status.success());
    assert!(!c.run("test -e /usr/bin/seatboard").status.success());
    drop(c);
    eprintln!("systemd_boot: whole test {:?}", began.elapsed());
}
