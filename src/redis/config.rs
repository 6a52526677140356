//! The Redis flags every subcommand that talks to Redis takes (contract §1),
//! each with its environment twin.

use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Which Redis deployment seatboard talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    /// One Redis (with or without replicas behind it).
    Standalone,
    /// A Redis Cluster: keys routed by slot, sharded or classic pub/sub.
    Cluster,
    /// Cluster when the first reachable node reports `cluster_enabled:1`.
    Auto,
}

/// How pub/sub is done in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PubSubMode {
    /// `SPUBLISH`/`SSUBSCRIBE` on the primary owning the channel's slot.
    Sharded,
    /// `PUBLISH`/`SUBSCRIBE`/`PSUBSCRIBE` on one node (broadcast by the cluster).
    Classic,
}

/// `--redis`, `--redis-mode`, `--pubsub`, `--redis-ca`.
#[derive(Args, Debug, Clone)]
pub struct RedisFlags {
    /// Redis URI (`redis://` or `rediss://` for TLS; user/password sent with AUTH);
    /// in cluster mode a comma-separated list of seed nodes.
    #[arg(
        long,
        env = "REALTIME_REDIS_URI",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub redis: String,
    /// standalone, cluster, or auto (cluster when the first reachable node has cluster_enabled:1).
    #[arg(
        long,
        env = "SEATBOARD_REDIS_MODE",
        value_enum,
        default_value = "auto",
        global = true
    )]
    pub redis_mode: RedisMode,
    /// Pub/sub in cluster mode: sharded (SPUBLISH/SSUBSCRIBE) or classic (PUBLISH/SUBSCRIBE).
    #[arg(
        long,
        env = "SEATBOARD_PUBSUB",
        value_enum,
        default_value = "sharded",
        global = true
    )]
    pub pubsub: PubSubMode,
    /// PEM bundle that verifies a `rediss://` server (default: the system roots).
    #[arg(long, env = "SEATBOARD_REDIS_CA", global = true)]
    pub redis_ca: Option<PathBuf>,
}

impl RedisFlags {
    /// The defaults (auto mode, sharded pub/sub, system roots) for one URI list.
    pub fn new(redis: &str) -> RedisFlags {
        RedisFlags {
            redis: redis.to_owned(),
            redis_mode: RedisMode::Auto,
            pubsub: PubSubMode::Sharded,
            redis_ca: None,
        }
    }
}

/// `text` with the password of every URI in `uris` (a `--redis` value)
/// replaced by `***`, as written and percent-decoded: an error or log line
/// that quotes a URI or a driver's message never shows a credential.
pub fn redact(text: &str, uris: &str) -> String {
    let mut out = text.to_owned();
    for uri in uris.split(',') {
        let Some(password) = password_of(uri.trim()) else {
            continue;
        };
        let decoded = percent_decode(password);
        for p in [password, decoded.as_str()] {
            if !p.is_empty() {
                out = out.replace(p, "***");
            }
        }
    }
    out
}

/// The password part of `scheme://[user]:password@host...`, if there is one.
fn password_of(uri: &str) -> Option<&str> {
    let rest = &uri[uri.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    Some(match userinfo.find(':') {
        Some(i) => &userinfo[i + 1..],
        // `redis://secret@host`: a lone user part may be a password too.
        None => userinfo,
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_shown() {
        let uris = "rediss://svc:S3cr%2Ft@redis.example.net:6380,redis://:other@10.0.0.2:7000";
        let msg = format!("invalid value '{uris}' for '--redis': bad (pw S3cr/t)");
        let shown = redact(&msg, uris);
        assert!(!shown.contains("S3cr"), "{shown}");
        assert!(!shown.contains("other"), "{shown}");
        assert!(
            shown.contains("rediss://svc:***@redis.example.net:6380"),
            "{shown}"
        );
        assert!(shown.contains("redis://:***@10.0.0.2:7000"), "{shown}");
        assert_eq!(
            redact("no secret here", "redis://127.0.0.1:6379"),
            "no secret here"
        );
        assert_eq!(redact("x tok y", "redis://tok@h:1"), "x *** y");
    }
}
