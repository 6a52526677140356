//! `seatboard publish-script`: the state hash's compare-and-set script for a
//! selection API in any language to embed and run with `EVALSHA`.

use crate::publish::script;
use std::io::Write;
use std::process::ExitCode;

/// Prints the script on stdout and its SHA1 (hex) on stderr.
pub fn run() -> ExitCode {
    let mut out = std::io::stdout().lock();
    if out.write_all(script::SOURCE.as_bytes()).is_err() || out.flush().is_err() {
        return ExitCode::from(1);
    }
    let _ = writeln!(std::io::stderr(), "{}", script::sha1_hex());
    ExitCode::SUCCESS
}
