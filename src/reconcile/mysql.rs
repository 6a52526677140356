//! The MySQL and MariaDB source: the sync `mysql` client on the worker's
//! thread, one connection, the session's statement timeout set at connect
//! (`max_execution_time` on MySQL, `max_statement_time` on MariaDB) with
//! `SESSION TRANSACTION READ ONLY`, the query prepared once, each check one
//! `START TRANSACTION READ ONLY`. TLS as `ssl-mode` asks (`DISABLED`, the
//! default; `PREFERRED`, plain when the server has no TLS; `REQUIRED`;
//! `VERIFY_CA`; `VERIFY_IDENTITY`; verified against `--db-ca`, else the
//! system's roots, and the web's roots the client carries). SIGTERM: `KILL
//! QUERY` on a short second session.

use super::db_tls;
use super::flags::redact;
use super::row::{integer_text, Row};
use super::source::{
    civil_us, required_columns, take_param, us_civil, CancelSlot, DbError, Source, UrlError,
};
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder, SslOpts, Statement, Value};
use std::time::Duration;

/// MySQL's "maximum statement execution time exceeded".
const MYSQL_TIMEOUT: u16 = 3024;
/// MariaDB's "query execution was interrupted (max_statement_time exceeded)".
const MARIADB_TIMEOUT: u16 = 1969;
/// "Query execution was interrupted" (a `KILL QUERY`).
const INTERRUPTED: u16 = 1317;

/// A MySQL or MariaDB database read through one connection.
pub struct My {
    opts: OptsBuilder,
    query: String,
    timeout: Duration,
    shown: String,
    cancel: CancelSlot,
    conn: Option<(Conn, Statement)>,
    /// `ssl-mode=PREFERRED`: a server without TLS is read in plain.
    preferred: bool,
    /// The trust roots as the file the client opens at each connect.
    _roots_file: Option<std::fs::File>,
}

/// `url` without its `ssl-mode` parameter, and that parameter's value.
fn split_ssl_mode(url: &str) -> (String, Option<String>) {
    let (url, mode) = take_param(url, &["ssl-mode", "ssl_mode"]);
    (url, mode.map(|m| m.to_ascii_uppercase()))
}

impl My {
    /// Checks the URL (the error never holds the password); nothing is connected yet.
    pub fn new(
        url: &str,
        ca: Option<&[u8]>,
        query: &str,
        timeout: Duration,
        cancel: CancelSlot,
    ) -> Result<My, UrlError> {
        let (url, mode) = split_ssl_mode(url);
        let opts = Opts::from_url(&url).map_err(|e| match e {
            mysql::UrlError::UnknownParameter(p) => UrlError::UnknownParameter(p),
            _ => UrlError::NotMysql,
        })?;
        let verifies = matches!(mode.as_deref(), Some("VERIFY_CA" | "VERIFY_IDENTITY"));
        // `--db-ca` (already checked), or for a verifying mode the system's
        // roots; the client adds the web's roots it carries.
        let (roots, roots_file) = if ca.is_some() || verifies {
            match db_tls::roots_file(ca) {
                Ok(Some((file, path))) => (Some(path), Some(file)),
                Ok(None) => (None, None),
                Err(e) => return Err(UrlError::Roots(e)),
            }
        } else {
            (None, None)
        };
        let base = SslOpts::default().with_root_cert_path(roots);
        let ssl = match mode.as_deref() {
            None | Some("DISABLED") => None,
            Some("PREFERRED" | "REQUIRED") => Some(
                base.with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
            ),
            Some("VERIFY_CA") => Some(base.with_danger_skip_domain_validation(true)),
            Some("VERIFY_IDENTITY") => Some(base),
            Some(other) => return Err(UrlError::SslMode(other.to_owned())),
        };
        let io = timeout + Duration::from_secs(5);
        let opts = OptsBuilder::from_opts(opts)
            .prefer_socket(false)
            .ssl_opts(ssl)
            .tcp_connect_timeout(Some(Duration::from_secs(5)))
            .read_timeout(Some(io))
            .write_timeout(Some(io));
        Ok(My {
            opts,
            query: query.to_owned(),
            timeout,
            shown: redact(&url),
            cancel,
            conn: None,
            preferred: mode.as_deref() == Some("PREFERRED"),
            _roots_file: roots_file,
        })
    }

