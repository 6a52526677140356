//! The Redis layer's errors: a refused `--redis`/`--redis-ca` value
//! ([`ConfigError`], a usage error), a bad CA bundle ([`TrustError`]) and a
//! failed connect or command ([`Error`]). A seed appears in them only as its
//! parsed target ([`Target`]: scheme, host, port, whether credentials were
//! given) or by its position ([`Which`]): no variant holds a password or a
//! whole URI, so none can show one.

use std::fmt;
use std::path::PathBuf;

/// How a `--redis` URI is written.
pub const FORM: &str =
    "redis[s]://[[user]:password@]host[:port][/db], comma-separated in cluster mode, \
with / ? # , @ : % in a password percent-encoded (%2F %3F %23 %2C %40 %3A %25)";

/// Which URI of a `--redis` list an error is about, by position only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Which {
    /// Position from 1.
    pub index: usize,
    /// How many URIs the value holds.
    pub of: usize,
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.of == 1 {
            f.write_str("the URI")
        } else {
            write!(f, "URI {} of {}", self.index, self.of)
        }
    }
}

/// A parsed seed as an error may show it: `***@` marks credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `rediss://` rather than `redis://`.
    pub tls: bool,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Whether the URI carried a user or a password (never which).
    pub credentials: bool,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let auth = if self.credentials { "***@" } else { "" };
        write!(f, "{scheme}://{auth}{}:{}", self.host, self.port)
    }
}

/// Why a `--redis` or `--redis-ca` value was refused (exit 2, naming the flag).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A URI the driver could not parse; `reason` is the driver's description
    /// without its detail (a detail may quote the URI).
    #[error("invalid value for '--redis': {which} is not a Redis URL ({reason}): {FORM}")]
    NotAUrl {
        /// Which URI.
        which: Which,
        /// The driver's short reason.
        reason: String,
    },
    /// `rediss://...#insecure`: certificate checks off, refused.
    #[error("invalid value for '--redis': {target}: #insecure is not supported")]
    Insecure {
        /// The seed, redacted.
        target: Target,
    },
    /// A URI of another scheme (`unix://`...).
    #[error("invalid value for '--redis': {which}: use redis:// or rediss://")]
    Scheme {
        /// Which URI.
        which: Which,
    },
    /// An empty value.
    #[error("invalid value for '--redis': no URI: {FORM}")]
    Empty,
    /// Some seeds with TLS, some without.
    #[error("invalid value for '--redis': mixes redis:// and rediss://")]
    MixedTls,
    /// Seeds with different users or passwords.
    #[error("invalid value for '--redis': the seeds' credentials differ")]
    CredentialsDiffer,
    /// The `--redis-ca` file could not be read.
    #[error("invalid value '{}' for '--redis-ca': {source}", path.display())]
    CaUnreadable {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The `--redis-ca` file holds no usable certificate.
    #[error("invalid value '{}' for '--redis-ca': {source}", path.display())]
    CaUnusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: TrustError,
    },
}

/// Why a PEM bundle cannot serve as trust anchors.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Not PEM.
    #[error("not a PEM certificate bundle: {0}")]
    NotPem(#[source] rustls::pki_types::pem::Error),
    /// A certificate that is no trust anchor.
    #[error("unusable certificate: {0}")]
    Unusable(#[source] rustls::Error),
    /// PEM without a certificate.
    #[error("no certificate in the file")]
    Empty,
}

/// Why no connection to Redis could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Under `--redis-mode auto`, no node answered `INFO cluster`.
    #[error("Redis mode unknown (no node reachable): {0}")]
    ModeUnknown(#[source] NodeError),
    /// No standalone node took a connection.
    #[error(transparent)]
    Standalone(NodeError),
    /// The cluster client failed to connect.
    #[error(transparent)]
    Cluster(redis::RedisError),
}

/// The last node tried, and why it failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// There was no node to try.
    #[error("no seed node")]
    NoNode,
    /// `host:port` failed.
    #[error("{host}:{port}: {}", Driver(source))]
    Failed {
        /// Node host.
        host: String,
        /// Node port.
        port: u16,
        /// The driver's error.
        #[source]
        source: redis::RedisError,
    },
}

