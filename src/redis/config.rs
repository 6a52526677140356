//! The Redis flags every subcommand that talks to Redis takes (contract §1),
//! each with its environment twin.

use super::error::{ConfigError, Target, Which};
use clap::{Args, ValueEnum};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
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

/// The seeds of a `--redis` value, checked. An error names the flag and
/// never quotes the value: a password holding `/`, `?`, `#`, `,` or `@`
/// defeats any attempt to find it in a URI that does not parse, so a seed is
/// shown only from its parsed parts ([`Target`]), or by its position
/// ([`Which`]).
pub fn seeds(value: &str) -> Result<Vec<ConnectionInfo>, ConfigError> {
    let uris: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let n = uris.len();
    let mut seeds = Vec::with_capacity(n);
    for (i, uri) in uris.iter().enumerate() {
        let which = Which {
            index: i + 1,
            of: n,
        };
        let info = uri
            .into_connection_info()
            .map_err(|e| ConfigError::NotAUrl {
                which,
                reason: safe_reason(&e),
            })?;
        match info.addr() {
            ConnectionAddr::Tcp(..) => {}
            ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err(ConfigError::Insecure {
                    target: target(&info).ok_or(ConfigError::Scheme { which })?,
                })
            }
            ConnectionAddr::TcpTls { .. } => {}
            _ => return Err(ConfigError::Scheme { which }),
        }
        seeds.push(info);
    }
    let Some(first) = seeds.first() else {
        return Err(ConfigError::Empty);
    };
    let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
    for s in &seeds {
        if matches!(s.addr(), ConnectionAddr::TcpTls { .. }) != tls {
            return Err(ConfigError::MixedTls);
        }
        let (a, b) = (s.redis_settings(), first.redis_settings());
        if a.username() != b.username() || a.password() != b.password() {
            return Err(ConfigError::CredentialsDiffer);
        }
    }
    Ok(seeds)
}

/// The driver's reason without its detail (a detail may quote the URI).
fn safe_reason(e: &redis::RedisError) -> String {
    let text = e.to_string();
    match (e.detail(), text.split_once(" - ")) {
        (None, Some((desc, _))) => desc.to_string(),
        _ => "it does not parse".to_string(),
    }
}

/// A parsed seed as an error may show it: no credential.
fn target(info: &ConnectionInfo) -> Option<Target> {
    let r = info.redis_settings();
    let credentials = r.username().is_some() || r.password().is_some();
    let (tls, host, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (false, host, port),
        ConnectionAddr::TcpTls { host, port, .. } => (true, host, port),
        _ => return None,
    };
    Some(Target {
        tls,
        host: host.clone(),
        port: *port,
        credentials,
    })
}

/// A key, channel or course-code prefix: never empty (an empty one matches
/// every Redis key, every channel, or every course).
pub fn prefix(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("a prefix must not be empty: it would match every Redis key, channel or course".into())
    } else {
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::seeds;

    /// Characters a generated password holds that a URI cannot carry raw.
    const AWKWARD: &str = "/?#,@:%+=&; '\"\\[]{}$!*|<>^`~";

    #[test]
    fn a_refused_value_never_shows_a_password() {
        for c in AWKWARD.chars() {
            let pw = format!("Pw{c}S3cret{c}x");
            for uri in [
                format!("redis://:{pw}@127.0.0.1:70000"),
                format!("redis://svc:{pw}@127.0.0.1:6379/notadb"),
                format!("http://:{pw}@127.0.0.1:6379"),
                format!("rediss://:{pw}@127.0.0.1:6380/#insecure"),
                format!("redis://:{pw}@10.0.0.1:6379,rediss://:{pw}@10.0.0.2:6379"),
            ] {
                let Err(e) = seeds(&uri) else {
                    // Some characters make a valid URI of it: nothing shown then.
                    continue;
                };
                let e = e.to_string();
                assert!(e.starts_with("invalid value for '--redis'"), "{e}");
                assert!(!e.contains("S3cret"), "{uri} gave: {e}");
            }
        }
    }

    #[test]
    fn seeds_are_shown_from_their_parsed_parts() {
        let e = seeds("rediss://u:p4ss@h.example:6380/#insecure")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rediss://***@h.example:6380"), "{e}");
        assert!(!e.contains("p4ss"), "{e}");
        let e = seeds("redis://a:1,redis://b:2,redis://:x/y@c:3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("URI 3 of 3"), "{e}");
        assert!(e.contains("percent-encoded"), "{e}");
        assert_eq!(
            seeds("redis://u:p%2Fq@127.0.0.1:1").map(|s| s.len()).ok(),
            Some(1)
        );
    }
}

/// Where the publishing subcommands write: Redis and the two publishing prefixes.
#[derive(Args, Debug, Clone)]
pub struct RedisTarget {
    /// Redis: URIs, mode, pub/sub flavour, CA.
    #[command(flatten)]
    pub redis: RedisFlags,
    /// Pub/sub channel prefix.
    #[arg(long, env = "SEATBOARD_CHANNEL_PREFIX", default_value = "seats:", value_parser = prefix)]
    pub channel_prefix: String,
    /// State hash prefix.
    #[arg(long, env = "SEATBOARD_STATE_PREFIX", default_value = "seatstate:", value_parser = prefix)]
    pub state_prefix: String,
}
