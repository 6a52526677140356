//! `seatboard rehearse` against a real deployment on loopback: HAProxy (the
//! shipped config) in front of two nodes and a real redis-server (section 9),
//! over plain HTTP and over HTTPS (HAProxy terminating TLS with a test CA's
//! certificate).

use crate::common::{metric_value, seatboard_command, wait_for, RedisServer, Seatboard};
use crate::lb;
use crate::redis_util::cut::CutProxy;
use crate::tls_util::{self, make_certs};
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const SECRET: &str = "rehearse-test-secret-rehearse-test-secret-0123";

/// Redis, two nodes (the second with `second` flags added) and HAProxy.
struct Deployment {
    redis: RedisServer,
    nodes: Vec<Seatboard>,
    _proxy: lb::Haproxy,
    lb_port: u16,
    /// HAProxy's TLS port, when it has one ([`deployment_behind_tls`]).
    tls_port: Option<u16>,
}

fn deployment(second: &[&str]) -> Deployment {
    deployment_with(&[], second)
}

/// As [`deployment`], with flags added to the first node too.
fn deployment_with(first: &[&str], second: &[&str]) -> Deployment {
    let redis = RedisServer::start();
    let uri = redis.uri();
    deployment_on(redis, [&uri, &uri], first, second)
}

/// `serve` on `uri` with the test's secret, one shard, and `extra`.
fn node_args<'a>(uri: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "serve",
        "--redis",
        uri,
        "--jwt-secret",
        SECRET,
        "--shards",
        "1",
    ];
    args.extend_from_slice(extra);
    args
}

/// As [`deployment_with`], each node reaching Redis at its own URI.
fn deployment_on(
    redis: RedisServer,
    uris: [&str; 2],
    first: &[&str],
    second: &[&str],
) -> Deployment {
    deployment_tls(redis, uris, first, second, None)
}

/// Two plain nodes on a real Redis, HAProxy with a plain port and a TLS port
/// serving `pem` (certificate and key): the deployment as browsers reach it
/// over https://.
fn deployment_behind_tls(pem: &std::path::Path) -> Deployment {
    let redis = RedisServer::start();
    let uri = redis.uri();
    deployment_tls(redis, [&uri, &uri], &[], &[], Some(pem))
}

/// As [`deployment_on`], HAProxy also terminating TLS with `pem` on a
/// second port when given (the plain port stays for the readiness check).
fn deployment_tls(
    redis: RedisServer,
    uris: [&str; 2],
    first: &[&str],
    second: &[&str],
    pem: Option<&std::path::Path>,
) -> Deployment {
    let (one, two) = (node_args(uris[0], first), node_args(uris[1], second));
    let nodes = vec![Seatboard::start(&one), Seatboard::start(&two)];
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let lb_port = lb::free_port();
    let mut cfg = lb::render(&lb::shipped(), &lb::Bind::Plain(lb_port), &ports, 5000);
    let tls_port = pem.map(|pem| {
        let port = lb::free_port();
        let plain = format!("bind 127.0.0.1:{lb_port}\n");
        let both = format!(
            "{plain}    bind 127.0.0.1:{port} ssl crt {} alpn http/1.1\n",
            pem.display()
        );
        assert!(cfg.contains(&plain), "{cfg}");
        cfg = cfg.replacen(&plain, &both, 1);
        port
    });
    let dir = std::env::temp_dir().join(format!(
        "seatboard-rehearse-{}-{lb_port}",
        std::process::id()
    ));
    let proxy = lb::Haproxy::start(&dir, lb_port, &cfg, 1);
    assert!(
        proxy.wait_ready("/readyz", Duration::from_secs(20)),
        "haproxy never saw a node up"
    );
    Deployment {
        redis,
        nodes,
        _proxy: proxy,
        lb_port,
        tls_port,
    }
}

fn rehearse(d: &Deployment, extra: &[&str], json: &std::path::Path) -> Output {
    rehearse_command(d, extra, json)
        .output()
        .expect("run rehearse")
}

/// The rehearsal of [`rehearse`], not started yet: 300 viewers (a fifth on
/// SSE) over 30 courses, 300 snapshots/s for 3 s; `extra` flags and values
/// in pairs, each replacing the default of the same flag.
fn rehearse_command(d: &Deployment, extra: &[&str], json: &std::path::Path) -> Command {
    let target = format!("http://127.0.0.1:{}", d.lb_port);
    rehearse_command_at(d, &target, extra, json)
}

