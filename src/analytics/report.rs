//! `seatboard analytics report`: a session's stream read back (by
//! [`crate::analytics_stream::read`]) and printed as a table or CSV on stdout.

use super::ReportArgs;
use crate::analytics_stream::read::{read_after, read_last, PAGE};
use crate::analytics_stream::Entry;
use crate::redis::commands::Commands;
use crate::redis::Error;
use std::io::Write;

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix millisecond.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (H. Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Writes the series as a table or CSV.
pub fn render(
    out: &mut impl Write,
    key: &str,
    series: &[(String, Entry)],
    csv: bool,
) -> std::io::Result<()> {
    if csv {
        writeln!(
            out,
            "id,bucket_start_ms,bucket_ms,course,updates,viewers,seats_taken,total_seats"
        )?;
        for (id, e) in series {
            for c in &e.courses {
                writeln!(
                    out,
                    "{id},{},{},{},{},{},{},{}",
                    e.bucket_start_ms,
                    e.bucket_ms,
                    c.course,
                    c.updates,
                    c.viewers,
                    c.seats_taken,
                    c.total_seats
                )?;
            }
        }
        return Ok(());
    }
    let width = series
        .iter()
        .flat_map(|(_, e)| e.courses.iter().map(|c| c.course.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "{:<19}  {:>9}  {:<width$}  {:>8}  {:>9}  {:>8}  {:>8}  {:>8}  {:>6}",
        "bucket_start (UTC)",
        "bucket_ms",
        "course",
        "updates",
        "updates/s",
        "viewers",
        "taken",
        "seats",
        "fill"
    )?;
    let mut rows = 0usize;
    for (_, e) in series {
        let secs = e.bucket_ms.max(1) as f64 / 1000.0;
        for c in &e.courses {
            let fill = if c.total_seats > 0 {
                format!(
                    "{:.1}%",
                    c.seats_taken as f64 * 100.0 / c.total_seats as f64
                )
            } else {
                "-".into()
            };
            writeln!(
                out,
                "{:<19}  {:>9}  {:<width$}  {:>8}  {:>9.2}  {:>8}  {:>8}  {:>8}  {:>6}",
                utc(e.bucket_start_ms),
                e.bucket_ms,
                c.course,
                c.updates,
                c.updates as f64 / secs,
                c.viewers,
                c.seats_taken,
                c.total_seats,
                fill
            )?;
            rows += 1;
        }
    }
    writeln!(out, "{} entries, {rows} course rows in {key}", series.len())
}

/// Why `seatboard analytics report` failed (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The stream could not be read.
    #[error("{command} {key}: {source}")]
    Read {
        /// `XRANGE` or `XREVRANGE`.
        command: &'static str,
        /// The stream.
        key: String,
        /// Why (boxed: the driver's error is large).
        #[source]
        source: Box<Error>,
    },
    /// Stdout refused the table.
    #[error("cannot write: {0}")]
    Write(#[source] std::io::Error),
}

/// `seatboard analytics report`: reads the whole stream (or its last `--last` entries) and prints it.
pub fn run(
    con: &mut Commands,
    key: &str,
    args: &ReportArgs,
    out: &mut impl Write,
) -> Result<(), ReportError> {
    let read = |command| {
        move |source| ReportError::Read {
            command,
            key: key.to_owned(),
            source: Box::new(source),
        }
    };
    let mut series = Vec::new();
    if args.last > 0 {
        series = read_last(con, key, args.last).map_err(read("XREVRANGE"))?.0;
    } else {
        let mut after: Option<String> = None;
        loop {
            let (page, last) =
                read_after(con, key, after.as_deref(), PAGE).map_err(read("XRANGE"))?;
            series.extend(page);
            match last {
                Some(id) if after.as_deref() != Some(id.as_str()) => after = Some(id),
                _ => break,
            }
        }
    }
    render(out, key, &series, args.csv).map_err(ReportError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytics_stream::CourseRow;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_764_420_000_123), "2025-11-29 12:40:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn table_and_csv() {
        let e = Entry {
            bucket_start_ms: 1_764_420_000_000,
            bucket_ms: 30_000,
            courses: vec![CourseRow {
                course: "CS101".into(),
                updates: 60,
                viewers: 3,
                seats_taken: 41,
                total_seats: 42,
            }],
        };
        let series = vec![("1-0".to_string(), e)];
        let mut out = Vec::new();
        render(&mut out, "analytics:s", &series, true).expect("csv");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(
            text.lines().nth(1),
            Some("1-0,1764420000000,30000,CS101,60,3,41,42")
        );
        let mut out = Vec::new();
        render(&mut out, "analytics:s", &series, false).expect("table");
        let text = String::from_utf8(out).expect("utf8");
        let row = text.lines().nth(1).expect("row");
        assert!(row.starts_with("2025-11-29 12:40:00"), "{row}");
        for w in ["CS101", "60", "2.00", "41", "42", "97.6%"] {
            assert!(row.split_whitespace().any(|x| x == w), "{w} in {row}");
        }
        assert!(text.ends_with("1 entries, 1 course rows in analytics:s\n"));
    }
}
