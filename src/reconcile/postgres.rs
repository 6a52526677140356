//! The PostgreSQL source: the sync `postgres` client on the worker's thread,
//! one connection (`application_name` `seatboard-reconcile`), the session's
//! `statement_timeout` and `default_transaction_read_only` set at connect,
//! the query prepared once, each check one `BEGIN READ ONLY` transaction.
//! TLS as `sslmode` asks, in libpq's terms (`db_tls.rs`: rustls, verified
//! against `--db-ca` or the system roots); SIGTERM sends PostgreSQL's own
//! cancel request.

use super::db_tls::{client_config, pg_mode};
use super::flags::redact;
use super::row::Row;
use super::source::{take_param, CancelSlot, DbError, Source, UrlError};
use postgres::error::SqlState;
use postgres::types::Type;
use postgres::{Client, Config, NoTls, Statement};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A PostgreSQL database read through one connection.
pub struct Pg {
    config: Config,
    tls: Option<MakeRustlsConnect>,
    query: String,
    timeout: Duration,
    shown: String,
    cancel: CancelSlot,
    client: Option<(Client, Statement)>,
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
            .connect_timeout(Duration::from_secs(5))
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
            client: None,
        })
    }

    fn connect(&mut self) -> Result<(), postgres::Error> {
        let mut client = match &self.tls {
            Some(t) => self.config.connect(t.clone())?,
            None => self.config.connect(NoTls)?,
        };
        let ms = self.timeout.as_millis();
        client.batch_execute(&format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET default_transaction_read_only = on"
        ))?;
        let stmt = client.prepare(&self.query)?;
        let token = client.cancel_token();
        let tls = self.tls.clone();
        self.cancel.set(Box::new(move || {
            let r = match tls {
                Some(t) => token.cancel_query(t),
                None => token.cancel_query(NoTls),
            };
            if let Err(e) = r {
                tracing::debug!(error = %e, "cancel request failed");
            }
        }));
        self.client = Some((client, stmt));
        Ok(())
    }

    fn error(&mut self, e: postgres::Error) -> DbError {
        let text = match e.as_db_error() {
            Some(d) => format!("{} ({}): {}", self.shown, d.code().code(), d.message()),
            None => format!("{}: {e}", self.shown),
        };
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            return DbError::Timeout(text);
        }
        self.client = None;
        DbError::Down(text)
    }
}

fn int(row: &postgres::Row, i: usize, ty: &Type) -> Result<Option<i128>, ()> {
    let r = match *ty {
        Type::INT2 => row.try_get::<_, Option<i16>>(i).map(|v| v.map(i128::from)),
        Type::INT4 => row.try_get::<_, Option<i32>>(i).map(|v| v.map(i128::from)),
        Type::INT8 => row.try_get::<_, Option<i64>>(i).map(|v| v.map(i128::from)),
        Type::OID => row.try_get::<_, Option<u32>>(i).map(|v| v.map(i128::from)),
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
fn read(row: &postgres::Row) -> Row {
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
        if self.client.is_none() {
            self.connect().map_err(|e| self.error(e))?;
        }
        let bound = bound_us.unwrap_or(super::source::LOWEST_US);
        let since = if bound >= 0 {
            UNIX_EPOCH + Duration::from_micros(bound as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(bound.unsigned_abs())
        };
        let result = {
            let Some((client, stmt)) = self.client.as_mut() else {
                return Err(DbError::Down(format!("{}: not connected", self.shown)));
            };
            (|| {
                let mut tx = client.build_transaction().read_only(true).start()?;
                let rows = tx.query(&*stmt, &[&since])?;
                tx.commit()?;
                Ok::<_, postgres::Error>(rows)
            })()
        };
        match result {
            Ok(rows) => Ok(rows.iter().map(read).collect()),
            Err(e) => Err(self.error(e)),
        }
    }
}
