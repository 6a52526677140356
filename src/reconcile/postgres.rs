//! The PostgreSQL source: `tokio-postgres` on a current-thread runtime of
//! the worker's own thread, one connection (`application_name`
//! `seatboard-reconcile`), the session's `statement_timeout` and
//! `default_transaction_read_only` set at connect, the query prepared once,
//! each check one `BEGIN READ ONLY` transaction. Every exchange with the
//! server is also limited on this side ([`answer_limit`]): a server that
//! stops answering without closing (a frozen process, a partition) drops the
//! connection and is retried like one that is down, where the sync client
//! would wait for ever. TLS as `sslmode` asks, in libpq's terms
//! (`db_tls.rs`: rustls, verified against `--db-ca` or the system roots);
//! SIGTERM sends PostgreSQL's own cancel request.

use super::db_tls::{client_config, pg_mode};
use super::flags::redact;
use super::row::{integer_text, Row};
use super::source::{required_columns, take_param, CancelSlot, DbError, Source, UrlError};
use bytes::BytesMut;
use std::error::Error;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long the connect (TCP, TLS, startup and authentication) may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How long a check's exchange may wait for the server: the statement
/// timeout, which the server enforces itself, and this much more for the
/// round trips around it.
const ANSWER_SLACK: Duration = Duration::from_secs(5);

/// How long a cancel request may take (SIGTERM exits within 2 s).
const CANCEL_LIMIT: Duration = Duration::from_secs(1);

/// The most a check's exchange with the server may take, on this side.
pub fn answer_limit(statement_timeout: Duration) -> Duration {
    statement_timeout + ANSWER_SLACK
}

/// A PostgreSQL database read through one connection.
pub struct Pg {
    config: Config,
    tls: Option<MakeRustlsConnect>,
    query: String,
    timeout: Duration,
    shown: String,
    cancel: CancelSlot,
    /// The runtime driving the connection, made with it and dropped with
    /// it (its task, and so its socket, goes with the runtime).
    link: Option<(Runtime, Client, Statement)>,
}

