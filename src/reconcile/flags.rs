//! `seatboard reconcile`'s flags (contract §11), each with its environment
//! twin, and their check: a refusal names its flag (exit 2) and never shows
//! the password of `--db`.

use crate::redis::RedisTarget;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The command line of `seatboard reconcile`.
#[derive(Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// The selection database: postgres://, postgresql:// or mysql:// (user and password in the URL; a read replica where there is one).
    #[arg(long, env = "SEATBOARD_RECONCILE_DB", hide_env_values = true)]
    pub db: String,
    /// PEM bundle that verifies the database server (default: the system roots).
    #[arg(long, env = "SEATBOARD_RECONCILE_DB_CA")]
    pub db_ca: Option<PathBuf>,
    /// One SELECT returning course, section, total_seats, seats_taken, version, updated_at [, seat_info], with one bind parameter: the lower bound of updated_at ($1 or ?).
    #[arg(long, env = "SEATBOARD_RECONCILE_QUERY")]
    pub query: String,
    /// The incremental check's interval in ms (each wait shortened by a random 0-10 %).
    #[arg(long, env = "SEATBOARD_RECONCILE_INTERVAL_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub interval_ms: u64,
    /// How far before the newest updated_at seen an incremental check starts, in ms.
    #[arg(long, env = "SEATBOARD_RECONCILE_OVERLAP_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub overlap_ms: u64,
    /// How long a section found behind may stay so before it is repaired, in ms.
    #[arg(long, env = "SEATBOARD_RECONCILE_GRACE_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub grace_ms: u64,
    /// The full check's interval in seconds (each wait shortened by a random 0-10 %).
    #[arg(long, env = "SEATBOARD_RECONCILE_SWEEP_S", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub sweep_s: u64,
    /// The session's statement timeout in ms, enforced by the server.
    #[arg(long, env = "SEATBOARD_RECONCILE_STATEMENT_TIMEOUT_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub statement_timeout_ms: u64,
    /// How long a section may stay ahead of the database before it is replaced, in seconds.
    #[arg(long, env = "SEATBOARD_RECONCILE_AHEAD_REPAIR_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub ahead_repair_s: u64,
    /// Address of GET /metrics and GET /healthz; '' turns it off.
    #[arg(
        long,
        env = "SEATBOARD_RECONCILE_METRICS",
        default_value = "127.0.0.1:7442"
    )]
    pub metrics: String,
    /// One full check, differences printed on stdout, nothing written; exit 0 (agree), 1 (differ), 3 (cannot read).
    #[arg(long, env = "SEATBOARD_RECONCILE_CHECK")]
    pub check: bool,
    /// Redis and prefixes, as for `serve`.
    #[command(flatten)]
    pub target: RedisTarget,
}

/// Which database a `--db` URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `postgres://`, `postgresql://`.
    Postgres,
    /// `mysql://` (MySQL or MariaDB).
    Mysql,
}

/// A refused flag; its text names the flag and never holds a password.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// `--db` of another scheme, or not a URL.
    #[error("invalid value '{shown}' for '--db': a postgres://, postgresql:// or mysql:// URL")]
    Scheme {
        /// The URL with its credentials masked.
        shown: String,
    },
    /// `--db` that the client refuses.
    #[error("invalid value '{shown}' for '--db': {why}")]
    Db {
        /// The URL with its credentials masked.
        shown: String,
        /// Why (never holds the URL).
        why: super::source::UrlError,
    },
    /// `--query` without its bind parameter.
    #[error("invalid value for '--query': one bind parameter ({param}), the lower bound of updated_at, is required")]
    NoParameter {
        /// `$1` or `?`.
        param: &'static str,
    },
    /// `--query` that is not a SELECT.
    #[error("invalid value for '--query': one SELECT (or WITH ... SELECT) statement")]
    NotSelect,
    /// `--metrics` not an address.
    #[error("invalid value '{value}' for '--metrics': not an IP:PORT")]
    Metrics {
        /// The value given.
        value: String,
    },
    /// `--db-ca` unreadable.
    #[error("invalid value '{path}' for '--db-ca': {source}")]
    Ca {
        /// The path given.
        path: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// `--db-ca` read but no PEM bundle of trust anchors.
    #[error("invalid value '{path}' for '--db-ca': {source}")]
    CaUnusable {
        /// The path given.
        path: String,
        /// Why its certificates cannot serve.
        source: crate::redis::TrustError,
    },
    /// `--redis` refused.
    #[error(transparent)]
    Redis(#[from] crate::redis::ConfigError),
}

/// `url` with its user and password shown as `***`: scheme, host and port only.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let hostpart = rest.split(['/', '?']).next().unwrap_or("");
    let host = match hostpart.rsplit_once('@') {
        Some((_, h)) => format!("***@{h}"),
        None => hostpart.to_owned(),
    };
    format!("{scheme}://{host}")
}

