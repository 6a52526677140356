//! Contract section 1 on the command line itself: a missing or bad flag exits
//! 2 and the first stderr line names it (a missing required flag, a
//! `--session` by the rule `/api/history` reads one by, a `--jwks-ca` that
//! cannot be read with or without `--jwks-url`, an empty `--log-level`); the
//! `--auth none` warning is written whatever the log level; `relay` and
//! `reconcile` log at `info` unless told otherwise, as `serve` does;
//! `demo --help` lists no flag that `demo` ignores.

use crate::common::*;
use crate::tls_util;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// A Redis URI nobody answers (`serve` starts without Redis, degraded).
fn nowhere() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

/// `127.0.0.1:<a free port>`, for `--listen`.
fn listen() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A fresh folder for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("seatboard-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `seatboard <args>` with `env` added and the variables in `unset`
/// removed, expecting it to exit on its own: (exit code, stderr). A process
/// still running after [`T`] is killed and fails the test: it took what it
/// should have refused.
fn run_to_exit(args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> (Option<i32>, String) {
    let mut cmd = seatboard_command();
    for v in unset {
        cmd.env_remove(v);
    }
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn seatboard");
    let status = wait_for(T, || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("seatboard {args:?} {env:?} kept running; it should have refused to start");
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status.and_then(|s| s.code()), err)
}

fn first_line(stderr: &str) -> &str {
    stderr.lines().next().unwrap_or_default()
}

/// Asserts exit 2 and a first stderr line that names `flag` (`'--session`).
fn refused_naming(what: &str, (code, err): (Option<i32>, String), flag: &str) {
    assert_eq!(code, Some(2), "{what}: exit code; stderr:\n{err}");
    let first = first_line(&err);
    assert!(first.contains(flag), "{what}: first line {first:?}");
}

fn output(args: &[&str], unset: &[&str]) -> Output {
    let mut cmd = seatboard_command();
    for v in unset {
        cmd.env_remove(v);
    }
    cmd.args(args).output().expect("run seatboard")
}

#[test]
fn a_missing_required_flag_is_named_on_the_first_stderr_line() {
    let redis = nowhere();
    let unset = [
        "SEATBOARD_PUBLISH_COURSE",
        "SEATBOARD_PUBLISH_TOTAL",
        "SEATBOARD_PUBLISH_TAKEN",
        "SEATBOARD_TOKEN_USER",
        "SEATBOARD_REHEARSE_TARGET",
        "SEATBOARD_RECONCILE_DB",
        "SEATBOARD_RECONCILE_QUERY",
    ];
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["publish", "--section", "1", "--redis", &redis],
            &["--course <COURSE>", "--total <TOTAL>", "--taken <TAKEN>"],
        ),
        (&["token", "--jwt-secret", TEST_SECRET], &["--user <USER>"]),
        (&["rehearse"], &["--target <TARGET>"]),
        (&["reconcile"], &["--db <DB>", "--query <QUERY>"]),
    ];
    for (args, missing) in cases {
        let out = output(args, &unset);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let first = first_line(&err);
        assert!(first.starts_with("error: "), "{args:?}: {first:?}");
        for flag in missing {
            assert!(first.contains(flag), "{args:?}: {flag} not in {first:?}");
        }
        // The usage shown is the subcommand's: a flag given is not made to
        // look required.
        let usage = err
            .lines()
            .find(|l| l.starts_with("Usage: "))
            .unwrap_or_default();
        assert!(usage.contains("[OPTIONS]"), "{args:?}: {usage:?}");
    }
    let out = output(&["token", "--jwt-secret", TEST_SECRET], &unset);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Usage: seatboard token [OPTIONS] --user <USER>\n"),
        "{err}"
    );
    assert!(!err.contains("--jwt-secret"), "{err}");
}

/// What a case is called, its flags and its variables.
type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);