/// The driver's error as an operator reads it: a read or write that gave
/// up after its timeout says so (the driver shows the system's "Resource
/// temporarily unavailable", `EAGAIN` from a socket timeout, for a Redis
/// that accepted the connection and never answered).
struct Driver<'a>(&'a redis::RedisError);

impl fmt::Display for Driver<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_timeout() {
            write!(f, "no answer within the timeout (timed out)")
        } else {
            self.0.fmt(f)
        }
    }
}

/// A failed call of the command client; `what` is the client's name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client is waiting out its reconnect backoff.
    #[error("{what}: Redis down, waiting to reconnect")]
    Backoff {
        /// The client.
        what: &'static str,
    },
    /// Connecting failed.
    #[error("{what}: connect: {source}")]
    Connect {
        /// The client.
        what: &'static str,
        /// Why.
        #[source]
        source: ConnectError,
    },
    /// The command (or pipeline) failed: an I/O error or Redis's error reply.
    #[error("{what}: {}", Driver(source))]
    Command {
        /// The client.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: redis::RedisError,
    },
    /// `CLUSTER SLOTS` answered something that is no slot map.
    #[error("CLUSTER SLOTS: no slot map")]
    NoSlotMap,
}

impl Error {
    /// True when the call failed on the way to Redis (no connection, backoff)
    /// rather than by a reply: nothing was done.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Backoff { .. } | Error::Connect { .. })
    }

    /// True when Redis answered that it does not hold a script (`NOSCRIPT`).
    pub fn is_noscript(&self) -> bool {
        match self {
            Error::Command { source, .. } => source.clone().into_server_errors().is_some_and(|e| {
                e.iter()
                    .any(|(_, e)| e.kind() == Some(redis::ServerErrorKind::NoScript))
            }),
            _ => false,
        }
    }
}

/// For callers that report a failure as text (the benches' messages).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_shows_no_credential() {
        let t = Target {
            tls: true,
            host: "h.example".into(),
            port: 6380,
            credentials: true,
        };
        let e = ConfigError::Insecure { target: t };
        assert_eq!(
            e.to_string(),
            "invalid value for '--redis': rediss://***@h.example:6380: #insecure is not supported"
        );
        assert_eq!(Which { index: 2, of: 3 }.to_string(), "URI 2 of 3");
        assert_eq!(Which { index: 1, of: 1 }.to_string(), "the URI");
    }

    #[test]
    fn the_cause_is_kept_as_the_source() {
        use std::error::Error as _;
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = Error::Command {
            what: "presence",
            source: redis::RedisError::from(io),
        };
        assert!(e.source().is_some());
        assert!(e.to_string().starts_with("presence: "), "{e}");
        assert!(!e.is_unreachable());
        assert!(Error::Backoff { what: "x" }.is_unreachable());
    }

    #[test]
    fn a_socket_timeout_reads_as_one() {
        for kind in [std::io::ErrorKind::WouldBlock, std::io::ErrorKind::TimedOut] {
            let node = NodeError::Failed {
                host: "127.0.0.1".into(),
                port: 6379,
                source: redis::RedisError::from(std::io::Error::from(kind)),
            };
            assert_eq!(
                node.to_string(),
                "127.0.0.1:6379: no answer within the timeout (timed out)"
            );
            let e = Error::Command {
                what: "publish",
                source: redis::RedisError::from(std::io::Error::from(kind)),
            };
            assert_eq!(
                e.to_string(),
                "publish: no answer within the timeout (timed out)"
            );
        }
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = Error::Command {
            what: "p",
            source: refused,
        };
        assert!(!e.to_string().contains("timeout"), "{e}");
    }

    #[test]
    fn noscript_is_known_by_its_kind() {
        let error = |reply: &[u8]| {
            let value = redis::parse_redis_value(reply).expect("RESP");
            let source = value.extract_error().expect_err("an error reply");
            Error::Command { what: "p", source }
        };
        assert!(error(b"-NOSCRIPT No matching script.\r\n").is_noscript());
        assert!(!error(b"-ERR NOSCRIPT in the text only\r\n").is_noscript());
    }
}