impl Pg {
    /// Checks the URL (the error never holds the password); nothing is connected yet.
    pub fn new(
        url: &str,
        ca: Option<&[u8]>,
        query: &str,
        timeout: Duration,
        cancel: CancelSlot,
    ) -> Result<Pg, UrlError> {
        // The client knows only three of libpq's six modes: the mode is taken
        // out and applied here.
        let (url, sslmode) = take_param(url, &["sslmode"]);
        if take_param(&url, &["sslrootcert"]).1.is_some() {
            return Err(UrlError::RootCertParam);
        }
        let (mode, verify) = pg_mode(sslmode.as_deref(), ca.is_some())
            .ok_or_else(|| UrlError::PgSslMode(sslmode.clone().unwrap_or_default()))?;
        let mut config = Config::from_str(&url).map_err(|e| {
            // The parser's message names an option, never its value.
            if e.to_string().contains('@') {
                UrlError::NotPostgres
            } else {
                UrlError::Postgres(e)
            }
        })?;
        config
            .application_name("seatboard-reconcile")
            .connect_timeout(CONNECT_LIMIT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        config.ssl_mode(mode);
        let tls = match verify {
            None => None,
            Some(v) => Some(MakeRustlsConnect::new(
                client_config(v, ca).map_err(UrlError::Tls)?,
            )),
        };
        Ok(Pg {
            config,
            tls,
            query: query.to_owned(),
            timeout,
            shown: redact(&url),
            cancel,
            link: None,
        })
    }

    /// The connection, its session set up and the query prepared, within
    /// [`CONNECT_LIMIT`] plus the answer limit.
    fn connect(&mut self) -> Result<(), DbError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DbError::Down(format!("{}: a runtime: {e}", self.shown)))?;
        let ms = self.timeout.as_millis();
        // The session's settings, made in a read-only transaction too (a
        // plain `SET` outlives its transaction).
        let setup = format!(
            "BEGIN READ ONLY; SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET default_transaction_read_only = on; COMMIT"
        );
        let (config, tls, query) = (&self.config, self.tls.clone(), &self.query);
        let limit = CONNECT_LIMIT + answer_limit(self.timeout);
        // The timer is made inside the runtime (it needs its clock).
        let made = rt.block_on(async move {
            tokio::time::timeout(limit, async move {
                let client = match tls {
                    Some(t) => {
                        let (client, conn) = config.connect(t).await?;
                        tokio::spawn(async move { drop(conn.await) });
                        client
                    }
                    None => {
                        let (client, conn) = config.connect(NoTls).await?;
                        tokio::spawn(async move { drop(conn.await) });
                        client
                    }
                };
                client.batch_execute(&setup).await?;
                let stmt = client.prepare(query).await?;
                Ok::<_, tokio_postgres::Error>((client, stmt))
            })
            .await
        });
        let (client, stmt) = match made {
            Ok(Ok(made)) => made,
            Ok(Err(e)) => return Err(self.error(e)),
            Err(_) => return Err(self.no_answer("connect", limit)),
        };
        let token = client.cancel_token();
        let tls = self.tls.clone();
        self.cancel.set(Box::new(move || {
            let sent = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| {
                    rt.block_on(async {
                        let cancel = async {
                            match tls {
                                Some(t) => token.cancel_query(t).await,
                                None => token.cancel_query(NoTls).await,
                            }
                        };
                        tokio::time::timeout(CANCEL_LIMIT, cancel).await
                    })
                });
            match sent {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::debug!(error = %e, "cancel request failed"),
                Ok(Err(_)) => tracing::debug!("cancel request not answered"),
                Err(e) => tracing::debug!(error = %e, "cancel request: no runtime"),
            }
        }));
        self.link = Some((rt, client, stmt));
        Ok(())
    }

    fn error(&mut self, e: tokio_postgres::Error) -> DbError {
        let text = match e.as_db_error() {
            Some(d) => format!("{} ({}): {}", self.shown, d.code().code(), d.message()),
            None => format!("{}: {e}", self.shown),
        };
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            return DbError::Timeout(text);
        }
        self.link = None;
        DbError::Down(text)
    }

    /// The server did not answer `what` within `limit`: the connection is
    /// dropped (the runtime and its socket with it), and the database is down.
    fn no_answer(&mut self, what: &str, limit: Duration) -> DbError {
        self.link = None;
        DbError::Down(format!(
            "{}: no answer to the {what} within {} ms",
            self.shown,
            limit.as_millis()
        ))
    }
}

/// A sweep's lower bound: `-infinity`, before every row (a year-1000 bound
/// would leave out older dates and `-infinity` itself, a plausible default).
#[derive(Debug)]
struct Unbounded;

impl ToSql for Unbounded {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        // Both timestamp types' binary `-infinity`.
        out.extend_from_slice(&i64::MIN.to_be_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMP || *ty == Type::TIMESTAMPTZ
    }

    to_sql_checked!();
}

/// `numeric`'s sign word of a positive value (NaN and the infinities have others).
const NUMERIC_POS: u16 = 0x0000;
/// `numeric`'s sign word of a negative value.
const NUMERIC_NEG: u16 = 0x4000;

/// PostgreSQL's binary `numeric` as an integer: `None` for NaN, an
/// infinity, a nonzero digit below the units, a value past `i128`, or a
/// malformed value. The form: `ndigits` i16, `weight` i16 (the first
/// digit's power of 10000), sign u16, `dscale` u16, then `ndigits` base-10000
/// digits as i16, most significant first.
fn numeric(raw: &[u8]) -> Option<i128> {
    let word = |at: usize| -> Option<[u8; 2]> { raw.get(at..at + 2)?.try_into().ok() };
    let ndigits = usize::try_from(i16::from_be_bytes(word(0)?)).ok()?;
    let weight = i16::from_be_bytes(word(2)?);
    let negative = match u16::from_be_bytes(word(4)?) {
        NUMERIC_POS => false,
        NUMERIC_NEG => true,
        _ => return None,
    };
    if raw.len() != 8 + 2 * ndigits {
        return None;
    }
    let digits = (0..ndigits)
        .map(|k| {
            let d = i16::from_be_bytes(word(8 + 2 * k)?);
            (0..10_000).contains(&d).then_some(i128::from(d))
        })
        .collect::<Option<Vec<i128>>>()?;
    // Digit k stands for digits[k] × 10000^(weight − k): every one below the
    // units must be 0.
    let units = usize::try_from(i32::from(weight) + 1).unwrap_or(0);
    if digits.iter().skip(units).any(|&d| d != 0) {
        return None;
    }
    let mut value: i128 = 0;
    for k in 0..units {
        let d = digits.get(k).copied().unwrap_or(0);
        value = value.checked_mul(10_000)?.checked_add(d)?;
    }
    Some(if negative { -value } else { value })
}

