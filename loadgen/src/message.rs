//! What the rehearsal (or the bench suite) and a viewer loop say to each
//! other, typed: [`Command`]s in, [`Output`]s back. On a thread they travel
//! as values; to and from a child process as one JSON line each (stdin,
//! stdout). A line that is not one of them is an error that names it.

use crate::counters::Counters;
use crate::hist::Hist;
use crate::report::Report;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a viewer loop is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Answer with the counters at once (window boundaries).
    Mark,
    /// Answer with the report and stop.
    Report,
    /// From now on a lost connection starts a blind interval.
    Arm,
    /// Every viewer is blind from now until it holds the next reference
    /// (Redis went away: boards are frozen though sockets stay open).
    Blind,
    /// Arm, reset (RST) every open connection at once, as when a node dies
    /// and its viewers are sent on, and forget the refusals counted so far.
    Drop,
    /// Later latency samples go to the histogram of `phase`.
    Lat {
        /// The phase's name (`warmup`, `before`, `during`, ...).
        phase: String,
    },
    /// A reference board: per course, per section, the version the
    /// publisher had written.
    Ref {
        /// Versions by course index, then section.
        versions: Vec<Vec<u64>>,
    },
}

/// What a viewer loop answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// Every 500 ms: counters, refusals so far, latency since the last one.
    Progress(Progress),
    /// The answer to [`Command::Mark`].
    Mark(Counters),
    /// The answer to [`Command::Report`] (or the end of its time).
    Report(Box<Report>),
    /// A line that did not read: a command line the loop could not read,
    /// or (from a child's parent, [`crate::children`]) an output line.
    Rejected(MessageError),
}

/// One progress value.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    /// The counters now.
    pub counters: Counters,
    /// Refusals by status so far: (status, count).
    pub refusals: Vec<(u16, u64)>,
    /// Latency (µs) since the last progress value.
    pub latency: Hist,
}

/// A line that is not the message it should be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageError {
    /// The line, as it came.
    pub line: String,
    /// Why it does not read.
    pub why: String,
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unreadable message {:?}: {}", self.line, self.why)
    }
}

impl std::error::Error for MessageError {}

/// Reads one line as a `T` (a [`Command`] or an [`Output`]).
pub fn parse<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, MessageError> {
    serde_json::from_str(line.trim()).map_err(|e| MessageError {
        line: line.trim().to_owned(),
        why: e.to_string(),
    })
}

/// One message as its line (no newline).
pub fn line<T: Serialize>(msg: &T) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_as_lines() {
        let all = [
            Command::Mark,
            Command::Report,
            Command::Arm,
            Command::Blind,
            Command::Drop,
            Command::Lat {
                phase: "during".into(),
            },
            Command::Ref {
                versions: vec![vec![1, 2], vec![]],
            },
        ];
        for c in all {
            let l = line(&c);
            assert_eq!(parse::<Command>(&l), Ok(c), "{l}");
        }
        assert_eq!(line(&Command::Arm), r#"{"cmd":"arm"}"#);
    }

    #[test]
    fn unknown_and_malformed_commands_are_named_errors() {
        let e = parse::<Command>(r#"{"cmd":"explode"}"#).unwrap_err();
        assert_eq!(e.line, r#"{"cmd":"explode"}"#);
        assert!(e.why.contains("explode"), "{e}");
        let e = parse::<Command>("report").unwrap_err();
        assert!(
            e.to_string().starts_with("unreadable message \"report\""),
            "{e}"
        );
        assert!(parse::<Command>(r#"{"cmd":"ref","versions":"x"}"#).is_err());
    }

    #[test]
    fn outputs_round_trip_as_lines() {
        let mut latency = Hist::default();
        latency.record(1500);
        let p = Output::Progress(Progress {
            counters: Counters {
                open: 9,
                ..Counters::default()
            },
            refusals: vec![(503, 2)],
            latency,
        });
        let Output::Progress(back) = parse::<Output>(&line(&p)).unwrap() else {
            panic!("a progress value");
        };
        assert_eq!(back.counters.open, 9);
        assert_eq!(back.refusals, vec![(503, 2)]);
        assert_eq!((back.latency.total(), back.latency.max()), (1, 1500));
        let rejected = Output::Rejected(MessageError {
            line: "x".into(),
            why: "y".into(),
        });
        assert!(matches!(
            parse::<Output>(&line(&rejected)),
            Ok(Output::Rejected(_))
        ));
        assert!(parse::<Output>(r#"{"p":{}}"#).is_err());
    }
}
