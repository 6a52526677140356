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
    /// One SELECT returning course, section, total_seats, seats_taken, version, updated_at [, seat_info] (named exactly so; a result lacking one is a database error), with one bind parameter: the lower bound of updated_at ($1 or ?).
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
    /// One full check, differences printed on stdout, nothing written; exit 0 (agree), 1 (differ), 3 (cannot read, or the query's result lacks a required column).
    #[arg(long, env = "SEATBOARD_RECONCILE_CHECK")]
    pub check: bool,
    /// Redis and prefixes, as for `serve`.
    #[command(flatten)]
    pub target: RedisTarget,
    /// Log level (error, warn, info, debug, trace), as for `serve`.
    #[arg(long, env = "SEATBOARD_LOG", default_value = "info")]
    pub log_level: String,
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
    /// `--query` with a bind parameter besides the lower bound.
    #[error("invalid value for '--query': one bind parameter ({param}), the lower bound of updated_at, is allowed; found {found}")]
    ManyParameters {
        /// `$1` or `?`.
        param: &'static str,
        /// The parameters found (`$1, $2`; `2 of ?`).
        found: String,
    },
    /// `--query` that is not a SELECT.
    #[error("invalid value for '--query': one SELECT (or WITH ... SELECT) statement")]
    NotSelect,
    /// `--query` holding more than one statement.
    #[error("invalid value for '--query': one statement, found {count} (separated by ';')")]
    ManyStatements {
        /// The statements found.
        count: usize,
    },
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

/// `url` with its user and password shown as `***`: scheme, host and port
/// only. Everything up to the last `@` is taken as credentials, so a password
/// with an unencoded `/`, `?` or `@` in it is never shown in part.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let (hidden, after) = match rest.rsplit_once('@') {
        Some((_, h)) => ("***@", h),
        None => ("", rest),
    };
    let host = after.split(['/', '?']).next().unwrap_or("");
    format!("{scheme}://{hidden}{host}")
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

/// `--query` checked: one SELECT (or WITH ... SELECT), one statement (a
/// trailing `;` aside), one bind parameter (`$1` used any number of times
/// on PostgreSQL, one `?` on MySQL), all read outside literals, quoted
/// names and comments ([`super::query::lex`]).
pub fn query(sql: &str, kind: Kind) -> Result<(), FlagError> {
    let shape = super::query::lex(sql, kind);
    if !matches!(shape.first.as_str(), "select" | "with" | "(") {
        return Err(FlagError::NotSelect);
    }
    if shape.statements > 1 {
        return Err(FlagError::ManyStatements {
            count: shape.statements,
        });
    }
    // The parameter asked for, whether it is there, and every one found.
    let (param, there, found, n) = match kind {
        Kind::Postgres => {
            let found: Vec<String> = shape.numbered.iter().map(|n| format!("${n}")).collect();
            let there = shape.numbered.contains(&1);
            ("$1", there, found.join(", "), shape.numbered.len())
        }
        Kind::Mysql => (
            "?",
            shape.marks > 0,
            format!("{} of ?", shape.marks),
            shape.marks,
        ),
    };
    if !there {
        return Err(FlagError::NoParameter { param });
    }
    if n > 1 {
        return Err(FlagError::ManyParameters { param, found });
    }
    Ok(())
}

/// Checks the flags in order: `--db`, `--query`, `--db-ca`, `--metrics`, Redis.
pub fn check(a: &ReconcileArgs) -> Result<Checked, FlagError> {
    let kind = kind(&a.db)?;
    query(&a.query, kind)?;
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
        // A password with an unencoded `/` or `?` is hidden whole.
        for url in [
            "postgres://reader:hunter/2x@127.0.0.1:61432/sel",
            "mysql://reader:hun?ter2x@h:3306/sel",
            "mysql://reader:a/b?c@d@h:3306/sel?ssl-mode=REQUIRED",
        ] {
            let shown = redact(url);
            assert!(
                shown.ends_with("***@h:3306") || shown.ends_with("***@127.0.0.1:61432"),
                "{shown}"
            );
            assert!(!shown.contains("hun") && !shown.contains("2x"), "{shown}");
        }
    }

    #[test]
    fn schemes_and_parameters() {
        assert_eq!(kind("postgresql://h/d").ok(), Some(Kind::Postgres));
        assert_eq!(kind("MySQL://h/d").ok(), Some(Kind::Mysql));
        let e = kind("sqlite://u:S3cret@h/d").err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(e.contains("'--db'") && !e.contains("S3cret"), "{e}");
    }

    /// The refusal of `sql` as `kind`'s query, as printed (None: accepted).
    fn refusal(sql: &str, kind: Kind) -> Option<String> {
        query(sql, kind).err().map(|e| e.to_string())
    }

    #[test]
    fn a_query_is_one_select_with_one_bind_parameter() {
        let pg = |sql: &str| refusal(sql, Kind::Postgres);
        let my = |sql: &str| refusal(sql, Kind::Mysql);
        const Q: &str = "SELECT course FROM t WHERE updated_at >= ";
        for ok in [
            format!("{Q}$1"),
            format!("{Q}$1 OR u > $1"),
            format!("{Q}$1;"),
            format!("{Q}$1 ;\n  "),
            format!("{Q}$1 AND note <> '$2; SELECT 1'"),
            format!("{Q}$1 AND f = $f$ $2; $f$"),
            format!("-- the reconciler\n{Q}$1 /* not $2 */"),
            format!("WITH x AS (SELECT 1) {Q}$1"),
        ] {
            assert_eq!(pg(&ok), None, "{ok}");
        }
        assert_eq!(
            my(&format!("{Q}? AND c <> 'why?' AND `a?` = 1 -- ?\n;")),
            None
        );
        for (bad, what) in [
            (format!("{Q}$1 AND updated_at < $2"), "found $1, $2"),
            (format!("{Q}$2"), "($1)"),
            (format!("{Q}$10"), "($1)"),
            (format!("{Q}'$1'"), "($1)"),
            (format!("{Q}?"), "($1)"),
            (format!("{Q}$1; SELECT 1"), "one statement, found 2"),
            (format!("{Q}$1;;SELECT 1;"), "one statement, found 2"),
            ("DELETE FROM t WHERE u < $1".into(), "one SELECT"),
            ("/* x */ UPDATE t SET a = $1".into(), "one SELECT"),
        ] {
            let e = pg(&bad).unwrap_or_default();
            assert!(e.contains("'--query'") && e.contains(what), "{bad}: {e}");
        }
        for (bad, what) in [
            (format!("{Q}? AND updated_at < ?"), "found 2 of ?"),
            (format!("{Q}$1"), "(?)"),
            (format!("{Q}?; SELECT 1"), "one statement, found 2"),
        ] {
            let e = my(&bad).unwrap_or_default();
            assert!(e.contains("'--query'") && e.contains(what), "{bad}: {e}");
        }
    }
}