    fn connect(&mut self) -> Result<(), mysql::Error> {
        let (mut conn, opts) = match Conn::new(self.opts.clone()) {
            // `PREFERRED`: TLS when the server has it, else plain (the
            // cancelling session too).
            Err(mysql::Error::DriverError(mysql::DriverError::TlsNotSupported))
                if self.preferred =>
            {
                let plain = self.opts.clone().ssl_opts(None::<SslOpts>);
                (Conn::new(plain.clone())?, plain)
            }
            other => (other?, self.opts.clone()),
        };
        let version: Option<String> = conn.query_first("SELECT VERSION()")?;
        let ms = self.timeout.as_millis();
        if version.is_some_and(|v| v.contains("MariaDB")) {
            conn.query_drop(format!(
                "SET SESSION max_statement_time = {}.{:03}",
                ms / 1000,
                ms % 1000
            ))?;
        } else {
            conn.query_drop(format!("SET SESSION max_execution_time = {ms}"))?;
        }
        conn.query_drop("SET SESSION TRANSACTION READ ONLY")?;
        let stmt = conn.prep(&self.query)?;
        let id = conn.connection_id();
        let opts = opts.read_timeout(Some(Duration::from_secs(1)));
        self.cancel.set(Box::new(move || {
            match Conn::new(opts).and_then(|mut c| c.query_drop(format!("KILL QUERY {id}"))) {
                Ok(()) => {}
                Err(e) => tracing::debug!(error = %e, "KILL QUERY failed"),
            }
        }));
        self.conn = Some((conn, stmt));
        Ok(())
    }

    fn error(&mut self, e: mysql::Error) -> DbError {
        if let mysql::Error::MySqlError(m) = &e {
            let text = format!("{} ({}): {}", self.shown, m.code, m.message);
            if matches!(m.code, MYSQL_TIMEOUT | MARIADB_TIMEOUT | INTERRUPTED) {
                // The connection stays: only the statement ended. Its
                // transaction is ended before the next check.
                if let Some((c, _)) = self.conn.as_mut() {
                    if c.query_drop("ROLLBACK").is_err() {
                        self.conn = None;
                    }
                }
                return DbError::Timeout(text);
            }
            self.conn = None;
            return DbError::Down(text);
        }
        self.conn = None;
        DbError::Down(format!("{}: {}", self.shown, e))
    }
}

fn int(v: &Value) -> Result<Option<i128>, ()> {
    match v {
        Value::NULL => Ok(None),
        Value::Int(i) => Ok(Some(i128::from(*i))),
        Value::UInt(u) => Ok(Some(i128::from(*u))),
        // A DECIMAL, or an integer as text: a fraction of zeros only.
        Value::Bytes(b) => std::str::from_utf8(b)
            .ok()
            .and_then(integer_text)
            .map(Some)
            .ok_or(()),
        _ => Err(()),
    }
}

fn text(v: &Value) -> Result<Option<String>, ()> {
    match v {
        Value::NULL => Ok(None),
        Value::Bytes(b) => String::from_utf8(b.clone()).map(Some).map_err(|_| ()),
        _ => Err(()),
    }
}

/// A DATETIME or TIMESTAMP (as the session's clock shows it) in µs.
fn when(v: &Value) -> Option<i64> {
    match v {
        Value::Date(y, mo, d, h, mi, s, us) => Some(civil_us(
            i64::from(*y),
            u32::from(*mo),
            u32::from(*d),
            u32::from(*h),
            u32::from(*mi),
            u32::from(*s),
            *us,
        )),
        Value::Bytes(b) => {
            let t = std::str::from_utf8(b).ok()?;
            let n = |r: std::ops::Range<usize>| t.get(r).and_then(|x| x.parse::<u32>().ok());
            let us = t
                .get(20..)
                .filter(|f| !f.is_empty())
                .and_then(|f| format!("{f:0<6}").get(..6)?.parse().ok())
                .unwrap_or(0);
            Some(civil_us(
                i64::from(n(0..4)?),
                n(5..7)?,
                n(8..10)?,
                n(11..13).unwrap_or(0),
                n(14..16).unwrap_or(0),
                n(17..19).unwrap_or(0),
                us,
            ))
        }
        _ => None,
    }
}

