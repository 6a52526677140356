//! One section's full current state as published by the selection API, parsed
//! and validated, and the version rule every holder of a board applies.
//!
//! # The version rule (contract §2)
//!
//! A snapshot replaces the one held for its section when its `version` is
//! greater, or when either side has no version (last write wins). A snapshot
//! equal to the one held is the same publish seen twice (two subscriptions, a
//! reread after a reconnect) and changes nothing. A section read from the
//! state hash (a seed) was read before anything routed after it, so it only
//! fills a gap or brings a strictly newer version. A live snapshot sent with
//! `"replace": true` (only the reconciler sends one, to undo a version the
//! database never held) is taken whatever version is held, and its version is
//! the one later snapshots must pass; a seed never replaces that way.
//! [`Snapshot::supersedes`],
//! [`Snapshot::replaces`] and [`Snapshot::seed_replaces`] are that rule; the
//! node board, the shard inbox and each shard's course use nothing else.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt::Write as _;
use std::sync::Arc;

/// Largest payload accepted from Redis, in bytes.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Largest value accepted for `section`, `total_seats` and `seats_taken`.
const MAX_COUNT: i64 = (1 << 31) - 1;
/// Largest `version` accepted: 2^53, the largest integer a JSON number
/// carries exactly in every language (contract §2).
pub const MAX_VERSION: u64 = 1 << 53;

/// The deepest `seat_info` taken (objects and arrays, itself counted): as
/// deep as a serde_json value may go, far inside what the state script's
/// JSON decoder reads in Redis (1,000), so no field a hub takes is ever
/// mistaken there for one that is not JSON.
pub const MAX_SEAT_INFO_DEPTH: usize = 128;

/// How deeply `json` (valid JSON text) nests its objects and arrays.
pub fn json_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether `v` is a version a snapshot may carry (0..=[`MAX_VERSION`]).
pub fn valid_version(v: u64) -> bool {
    v <= MAX_VERSION
}

/// A validated whole-section snapshot, shared read-only between threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Course code, already checked against the channel.
    pub course: Arc<str>,
    /// Section id within the course.
    pub section: u32,
    /// Seats in the section.
    pub total_seats: u32,
    /// Seats taken.
    pub seats_taken: u32,
    /// Publisher's version, if it sent one; orders snapshots of one section.
    pub version: Option<u64>,
    /// Publish time in Unix ms, for latency metrics.
    pub ts: Option<u64>,
    /// Sent with `"replace": true`: taken whatever version is held (contract §2).
    pub replace: bool,
    /// The section's JSON object as it appears inside a frame's `sections` list,
    /// serialized once at ingest so every render only concatenates.
    pub json: Box<str>,
}

/// Why a payload was refused; each maps to one `reason` label in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Not parseable as a JSON object.
    Json,
    /// JSON, but a field is missing, of the wrong type or out of range.
    Schema,
    /// The payload's course is not the channel's course.
    ChannelMismatch,
    /// Over [`MAX_PAYLOAD`].
    TooLarge,
    /// A new section of a course that holds [`crate::MAX_SECTIONS`]
    /// already (never a parse result: counted where a course's sections are held).
    TooManySections,
}

impl Reject {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Reject; 5] = [
        Reject::Json,
        Reject::Schema,
        Reject::ChannelMismatch,
        Reject::TooLarge,
        Reject::TooManySections,
    ];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Reject::Json => "json",
            Reject::Schema => "schema",
            Reject::ChannelMismatch => "channel_mismatch",
            Reject::TooLarge => "too_large",
            Reject::TooManySections => "too_many_sections",
        }
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reject::Json => "payload is not a JSON object",
            Reject::Schema => "a field is missing, of the wrong type or out of range",
            Reject::ChannelMismatch => "the payload's course is not the channel's",
            Reject::TooLarge => "payload over 64 KiB",
            Reject::TooManySections => "the course holds its most sections already",
        })
    }
}

impl std::error::Error for Reject {}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(alias = "SharedCourseCode", borrow)]
    course: Option<&'a RawValue>,
    #[serde(alias = "SectionID", borrow)]
    section: Option<&'a RawValue>,
    #[serde(alias = "TotalSeats", borrow)]
    total_seats: Option<&'a RawValue>,
    #[serde(alias = "SeatsTaken", borrow)]
    seats_taken: Option<&'a RawValue>,
    #[serde(alias = "SeatInfo", borrow)]
    seat_info: Option<&'a RawValue>,
    #[serde(alias = "Version", borrow)]
    version: Option<&'a RawValue>,
    #[serde(alias = "Ts", borrow)]
    ts: Option<&'a RawValue>,
    #[serde(borrow)]
    replace: Option<&'a RawValue>,
}