/// A `--listen` address this host does not have is a bad value: exit 2,
/// the first line naming the flag (a port already held stays a failure to
/// start, exit 1).
#[test]
fn a_listen_address_this_host_lacks_is_refused_naming_the_flag() {
    let redis = nowhere();
    let addr = format!("192.0.2.1:{}", free_port());
    for cmd in [
        vec![
            "serve", "--auth", "none", "--redis", &redis, "--listen", &addr,
        ],
        vec!["demo", "--listen", &addr],
    ] {
        let got = run_to_exit(&cmd, &[], &["SEATBOARD_LISTEN", "SEATBOARD_AUTH"]);
        refused_naming(&format!("{cmd:?}"), got, "'--listen'");
    }
}

/// `--auth none` takes no key, but a key flag given a bad value is refused
/// as `--auth jwt` would refuse it (exit 2 naming it), flag or variable.
#[test]
fn auth_none_refuses_a_bad_jwks_url_or_public_key_as_jwt_would() {
    let redis = nowhere();
    let unset = [
        "SEATBOARD_JWT_SECRET",
        "SEATBOARD_JWKS_URL",
        "SEATBOARD_JWT_PUBLIC_KEY",
        "SEATBOARD_AUTH",
    ];
    let l = listen();
    let base = ["serve", "--listen", &l, "--redis", &redis, "--auth", "none"];
    let jwks: [Case; 2] = [
        ("ftp", vec!["--jwks-url", "ftp://x/jwks"], vec![]),
        (
            "plain http elsewhere",
            vec![],
            vec![("SEATBOARD_JWKS_URL", "http://192.0.2.1/jwks")],
        ),
    ];
    let pem: [Case; 2] = [
        (
            "a missing key file",
            vec!["--jwt-public-key", "/nonexistent/seatboard/key.pem"],
            vec![],
        ),
        (
            "a key file with no key",
            vec![],
            vec![("SEATBOARD_JWT_PUBLIC_KEY", "/dev/null")],
        ),
    ];
    let cases = jwks
        .into_iter()
        .map(|c| (c, "'--jwks-url'"))
        .chain(pem.into_iter().map(|c| (c, "'--jwt-public-key'")));
    for ((what, extra, env), flag) in cases {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let got = run_to_exit(&args, &env, &unset);
        refused_naming(what, got, flag);
    }
}

