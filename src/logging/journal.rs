//! Log levels the systemd journal understands. Under a unit whose stderr is
//! the journal (`JOURNAL_STREAM` names stderr's device and inode), each line
//! starts with its syslog priority, `<3>` error to `<7>` debug: journald
//! strips the prefix and files the line at that priority, so
//! `journalctl -p warning` shows warnings. Anywhere else lines are unchanged.

use std::fmt;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` is set and names
/// the device and inode stderr has (a child whose stderr was redirected
/// inherits the variable but not the stream, and gets plain lines).
pub fn stderr_is_journal() -> bool {
    let Some(var) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some(var) = var.to_str() else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => names_stream(var, m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// Whether a `JOURNAL_STREAM` value (`<device>:<inode>`, decimal) names the
/// stream with device `dev` and inode `ino`.
fn names_stream(var: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = var.trim().split_once(':') else {
        return false;
    };
    d.parse::<u64>().is_ok_and(|d| d == dev) && i.parse::<u64>().is_ok_and(|i| i == ino)
}

/// The syslog priority prefix of a `tracing` level (sd-daemon(3)).
pub fn level_prefix(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "<3>",
        Level::WARN => "<4>",
        Level::INFO => "<6>",
        Level::DEBUG | Level::TRACE => "<7>",
    }
}

/// The priority prefix of a line written outside `tracing` (usage errors,
/// start failures): `error:` lines are errors, `warning:` lines warnings,
/// the rest notices of the info level.
pub fn line_prefix(line: &str) -> &'static str {
    if line.starts_with("error:") {
        "<3>"
    } else if line.starts_with("warning:") {
        "<4>"
    } else {
        "<6>"
    }
}

/// An event formatter that writes the level's priority prefix before what
/// the inner formatter writes, when `journal` is on.
pub struct Prefixed<F> {
    /// Whether stderr is the journal (prefixes are written).
    pub journal: bool,
    /// The formatter of the line itself.
    pub inner: F,
}

impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.journal {
            writer.write_str(level_prefix(event.metadata().level()))?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_has_its_syslog_priority() {
        assert_eq!(level_prefix(&Level::ERROR), "<3>");
        assert_eq!(level_prefix(&Level::WARN), "<4>");
        assert_eq!(level_prefix(&Level::INFO), "<6>");
        assert_eq!(level_prefix(&Level::DEBUG), "<7>");
        assert_eq!(level_prefix(&Level::TRACE), "<7>");
    }

    #[test]
    fn plain_lines_take_the_priority_their_first_word_names() {
        assert_eq!(line_prefix("error: --jwt-secret: too short"), "<3>");
        assert_eq!(line_prefix("warning: rehearse: viewers loop 1"), "<4>");
        assert_eq!(line_prefix("relay stopped"), "<6>");
        assert_eq!(line_prefix(" error: indented"), "<6>");
    }

    #[test]
    fn journal_stream_must_name_this_device_and_inode() {
        assert!(names_stream("8:12345", 8, 12345));
        assert!(names_stream("8:12345\n", 8, 12345));
        assert!(!names_stream("8:12346", 8, 12345));
        assert!(!names_stream("9:12345", 8, 12345));
        assert!(!names_stream("812345", 8, 12345));
        assert!(!names_stream("", 8, 12345));
        assert!(!names_stream("x:y", 8, 12345));
        assert!(!names_stream("-8:12345", 8, 12345));
    }
}
