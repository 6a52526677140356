//! `seatboard reconcile` (contract §11): the database is the truth. A worker
//! beside the nodes reads the selection database (read only, one
//! connection, the operator's query) and repairs what a fire-and-forget
//! publish lost, so every board equals the database within a bounded time.
//!
//! `flags.rs` the command line (`query.rs` reads the query's parameters
//! and statements); `source.rs` the database trait, with
//! `postgres.rs` and `mysql.rs`; `row.rs` a row checked by section 2's
//! rules; `decide.rs` the pure, clock-free rule of what to look up, leave,
//! write or replace; `store.rs` the Redis side; `metrics.rs` the figures
//! (served by `crate::worker_http`); `schedule.rs` the clock-free rule of
//! when the loop checks, sweeps or pings Redis; `run.rs` the loop and `--check`.
//!
//! SIGTERM or SIGINT: the statement in flight is cancelled on the server,
//! what a check was about to write is dropped, exit 0 within 2 s.

pub mod db_tls;
pub mod decide;
pub mod flags;
pub mod metrics;
pub mod mysql;
pub mod postgres;
pub mod query;
pub mod row;
pub mod run;
pub mod schedule;
pub mod source;
pub mod store;

use crate::channels::signals::Stop;
use crate::logging::{line, usage};
use crate::redis::commands::Commands;
use crate::supervisor::{self, Policy};
use flags::{Checked, FlagError, Kind, ReconcileArgs};
use metrics::Shared;
use run::{CheckError, Worker};
use source::{CancelSlot, Source, UrlError};
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::Store;

/// How long after SIGTERM the worker is waited for (the contract's 2 s, with margin).
const STOP_WAIT: Duration = Duration::from_millis(1500);

/// Runs `seatboard reconcile` (or `--check`) to its exit code.
pub fn main(args: ReconcileArgs) -> ExitCode {
    let c = match checked(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let opened = match open(&args, &c) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if args.check {
        return check(opened.worker);
    }
    let signals = match listen(&c, &opened.shared) {
        Ok(s) => s,
        Err(code) => return code,
    };
    serve(&args, &c, opened, signals)
}

/// The worker and what stops it: the flag it polls and the slot that
/// cancels its statement in flight.
struct Opened {
    worker: Worker,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    slot: CancelSlot,
}

/// The flag check and the log level: exit 2 with the reason if either is wrong.
fn checked(args: &ReconcileArgs) -> Result<Checked, ExitCode> {
    let c = flags::check(args).map_err(|e| usage(&e))?;
    if let Err(e) = crate::logging::init(&args.log_level) {
        return Err(usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        )));
    }
    Ok(c)
}

/// Opens the database (exit 2 with the reason if it refuses) and the Redis
/// store, and builds the worker over them.
fn open(args: &ReconcileArgs, c: &Checked) -> Result<Opened, ExitCode> {
    let slot = CancelSlot::default();
    let source = source(args, c, &slot).map_err(|why| {
        usage(&FlagError::Db {
            shown: flags::redact(&args.db),
            why,
        })
    })?;
    let shared = Arc::new(Shared::new());
    let store = Store {
        link: Commands::new(&c.redis, "reconcile"),
        channel_prefix: args.target.channel_prefix.clone(),
        state_prefix: args.target.state_prefix.clone(),
        commands: 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Worker::new(
        source,
        store,
        Arc::clone(&shared),
        c.timing,
        Arc::clone(&stop),
    );
    Ok(Opened {
        worker,
        shared,
        stop,
        slot,
    })
}

/// The database `--db` names, its statements cancellable through `slot`.
fn source(
    args: &ReconcileArgs,
    c: &Checked,
    slot: &CancelSlot,
) -> Result<Box<dyn Source>, UrlError> {
    let timeout = c.timing.statement_timeout;
    match c.kind {
        Kind::Postgres => postgres::Pg::new(
            &args.db,
            c.ca.as_deref(),
            &args.query,
            timeout,
            slot.clone(),
        )
        .map(|s| Box::new(s) as Box<dyn Source>),
        Kind::Mysql => mysql::My::new(
            &args.db,
            c.ca.as_deref(),
            &args.query,
            timeout,
            slot.clone(),
        )
        .map(|s| Box::new(s) as Box<dyn Source>),
    }
}

/// `--check`: one full check; exit 0 when Redis agrees with the database, 1
/// when it does not, 3 when the database or Redis cannot be read (a result
/// lacking a required column included: nothing could be compared).
fn check(mut worker: Worker) -> ExitCode {
    match run::check_once(&mut worker) {
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
    }
}

/// The start of the long run: SIGTERM and SIGINT caught, and the metrics
/// endpoint if `--metrics` names one; exit 1 if either cannot start.
fn listen(c: &Checked, shared: &Arc<Shared>) -> Result<Arc<Stop>, ExitCode> {
    let signals = match Stop::catch() {
        Ok(s) => s,
        Err(e) => {
            line(&format!("error: cannot start: signals: {e}"));
            return Err(ExitCode::from(1));
        }
    };
    if let Some(addr) = c.metrics {
        let started =
            TcpListener::bind(addr).and_then(|l| crate::worker_http::spawn(l, Arc::clone(shared)));
        if let Err(e) = started {
            line(&format!("error: cannot start: --metrics {addr}: {e}"));
            return Err(ExitCode::from(1));
        }
    }
    Ok(signals)
}

/// The run: the worker on its thread until SIGTERM or SIGINT, then the
/// statement in flight cancelled and the worker waited for; exit 0.
fn serve(args: &ReconcileArgs, c: &Checked, opened: Opened, signals: Arc<Stop>) -> ExitCode {
    let Opened {
        mut worker,
        stop,
        slot,
        ..
    } = opened;
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    let spawned = supervisor::spawn("reconcile", Policy::Logged, move || worker.run(stop_rx));
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
    let sig = signals.next();
    tracing::info!(signal = ?sig, "stopping: the statement in flight is cancelled");
    stop.store(true, Relaxed);
    let _ = stop_tx.try_send(());
    slot.cancel();
    supervisor::join("reconcile", Instant::now() + STOP_WAIT);
    crate::logging::flush(Duration::from_millis(200));
    ExitCode::SUCCESS
}
