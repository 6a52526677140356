//! Process setup shared by every subcommand: logging to stderr and usage errors.
//! Nothing here panics or blocks when stderr stops taking writes.

mod budget;
mod journal;
mod sink;

pub use budget::{Allowance, LogBudget};
pub use sink::{dropped, flush};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

/// Logs to stderr at `level` (an EnvFilter directive such as `info`), with
/// terminal colour codes only when stderr is a terminal and `NO_COLOR` is unset
/// (a file or journald gets plain text). Under systemd with stderr the
/// journal, each line starts with its syslog priority (`<4>` a warning), which
/// journald files it under. Lines go through the writer thread of [`sink`]: a
/// stalled or closed stderr drops lines, it never stops a thread. Events
/// with target [`LOUD`] are written at every level, `off` included.
pub fn init(level: &str) -> Result<(), InitError> {
    bare_targets_refused(level)?;
    let filter = tracing_subscriber::EnvFilter::try_new(level)?
        .add_directive(format!("{LOUD}=warn").parse()?);
    sink::start();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sink::Sink)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .event_format(journal::Prefixed {
            journal: to_journal(),
            inner: tracing_subscriber::fmt::format().with_target(false),
        })
        .try_init()?;
    Ok(())
}

/// The target of a warning no `--log-level` silences (`--auth none`), as in
/// `tracing::warn!(target: LOUD, ...)`: it is written as any other warning
/// (same line, same journal priority), whatever the level.
pub const LOUD: &str = "seatboard::loud";

/// Why logging could not be set up: a `--log-level` refused (exit 2, the
/// caller names the flag) or a second set-up in one process.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// No directive at all (`--log-level ''`, `SEATBOARD_LOG=`): a blank
    /// line of an env file, not a wish to log nothing (that is `off`).
    #[error("no level given (trace, debug, info, warn, error, off, or target=level)")]
    Empty,
    /// A bare word that is no level (a typo such as `nope`).
    #[error("'{0}' is no level (trace, debug, info, warn, error, off) and no target=level")]
    NotALevel(String),
    /// A directive the filter cannot parse.
    #[error(transparent)]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    /// A subscriber was already set.
    #[error(transparent)]
    Set(#[from] Box<dyn std::error::Error + Send + Sync>),
}

/// A directive that is a bare word but no level (`nope`, `inf`) is a target
/// name to the filter: every other line would vanish. Such a typo is a bad
/// value, not a silent log-off; so is a value without any directive.
fn bare_targets_refused(level: &str) -> Result<(), InitError> {
    if level.split(',').all(|d| d.trim().is_empty()) {
        return Err(InitError::Empty);
    }
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    match level.split(',').map(str::trim).find(|d| {
        !d.is_empty() && !d.contains('=') && !LEVELS.contains(&d.to_ascii_lowercase().as_str())
    }) {
        Some(d) => Err(InitError::NotALevel(d.to_owned())),
        None => Ok(()),
    }
}

/// Whether stderr is the journal's stream, looked at once per process.
fn to_journal() -> bool {
    static JOURNAL: OnceLock<bool> = OnceLock::new();
    *JOURNAL.get_or_init(journal::stderr_is_journal)
}

/// Whether log lines carry colour codes: on a terminal, and never while
/// `NO_COLOR` is set (to anything, the empty string included).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none()
}

/// A usage error: the first stderr line names the flag, exit 2.
pub fn usage<M: std::fmt::Display + ?Sized>(msg: &M) -> ExitCode {
    line(&format!("error: {msg}"));
    ExitCode::from(2)
}

/// Writes one line to stderr after the log lines queued before it, dropping
/// it (counted) if stderr refuses it: `eprintln!` would panic instead. Into
/// the journal, an `error:` line is filed as an error, `warning:` a warning.
pub fn line(msg: &str) {
    flush(Duration::from_millis(200));
    let prefix = if to_journal() {
        journal::line_prefix(msg)
    } else {
        ""
    };
    sink::write_now(format!("{prefix}{msg}\n").as_bytes());
}

/// Writes a command-line refusal of several lines to stderr, each at error
/// priority when stderr is the journal ([`refusal_to_journal`]).
pub fn refusal(text: &str) {
    if !refusal_to_journal(text) {
        sink::write_now(text.as_bytes());
    }
}

/// Writes a command-line refusal (clap's message, several lines) to stderr
/// with every line at error priority when stderr is the journal, so
/// `journalctl -p err` shows the flag it names even on a later line.
/// Returns false, writing nothing, when stderr is not the journal.
pub fn refusal_to_journal(text: &str) -> bool {
    if !journal::stderr_is_journal() {
        return false;
    }
    let mut out = String::with_capacity(text.len() + 64);
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        out.push_str("<3>");
        out.push_str(l);
        out.push('\n');
    }
    sink::write_now(out.as_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::{bare_targets_refused, colour};

    #[test]
    fn a_bare_word_that_is_no_level_is_refused() {
        for ok in [
            "info",
            "WARN",
            "off",
            "seatboard=debug,warn",
            "debug, h2=off",
        ] {
            assert!(bare_targets_refused(ok).is_ok(), "{ok}");
        }
        for bad in ["nope", "inf", "info,nope", "warning"] {
            let e = bare_targets_refused(bad).expect_err(bad).to_string();
            assert!(e.contains("no level"), "{e}");
        }
        for empty in ["", " ", ",", " , "] {
            let e = bare_targets_refused(empty).expect_err(empty).to_string();
            assert!(e.contains("no level given"), "{e}");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
        assert!(!colour(false, Some("1".into())));
    }
}
