//! The selection database as the reconciler sees it: one connection that
//! runs the operator's query with a lower bound on `updated_at`, in a
//! read-only transaction under the session's statement timeout, and a way
//! to cancel the statement in flight from another thread (SIGTERM).

use super::row::Row;
use std::sync::{Arc, Mutex};

/// Why the client refused `--db` (exit 2); never holds the URL or its
/// password.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// PostgreSQL's parser refused it; its message names an option, never
    /// its value.
    #[error("{0}")]
    Postgres(#[source] tokio_postgres::Error),
    /// PostgreSQL's parser refused it with a message that may quote the URL.
    #[error("not a valid PostgreSQL URL")]
    NotPostgres,
    /// A MySQL URL parameter the client does not know.
    #[error("unknown parameter {0}")]
    UnknownParameter(String),
    /// The MySQL client refused it.
    #[error("not a valid MySQL URL")]
    NotMysql,
    /// A MySQL `ssl-mode` of no known kind.
    #[error(
        "ssl-mode {0} is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
    )]
    SslMode(String),
    /// A PostgreSQL `sslmode` of no known kind.
    #[error("sslmode {0} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    PgSslMode(String),
    /// libpq's `sslrootcert`, which the client does not take.
    #[error("sslrootcert is not taken: give the CA bundle with --db-ca")]
    RootCertParam,
    /// The trust roots could not be handed to the MySQL client.
    #[error("TLS: the trust roots: {0}")]
    Roots(#[source] std::io::Error),
    /// The trust roots for TLS (`--db-ca`, else the system's) are unusable.
    #[error("TLS: {0}")]
    Tls(#[source] crate::redis::TrustError),
}

/// `url` without its query parameter named any of `names` (any case), and
/// that parameter's value: a TLS mode the client library would refuse or
/// misread, taken out for the reconciler to apply itself.
pub fn take_param(url: &str, names: &[&str]) -> (String, Option<String>) {
    let Some((base, params)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = params
        .split('&')
        .filter(|p| match p.split_once('=') {
            Some((k, v)) if names.iter().any(|n| k.eq_ignore_ascii_case(n)) => {
                value = Some(v.to_owned());
                false
            }
            _ => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), value)
    } else {
        (format!("{base}?{}", kept.join("&")), value)
    }
}

/// Why a check could not read the database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Down, refusing (a bad password, a missing table) or lost; the text
    /// never holds the password.
    #[error("database: {0}")]
    Down(String),
    /// The statement ran past the statement timeout and the server cancelled it.
    #[error("database: statement cancelled at its timeout: {0}")]
    Timeout(String),
    /// The query's result lacks required columns (named here, never empty):
    /// nothing can be compared until `--query` returns them.
    #[error(
        "database: {shown}: the --query returns no column {}: it must return {}",
        .missing.join(", "),
        REQUIRED.join(", ")
    )]
    Columns {
        /// The database as shown in errors (no password).
        shown: String,
        /// The required columns the result lacks, in [`REQUIRED`]'s order.
        missing: Vec<&'static str>,
    },
}

/// The columns every result of `--query` must have (`seat_info` may be left
/// out), named exactly so, as the sources read them.
pub const REQUIRED: [&str; 6] = [
    "course",
    "section",
    "total_seats",
    "seats_taken",
    "version",
    "updated_at",
];

/// Ok when a result whose columns are named `names` has every
/// [`REQUIRED`] column (names compared exactly, as the rows are read);
/// else the database error naming the ones it lacks.
pub fn required_columns<'a>(
    shown: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(), DbError> {
    let names: Vec<&str> = names.into_iter().collect();
    let missing: Vec<&'static str> = REQUIRED
        .into_iter()
        .filter(|r| !names.contains(r))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(DbError::Columns {
            shown: shown.to_owned(),
            missing,
        })
    }
}

/// A database the reconciler reads.
pub trait Source: Send {
    /// The rows whose `updated_at` is at or after `bound_us` (µs since the
    /// epoch on the database's clock; None: every row), connecting first if
    /// needed. An error other than a timeout drops the connection.
    fn fetch(&mut self, bound_us: Option<i64>) -> Result<Vec<Row>, DbError>;
}

/// Cancels the statement in flight on the server (a cancel request, or
/// `KILL QUERY` on a short second session).
pub type Canceller = Box<dyn FnOnce() + Send>;

/// Where a source leaves the way to cancel its statement in flight.
#[derive(Clone, Default)]
pub struct CancelSlot(Arc<Mutex<Option<Canceller>>>);

impl CancelSlot {
    /// Set when a connection is made.
    pub fn set(&self, c: Canceller) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// Cancels whatever runs now (at most once).
    pub fn cancel(&self) {
        let c = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = c {
            c();
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01: (year, month, day).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A calendar time (taken as UTC) in µs since the epoch.
pub fn civil_us(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32, us: u32) -> i64 {
    let secs = days_from_civil(y, mo, d) * 86_400 + i64::from(h * 3600 + mi * 60 + s);
    secs * 1_000_000 + i64::from(us)
}

/// µs since the epoch as (year, month, day, hour, minute, second, µs).
pub fn us_civil(t: i64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let secs = t.div_euclid(1_000_000);
    let us = t.rem_euclid(1_000_000) as u32;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400) as u32;
    (y, m, d, sod / 3600, sod / 60 % 60, sod % 60, us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_lacking_required_columns_names_them() {
        let all = [
            "version",
            "course",
            "seat_info",
            "section",
            "updated_at",
            "total_seats",
            "seats_taken",
        ];
        assert!(required_columns("db", all).is_ok());
        assert!(required_columns("db", all.into_iter().filter(|c| *c != "seat_info")).is_ok());
        let e = required_columns(
            "postgres://h:5432/d",
            ["course", "section", "total_seats", "updated_at", "extra"],
        )
        .expect_err("two missing");
        assert!(
            matches!(&e, DbError::Columns { missing, .. } if *missing == ["seats_taken", "version"])
        );
        assert_eq!(
            e.to_string(),
            "database: postgres://h:5432/d: the --query returns no column seats_taken, version: \
             it must return course, section, total_seats, seats_taken, version, updated_at"
        );
        // Names are matched exactly, as the rows are read: no other case.
        let e = required_columns(
            "db",
            all.map(|c| if c == "version" { "Version" } else { c }),
        );
        assert!(matches!(e, Err(DbError::Columns { missing, .. }) if missing == ["version"]));
        // No column at all (a statement with no result set): every one.
        let e = required_columns("db", []);
        assert!(matches!(e, Err(DbError::Columns { missing, .. }) if missing == REQUIRED));
    }

    #[test]
    fn calendar_round_trips() {
        assert_eq!(civil_us(1970, 1, 1, 0, 0, 0, 0), 0);
        assert_eq!(civil_us(2000, 3, 1, 0, 0, 1, 5), 951_868_801_000_005);
        const YEAR_1000: i64 = -30_610_224_000_000_000;
        assert_eq!(civil_us(1000, 1, 1, 0, 0, 0, 0), YEAR_1000);
        for t in [0, YEAR_1000, 1_764_420_000_123_456, -1, 951_868_801_000_005] {
            let (y, mo, d, h, mi, s, us) = us_civil(t);
            assert_eq!(civil_us(y, mo, d, h, mi, s, us), t);
        }
    }
}