fn read(row: &mysql::Row) -> Row {
    let mut out = Row::default();
    let mut required = 0;
    for (i, col) in row.columns_ref().iter().enumerate() {
        let Some(v) = row.as_ref(i) else {
            continue;
        };
        let mut bad = false;
        match col.name_str().as_ref() {
            "course" => {
                required += 1;
                match text(v) {
                    Ok(t) => out.course = t,
                    Err(()) => bad = true,
                }
            }
            name @ ("section" | "total_seats" | "seats_taken" | "version") => {
                required += 1;
                match int(v) {
                    Ok(n) => match name {
                        "section" => out.section = n,
                        "total_seats" => out.total_seats = n,
                        "seats_taken" => out.seats_taken = n,
                        _ => out.version = n,
                    },
                    Err(()) => bad = true,
                }
            }
            "seat_info" => match text(v) {
                Ok(t) => out.seat_info = t,
                Err(()) => bad = true,
            },
            "updated_at" => out.updated_us = when(v),
            _ => {}
        }
        out.unreadable |= bad;
    }
    out.unreadable |= required < 5;
    out
}

impl Source for My {
    fn fetch(&mut self, bound_us: Option<i64>) -> Result<Vec<Row>, DbError> {
        if self.conn.is_none() {
            self.connect().map_err(|e| self.error(e))?;
        }
        let bound = match bound_us {
            Some(t) => {
                let (y, mo, d, h, mi, s, us) = us_civil(t);
                Value::Date(
                    y.clamp(1000, 9999) as u16,
                    mo as u8,
                    d as u8,
                    h as u8,
                    mi as u8,
                    s as u8,
                    us,
                )
            }
            // A sweep: the zero date, before every row (zero dates and years
            // before 1000 included).
            None => Value::Date(0, 0, 0, 0, 0, 0, 0),
        };
        let result = {
            let Some((conn, stmt)) = self.conn.as_mut() else {
                return Err(DbError::Down(format!("{}: not connected", self.shown)));
            };
            (|| {
                conn.query_drop("START TRANSACTION READ ONLY")?;
                let mut result = conn.exec_iter(&*stmt, (bound,))?;
                // The result set's columns: sent even when no row follows.
                let names: Vec<String> = result
                    .columns()
                    .as_ref()
                    .iter()
                    .map(|c| c.name_str().into_owned())
                    .collect();
                let rows = result.by_ref().collect::<Result<Vec<mysql::Row>, _>>()?;
                drop(result);
                conn.query_drop("COMMIT")?;
                Ok::<_, mysql::Error>((names, rows))
            })()
        };
        let (names, rows) = result.map_err(|e| self.error(e))?;
        // The connection stays (the query is wrong, not the session).
        required_columns(&self.shown, names.iter().map(String::as_str))?;
        Ok(rows.iter().map(read).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_mode_is_taken_out_of_the_url() {
        assert_eq!(
            split_ssl_mode("mysql://u:p@h:3306/d?ssl-mode=verify_ca&x=1"),
            ("mysql://u:p@h:3306/d?x=1".into(), Some("VERIFY_CA".into()))
        );
        assert_eq!(split_ssl_mode("mysql://h/d"), ("mysql://h/d".into(), None));
    }

    #[test]
    fn datetimes_as_text_or_values() {
        let t = civil_us(2026, 12, 5, 1, 2, 3, 450_000);
        assert_eq!(
            when(&Value::Bytes(b"2026-12-05 01:02:03.45".to_vec())),
            Some(t)
        );
        assert_eq!(when(&Value::Date(2026, 12, 5, 1, 2, 3, 450_000)), Some(t));
        assert_eq!(int(&Value::Bytes(b"-3".to_vec())), Ok(Some(-3)));
        assert_eq!(int(&Value::Double(1.0)), Err(()));
    }

    #[test]
    fn a_decimal_with_a_fraction_of_zeros_is_an_integer() {
        assert_eq!(int(&Value::Bytes(b"5.0".to_vec())), Ok(Some(5)));
        assert_eq!(int(&Value::Bytes(b"-12.00".to_vec())), Ok(Some(-12)));
        assert_eq!(int(&Value::Bytes(b"5.50".to_vec())), Err(()));
        assert_eq!(int(&Value::Bytes(b"five".to_vec())), Err(()));
        assert_eq!(int(&Value::NULL), Ok(None));
    }
}
