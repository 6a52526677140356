//! The selection database the booted reconciler reads: a PostgreSQL the test
//! kit starts on the host's loopback (the container shares the host's
//! network), a table of sections and a role that may only `SELECT` it, and
//! the lines of the env file that point `seatboard-reconcile.service` at it.

use crate::common::*;
use testkit::proc::Postgres;

/// The table and the reader role (trust authentication: any password is taken,
/// what the role may do is the point).
const SCHEMA: &str = "
CREATE TABLE seats (course text NOT NULL, section int NOT NULL, total_seats int NOT NULL,
  seats_taken int NOT NULL, version bigint, updated_at timestamptz NOT NULL,
  PRIMARY KEY (course, section));
CREATE ROLE reader LOGIN PASSWORD 'Rd-0nly';
GRANT SELECT ON seats TO reader;";

/// The operator's query, as `systemd/README.md` shows it (one bind parameter).
const QUERY: &str = "SELECT course, section, total_seats, seats_taken, version, updated_at FROM seats WHERE updated_at >= $1";

/// The database, and the reconciler's `/metrics` port.
pub struct Selection {
    pg: Postgres,
    /// `SEATBOARD_RECONCILE_METRICS`'s port.
    pub metrics: u16,
}

impl Selection {
    /// Starts PostgreSQL with the table and the role (on a thread: it runs
    /// while the container boots).
    pub fn start() -> std::thread::JoinHandle<Selection> {
        std::thread::spawn(|| {
            let pg = Postgres::start();
            pg.psql(SCHEMA);
            Selection {
                pg,
                metrics: free_port(),
            }
        })
    }

    /// The env file's lines for the reconciler: the database (as the reader
    /// role), the query in single quotes, short clocks so a repair is quick.
    pub fn env_lines(&self) -> String {
        format!(
            "SEATBOARD_RECONCILE_DB={db}\n\
             SEATBOARD_RECONCILE_QUERY='{QUERY}'\n\
             SEATBOARD_RECONCILE_INTERVAL_MS=300\n\
             SEATBOARD_RECONCILE_GRACE_MS=300\n\
             SEATBOARD_RECONCILE_METRICS=127.0.0.1:{metrics}\n",
            db = self.pg.url("reader", "Rd-0nly"),
            metrics = self.metrics
        )
    }

    /// A row committed whose publish never happened.
    pub fn commit(&self, course: &str, section: u32, taken: u32, version: u64) {
        self.pg.psql(&format!(
            "INSERT INTO seats VALUES ('{course}', {section}, 30, {taken}, {version}, clock_timestamp())"
        ));
    }

    /// The roles of the reconciler's sessions on the server now.
    pub fn sessions(&self) -> Vec<String> {
        self.pg
            .psql("SELECT usename FROM pg_stat_activity WHERE application_name = 'seatboard-reconcile'")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}
