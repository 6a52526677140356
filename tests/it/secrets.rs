//! No secret in any error line (contract section 1: a bad flag exits 2
//! naming it): a `--redis` URI that does not parse, or is refused, is never
//! echoed, whatever its password holds, given as the flag or as
//! `REALTIME_REDIS_URI`, for every subcommand that talks to Redis.

use crate::common::seatboard_command;
use std::process::Output;

/// Characters a generated password may hold that a URI cannot carry raw
/// (and some it can).
const AWKWARD: &str = "/?#,@:%+=&; '\"\\[]{}$!*|<>^`~é";

/// What marks the password in the output.
const CORE: &str = "S3cretCore";

/// Each subcommand that takes `--redis`, with the flags it needs to get as
/// far as checking it.
fn commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["serve", "--listen", "127.0.0.1:0", "--auth", "none"],
        vec!["publish", "--course", "CS101", "--section", "1"]
            .into_iter()
            .chain(["--total", "4", "--taken", "1"])
            .collect(),
        vec!["simulate", "--duration", "1"],
        vec!["analytics"],
        vec!["rehearse", "--target", "http://127.0.0.1:9"],
    ]
}

/// A bad URI around `pw`: an impossible port, or `#insecure` (refused).
fn bad_uri(pw: &str, i: usize) -> String {
    if i % 2 == 0 {
        format!("redis://:{pw}@127.0.0.1:70000")
    } else {
        format!("rediss://svc:{pw}@127.0.0.1:6380/#insecure")
    }
}

fn check(out: &Output, what: &str) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    let first = stderr.lines().next().unwrap_or("");
    assert!(first.contains("'--redis'"), "{what}: first line {first}");
    assert!(
        !stderr.contains(CORE) && !stdout.contains(CORE),
        "{what}: the password shows:\n{stderr}{stdout}"
    );
}

#[test]
fn a_bad_redis_uri_is_refused_without_its_password_by_every_command() {
    for args in commands() {
        for (i, c) in AWKWARD.chars().enumerate() {
            let pw = format!("p{c}{CORE}{c}w");
            let uri = bad_uri(&pw, i);
            let out = seatboard_command()
                .args(&args)
                .args(["--redis", &uri])
                .env_remove("REALTIME_REDIS_URI")
                .output()
                .expect("run seatboard");
            check(&out, &format!("{} --redis {uri}", args[0]));
            let out = seatboard_command()
                .args(&args)
                .env("REALTIME_REDIS_URI", &uri)
                .output()
                .expect("run seatboard");
            check(&out, &format!("{} REALTIME_REDIS_URI={uri}", args[0]));
        }
    }
}
