//! The state hash's compare-and-set (PROTOCOL section 2): one Lua script on one
//! key, run with `EVALSHA` and loaded again after `NOSCRIPT`, so the hash never
//! goes backwards when publishers race.

use sha1::{Digest, Sha1};
use shards::Snapshot;
use std::sync::OnceLock;

/// The script's text, as `seatboard publish-script` prints it.
pub const SOURCE: &str = include_str!("script.lua");

/// The script's SHA1 in lowercase hex, the name `EVALSHA` runs it by.
pub fn sha1_hex() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| {
        Sha1::digest(SOURCE.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    })
}

/// The compare-and-set call for one snapshot: `EVALSHA` by default, `EVAL`
/// with the full text when the server lost the script (`NOSCRIPT`); `EVAL`
/// caches it again on the node that runs it.
pub fn cmd(state_prefix: &str, s: &Snapshot, payload: &str, full_text: bool) -> ::redis::Cmd {
    let mut c = if full_text {
        let mut c = ::redis::cmd("EVAL");
        c.arg(SOURCE);
        c
    } else {
        let mut c = ::redis::cmd("EVALSHA");
        c.arg(sha1_hex());
        c
    };
    c.arg(1)
        .arg(format!("{state_prefix}{}", s.course))
        .arg(s.section)
        .arg(payload)
        .arg(s.version.map(|v| v.to_string()).unwrap_or_default());
    c
}