/// An integral `numeric` column value.
struct Numeric(i128);

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Numeric, Box<dyn Error + Sync + Send>> {
        numeric(raw)
            .map(Numeric)
            .ok_or_else(|| "not an integer numeric".into())
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

fn int(row: &tokio_postgres::Row, i: usize, ty: &Type) -> Result<Option<i128>, ()> {
    let r = match *ty {
        Type::INT2 => row.try_get::<_, Option<i16>>(i).map(|v| v.map(i128::from)),
        Type::INT4 => row.try_get::<_, Option<i32>>(i).map(|v| v.map(i128::from)),
        Type::INT8 => row.try_get::<_, Option<i64>>(i).map(|v| v.map(i128::from)),
        Type::OID => row.try_get::<_, Option<u32>>(i).map(|v| v.map(i128::from)),
        Type::NUMERIC => row.try_get::<_, Option<Numeric>>(i).map(|v| v.map(|n| n.0)),
        // A decimal integer as text, as the MySQL source takes it.
        Type::TEXT | Type::VARCHAR | Type::BPCHAR => {
            return match row.try_get::<_, Option<String>>(i) {
                Ok(None) => Ok(None),
                Ok(Some(t)) => integer_text(&t).map(Some).ok_or(()),
                Err(_) => Err(()),
            };
        }
        _ => return Err(()),
    };
    r.map_err(|_| ())
}

fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    }
}

/// One result row read by its column names, whatever their order.
fn read(row: &tokio_postgres::Row) -> Row {
    let mut out = Row::default();
    let mut required = 0;
    for (i, col) in row.columns().iter().enumerate() {
        let ty = col.type_();
        let mut bad = false;
        match col.name() {
            "course" => {
                required += 1;
                match row.try_get::<_, Option<String>>(i) {
                    Ok(v) => out.course = v,
                    Err(_) => bad = true,
                }
            }
            name @ ("section" | "total_seats" | "seats_taken" | "version") => {
                required += 1;
                match int(row, i, ty) {
                    Ok(v) => match name {
                        "section" => out.section = v,
                        "total_seats" => out.total_seats = v,
                        "seats_taken" => out.seats_taken = v,
                        _ => out.version = v,
                    },
                    Err(()) => bad = true,
                }
            }
            "seat_info" => {
                let v = if *ty == Type::JSON || *ty == Type::JSONB {
                    row.try_get::<_, Option<serde_json::Value>>(i)
                        .map(|v| v.map(|v| v.to_string()))
                } else {
                    row.try_get::<_, Option<String>>(i)
                };
                match v {
                    Ok(v) => out.seat_info = v,
                    Err(_) => bad = true,
                }
            }
            "updated_at" => {
                if let Ok(Some(t)) = row.try_get::<_, Option<SystemTime>>(i) {
                    out.updated_us = Some(micros(t));
                }
            }
            _ => {}
        }
        out.unreadable |= bad;
    }
    out.unreadable |= required < 5;
    out
}

