//! `seatboard analytics`: the history worker (contract section 7) and its
//! `report` command. A separate process from the hub: it pattern-subscribes to
//! the seat channels, counts snapshots per course, reads presence counts (read
//! only) at the end of every wall-clock-aligned bucket and appends one stream
//! entry per non-idle bucket.

pub mod metrics;
pub mod redis;
pub mod report;

use crate::analytics_stream::stream_key;
pub use crate::cli::{AnalyticsArgs, AnalyticsCommand, ReportArgs};
use crate::logging::{init as logging, usage};
use std::process::ExitCode;

/// Runs `seatboard analytics [report]` and returns the process exit code.
pub fn main(args: AnalyticsArgs) -> ExitCode {
    if let Err(e) = logging(&args.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        ));
    }
    let metrics_addr: Option<std::net::SocketAddr> = match args.metrics.trim() {
        "" => None,
        m => match m.parse() {
            Ok(a) => Some(a),
            Err(_) => {
                return usage(&format!(
                    "invalid value '{m}' for '--metrics': not an IP:PORT"
                ))
            }
        },
    };
    let redis = match crate::redis::Redis::from_flags(&args.redis) {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    match &args.action {
        Some(AnalyticsCommand::Report(r)) => {
            let key = stream_key(&args.analytics_prefix, &args.session);
            let mut out = std::io::stdout().lock();
            let mut con = crate::redis::commands::Commands::new(&redis, "report");
            match report::run(&mut con, &key, r, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    crate::logging::line(&format!("error: {e}"));
                    ExitCode::from(1)
                }
            }
        }
        None => {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                if let Err(e) = signal_hook::flag::register(sig, std::sync::Arc::clone(&stop)) {
                    crate::logging::line(&format!("error: cannot install signal handlers: {e}"));
                    return ExitCode::from(1);
                }
            }
            let figures = std::sync::Arc::new(metrics::Shared::default());
            if let Some(addr) = metrics_addr {
                let started = std::net::TcpListener::bind(addr)
                    .and_then(|l| crate::worker_http::spawn(l, std::sync::Arc::clone(&figures)));
                if let Err(e) = started {
                    crate::logging::line(&format!("error: cannot start: --metrics {addr}: {e}"));
                    return ExitCode::from(1);
                }
            }
            match redis::run(&redis, &args, &stop, figures) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    crate::logging::line(&format!("error: cannot start: {e}"));
                    ExitCode::from(1)
                }
            }
        }
    }
}