#[test]
fn serve_refuses_a_jwks_ca_it_cannot_use_with_or_without_jwks_url() {
    let dir = scratch("jwks-ca");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "no certificate here\n").expect("junk file");
    let junk = junk.to_string_lossy().into_owned();
    let missing = "/nonexistent/seatboard/ca.pem";
    let redis = nowhere();
    let unset = [
        "SEATBOARD_JWT_SECRET",
        "SEATBOARD_JWKS_URL",
        "SEATBOARD_JWKS_CA",
        "SEATBOARD_AUTH",
    ];
    for file in [missing, junk.as_str()] {
        let l = listen();
        let base = ["serve", "--listen", &l, "--redis", &redis];
        let cases: [Case; 4] = [
            (
                "a secret",
                vec!["--jwt-secret", TEST_SECRET, "--jwks-ca", file],
                vec![],
            ),
            (
                "--auth none",
                vec!["--auth", "none", "--jwks-ca", file],
                vec![],
            ),
            (
                "SEATBOARD_JWKS_CA",
                vec!["--jwt-secret", TEST_SECRET],
                vec![("SEATBOARD_JWKS_CA", file)],
            ),
            (
                "--jwks-url",
                vec!["--jwks-url", "http://127.0.0.1:9/jwks", "--jwks-ca", file],
                vec![],
            ),
        ];
        for (what, extra, env) in cases {
            let args: Vec<&str> = base.iter().copied().chain(extra).collect();
            let got = run_to_exit(&args, &env, &unset);
            refused_naming(&format!("{what}, {file}"), got, "'--jwks-ca'");
        }
    }
    // A usable bundle without a --jwks-url is taken.
    tls_util::make_certs(&dir);
    let ca = dir.join("ca.pem").to_string_lossy().into_owned();
    let mut sb = Seatboard::spawn_on(
        free_port(),
        &[
            "serve",
            "--redis",
            &redis,
            "--jwt-secret",
            TEST_SECRET,
            "--jwks-ca",
            &ca,
            "--log-level",
            "warn",
        ],
        &[],
        None,
    );
    assert!(
        sb.wait_answer("/healthz", T, |r| r.status == 200),
        "serve with a usable --jwks-ca did not start"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_command_refuses_a_session_id_history_would_refuse() {
    let redis = nowhere();
    let long = "s".repeat(129);
    let bad = ["", "bad session!", "a/b", long.as_str()];
    let l = listen();
    let commands: [&[&str]; 3] = [
        &["serve", "--listen", &l, "--auth", "none", "--redis", &redis],
        &["analytics", "--redis", &redis],
        &["analytics", "report", "--redis", &redis],
    ];
    for cmd in commands {
        for value in bad {
            let args: Vec<&str> = cmd.iter().copied().chain(["--session", value]).collect();
            let got = run_to_exit(&args, &[], &["SEATBOARD_SESSION"]);
            refused_naming(&format!("{cmd:?} --session {value:?}"), got, "'--session");
            let got = run_to_exit(cmd, &[("SEATBOARD_SESSION", value)], &[]);
            refused_naming(
                &format!("{cmd:?} SEATBOARD_SESSION={value:?}"),
                got,
                "'--session",
            );
        }
    }
    // The longest, with every kind of character the rule takes, is served.
    let good = format!("fall-2025:main_1.{}", "a".repeat(110));
    let sb = Seatboard::start(&[
        "serve",
        "--auth",
        "none",
        "--redis",
        &redis,
        "--session",
        &good,
    ]);
    let r = http_get(sb.port, "/api/history?role=admin").expect("GET /api/history");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains(&good), "{}", r.body);
}

/// `serve --auth none --log-level <level>` with stderr into `file` and
/// `env` added (`JOURNAL_STREAM` removed unless given).
fn serve_auth_none(level: &str, file: &std::path::Path, env: &[(&str, &str)]) -> Child {
    let err = std::fs::File::create(file).expect("stderr file");
    seatboard_command()
        .args(["serve", "--auth", "none", "--log-level", level])
        .args(["--listen", &listen(), "--redis", &nowhere()])
        .env_remove("JOURNAL_STREAM")
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::from(err))
        .spawn()
        .expect("spawn seatboard")
}

/// The `AUTH DISABLED` line `child` writes into `file`, once it is there.
fn auth_warning(mut child: Child, file: &std::path::Path) -> Option<String> {
    let line = wait_for(T, || {
        let text = std::fs::read_to_string(file).ok()?;
        text.lines()
            .find(|l| l.contains("AUTH DISABLED"))
            .map(str::to_owned)
            .or_else(|| child.try_wait().ok().flatten().map(|_| String::new()))
    });
    let _ = child.kill();
    let _ = child.wait();
    line.filter(|l| !l.is_empty())
}