/// The database kind a URL names.
pub fn kind(url: &str) -> Result<Kind, FlagError> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") => Ok(Kind::Postgres),
        Some("mysql") => Ok(Kind::Mysql),
        _ => Err(FlagError::Scheme { shown: redact(url) }),
    }
}

/// Whether `sql` holds `needle` outside string literals and quoted names.
fn has_param(sql: &str, needle: &str) -> bool {
    let b = sql.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, b'\'' | b'"' | b'`') => quote = Some(c),
            None if sql[i..].starts_with(needle) => {
                // `$1` but not `$10`.
                let next = b.get(i + needle.len());
                if needle != "$1" || !next.is_some_and(u8::is_ascii_digit) {
                    return true;
                }
            }
            None => {}
        }
        i += 1;
    }
    false
}

/// What the flags say, checked.
pub struct Checked {
    /// The database kind.
    pub kind: Kind,
    /// `--db-ca`'s PEM text.
    pub ca: Option<Vec<u8>>,
    /// `--metrics`.
    pub metrics: Option<SocketAddr>,
    /// The Redis deployment.
    pub redis: std::sync::Arc<crate::redis::Redis>,
    /// The timing the loop runs by.
    pub timing: Timing,
}

/// The loop's clocks, from the flags.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `--interval-ms`.
    pub interval: Duration,
    /// `--overlap-ms`.
    pub overlap: Duration,
    /// `--grace-ms`.
    pub grace: Duration,
    /// `--sweep-s`.
    pub sweep: Duration,
    /// `--statement-timeout-ms`.
    pub statement_timeout: Duration,
    /// `--ahead-repair-s`.
    pub ahead_repair: Duration,
}

/// Checks the flags in order: `--db`, `--query`, `--db-ca`, `--metrics`, Redis.
pub fn check(a: &ReconcileArgs) -> Result<Checked, FlagError> {
    let kind = kind(&a.db)?;
    let q = a.query.trim_start().to_ascii_lowercase();
    if !(q.starts_with("select") || q.starts_with("with") || q.starts_with('(')) {
        return Err(FlagError::NotSelect);
    }
    let param = match kind {
        Kind::Postgres => "$1",
        Kind::Mysql => "?",
    };
    if !has_param(&a.query, param) {
        return Err(FlagError::NoParameter { param });
    }
    let ca = match &a.db_ca {
        Some(p) => {
            let path = || p.display().to_string();
            let pem = std::fs::read(p).map_err(|source| FlagError::Ca {
                path: path(),
                source,
            })?;
            // Checked whatever the URL's TLS mode: a bad file should not wait
            // for a mode that reads it.
            crate::redis::trust_roots(Some(&pem)).map_err(|source| FlagError::CaUnusable {
                path: path(),
                source,
            })?;
            Some(pem)
        }
        None => None,
    };
    let metrics = match a.metrics.trim() {
        "" => None,
        m => Some(
            m.parse()
                .map_err(|_| FlagError::Metrics { value: m.into() })?,
        ),
    };
    let redis = crate::redis::Redis::from_flags(&a.target.redis)?;
    Ok(Checked {
        kind,
        ca,
        metrics,
        redis,
        timing: Timing {
            interval: Duration::from_millis(a.interval_ms),
            overlap: Duration::from_millis(a.overlap_ms),
            grace: Duration::from_millis(a.grace_ms),
            sweep: Duration::from_secs(a.sweep_s),
            statement_timeout: Duration::from_millis(a.statement_timeout_ms),
            ahead_repair: Duration::from_secs(a.ahead_repair_s),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        assert_eq!(
            redact("postgres://svc:S3cret@db.example:5432/sel?sslmode=require"),
            "postgres://***@db.example:5432"
        );
        assert_eq!(redact("mysql://db:3306/x"), "mysql://db:3306");
        assert_eq!(redact("S3cret"), "***");
        assert_eq!(redact("mysql://u:p@ss@h:1/d"), "mysql://***@h:1");
    }

    #[test]
    fn schemes_and_parameters() {
        assert_eq!(kind("postgresql://h/d").ok(), Some(Kind::Postgres));
        assert_eq!(kind("MySQL://h/d").ok(), Some(Kind::Mysql));
        let e = kind("sqlite://u:S3cret@h/d").err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(e.contains("'--db'") && !e.contains("S3cret"), "{e}");
        assert!(has_param("select * from t where updated_at >= $1", "$1"));
        assert!(!has_param("select '$1' from t where a = $10", "$1"));
        assert!(has_param("select * from t where u >= ?", "?"));
        assert!(!has_param("select 'why?' from t", "?"));
    }
}