impl Source for Pg {
    fn fetch(&mut self, bound_us: Option<i64>) -> Result<Vec<Row>, DbError> {
        if self.link.is_none() {
            self.connect()?;
        }
        let since = bound_us.map(|bound| {
            if bound >= 0 {
                UNIX_EPOCH + Duration::from_micros(bound as u64)
            } else {
                UNIX_EPOCH - Duration::from_micros(bound.unsigned_abs())
            }
        });
        let limit = answer_limit(self.timeout);
        let result = {
            let Some((rt, client, stmt)) = self.link.as_mut() else {
                return Err(DbError::Down(format!("{}: not connected", self.shown)));
            };
            rt.block_on(async {
                let check = async {
                    let tx = client.build_transaction().read_only(true).start().await?;
                    let rows = match &since {
                        Some(t) => tx.query(&*stmt, &[t]).await?,
                        None => tx.query(&*stmt, &[&Unbounded]).await?,
                    };
                    tx.commit().await?;
                    Ok::<_, tokio_postgres::Error>(rows)
                };
                tokio::time::timeout(limit, check).await
            })
        };
        let rows = match result {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => return Err(self.error(e)),
            Err(_) => return Err(self.no_answer("query", limit)),
        };
        // The result's columns, from the executed statement: there even
        // when no row came back. The connection stays (the query is wrong,
        // not the session).
        if let Some((_, _, stmt)) = self.link.as_ref() {
            required_columns(&self.shown, stmt.columns().iter().map(|c| c.name()))?;
        }
        Ok(rows.iter().map(read).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `numeric`'s binary form: the header, then the base-10000 digits.
    fn raw(weight: i16, sign: u16, dscale: u16, digits: &[i16]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((digits.len() as i16).to_be_bytes());
        b.extend(weight.to_be_bytes());
        b.extend(sign.to_be_bytes());
        b.extend(dscale.to_be_bytes());
        for d in digits {
            b.extend(d.to_be_bytes());
        }
        b
    }

    #[test]
    fn integral_numerics_are_read() {
        // 5, 12345678 (two digits), 10000 (trailing zero digits left out).
        assert_eq!(numeric(&raw(0, 0, 0, &[5])), Some(5));
        assert_eq!(numeric(&raw(1, 0, 0, &[1234, 5678])), Some(12_345_678));
        assert_eq!(numeric(&raw(1, 0, 0, &[1])), Some(10_000));
        // -42, and 0 (no digits at all).
        assert_eq!(numeric(&raw(0, 0x4000, 0, &[42])), Some(-42));
        assert_eq!(numeric(&raw(0, 0, 0, &[])), Some(0));
        assert_eq!(numeric(&raw(0, 0, 2, &[])), Some(0));
        // 2^53 = 9007 1992 5474 0992, and 7.00 (numeric(10,2): a scale, no fraction).
        assert_eq!(
            numeric(&raw(3, 0, 0, &[9007, 1992, 5474, 992])),
            Some(1 << 53)
        );
        assert_eq!(numeric(&raw(0, 0, 2, &[7, 0])), Some(7));
        // 10^32, past u64 but within i128 (the row's check then refuses it).
        assert_eq!(numeric(&raw(8, 0, 0, &[1])), Some(10_i128.pow(32)));
    }

    #[test]
    fn fractions_nan_infinities_and_giants_are_not() {
        // 5.5 (5, then 5000 at 10000^-1), and 0.0001.
        assert_eq!(numeric(&raw(0, 0, 1, &[5, 5000])), None);
        assert_eq!(numeric(&raw(-1, 0, 4, &[1])), None);
        // NaN, +infinity, -infinity.
        for sign in [0xC000, 0xD000, 0xF000] {
            assert_eq!(numeric(&raw(0, sign, 0, &[])), None, "{sign:#x}");
        }
        // 10^40 and 10^40000 are past i128.
        assert_eq!(numeric(&raw(10, 0, 0, &[1])), None);
        assert_eq!(numeric(&raw(10_000, 0, 0, &[1])), None);
        // Malformed: a digit out of range, a length that does not match.
        assert_eq!(numeric(&raw(0, 0, 0, &[10_000])), None);
        let mut short = raw(0, 0, 0, &[5]);
        short.pop();
        assert_eq!(numeric(&short), None);
        assert_eq!(numeric(&[0, 1]), None);
        assert_eq!(
            Numeric::from_sql(&Type::NUMERIC, &raw(0, 0, 1, &[5, 5000]))
                .ok()
                .map(|n| n.0),
            None
        );
        assert!(Numeric::accepts(&Type::NUMERIC) && !Numeric::accepts(&Type::INT8));
    }
}
