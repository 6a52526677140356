//! `seatboard analytics`: the history worker (contract section 7) and its
//! `report` command. A separate process from the hub: it pattern-subscribes to
//! the seat channels, counts snapshots per course, reads presence counts (read
//! only) at the end of every wall-clock-aligned bucket and appends one stream
//! entry per non-idle bucket.

pub mod redis;
pub mod report;
pub mod worker;

use crate::logging::{init as logging, usage};
use clap::{Args, Subcommand};
use std::process::ExitCode;

/// Flags of `seatboard analytics` (the shared ones also apply to `report`).
#[derive(Args, Debug, Clone)]
pub struct AnalyticsArgs {
    /// Run something else than the worker.
    #[command(subcommand)]
    pub action: Option<AnalyticsCommand>,
    /// Redis: URIs, mode, pub/sub flavour, CA.
    #[command(flatten)]
    pub redis: crate::redis::RedisFlags,
    /// Pub/sub channel prefix (the worker subscribes to `<prefix>*`).
    #[arg(long, env = "SEATBOARD_CHANNEL_PREFIX", default_value = "seats:")]
    pub channel_prefix: String,
    /// State hash prefix (sharded cluster: the courses to shard-subscribe are found by SCAN of it).
    #[arg(long, env = "SEATBOARD_STATE_PREFIX", default_value = "seatstate:")]
    pub state_prefix: String,
    /// Presence sorted-set prefix (read only).
    #[arg(long, env = "SEATBOARD_PRESENCE_PREFIX", default_value = "presence:")]
    pub presence_prefix: String,
    /// Selection window id: entries go to `<analytics-prefix><session>`.
    #[arg(
        long,
        env = "SEATBOARD_SESSION",
        default_value = "default",
        global = true
    )]
    pub session: String,
    /// Stream key prefix.
    #[arg(
        long,
        env = "SEATBOARD_ANALYTICS_PREFIX",
        default_value = "analytics:",
        global = true
    )]
    pub analytics_prefix: String,
    /// Bucket length (ms); buckets are aligned to wall-clock multiples of it.
    #[arg(long, env = "SEATBOARD_BUCKET_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub bucket_ms: u64,
    /// Approximate stream length cap (`XADD MAXLEN ~`).
    #[arg(long, env = "SEATBOARD_ANALYTICS_MAX_LEN", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_len: u64,
    /// Log level (error, warn, info, debug, trace).
    #[arg(long, env = "SEATBOARD_LOG", default_value = "info", global = true)]
    pub log_level: String,
}

/// Subcommands of `seatboard analytics`.
#[derive(Subcommand, Debug, Clone)]
pub enum AnalyticsCommand {
    /// Print the series of a session as a table (or CSV) and exit.
    Report(ReportArgs),
}

/// Flags of `seatboard analytics report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
    /// Only the last N entries (0: all).
    #[arg(long, default_value_t = 0)]
    pub last: usize,
}

/// The stream key of a session.
pub fn stream_key(prefix: &str, session: &str) -> String {
    format!("{prefix}{session}")
}

/// Runs `seatboard analytics [report]` and returns the process exit code.
pub fn main(args: AnalyticsArgs) -> ExitCode {
    if let Err(e) = logging(&args.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        ));
    }
    if args.session.is_empty() {
        return usage("invalid value '' for '--session': must not be empty");
    }
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
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
        None => {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                if let Err(e) = signal_hook::flag::register(sig, std::sync::Arc::clone(&stop)) {
                    eprintln!("error: cannot install signal handlers: {e}");
                    return ExitCode::from(1);
                }
            }
            redis::run(&redis, &args, &stop);
            ExitCode::SUCCESS
        }
    }
}