/// [`rehearse_command`] against `target`.
fn rehearse_command_at(
    d: &Deployment,
    target: &str,
    extra: &[&str],
    json: &std::path::Path,
) -> Command {
    let mut flags: Vec<(&str, &str)> = vec![
        ("--viewers", "300"),
        ("--connect-rate", "600"),
        ("--courses", "30"),
        ("--publish-rate", "300"),
        ("--duration", "3"),
        ("--sse-share", "0.2"),
    ];
    for pair in extra.chunks(2) {
        let (flag, value) = (pair[0], pair.get(1).copied().unwrap_or(""));
        match flags.iter_mut().find(|(f, _)| *f == flag) {
            Some(default) => default.1 = value,
            None => flags.push((flag, value)),
        }
    }
    let mut c = seatboard_command();
    c.args(["rehearse", "--target", target])
        .args(["--redis", &d.redis.uri(), "--jwt-secret", SECRET])
        .args(flags.iter().flat_map(|(f, v)| [*f, *v]))
        .arg("--json")
        .arg(json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

fn read_json(p: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("json written")).expect("json")
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("seatboard-rehearse-{}-{name}", std::process::id()))
}

#[test]
fn a_deployment_that_holds_passes_with_every_board_correct_and_nothing_left() {
    let d = deployment(&[]);
    let json = temp("pass.json");
    let report = temp("pass.html");
    let report_arg = report.to_string_lossy().into_owned();
    let nodes = node_urls(&d);
    let out = rehearse(&d, &["--report", &report_arg, "--nodes", &nodes], &json);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout when it is not a terminal"
    );
    let j = read_json(&json);
    assert_eq!(j["verdict"], "pass");
    assert_eq!(j["correct"], 1.0);
    assert_eq!(j["viewers"], 300);
    assert!(j["published"].as_u64().unwrap_or(0) > 0, "{j}");
    assert!(j["latency_ms"]["p99"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    for k in [
        "t",
        "viewers",
        "connects",
        "refused",
        "published",
        "p50_ms",
        "p99_ms",
    ] {
        assert!(j["series"][0].get(k).is_some(), "series lacks {k}");
    }
    assert_eq!(
        d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]),
        "",
        "rehearsal keys left in Redis"
    );
    nodes_have_cpu_and_rss(&j, 2);
    // The viewers took compression, as browsers do: fewer bytes on the
    // wire than in the messages, on each node.
    for node in &d.nodes {
        let wire = node.metric("seatboard_ws_bytes_sent_total");
        let payload = node.metric("seatboard_ws_payload_bytes_total");
        assert!(
            wire > 0.0 && wire < payload,
            "wire {wire} B, payload {payload} B"
        );
    }
    report_draws_in_chromium(&report);
    // Operators rehearse more than once: the same nodes, which still hold
    // the first run's boards in memory, pass again.
    let again = temp("pass-again.json");
    let out = rehearse(&d, &[], &again);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a second rehearsal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read_json(&again)["correct"], 1.0);
}

/// `--nodes` for the deployment: each node's own URL.
fn node_urls(d: &Deployment) -> String {
    let urls: Vec<String> = d
        .nodes
        .iter()
        .map(|n| format!("http://127.0.0.1:{}", n.port))
        .collect();
    urls.join(",")
}

/// The JSON's `nodes`: `want` of them, each with a CPU and RSS series of
/// one point a second, the nodes busy (CPU above 0) and resident (RSS).
fn nodes_have_cpu_and_rss(j: &Value, want: usize) {
    let nodes = j["nodes"].as_array().expect("nodes in the JSON");
    assert_eq!(nodes.len(), want, "{}", j["nodes"]);
    let mut busy = false;
    for n in nodes {
        let series = n["series"].as_array().expect("a node's series");
        assert!(series.len() >= 3, "a point a second: {n}");
        for p in series {
            assert!(p["t"].as_f64().is_some(), "{p}");
            assert!(p["rss_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{p}");
            busy |= p["cpu_pct"].as_f64().unwrap_or(0.0) > 0.0;
        }
        assert_eq!(n["redis_reconnects"], 0, "{n}");
    }
    assert!(busy, "no node used any CPU: {}", j["nodes"]);
}

/// The HTML report opened in Chromium draws every plot with data and loads
/// nothing else (tests/browser/report.mjs; screenshot in target/browser/).
fn report_draws_in_chromium(report: &std::path::Path) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/browser");
    std::fs::create_dir_all(&out_dir).expect("target/browser");
    let status = std::process::Command::new("node")
        .arg(root.join("tests/browser/report.mjs"))
        .arg(format!("file://{}", report.display()))
        .arg(out_dir.join("rehearsal-report.png"))
        .status()
        .expect("node must be installed");
    assert!(status.success(), "report.mjs failed");
}

