//! `seatboard reconcile` (contract §11): the database is the truth. A worker
//! beside the nodes reads the selection database (read only, one
//! connection, the operator's query) and repairs what a fire-and-forget
//! publish lost, so every board equals the database within a bounded time.
//!
//! `flags.rs` the command line; `source.rs` the database trait, with
//! `postgres.rs` and `mysql.rs`; `row.rs` a row checked by section 2's
//! rules; `decide.rs` the pure, clock-free rule of what to look up, leave,
//! write or replace; `store.rs` the Redis side; `metrics.rs` the figures
//! (served by `crate::worker_http`); `run.rs` the loop and `--check`.
//!
//! SIGTERM or SIGINT: the statement in flight is cancelled on the server,
//! what a check was about to write is dropped, exit 0 within 2 s.

pub mod decide;
pub mod flags;
pub mod metrics;
pub mod mysql;
pub mod postgres;
pub mod row;
pub mod run;
pub mod source;
pub mod store;

use crate::logging::{line, usage};
use crate::redis::commands::Commands;
use flags::{FlagError, Kind, ReconcileArgs};
use metrics::Shared;
use run::{CheckError, Worker};
use source::{CancelSlot, Source};
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use store::Store;

/// How long after SIGTERM the worker is waited for (the contract's 2 s, with margin).
const STOP_WAIT: Duration = Duration::from_millis(1500);

/// Runs `seatboard reconcile` (or `--check`) to its exit code.
pub fn main(args: ReconcileArgs) -> ExitCode {
    let c = match flags::check(&args) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    if let Err(e) = crate::logging::init(&args.target.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.target.log_level
        ));
    }
    let slot = CancelSlot::default();
    let t = c.timing;
    let source: Result<Box<dyn Source>, String> = match c.kind {
        Kind::Postgres => postgres::Pg::new(
            &args.db,
            c.ca.as_deref(),
            &args.query,
            t.statement_timeout,
            slot.clone(),
        )
        .map(|s| Box::new(s) as Box<dyn Source>),
        Kind::Mysql => mysql::My::new(
            &args.db,
            args.db_ca.clone(),
            &args.query,
            t.statement_timeout,
            slot.clone(),
        )
        .map(|s| Box::new(s) as Box<dyn Source>),
    };
    let source = match source {
        Ok(s) => s,
        Err(why) => {
            return usage(&FlagError::Db {
                shown: flags::redact(&args.db),
                why,
            })
        }
    };
    let shared = Arc::new(Shared::new());
    let store = Store {
        link: Commands::new(&c.redis, "reconcile"),
        channel_prefix: args.target.channel_prefix.clone(),
        state_prefix: args.target.state_prefix.clone(),
        commands: 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut worker = Worker::new(source, store, Arc::clone(&shared), t, Arc::clone(&stop));
    if args.check {
        return match run::check_once(&mut worker) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                let why = match e {
                    CheckError::Db(d) => d.to_string(),
                    CheckError::Redis(r) => format!("Redis: {r}"),
                    CheckError::Stopped => "stopped".into(),
                };
                line(&format!("error: cannot check: {why}"));
                ExitCode::from(3)
            }
        };
    }
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            line(&format!("error: cannot start: signals: {e}"));
            return ExitCode::from(1);
        }
    };
    if let Some(addr) = c.metrics {
        let started =
            TcpListener::bind(addr).and_then(|l| crate::worker_http::spawn(l, Arc::clone(&shared)));
        if let Err(e) = started {
            line(&format!("error: cannot start: --metrics {addr}: {e}"));
            return ExitCode::from(1);
        }
    }
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let spawned = std::thread::Builder::new()
        .name("reconcile".into())
        .spawn(move || {
            worker.run(stop_rx);
            let _ = done_tx.send(());
        });
    if let Err(e) = spawned {
        line(&format!("error: cannot start: thread: {e}"));
        return ExitCode::from(1);
    }
    tracing::info!(
        db = %flags::redact(&args.db),
        interval_ms = args.interval_ms,
        sweep_s = args.sweep_s,
        metrics = ?c.metrics,
        "seatboard reconcile running"
    );
    let sig = signals.forever().next();
    tracing::info!(signal = ?sig, "stopping: the statement in flight is cancelled");
    stop.store(true, Relaxed);
    let _ = stop_tx.try_send(());
    slot.cancel();
    let _ = done_rx.recv_timeout(STOP_WAIT);
    crate::logging::flush(Duration::from_millis(200));
    ExitCode::SUCCESS
}