#[test]
fn the_auth_none_warning_is_written_at_every_log_level() {
    let dir = scratch("loud");
    let file = dir.join("stderr");
    let mut shapes = Vec::new();
    for level in [
        "info",
        "warn",
        "error",
        "off",
        "seatboard=off",
        "off,seatboard::loud=off",
    ] {
        let child = serve_auth_none(level, &file, &[]);
        let line = auth_warning(child, &file)
            .unwrap_or_else(|| panic!("--log-level {level}: no AUTH DISABLED line"));
        // `<timestamp>  WARN AUTH DISABLED ...`, as any other warning.
        let (stamp, rest) = line.split_once(' ').unwrap_or_default();
        assert!(
            stamp.ends_with('Z') && stamp.contains('T'),
            "{level}: {line:?}"
        );
        assert!(
            rest.trim_start().starts_with("WARN AUTH DISABLED"),
            "{level}: {line:?}"
        );
        shapes.push(rest.to_owned());
    }
    assert!(shapes.windows(2).all(|w| w[0] == w[1]), "{shapes:?}");
    // Under the journal it is filed as a warning, also at `off`.
    std::fs::File::create(&file).expect("stderr file");
    let meta = std::fs::metadata(&file).expect("stat");
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("stderr file");
    let child = seatboard_command()
        .args(["serve", "--auth", "none", "--log-level", "off"])
        .args(["--listen", &listen(), "--redis", &nowhere()])
        .env("JOURNAL_STREAM", &stream)
        .stdout(Stdio::null())
        .stderr(Stdio::from(err))
        .spawn()
        .expect("spawn seatboard");
    let line = auth_warning(child, &file).expect("the warning under the journal");
    assert!(line.starts_with("<4>"), "{line:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn relay_and_reconcile_log_at_info_unless_told_as_serve_does() {
    let dir = scratch("levels");
    let sock = dir.join("relay.sock");
    let sock = sock.to_str().expect("UTF-8 path");
    let db = format!("postgres://u:p@127.0.0.1:{}/x", free_port());
    let query = "SELECT course, section, total_seats, seats_taken, version, updated_at FROM t WHERE updated_at >= $1";
    let runs: [(&str, Vec<&str>); 2] = [
        ("seatboard relay running", vec!["relay", "--socket", sock]),
        (
            "seatboard reconcile running",
            vec!["reconcile", "--db", &db, "--query", query],
        ),
    ];
    let redis = nowhere();
    for (running, args) in &runs {
        for (level, shown) in [(None, true), (Some("warn"), false)] {
            let file = dir.join("stderr");
            let err = std::fs::File::create(&file).expect("stderr file");
            let metrics = free_port();
            let mut cmd = seatboard_command();
            cmd.args(args)
                .args(["--redis", &redis])
                .args(["--metrics", &format!("127.0.0.1:{metrics}")])
                .env_remove("SEATBOARD_LOG");
            if let Some(l) = level {
                cmd.args(["--log-level", l]);
            }
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::from(err))
                .spawn()
                .expect("spawn seatboard");
            let up = wait_for(T, || {
                testkit::scrape::get_ok(metrics, "/healthz", Duration::from_secs(1))
            });
            // SAFETY: kill(2) on the child this test started.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let status = wait_for(T, || child.try_wait().ok().flatten());
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            assert!(up.is_some(), "{args:?} {level:?}: /healthz never answered");
            assert_eq!(status.and_then(|s| s.code()), Some(0), "{args:?} {level:?}");
            // Everything it logged is in the file once it has exited.
            let text = std::fs::read_to_string(&file).expect("stderr");
            assert_eq!(text.contains(running), shown, "{args:?} {level:?}:\n{text}");
        }
    }
}

/// `seatboard publish` of one section to `redis`.
fn publish_one(redis: &str) -> [&str; 11] {
    [
        "publish",
        "--course",
        "CS101",
        "--section",
        "1",
        "--total",
        "4",
        "--taken",
        "1",
        "--redis",
        redis,
    ]
}

#[test]
fn an_empty_log_level_is_refused_by_every_command() {
    let redis = nowhere();
    let l = listen();
    let commands: [&[&str]; 4] = [
        &["serve", "--listen", &l, "--auth", "none", "--redis", &redis],
        &["analytics", "--redis", &redis],
        &["simulate", "--duration", "1", "--redis", &redis],
        &publish_one(&redis),
    ];
    for cmd in commands {
        for value in ["", " ", ","] {
            let args: Vec<&str> = cmd.iter().copied().chain(["--log-level", value]).collect();
            let got = run_to_exit(&args, &[], &["SEATBOARD_LOG"]);
            refused_naming(
                &format!("{cmd:?} --log-level {value:?}"),
                got,
                "'--log-level'",
            );
        }
        let got = run_to_exit(cmd, &[("SEATBOARD_LOG", "")], &[]);
        refused_naming(&format!("{cmd:?} SEATBOARD_LOG="), got, "'--log-level'");
    }
}

