//! Contract section 1: every flag of every subcommand has an environment
//! twin, and a flag wins over its variable. Read from each subcommand's
//! `--help` (clap lists a flag's variable as `[env: NAME=]`), and tried on
//! `seatboard token`, whose output shows what it was given.

use crate::common;
use common::*;

/// Every subcommand a user runs, as its words on the command line.
const SUBCOMMANDS: &[&[&str]] = &[
    &["serve"],
    &["demo"],
    &["analytics"],
    &["analytics", "report"],
    &["publish"],
    &["simulate"],
    &["publish-script"],
    &["rehearse"],
    &["relay"],
    &["reconcile"],
    &["token"],
];

/// The flags a `--help` text lists (its own `--help` and `--version`
/// aside), and those of them without an environment variable.
fn flags_without_a_twin(help: &str) -> (usize, Vec<String>) {
    let mut out = Vec::new();
    let mut seen = 0;
    let mut entry: Option<(String, String)> = None;
    let mut done = |e: Option<(String, String)>, out: &mut Vec<String>| {
        if let Some((flag, text)) = e {
            let own = flag == "--help" || (flag == "--version" && text.contains("Print version"));
            seen += usize::from(!own);
            if !own && !text.contains("[env: ") {
                out.push(flag);
            }
        }
    };
    for line in help.lines() {
        let t = line.trim_start();
        let flag = t
            .strip_prefix("-")
            .and_then(|_| t.split_whitespace().find(|w| w.starts_with("--")))
            .filter(|_| line.starts_with("  "));
        match flag {
            Some(f) => {
                done(entry.take(), &mut out);
                let name: String = f
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                entry = Some((name, line.to_string()));
            }
            None => {
                if let Some((_, text)) = entry.as_mut() {
                    text.push('\n');
                    text.push_str(line);
                }
            }
        }
    }
    done(entry.take(), &mut out);
    (seen, out)
}

#[test]
fn every_flag_of_every_subcommand_has_an_environment_twin() {
    let mut missing = Vec::new();
    let mut flags = 0;
    for words in SUBCOMMANDS {
        let out = seatboard_command()
            .args(*words)
            .arg("--help")
            .output()
            .expect("run --help");
        assert!(out.status.success(), "{words:?} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        let (seen, without) = flags_without_a_twin(&help);
        // `publish-script` takes none.
        assert!(
            seen > 0 || words == &["publish-script"],
            "{words:?} --help lists no flag"
        );
        flags += seen;
        for f in without {
            missing.push(format!("{} {f}", words.join(" ")));
        }
    }
    // serve alone has over 40.
    assert!(flags > 100, "every flag was read: {flags}");
    assert!(missing.is_empty(), "flags without a variable: {missing:?}");
}

#[test]
fn the_reader_of_help_texts_finds_a_flag_without_a_variable() {
    let help = "Options:\n      --user <USER>\n          User id [env: SEATBOARD_TOKEN_USER=]\n      --ttl <TTL>\n          Lifetime\n\n          [default: 1h]\n  -h, --help\n          Print help\n";
    assert_eq!(flags_without_a_twin(help), (2, vec!["--ttl".to_string()]));
}

/// The claims of the token `seatboard token` prints with `args` and `env`.
fn token_claims(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let out = seatboard_command()
        .arg("token")
        .args(args)
        .envs(env.iter().copied())
        .env(
            "SEATBOARD_JWT_SECRET",
            "an-env-twin-test-secret-of-32-bytes!",
        )
        .output()
        .expect("run token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let claims = token.split('.').nth(1).expect("a JWT");
    let raw = base64_url_decode(claims);
    serde_json::from_slice(&raw).expect("claims JSON")
}

fn base64_url_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .expect("base64url")
}

#[test]
fn a_variable_sets_a_flag_and_the_flag_wins_over_it() {
    let env = [
        ("SEATBOARD_TOKEN_USER", "from-env"),
        ("SEATBOARD_TOKEN_ROLE", "admin"),
        ("SEATBOARD_TOKEN_TTL", "2h"),
    ];
    let c = token_claims(&[], &env);
    assert_eq!(
        (c["sub"].as_str(), c["role"].as_str()),
        (Some("from-env"), Some("admin"))
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let ttl = c["exp"].as_u64().expect("exp").saturating_sub(now);
    assert!((7000..=7300).contains(&ttl), "2h from the variable: {ttl}");
    let c = token_claims(
        &["--user", "from-flag", "--role", "student", "--ttl", "60"],
        &env,
    );
    assert_eq!(
        (c["sub"].as_str(), c["role"].as_str()),
        (Some("from-flag"), Some("student"))
    );
    let ttl = c["exp"].as_u64().expect("exp").saturating_sub(now);
    assert!(ttl <= 120, "the flag's 60 s: {ttl}");
}
