//! One database row as the source reads it, and its check by section 2's
//! rules: the row is written out as the snapshot a selection API would
//! publish and parsed by the hub's own parser, so a row is refused exactly
//! when a hub would refuse its snapshot (and `version` is required here).

use serde_json::value::RawValue;
use shards::snapshot::Reject;
use shards::Snapshot;
use std::fmt::Write as _;

/// A row's columns, typed as loosely as the databases return them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// `course` (None: null or not text).
    pub course: Option<String>,
    /// `section`.
    pub section: Option<i128>,
    /// `total_seats`.
    pub total_seats: Option<i128>,
    /// `seats_taken`.
    pub seats_taken: Option<i128>,
    /// `version`.
    pub version: Option<i128>,
    /// `seat_info` as JSON text (None: no column or null).
    pub seat_info: Option<String>,
    /// `updated_at` in µs since the epoch (the database's own clock).
    pub updated_us: Option<i64>,
    /// A column was of a type no rule can read (counted `schema`).
    pub unreadable: bool,
}

/// A decimal integer written as text (`-3`, ` 42 `, `5.00`: a fraction of
/// zeros only), as both databases may return an integer column; `None` for
/// anything else (`5.5`, `1e3`, a number past `i128`).
pub fn integer_text(text: &str) -> Option<i128> {
    let t = text.trim();
    let whole = match t.split_once('.') {
        Some((whole, frac)) if !frac.is_empty() && frac.bytes().all(|b| b == b'0') => whole,
        Some(_) => return None,
        None => t,
    };
    let digits = whole.strip_prefix(['-', '+']).unwrap_or(whole);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    whole.parse().ok()
}

/// A row checked: the snapshot it stands for (its version always set).
pub fn snapshot(row: &Row) -> Result<Snapshot, Reject> {
    if row.unreadable {
        return Err(Reject::Schema);
    }
    let (Some(course), Some(section), Some(total), Some(taken), Some(version)) = (
        row.course.as_deref(),
        row.section,
        row.total_seats,
        row.seats_taken,
        row.version,
    ) else {
        return Err(Reject::Schema);
    };
    let info = match row.seat_info.as_deref() {
        // One JSON value, exactly (so nothing can be spliced into the object).
        Some(text) => Some(
            serde_json::from_str::<&RawValue>(text)
                .map_err(|e| {
                    if e.is_data() {
                        Reject::Schema
                    } else {
                        Reject::Json
                    }
                })?
                .get(),
        ),
        None => None,
    };
    let course = serde_json::to_string(course).map_err(|_| Reject::Schema)?;
    let mut p = String::with_capacity(128 + info.map_or(0, str::len));
    let _ = write!(
        p,
        "{{\"course\":{course},\"section\":{section},\"total_seats\":{total},\"seats_taken\":{taken},\"version\":{version}"
    );
    if let Some(info) = info {
        p.push_str(",\"seat_info\":");
        p.push_str(info);
    }
    p.push('}');
    let s = Snapshot::parse(p.as_bytes(), None)?;
    if s.version.is_none() {
        return Err(Reject::Schema);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Row {
        Row {
            course: Some("CS101".into()),
            section: Some(3),
            total_seats: Some(40),
            seats_taken: Some(39),
            version: Some(17),
            seat_info: Some(r#"{"room":"B12"}"#.into()),
            updated_us: Some(1),
            unreadable: false,
        }
    }

    #[test]
    fn a_good_row_is_its_snapshot() {
        let s = snapshot(&good()).expect("valid");
        assert_eq!((&*s.course, s.section, s.seats_taken), ("CS101", 3, 39));
        assert_eq!(s.version, Some(17));
        assert!(s.json.contains(r#""seat_info":{"room":"B12"}"#));
    }

    #[test]
    fn integers_as_text_with_a_fraction_of_zeros_only() {
        for (t, want) in [
            ("5", Some(5)),
            ("-3", Some(-3)),
            ("+7", Some(7)),
            (" 42 ", Some(42)),
            ("5.0", Some(5)),
            ("5.00", Some(5)),
            ("-0.000", Some(0)),
            ("9007199254740992", Some(1 << 53)),
            ("5.5", None),
            ("5.01", None),
            ("5.", None),
            (".0", None),
            ("-", None),
            ("", None),
            ("1e3", None),
            ("0x10", None),
            ("4 2", None),
            ("1.0.0", None),
            ("999999999999999999999999999999999999999999", None),
        ] {
            assert_eq!(integer_text(t), want, "{t:?}");
        }
    }

    #[test]
    fn hostile_rows_are_refused_by_reason() {
        let with = |f: &dyn Fn(&mut Row)| {
            let mut r = good();
            f(&mut r);
            snapshot(&r).map(|_| ())
        };
        let schema: &[&dyn Fn(&mut Row)] = &[
            &|r| r.course = Some("CS 101".into()),
            &|r| r.course = Some("\"},\"x\":{\"".into()),
            &|r| r.course = None,
            &|r| r.seats_taken = Some(-1),
            &|r| r.total_seats = Some(1 << 31),
            &|r| r.version = None,
            &|r| r.version = Some((1 << 53) + 1),
            &|r| r.version = Some(-5),
            &|r| r.seat_info = Some("[1,2]".into()),
            &|r| r.seat_info = Some("\"text\"".into()),
            &|r| r.unreadable = true,
        ];
        for f in schema {
            assert_eq!(with(*f), Err(Reject::Schema));
        }
        assert_eq!(
            with(&|r| r.seat_info = Some("{nope".into())),
            Err(Reject::Json)
        );
        // Two values spliced into one column are not one JSON value.
        assert_eq!(
            with(&|r| r.seat_info = Some(r#"{},"replace":true"#.into())),
            Err(Reject::Json)
        );
        let pad = format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024));
        assert_eq!(
            with(&|r| r.seat_info = Some(pad.clone())),
            Err(Reject::TooLarge)
        );
        assert_eq!(with(&|r| r.seat_info = None), Ok(()));
        assert_eq!(with(&|r| r.version = Some(1 << 53)), Ok(()));
    }
}