/// True when `s` is a valid course code: 1-64 of `[A-Za-z0-9_.-]`.
pub fn valid_course(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

fn int(raw: Option<&RawValue>, max: i64) -> Result<Option<i64>, Reject> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.get() == "null" {
        return Ok(None);
    }
    match serde_json::from_str::<i64>(raw.get()) {
        Ok(v) if (0..=max).contains(&v) => Ok(Some(v)),
        _ => Err(Reject::Schema),
    }
}

fn required(raw: Option<&RawValue>) -> Result<u32, Reject> {
    int(raw, MAX_COUNT)?.map(|v| v as u32).ok_or(Reject::Schema)
}

impl Snapshot {
    /// Parses and validates one payload; `channel_course` is the channel's suffix
    /// (`None` when the caller has no channel, e.g. a state-hash read keyed by course).
    pub fn parse(payload: &[u8], channel_course: Option<&str>) -> Result<Snapshot, Reject> {
        if payload.len() > MAX_PAYLOAD {
            return Err(Reject::TooLarge);
        }
        let text = std::str::from_utf8(payload).map_err(|_| Reject::Json)?;
        let trimmed = text.trim_start();
        if !trimmed.starts_with('{') {
            // Valid JSON of another type is still not a snapshot object.
            return match serde_json::from_str::<&RawValue>(text) {
                Ok(_) => Err(Reject::Schema),
                Err(_) => Err(Reject::Json),
            };
        }
        let wire: Wire<'_> = serde_json::from_str(text).map_err(|e| {
            if e.is_data() {
                Reject::Schema
            } else {
                Reject::Json
            }
        })?;
        let course: &str = match wire.course {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|_| Reject::Schema)?,
            None => return Err(Reject::Schema),
        };
        if !valid_course(course) {
            return Err(Reject::Schema);
        }
        let section = required(wire.section)?;
        let total_seats = required(wire.total_seats)?;
        let seats_taken = required(wire.seats_taken)?;
        let version = int(wire.version, MAX_VERSION as i64)?.map(|v| v as u64);
        let ts = int(wire.ts, i64::MAX)?.map(|v| v as u64);
        // A JSON null reaches here as `None`.
        let seat_info = match wire.seat_info {
            Some(raw)
                if raw.get().starts_with('{') && json_depth(raw.get()) <= MAX_SEAT_INFO_DEPTH =>
            {
                Some(raw.get())
            }
            Some(_) => return Err(Reject::Schema),
            None => None,
        };
        let replace = match wire.replace.map(RawValue::get) {
            None | Some("null") | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(Reject::Schema),
        };
        if let Some(ch) = channel_course {
            if ch != course {
                return Err(Reject::ChannelMismatch);
            }
        }
        let mut snap = Snapshot::build(
            course.into(),
            section,
            total_seats,
            seats_taken,
            seat_info,
            version,
            ts,
        );
        snap.replace = replace;
        Ok(snap)
    }

    /// Builds a snapshot from trusted parts (simulator, tests) and serializes its fragment.
    pub fn build(
        course: Arc<str>,
        section: u32,
        total_seats: u32,
        seats_taken: u32,
        seat_info: Option<&str>,
        version: Option<u64>,
        ts: Option<u64>,
    ) -> Snapshot {
        let mut json = String::with_capacity(96 + seat_info.map_or(0, str::len));
        let _ = write!(
            json,
            "{{\"section\":{section},\"total_seats\":{total_seats},\"seats_taken\":{seats_taken}"
        );
        if let Some(info) = seat_info {
            json.push_str(",\"seat_info\":");
            json.push_str(info);
        }
        if let Some(v) = version {
            let _ = write!(json, ",\"version\":{v}");
        }
        json.push('}');
        Snapshot {
            course,
            section,
            total_seats,
            seats_taken,
            version,
            ts,
            replace: false,
            json: json.into_boxed_str(),
        }
    }

    /// The payload to publish for this snapshot, or why a hub would reject it
    /// (a version past [`MAX_VERSION`], a payload over [`MAX_PAYLOAD`], a
    /// bad course or seat count, a `seat_info` that is not a JSON object):
    /// the hub's own [`Snapshot::parse`] run on it, so a publisher refuses
    /// exactly what the hub would.
    pub fn publishable(&self) -> Result<String, Reject> {
        if self.version.is_some_and(|v| !valid_version(v)) {
            return Err(Reject::Schema);
        }
        let payload = self.to_payload();
        Snapshot::parse(payload.as_bytes(), Some(&self.course))?;
        Ok(payload)
    }

    /// The payload the selection API would publish for this snapshot.
    pub fn to_payload(&self) -> String {
        let mut s = String::with_capacity(self.json.len() + 64);
        let _ = write!(s, "{{\"course\":\"{}\",", self.course);
        s.push_str(&self.json[1..self.json.len() - 1]);
        if let Some(ts) = self.ts {
            let _ = write!(s, ",\"ts\":{ts}");
        }
        if self.replace {
            s.push_str(",\"replace\":true");
        }
        s.push('}');
        s
    }

    /// Whether this snapshot is newer than `current` (same section): greater
    /// version, or last write wins when either side has none.
    pub fn supersedes(&self, current: &Snapshot) -> bool {
        if self.replace {
            return true;
        }
        match (self.version, current.version) {
            (Some(new), Some(old)) => new > old,
            _ => true,
        }
    }

    /// Whether this live snapshot changes a board that holds `current` for its
    /// section: newer by [`Snapshot::supersedes`] and not the same publish
    /// again; one sent with `replace` whenever it differs from what is held.
    pub fn replaces(&self, current: Option<&Snapshot>) -> bool {
        match current.map(|cur| (cur, self.version, cur.version)) {
            None => true,
            Some((cur, _, _)) if self.replace => !cur.same_state(self),
            // Versions differ whenever the new one is greater: nothing else to compare.
            Some((_, Some(new), Some(old))) => new > old,
            Some((cur, _, _)) => cur != self,
        }
    }

    /// Whether `other` shows the same state of the section (its frame fragment
    /// and version), whichever way each was sent.
    pub fn same_state(&self, other: &Snapshot) -> bool {
        self.version == other.version && self.json == other.json
    }

    /// Whether this section read from the state hash changes a board that holds
    /// `current`: only a gap or a strictly newer version (`replace` is not
    /// honoured from a read: a read may be older than a live snapshot).
    /// A section held from a `replace` is never taken back by a read, which
    /// may have been answered before the repair reached the state hash.
    pub fn seed_replaces(&self, current: Option<&Snapshot>) -> bool {
        match (current, self.version) {
            (None, _) => true,
            (Some(cur), _) if cur.replace => false,
            (Some(cur), Some(v)) => cur.version.is_some_and(|c| v > c),
            (Some(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contract_example() {
        let p = br#"{"course":"CS101","section":3,"total_seats":42,"seats_taken":41,
 "seat_info":{"room":"B12"},"version":17,"ts":1764420000123}"#;
        let s = Snapshot::parse(p, Some("CS101")).unwrap();
        assert_eq!(s.section, 3);
        assert_eq!(s.total_seats, 42);
        assert_eq!(s.seats_taken, 41);
        assert_eq!(s.version, Some(17));
        assert_eq!(s.ts, Some(1764420000123));
        assert_eq!(
            &*s.json,
            r#"{"section":3,"total_seats":42,"seats_taken":41,"seat_info":{"room":"B12"},"version":17}"#
        );
        let again = Snapshot::parse(s.to_payload().as_bytes(), Some("CS101")).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn every_reject_is_an_error_with_its_own_text() {
        let texts: std::collections::HashSet<String> = Reject::ALL
            .iter()
            .map(|r| (r as &dyn std::error::Error).to_string())
            .collect();
        assert_eq!(texts.len(), Reject::ALL.len());
    }

    #[test]
    fn accepts_go_field_names() {
        let p = br#"{"SharedCourseCode":"MA-2.b","SectionID":0,"TotalSeats":10,"SeatsTaken":0,"SeatInfo":{"x":[1,2]},"Version":2,"Ts":5}"#;
        let s = Snapshot::parse(p, Some("MA-2.b")).unwrap();
        assert_eq!(&*s.course, "MA-2.b");
        assert_eq!(s.version, Some(2));
        assert!(s.json.contains(r#""seat_info":{"x":[1,2]}"#));
    }

    #[test]
    fn rejects_by_reason() {
        let cases: &[(&[u8], Reject)] = &[
            (b"{not json", Reject::Json),
            (b"", Reject::Json),
            (b"\xff\xfe", Reject::Json),
            (b"[1,2]", Reject::Schema),
            (b"42", Reject::Schema),
            (br#"{"course":"CS101","section":1,"total_seats":2}"#, Reject::Schema),
            (br#"{"course":"CS101","section":-1,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":"CS101","section":2147483648,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":"CS101","section":1.5,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":"CS 101","section":1,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":"","section":1,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":7,"section":1,"total_seats":2,"seats_taken":1}"#, Reject::Schema),
            (br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":"x"}"#, Reject::Schema),
            (br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":"3"}"#, Reject::Schema),
            (br#"{"course":"CS102","section":1,"total_seats":2,"seats_taken":1}"#, Reject::ChannelMismatch),
        ];
        for (payload, want) in cases {
            assert_eq!(
                Snapshot::parse(payload, Some("CS101")),
                Err(*want),
                "{}",
                String::from_utf8_lossy(payload)
            );
        }
        let big = format!(
            r#"{{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":{{"pad":"{}"}}}}"#,
            "x".repeat(MAX_PAYLOAD)
        );
        assert_eq!(
            Snapshot::parse(big.as_bytes(), Some("CS101")),
            Err(Reject::TooLarge)
        );
    }

    #[test]
    fn seat_info_deeper_than_the_bound_is_refused_and_strings_do_not_count() {
        let nested = |d: usize| format!("{}1{}", "{\"a\":[".repeat(d / 2), "]}".repeat(d / 2));
        let payload = |info: &str| {
            format!(
                r#"{{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":{info}}}"#
            )
        };
        assert_eq!(
            json_depth(&nested(MAX_SEAT_INFO_DEPTH)),
            MAX_SEAT_INFO_DEPTH
        );
        assert!(Snapshot::parse(payload(&nested(MAX_SEAT_INFO_DEPTH)).as_bytes(), None).is_ok());
        assert_eq!(
            Snapshot::parse(payload(&nested(MAX_SEAT_INFO_DEPTH + 2)).as_bytes(), None).err(),
            Some(Reject::Schema)
        );
        // Brackets inside strings, escaped quotes included, are text.
        let texty = r#"{"a":"[[[{{{\"[[[","b":[1]}"#;
        assert_eq!(json_depth(texty), 2);
        assert!(Snapshot::parse(payload(texty).as_bytes(), None).is_ok());
    }

    #[test]
    fn a_payload_of_exactly_64_kib_is_taken_and_seat_info_null_is_none() {
        let at = |len: usize| {
            let head = r#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":{"pad":""#;
            let tail = r#""}}"#;
            let pad = "x".repeat(len - head.len() - tail.len());
            Snapshot::parse(format!("{head}{pad}{tail}").as_bytes(), Some("CS101"))
        };
        assert!(at(MAX_PAYLOAD).is_ok(), "64 KiB is within the bound");
        assert!(at(2_000).is_ok());
        assert_eq!(at(MAX_PAYLOAD + 1), Err(Reject::TooLarge));
        let null =
            br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"seat_info":null}"#;
        let s = Snapshot::parse(null, Some("CS101")).unwrap();
        assert_eq!(&*s.json, r#"{"section":1,"total_seats":2,"seats_taken":1}"#);
    }

    #[test]
    fn a_replace_at_the_same_version_with_other_seats_is_taken() {
        let snap = |taken: u32, replace: bool| {
            let text = format!(
                r#"{{"course":"CS101","section":1,"total_seats":50,"seats_taken":{taken},"version":5,"replace":{replace}}}"#
            );
            Snapshot::parse(text.as_bytes(), Some("CS101")).unwrap()
        };
        let held = snap(3, false);
        assert!(
            snap(9, true).replaces(Some(&held)),
            "other seats, same version"
        );
        assert!(!snap(3, true).replaces(Some(&held)), "the same state again");
        assert!(
            !snap(9, false).replaces(Some(&held)),
            "without replace: not newer"
        );
    }

    #[test]
    fn versions_are_integers_up_to_2_pow_53() {
        let p = |v: &str| {
            let text = format!(
                r#"{{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":{v}}}"#
            );
            Snapshot::parse(text.as_bytes(), Some("CS101")).map(|s| s.version)
        };
        assert_eq!(p("0"), Ok(Some(0)));
        assert_eq!(p("9007199254740992"), Ok(Some(MAX_VERSION)));
        assert_eq!(p("null"), Ok(None));
        for bad in [
            "9007199254740993",
            "4611686018427387904",
            "18446744073709551616",
            "-1",
            "1.5",
            "17.0",
            "1e3",
        ] {
            assert_eq!(p(bad), Err(Reject::Schema), "version {bad}");
        }
        // The Go field name follows the same rule.
        let go = br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"Version":9007199254740993}"#;
        assert_eq!(Snapshot::parse(go, Some("CS101")), Err(Reject::Schema));
        assert!(valid_version(MAX_VERSION) && !valid_version(MAX_VERSION + 1));
    }

    #[test]
    fn publishable_refuses_what_the_hub_would() {
        let s = |version: Option<u64>, info: Option<&str>| {
            Snapshot::build("CS101".into(), 1, 40, 3, info, version, Some(5)).publishable()
        };
        let ok = s(Some(MAX_VERSION), Some(r#"{"room":"B12"}"#)).expect("publishable");
        let back = Snapshot::parse(ok.as_bytes(), Some("CS101")).expect("parses");
        assert_eq!(back.version, Some(MAX_VERSION));
        assert!(s(None, None).is_ok());
        assert_eq!(s(Some(MAX_VERSION + 1), None), Err(Reject::Schema));
        assert_eq!(s(Some(u64::MAX), None), Err(Reject::Schema));
        assert_eq!(s(Some(1), Some("[1]")), Err(Reject::Schema));
        let pad = format!(r#"{{"pad":"{}"}}"#, "x".repeat(MAX_PAYLOAD));
        assert_eq!(s(Some(1), Some(&pad)), Err(Reject::TooLarge));
        let bad_course = Snapshot::build("CS 101".into(), 1, 40, 3, None, None, None);
        assert_eq!(bad_course.publishable(), Err(Reject::Schema));
        let big_count = Snapshot::build("CS101".into(), 1, u32::MAX, 3, None, None, None);
        assert_eq!(big_count.publishable(), Err(Reject::Schema));
    }

    #[test]
    fn course_rule() {
        assert!(valid_course("CS101"));
        assert!(valid_course(&"a".repeat(64)));
        assert!(!valid_course(&"a".repeat(65)));
        assert!(!valid_course("a/b"));
        assert!(!valid_course("é"));
    }

    #[test]
    fn version_ordering() {
        let a = Snapshot::build("C".into(), 1, 5, 1, None, Some(3), None);
        let b = Snapshot::build("C".into(), 1, 5, 2, None, Some(3), None);
        let c = Snapshot::build("C".into(), 1, 5, 2, None, Some(4), None);
        let n = Snapshot::build("C".into(), 1, 5, 2, None, None, None);
        assert!(!b.supersedes(&a));
        assert!(c.supersedes(&a));
        assert!(!a.supersedes(&c));
        assert!(n.supersedes(&c));
        assert!(a.supersedes(&n));
        // Live: the same publish twice changes nothing; a gap is always filled.
        assert!(!n.replaces(Some(&n.clone())));
        assert!(n.replaces(Some(&a)));
        assert!(a.replaces(None));
        // Seed: only gaps and strictly newer versions.
        assert!(a.seed_replaces(None));
        assert!(c.seed_replaces(Some(&a)));
        assert!(!b.seed_replaces(Some(&a)));
        assert!(!n.seed_replaces(Some(&a)));
        assert!(!a.seed_replaces(Some(&n)));
    }

    #[test]
    fn replace_is_taken_whatever_version_is_held() {
        let forged = Snapshot::build("C".into(), 1, 5, 1, None, Some(MAX_VERSION), None);
        let p = br#"{"course":"C","section":1,"total_seats":5,"seats_taken":4,"version":7,"replace":true}"#;
        let repair = Snapshot::parse(p, Some("C")).expect("parses");
        assert!(repair.replace);
        // The frame fragment never carries the flag; the payload does.
        assert!(!repair.json.contains("replace"));
        assert_eq!(
            Snapshot::parse(repair.to_payload().as_bytes(), Some("C")),
            Ok(repair.clone())
        );
        assert!(repair.replaces(Some(&forged)));
        assert!(repair.supersedes(&forged));
        // Seen twice, it changes nothing the second time.
        assert!(!repair.replaces(Some(&repair.clone())));
        // Its version is the one later snapshots must pass.
        let same = Snapshot::build("C".into(), 1, 5, 4, None, Some(7), None);
        let next = Snapshot::build("C".into(), 1, 5, 5, None, Some(8), None);
        assert!(!same.replaces(Some(&repair)));
        assert!(next.replaces(Some(&repair)));
        // A read never takes a replaced section back, and is never a replace.
        assert!(!forged.seed_replaces(Some(&repair)));
        assert!(!repair.seed_replaces(Some(&forged)));
        // Only a boolean; false or null is a plain snapshot.
        let with = |v: &str| {
            let t = format!(
                r#"{{"course":"C","section":1,"total_seats":5,"seats_taken":4,"replace":{v}}}"#
            );
            Snapshot::parse(t.as_bytes(), Some("C")).map(|s| s.replace)
        };
        assert_eq!(with("false"), Ok(false));
        assert_eq!(with("null"), Ok(false));
        for bad in ["1", "\"true\"", "{}"] {
            assert_eq!(with(bad), Err(Reject::Schema), "replace {bad}");
        }
    }
}