#[test]
fn empty_or_overlapping_key_prefixes_and_a_zero_connection_cap_are_refused() {
    let redis = nowhere();
    let l = listen();
    let serve: &[&str] = &["serve", "--listen", &l, "--auth", "none", "--redis", &redis];
    let analytics: &[&str] = &["analytics", "--redis", &redis];
    let publish: &[&str] = &publish_one(&redis);
    let cases: [(&[&str], &[&str], &str); 9] = [
        (serve, &["--channel-prefix", ""], "'--channel-prefix"),
        (serve, &["--state-prefix", ""], "'--state-prefix"),
        (serve, &["--presence-prefix", ""], "'--presence-prefix"),
        // Presence keys would be state hashes (every presence write a
        // WRONGTYPE), or a SCAN of one would find the other's keys.
        (
            serve,
            &["--presence-prefix", "seatstate:"],
            "'--presence-prefix",
        ),
        (serve, &["--presence-prefix", "seat"], "'--presence-prefix"),
        (serve, &["--max-connections", "0"], "'--max-connections"),
        (
            analytics,
            &["--state-prefix", "p:", "--presence-prefix", "p:x"],
            "'--presence-prefix",
        ),
        (
            analytics,
            &["--rehearsal-prefix", ""],
            "'--rehearsal-prefix",
        ),
        (publish, &["--state-prefix", ""], "'--state-prefix"),
    ];
    for (cmd, flags, named) in cases {
        let args: Vec<&str> = cmd.iter().chain(flags).copied().collect();
        let got = run_to_exit(&args, &[], &[]);
        refused_naming(&format!("{args:?}"), got, named);
    }
    let got = run_to_exit(serve, &[("SEATBOARD_PRESENCE_PREFIX", "seatstate:")], &[]);
    refused_naming(
        "SEATBOARD_PRESENCE_PREFIX=seatstate:",
        got,
        "'--presence-prefix",
    );
}

#[test]
fn demo_help_lists_no_flag_demo_ignores_and_demo_never_signs_on() {
    let help = |sub: &str| {
        let out = output(&[sub, "--help"], &[]);
        assert!(out.status.success(), "{sub} --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (demo, serve) = (help("demo"), help("serve"));
    let ignored = [
        "--auth <",
        "--jwt-secret",
        "--jwks-url",
        "--jwks-ca",
        "--jwt-public-key",
        "--jwt-issuer",
        "--jwt-audience",
        "--jwt-role-claim",
        "--redis <",
        "--redis-mode",
        "--pubsub",
        "--redis-ca",
        "--channel-prefix",
        "--state-prefix",
        "--presence-prefix",
        "--analytics-prefix",
    ];
    for flag in ignored {
        assert!(serve.contains(flag), "serve --help lists {flag}");
        assert!(!demo.contains(flag), "demo --help lists {flag}:\n{demo}");
    }
    for flag in [
        "--listen",
        "--shards",
        "--tick-ms",
        "--session",
        "--log-level",
    ] {
        assert!(demo.contains(flag), "demo --help lists {flag}");
    }
    // Given a key, the demo still runs without sign-on.
    let sb = Seatboard::start(&["demo", "--jwt-secret", TEST_SECRET, "--auth", "jwt"]);
    assert!(
        ws_connect(sb.port, "/ws?user=ada").is_ok(),
        "no token needed"
    );
}

#[test]
fn a_short_secret_is_refused_under_auth_none_too() {
    let redis = nowhere();
    let unset = ["SEATBOARD_JWT_SECRET", "SEATBOARD_AUTH"];
    let l = listen();
    let base = ["serve", "--listen", &l, "--redis", &redis, "--auth", "none"];
    let flag: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--jwt-secret", "short"])
        .collect();
    refused_naming("flag", run_to_exit(&flag, &[], &unset), "--jwt-secret");
    let env = [("SEATBOARD_JWT_SECRET", "short")];
    refused_naming("variable", run_to_exit(&base, &env, &unset), "--jwt-secret");
}
