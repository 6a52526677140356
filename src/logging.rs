//! Process setup shared by every subcommand: logging to stderr and usage errors.

use std::process::ExitCode;

/// Logs to stderr at `level` (an EnvFilter directive such as `info`).
pub fn init(level: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| e.to_string())?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init()
        .map_err(|e| e.to_string())
}

/// A usage error: the first stderr line names the flag, exit 2.
pub fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}