#[test]
fn a_node_capped_by_max_connections_fails_and_names_the_refusals() {
    // HAProxy retries a refused upgrade on the other node (`retry-on 503`),
    // so a browser sees a refusal only when the fleet as a whole is short:
    // one node capped at 20, the other at 200, for 300 viewers.
    let d = deployment_with(&["--max-connections", "200"], &["--max-connections", "20"]);
    let json = temp("capped.json");
    let out = rehearse(&d, &[], &json);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = last_line(&out);
    assert!(
        last.contains("refus") && last.contains("503"),
        "last line: {last}"
    );
    let j = read_json(&json);
    assert_eq!(j["verdict"], "fail");
    assert!(j["refused"]["503"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
    // No --nodes: what answers /metrics at the target (through HAProxy).
    let answered = j["nodes"].as_array().map_or(0, Vec::len);
    assert!(
        answered >= 1,
        "nothing answered /metrics at the target: {j}"
    );
}

#[test]
fn viewers_not_connected_at_the_end_fail_the_board_check() {
    // 60 viewers over two nodes, the first capped at what it holds: once the
    // second is killed, its viewers find no room anywhere and are still
    // away at the end, while every board still on the first node is true.
    let d = deployment_with(&["--max-connections", "40"], &[]);
    let json = temp("gone.json");
    let child = rehearse_command(
        &d,
        &["--viewers", "60", "--sse-share", "0", "--duration", "5"],
        &json,
    )
    .spawn()
    .expect("start rehearse");
    let split = wait_for(Duration::from_secs(20), || {
        let on =
            |i: usize| loadgen::scrape::metric_sum(&d.nodes[i].metrics(), "seatboard_connections");
        let (a, b) = (on(0), on(1));
        (a + b == 60.0 && b > 0.0).then_some((a, b))
    });
    let mut killed = false;
    if split.is_some() {
        d.nodes[1].signal(libc::SIGKILL);
        killed = true;
    }
    let out = child.wait_with_output().expect("rehearse output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        killed,
        "the nodes never held the 60 viewers; stderr: {stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let (a, b) = split.unwrap_or_default();
    let j = read_json(&json);
    let gone = j["short"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|s| s.starts_with("boards:"))
        .unwrap_or_else(|| panic!("no boards: sentence with {b} of 60 viewers gone: {j}"));
    assert!(
        gone.contains("of them on viewers not connected at the end"),
        "{gone}"
    );
    assert!(j["correct"].as_f64().unwrap_or(1.0) < 1.0, "{j}");
    let checked = j["boards"]["checked"].as_u64().unwrap_or(0);
    assert!(
        checked >= 60,
        "every viewer's boards are counted (node A held {a}): {j}"
    );
}

#[test]
fn a_node_whose_redis_link_is_cut_every_second_fails_and_is_named() {
    // The second node reaches Redis through a forwarder the test shuts every
    // second: its pub/sub subscription (and every other link) drops and
    // comes back through the forwarder, over and over.
    let redis = RedisServer::start();
    let cutter = CutProxy::start(redis.port);
    let (direct, cut) = (redis.uri(), cutter.uri());
    let d = deployment_on(redis, [&direct, &cut], &[], &[]);
    let flapping = format!("http://127.0.0.1:{}", d.nodes[1].port);
    wait_for(Duration::from_secs(10), || {
        (metric_value(&d.nodes[1].metrics(), "seatboard_redis_connected") == 1.0).then_some(())
    })
    .expect("the second node reached Redis through the forwarder");
    let json = temp("cut.json");
    let nodes = node_urls(&d);
    let mut child = rehearse_command(&d, &["--nodes", &nodes], &json)
        .spawn()
        .expect("start rehearse");
    let mut cuts = 0;
    let exited = loop {
        cuts += usize::from(cutter.cut() > 0);
        // A cut a second until the rehearsal is over.
        if let Some(status) = wait_for(Duration::from_secs(1), || child.try_wait().ok().flatten()) {
            break status;
        }
        assert!(cuts < 60, "the rehearsal did not stop by itself");
    };
    let out = child.wait_with_output().expect("rehearse output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        cuts >= 3,
        "only {cuts} cuts during the run; stderr: {stderr}"
    );
    assert_eq!(exited.code(), Some(1), "stderr: {stderr}");
    let last = last_line(&out);
    assert!(
        last.contains(&format!("redis: node {flapping} lost its Redis connection")),
        "last line: {last}"
    );
    let steady = format!("http://127.0.0.1:{} ", d.nodes[0].port);
    assert!(!last.contains(&steady), "the steady node named: {last}");
    let j = read_json(&json);
    assert_eq!(j["verdict"], "fail");
    let node = j["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["url"] == flapping.as_str()))
        .expect("the flapping node in the JSON");
    assert!(
        node["redis_reconnects"].as_u64().unwrap_or(0) >= 1,
        "{node}"
    );
}

/// The pids of processes whose parent is `pid` and whose command line holds `word`.
fn children_running(pid: u32, word: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // The parent pid is the second field after the `)` of the name.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            ppid == Some(pid) && String::from_utf8_lossy(&cmdline).contains(word)
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether process `pid` still runs with `word` in its command line.
fn still_running(pid: u32, word: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(word))
}

#[test]
fn viewers_past_one_process_limit_run_in_child_processes_every_board_correct() {
    // Each process may hold 100 viewers: 240 WebSocket viewers in three
    // processes of 80, 60 SSE viewers in a fourth.
    let d = deployment(&[]);
    let json = temp("children.json");
    // The latency target is not what this checks: a loaded box must not fail it.
    let flags = ["--viewers-per-process", "100", "--p99-ms", "60000"];
    let child = rehearse_command(&d, &flags, &json)
        .spawn()
        .expect("start rehearse");
    let pid = child.id();
    let seen = wait_for(Duration::from_secs(20), || {
        Some(children_running(pid, "__rehearse-viewers")).filter(|c| c.len() == 4)
    });
    let out = child.wait_with_output().expect("rehearse output");
    let seen = seen.expect("four viewer processes never ran at once");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = read_json(&json);
    assert_eq!(j["processes"], 4, "{j}");
    assert_eq!(j["viewers"], 300);
    assert_eq!(j["correct"], 1.0, "{j}");
    assert!(j["boards"]["checked"].as_u64().unwrap_or(0) >= 300, "{j}");
    assert!(j["latency_ms"]["p99"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    for c in seen {
        assert!(
            !still_running(c, "__rehearse-viewers"),
            "viewer process {c} outlived the rehearsal"
        );
    }
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
}

#[test]
fn sigint_closes_the_viewers_cleans_up_and_fails_as_interrupted() {
    let d = deployment(&[]);
    let json = temp("sigint.json");
    let mut child = rehearse_command(
        &d,
        &["--viewers-per-process", "100", "--duration", "600"],
        &json,
    )
    .spawn()
    .expect("start rehearse");
    let pid = child.id();
    let seen = wait_for(Duration::from_secs(20), || {
        let publishing = !d
            .redis
            .cli(&["--scan", "--pattern", "seatstate:REHEARSAL-*"])
            .is_empty();
        let kids = children_running(pid, "__rehearse-viewers");
        (publishing && kids.len() == 4).then_some(kids)
    })
    .expect("the rehearsal never published with its four viewer processes");
    // SAFETY: kill(2) on the rehearsal this test started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let exited = wait_for(Duration::from_secs(30), || child.try_wait().ok().flatten())
        .expect("the rehearsal did not stop after SIGINT");
    let out = child.wait_with_output().expect("output");
    assert_eq!(
        exited.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = last_line(&out);
    assert!(last.contains("interrupted: SIGINT"), "last line: {last}");
    for c in seen {
        assert!(
            !still_running(c, "__rehearse-viewers"),
            "viewer process {c} left running"
        );
    }
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
}

#[test]
fn sigterm_cleans_up_as_sigint_does_and_every_state_hash_expires_by_itself() {
    let d = deployment(&[]);
    let json = temp("sigterm.json");
    let mut child = rehearse_command(&d, &["--duration", "600"], &json)
        .spawn()
        .expect("start rehearse");
    let pid = child.id();
    let keys = wait_for(Duration::from_secs(20), || {
        let keys = d
            .redis
            .cli(&["--scan", "--pattern", "seatstate:REHEARSAL-*"]);
        (!keys.is_empty()).then_some(keys)
    })
    .expect("the rehearsal never published");
    // Its duration plus 10 minutes, so a SIGKILL leaves nothing for long.
    for key in keys.lines() {
        let ttl: i64 = d.redis.cli(&["PTTL", key]).parse().unwrap_or(-3);
        assert!(
            (600_000..=1_200_000).contains(&ttl),
            "{key}: PTTL {ttl} ms, want 600 s + 10 min at most"
        );
    }
    // SAFETY: kill(2) on the rehearsal this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exited = wait_for(Duration::from_secs(30), || child.try_wait().ok().flatten())
        .expect("the rehearsal did not stop after SIGTERM");
    let out = child.wait_with_output().expect("output");
    assert_eq!(
        exited.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = last_line(&out);
    assert!(last.contains("interrupted: SIGTERM"), "last line: {last}");
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, flag) in [
        (vec!["--viewers", "0"], "--viewers"),
        // A negative number is a bad value of its flag, not an unknown argument.
        (vec!["--viewers", "-3"], "'-3' for '--viewers"),
        (vec!["--publish-rate", "-1"], "'-1' for '--publish-rate"),
        (vec!["--sse-share", "1.5"], "--sse-share"),
        (
            vec!["--rehearsal-prefix", "bad prefix"],
            "--rehearsal-prefix",
        ),
        (vec!["--jwt-secret", "short"], "--jwt-secret"),
        (vec!["--max-refused", "x"], "--max-refused"),
        // Values whose intervals would not fit a clock: refused, never a panic.
        (vec!["--connect-rate", "1e-300"], "--connect-rate"),
        (vec!["--publish-rate", "1e-300"], "--publish-rate"),
        (vec!["--duration", "1e20"], "--duration"),
        (
            vec!["--json", "/nonexistent-seatboard-dir/r.json"],
            "'--json': cannot write it",
        ),
        (
            vec!["--report", "/nonexistent-seatboard-dir/r.html"],
            "/nonexistent-seatboard-dir/r.html",
        ),
        (vec!["--report", "/"], "'--report'"),
        (
            vec!["--source-addrs", "127.0.0.1,192.0.2.77"],
            "'192.0.2.77' for '--source-addrs'",
        ),
    ] {
        let out = seatboard_command()
            .args(["rehearse", "--target", "http://127.0.0.1:9"])
            .args(&args)
            .output()
            .expect("run rehearse");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains(flag), "{args:?}: first line {first}");
    }
    // Found before anything runs: a writable --json is not even made.
    let json = temp("never.json");
    let out = seatboard_command()
        .args(["rehearse", "--target", "http://127.0.0.1:9", "--json"])
        .arg(&json)
        .args(["--source-addrs", "192.0.2.77"])
        .output()
        .expect("run rehearse");
    assert_eq!(out.status.code(), Some(2));
    assert!(!json.exists(), "{} was written", json.display());
    let out = seatboard_command()
        .args(["rehearse", "--target", "ftp://x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .lines()
        .next()
        .unwrap_or("")
        .contains("--target"));
}

/// Makes a test CA and a server certificate it signed (for localhost and
/// 127.0.0.1) in `dir`; the CA's PEM, and the certificate with its key as
/// one PEM, the form HAProxy's `crt` wants.
fn ca_and_server_pem(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    make_certs(dir);
    let mut both = std::fs::read(dir.join("server.crt")).expect("server.crt");
    both.extend(std::fs::read(dir.join("server.key")).expect("server.key"));
    let pem = dir.join("haproxy.pem");
    std::fs::write(&pem, both).expect("haproxy.pem");
    (dir.join("ca.pem"), pem)
}

#[test]
fn a_deployment_behind_tls_passes_over_https_with_every_board_correct() {
    let (ca, pem) = ca_and_server_pem(&temp("tls-certs"));
    let d = deployment_behind_tls(&pem);
    let port = d.tls_port.expect("a TLS port");
    let target = format!("https://localhost:{port}");
    let json = temp("tls-pass.json");
    // No --nodes: /metrics is scraped at the target, over TLS too. The
    // latency target is not what this checks: a loaded box must not fail it.
    let child = rehearse_command_at(
        &d,
        &target,
        &["--sse-share", "0.3", "--duration", "4", "--p99-ms", "60000"],
        &json,
    )
    .env("SSL_CERT_FILE", &ca)
    .env_remove("SSL_CERT_DIR")
    .spawn()
    .expect("start rehearse");
    // Both kinds of viewer come through TLS: the nodes hold the 90 SSE
    // streams and 210 WebSockets at once.
    let sse = r#"seatboard_connections_by_transport{transport="sse"}"#;
    let ws = r#"seatboard_connections_by_transport{transport="websocket"}"#;
    let held = wait_for(Duration::from_secs(20), || {
        let sum = |m: &str| -> f64 { d.nodes.iter().map(|n| metric_value(&n.metrics(), m)).sum() };
        (sum(sse) == 90.0 && sum(ws) == 210.0).then_some(())
    });
    let out = child.wait_with_output().expect("rehearse output");
    assert!(
        held.is_some(),
        "the nodes never held 90 SSE and 210 WebSocket viewers; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = read_json(&json);
    assert_eq!(j["verdict"], "pass", "{j}");
    assert_eq!(j["correct"], 1.0, "{j}");
    assert_eq!(j["viewers"], 300, "{j}");
    assert!(j["boards"]["checked"].as_u64().unwrap_or(0) >= 300, "{j}");
    assert!(j["latency_ms"]["p99"].as_f64().unwrap_or(0.0) > 0.0, "{j}");
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
    // The nodes' CPU and RSS, read from /metrics over https:// through
    // HAProxy: whichever node answered each scrape has its own series.
    let nodes = j["nodes"].as_array().expect("nodes in the JSON");
    assert!(!nodes.is_empty(), "nothing answered /metrics over TLS: {j}");
    let points: Vec<&Value> = nodes
        .iter()
        .flat_map(|n| n["series"].as_array().into_iter().flatten())
        .collect();
    assert!(points.len() >= 3, "a point a second: {}", j["nodes"]);
    for n in nodes {
        assert_eq!(n["url"], target.as_str(), "{n}");
    }
    for p in &points {
        assert!(p["rss_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{p}");
    }
    assert!(
        points
            .iter()
            .any(|p| p["cpu_pct"].as_f64().unwrap_or(0.0) > 0.0),
        "no node used any CPU: {}",
        j["nodes"]
    );
}

#[test]
fn an_https_target_whose_certificate_does_not_verify_fails_naming_it() {
    let (_, pem) = ca_and_server_pem(&temp("tls-served"));
    // SSL_CERT_FILE trusts another certificate only (a self-signed one),
    // not the test CA that signed the target's.
    let other_dir = temp("tls-other");
    tls_util::self_signed_pem(&other_dir);
    let other_ca = other_dir.join("cert.pem");
    let d = deployment_behind_tls(&pem);
    let port = d.tls_port.expect("a TLS port");
    let target = format!("https://localhost:{port}");
    let json = temp("tls-untrusted.json");
    let out = rehearse_command_at(&d, &target, &[], &json)
        .env("SSL_CERT_FILE", &other_ca)
        .env_remove("SSL_CERT_DIR")
        .output()
        .expect("run rehearse");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let last = last_line(&out);
    assert!(
        last.contains(&format!("tls: {target}: its certificate does not verify"))
            && last.contains("UnknownIssuer")
            && last.contains("SSL_CERT_FILE"),
        "last line: {last}"
    );
    let j = read_json(&json);
    assert_eq!(j["verdict"], "fail");
    assert!(
        j["short"][0].as_str().unwrap_or("").contains("certificate"),
        "{j}"
    );
    // Refused before anything was written: nothing published, nothing left.
    assert_eq!(j["published"], 0, "{j}");
    assert_eq!(d.redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
}

/// A `--target` where nothing answers: no viewer ever connects, and the
/// verdict says where to look.
#[test]
fn a_target_nobody_answers_is_named_as_the_likely_mistake() {
    let redis = RedisServer::start();
    let target = format!("http://127.0.0.1:{}", crate::common::free_port());
    let json = temp("nobody.json");
    let out = seatboard_command()
        .args(["rehearse", "--target", &target])
        .args(["--redis", &redis.uri(), "--jwt-secret", SECRET])
        .args(["--viewers", "3", "--connect-rate", "10", "--courses", "1"])
        .args(["--publish-rate", "5", "--duration", "2"])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run rehearse");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let last = last_line(&out);
    assert!(
        last.contains("no viewer connected: is --target right?"),
        "last line: {last}"
    );
    assert_eq!(redis.cli(&["--scan", "--pattern", "*REHEARSAL-*"]), "");
}
