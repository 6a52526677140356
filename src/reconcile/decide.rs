//! What the reconciler does with what it read, as a pure state machine with
//! no clock and no I/O (time is passed in, in ms): which rows to look up in
//! Redis, and, once looked up, which sections to leave, watch, write or
//! replace (contract §11).
//!
//! Per section it keeps the version last found in Redis equal to the
//! database's (such a row is not looked up again until the next sweep) and,
//! while the section differs, since when and how. A section missing or
//! behind is written once it has been so for the grace; one ahead is counted
//! once, then replaced once it has been ahead for `ahead_ms` with the same
//! field (a field that moves takes live publishes: a replica's lag, timed
//! again), with its row read again (`fresh`). A sweep forgets the
//! sections its rows no longer name, so the memory follows the table.

use shards::Snapshot;
use std::collections::HashMap;
use std::sync::Arc;

/// What Redis holds for a section's field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// No field.
    Missing,
    /// A field with no integer `version` (or not a JSON object).
    NoVersion,
    /// The field's integer version.
    Version(i128),
}

impl Field {
    /// The field as read by `HGET` (None: absent).
    pub fn read(bytes: Option<&[u8]>) -> Field {
        let Some(b) = bytes else {
            return Field::Missing;
        };
        // Read as the script's JSON decoder reads it: keys with their escapes
        // decoded (`"vers\u0069on"` is `version`), bytes that are not UTF-8
        // taken as they come (only a string can hold them).
        let text = String::from_utf8_lossy(b);
        let Ok(map) = serde_json::from_str::<HashMap<String, &serde_json::value::RawValue>>(&text)
        else {
            return Field::NoVersion;
        };
        let raw = map.get("version").or_else(|| map.get("Version"));
        match raw.map(|r| r.get()) {
            Some(text) => integer(text).map_or(Field::NoVersion, Field::Version),
            None => Field::NoVersion,
        }
    }

    /// The version, when the field has one.
    pub fn version(self) -> Option<i128> {
        match self {
            Field::Version(v) => Some(v),
            _ => None,
        }
    }
}

/// A JSON number's text as an integer (`17`, `17.0`, `1e3`, `120e-1`), as
/// the state script reads it (digit by digit, so `1e309` or 400 digits are
/// integers past any version), saturating at ±10^38; None for a fraction
/// or anything else.
fn integer(text: &str) -> Option<i128> {
    const SATURATED: i128 = 10i128.pow(38);
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    let exp: i64 = match exp {
        None => 0,
        Some(e) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => (-1, d),
                None => (1, e.strip_prefix('+').unwrap_or(e)),
            };
            if digits.is_empty() || !all_digits(digits) {
                return None;
            }
            // Far past any version's digits either way.
            sign * digits.parse::<i64>().unwrap_or(1_000_000).min(1_000_000)
        }
    };
    let digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    let shift = exp - frac.len() as i64;
    // The digits at or above the units; any nonzero one below is a fraction.
    let keep = (digits.len() as i64 + shift.min(0)).max(0) as usize;
    if digits[keep..].iter().any(|&d| d != 0) {
        return None;
    }
    let mut value: i128 = 0;
    let zeros = shift.max(0) as usize;
    for &d in digits[..keep].iter().chain(std::iter::repeat_n(&0, zeros)) {
        value = match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i128::from(d)))
        {
            Some(v) if v <= SATURATED => v,
            _ => SATURATED,
        };
        if value == SATURATED {
            break;
        }
    }
    Some(if negative { -value } else { value })
}

/// How Redis differs from the database for a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No field.
    Missing,
    /// A lower version, or none.
    Behind,
    /// A greater version: a snapshot the database never held.
    Ahead,
}

impl State {
    /// The `state` of `--check`'s lines and the `reason` label of a repair.
    pub fn label(self) -> &'static str {
        match self {
            State::Missing => "missing",
            State::Behind => "behind",
            State::Ahead => "ahead",
        }
    }
}

/// How Redis's `field` compares with the database's `version`; None when they agree.
pub fn compare(version: u64, field: Field) -> Option<State> {
    match field {
        Field::Missing => Some(State::Missing),
        Field::NoVersion => Some(State::Behind),
        Field::Version(v) if v < i128::from(version) => Some(State::Behind),
        Field::Version(v) if v > i128::from(version) => Some(State::Ahead),
        Field::Version(_) => None,
    }
}

/// A row to look up in Redis.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The row (the one held for a watched section not read this time).
    pub snap: Snapshot,
    /// Read from the database in this check.
    pub fresh: bool,
}

/// What a check's lookups call for.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Missing or behind past the grace: written with the compare-and-set script.
    pub write: Vec<(Snapshot, State)>,
    /// Ahead past `ahead_ms`, row unchanged: set and published with `replace`.
    pub replace: Vec<Snapshot>,
    /// Found ahead for the first time (counted, logged): row and Redis's version.
    pub newly_ahead: Vec<(Snapshot, i128)>,
    /// A section is due for replacement but its row was not read again: the
    /// next check should be a sweep.
    pub want_sweep: bool,
}

#[derive(Debug)]
struct Watch {
    state: State,
    since_ms: u64,
    /// The database's row as last read (ahead) or the row to write
    /// (missing, behind).
    row: Snapshot,
    /// Redis's version when it was found ahead, timed from then.
    field: i128,
}

#[derive(Debug, Default)]
struct Entry {
    /// The version last found in Redis equal to the database's.
    seen: Option<u64>,
    watch: Option<Box<Watch>>,
}

/// The reconciler's memory of every section, and the rule.
#[derive(Debug)]
pub struct Book {
    courses: HashMap<Arc<str>, HashMap<u32, Entry>>,
    grace_ms: u64,
    ahead_ms: u64,
}

impl Book {
    /// An empty book with the grace (missing, behind) and the ahead delay.
    pub fn new(grace_ms: u64, ahead_ms: u64) -> Book {
        Book {
            courses: HashMap::new(),
            grace_ms,
            ahead_ms,
        }
    }

    /// Sections remembered.
    pub fn len(&self) -> usize {
        self.courses.values().map(HashMap::len).sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.courses.is_empty()
    }

    /// Sections that differ now (watched).
    pub fn watched(&self) -> usize {
        self.courses
            .values()
            .flat_map(HashMap::values)
            .filter(|e| e.watch.is_some())
            .count()
    }

    /// The rows of one check (the highest version kept where a section comes
    /// twice) to look up in Redis: on a sweep all of them, else those not
    /// already found at their version; and every watched section, fresh or
    /// not. A sweep forgets the sections its rows do not name.
    pub fn plan(&mut self, rows: Vec<Snapshot>, sweep: bool) -> Vec<Candidate> {
        let mut newest: HashMap<(Arc<str>, u32), Snapshot> = HashMap::with_capacity(rows.len());
        for s in rows {
            let key = (Arc::clone(&s.course), s.section);
            match newest.get(&key) {
                Some(held) if held.version >= s.version => {}
                _ => {
                    newest.insert(key, s);
                }
            }
        }
        if sweep {
            self.courses.retain(|course, sections| {
                sections.retain(|section, _| newest.contains_key(&(Arc::clone(course), *section)));
                !sections.is_empty()
            });
        }
        let mut out = Vec::new();
        for ((_, section), snap) in newest.iter() {
            let entry = self.courses.get(&snap.course).and_then(|c| c.get(section));
            let known = entry.is_some_and(|e| e.watch.is_none() && e.seen == snap.version);
            if sweep || !known {
                out.push(Candidate {
                    snap: snap.clone(),
                    fresh: true,
                });
            }
        }
        for (course, sections) in &self.courses {
            for (section, e) in sections {
                if let Some(w) = &e.watch {
                    if !newest.contains_key(&(Arc::clone(course), *section)) {
                        out.push(Candidate {
                            snap: w.row.clone(),
                            fresh: false,
                        });
                    }
                }
            }
        }
        out
    }

    fn entry(&mut self, s: &Snapshot) -> &mut Entry {
        let course = match self.courses.get_key_value(&s.course) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::clone(&s.course),
        };
        self.courses
            .entry(course)
            .or_default()
            .entry(s.section)
            .or_default()
    }

    /// The candidates with what Redis holds for each (same order), at `now_ms`.
    pub fn judge(&mut self, looked: Vec<(Candidate, Field)>, now_ms: u64) -> Outcome {
        let (grace, ahead_ms) = (self.grace_ms, self.ahead_ms);
        let mut out = Outcome::default();
        for (c, field) in looked {
            let Some(version) = c.snap.version else {
                continue;
            };
            let e = self.entry(&c.snap);
            match compare(version, field) {
                None => {
                    e.seen = Some(version);
                    e.watch = None;
                }
                Some(state @ (State::Missing | State::Behind)) => {
                    e.seen = None;
                    match &mut e.watch {
                        Some(w) if w.state != State::Ahead => {
                            w.state = state;
                            if c.fresh {
                                w.row = c.snap.clone();
                            }
                            if now_ms >= w.since_ms.saturating_add(grace) {
                                out.write.push((w.row.clone(), state));
                            }
                        }
                        _ => {
                            if grace == 0 {
                                out.write.push((c.snap.clone(), state));
                            }
                            e.watch = Some(Box::new(Watch {
                                state,
                                since_ms: now_ms,
                                row: c.snap,
                                field: field.version().unwrap_or_default(),
                            }));
                        }
                    }
                }
                Some(State::Ahead) => {
                    e.seen = None;
                    let redis = field.version().unwrap_or_default();
                    match &mut e.watch {
                        Some(w) if w.state == State::Ahead && w.field == redis => {
                            // The field has not moved since it was found
                            // ahead (a row that changes meanwhile does not
                            // time it again: a poisoned version on a busy
                            // section would then never leave).
                            if c.fresh {
                                w.row = c.snap.clone();
                            }
                            if now_ms >= w.since_ms.saturating_add(ahead_ms) {
                                if c.fresh {
                                    out.replace.push(c.snap);
                                } else {
                                    out.want_sweep = true;
                                }
                            }
                        }
                        Some(w) if w.state == State::Ahead => {
                            // The field moved: live publishes reach it (a
                            // replica behind them, not a stuck field), so its
                            // lag is measured again.
                            w.field = redis;
                            w.row = c.snap;
                            w.since_ms = now_ms;
                        }
                        _ => {
                            out.newly_ahead.push((c.snap.clone(), redis));
                            if ahead_ms == 0 && c.fresh {
                                out.replace.push(c.snap.clone());
                            }
                            e.watch = Some(Box::new(Watch {
                                state: State::Ahead,
                                since_ms: now_ms,
                                row: c.snap,
                                field: redis,
                            }));
                        }
                    }
                }
            }
        }
        out
    }

    /// Sections written: Redis now holds their row's version.
    pub fn written(&mut self, snaps: &[Snapshot]) {
        for s in snaps {
            let e = self.entry(s);
            e.seen = s.version;
            e.watch = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(section: u32, taken: u32, version: u64) -> Snapshot {
        Snapshot::build("C".into(), section, 50, taken, None, Some(version), None)
    }

    fn look(c: Vec<Candidate>, f: impl Fn(&Candidate) -> Field) -> Vec<(Candidate, Field)> {
        c.into_iter()
            .map(|c| (f(&c), c))
            .map(|(f, c)| (c, f))
            .collect()
    }

    #[test]
    fn fields_read_like_the_script() {
        assert_eq!(Field::read(None), Field::Missing);
        assert_eq!(Field::read(Some(b"{\"version\":7}")), Field::Version(7));
        assert_eq!(Field::read(Some(b"{\"Version\":7.0}")), Field::Version(7));
        assert_eq!(Field::read(Some(b"{\"version\":1.5}")), Field::NoVersion);
        assert_eq!(Field::read(Some(b"[1]")), Field::NoVersion);
        assert_eq!(Field::read(Some(b"{\"seats\":1}")), Field::NoVersion);
        // An escaped key, and a byte that is not UTF-8, as the script reads them.
        assert_eq!(
            Field::read(Some(br#"{"course":"CS101","vers\u0069on":99}"#)),
            Field::Version(99)
        );
        assert_eq!(
            Field::read(Some(b"{\"version\":99,\"seat_info\":{\"room\":\"\xff\"}}")),
            Field::Version(99)
        );
        assert_eq!(
            Field::read(Some(b"{\"version\":18446744073709551617}")),
            Field::Version(18446744073709551617)
        );
        // Past a double's range or i128's: integers all the same, far ahead
        // (the script keeps such a field from every lower version).
        let huge = Field::Version(10i128.pow(38));
        assert_eq!(Field::read(Some(b"{\"version\":1e309}")), huge);
        let digits = format!("{{\"version\":{}}}", "9".repeat(401));
        assert_eq!(Field::read(Some(digits.as_bytes())), huge);
        assert_eq!(compare(5, huge), Some(State::Ahead));
        assert_eq!(
            Field::read(Some(b"{\"version\":-1e309}")),
            Field::Version(-(10i128.pow(38)))
        );
        for (text, want) in [
            ("1e3", Some(1000)),
            ("120e-1", Some(12)),
            ("12e-1", None),
            ("1.50E+1", Some(15)),
            ("1.55E+1", None),
            ("1.500E+3", Some(1500)),
            ("0.0", Some(0)),
            ("7.000", Some(7)),
            ("1e-400", None),
            ("0e-400", Some(0)),
            ("1e99999999999999999999", Some(10i128.pow(38))),
            ("\"7\"", None),
            ("true", None),
        ] {
            assert_eq!(integer(text), want, "{text}");
        }
        assert_eq!(compare(5, Field::Version(5)), None);
        assert_eq!(compare(5, Field::Version(4)), Some(State::Behind));
        assert_eq!(compare(5, Field::NoVersion), Some(State::Behind));
        assert_eq!(compare(5, Field::Version(1 << 53)), Some(State::Ahead));
        assert_eq!(compare(5, Field::Missing), Some(State::Missing));
    }

    #[test]
    fn behind_is_written_only_after_the_grace() {
        let mut b = Book::new(2000, 60_000);
        let c = b.plan(vec![row(1, 5, 3)], true);
        let o = b.judge(look(c, |_| Field::Version(2)), 0);
        assert!(o.write.is_empty(), "inside the grace");
        // The live publish arrives: nothing to write, ever.
        let c = b.plan(vec![], false);
        assert_eq!(c.len(), 1, "a watched section is looked at again");
        let o = b.judge(look(c, |_| Field::Version(3)), 1000);
        assert!(o.write.is_empty());
        assert_eq!(b.watched(), 0);
        // Found at its version: not looked up again until a sweep.
        assert!(b.plan(vec![row(1, 5, 3)], false).is_empty());
        assert_eq!(b.plan(vec![row(1, 5, 3)], true).len(), 1);
    }

    #[test]
    fn a_lost_publish_is_written_once_the_grace_is_over() {
        let mut b = Book::new(2000, 60_000);
        let c = b.plan(vec![row(1, 5, 3)], false);
        assert!(b.judge(look(c, |_| Field::Missing), 0).write.is_empty());
        // The row changed again meanwhile: the newest row is written.
        let c = b.plan(vec![row(1, 6, 4)], false);
        assert!(b.judge(look(c, |_| Field::Missing), 1999).write.is_empty());
        let c = b.plan(vec![], false);
        let o = b.judge(look(c, |_| Field::Missing), 2000);
        assert_eq!(o.write.len(), 1);
        assert_eq!(o.write[0].0.version, Some(4));
        assert_eq!(o.write[0].1, State::Missing);
        b.written(&[o.write[0].0.clone()]);
        assert!(b.plan(vec![row(1, 6, 4)], false).is_empty());
        // Grace 0: written in the check that finds it.
        let mut b = Book::new(0, 60_000);
        let c = b.plan(vec![row(2, 1, 1)], false);
        let o = b.judge(look(c, |_| Field::Version(0)), 5);
        assert_eq!(o.write[0].1, State::Behind);
    }

    #[test]
    fn ahead_is_counted_once_left_then_replaced_with_its_row_read_again() {
        let mut b = Book::new(2000, 60_000);
        let forged = Field::Version(1 << 53);
        let c = b.plan(vec![row(1, 5, 3)], true);
        let o = b.judge(look(c, |_| forged), 0);
        assert_eq!(o.newly_ahead.len(), 1);
        assert!(o.replace.is_empty());
        let c = b.plan(vec![row(1, 5, 3)], false);
        let o = b.judge(look(c, |_| forged), 30_000);
        assert!(o.newly_ahead.is_empty() && o.replace.is_empty());
        // Due, but the row was not read again: a sweep is asked for.
        let c = b.plan(vec![], false);
        assert!(!c[0].fresh);
        let o = b.judge(look(c, |_| forged), 60_000);
        assert!(o.replace.is_empty() && o.want_sweep);
        let c = b.plan(vec![row(1, 5, 3)], true);
        let o = b.judge(look(c, |_| forged), 60_500);
        assert_eq!(o.replace.len(), 1);
        b.written(&o.replace);
        assert!(b.plan(vec![row(1, 5, 3)], false).is_empty());
    }

    #[test]
    fn a_stuck_field_is_replaced_in_time_however_often_its_row_changes() {
        let mut b = Book::new(2000, 10_000);
        let forged = Field::Version(1 << 53);
        let c = b.plan(vec![row(1, 5, 3)], true);
        b.judge(look(c, |_| forged), 0);
        // The row keeps changing (its publishes are kept out by the forged
        // version): still timed from the first finding.
        for (t, v) in [(3_000, 4), (6_000, 5), (9_000, 6)] {
            let c = b.plan(vec![row(1, 5, v)], false);
            let o = b.judge(look(c, |_| forged), t);
            assert!(o.replace.is_empty() && o.newly_ahead.is_empty(), "{t}");
        }
        let c = b.plan(vec![row(1, 9, 7)], false);
        let o = b.judge(look(c, |_| forged), 10_000);
        assert_eq!(o.replace.len(), 1);
        assert_eq!(o.replace[0].version, Some(7), "the newest row");
    }

    #[test]
    fn a_field_that_moves_is_a_replica_behind_and_is_timed_again() {
        // Live publishes land (the field moves) while a lagging replica's row
        // follows: never replaced.
        let mut b = Book::new(2000, 10_000);
        let c = b.plan(vec![row(1, 5, 3)], true);
        b.judge(look(c, |_| Field::Version(9)), 0);
        for (t, v, f) in [(6_000, 8, 12), (12_000, 11, 15), (18_000, 14, 19)] {
            let c = b.plan(vec![row(1, 5, v)], false);
            let o = b.judge(look(c, |_| Field::Version(f)), t);
            assert!(o.replace.is_empty() && o.newly_ahead.is_empty(), "{t}");
        }
        // It stops moving: replaced ahead_ms after that.
        let c = b.plan(vec![row(1, 5, 15)], false);
        assert!(b
            .judge(look(c, |_| Field::Version(19)), 27_000)
            .replace
            .is_empty());
        let c = b.plan(vec![row(1, 5, 15)], true);
        assert_eq!(
            b.judge(look(c, |_| Field::Version(19)), 28_000)
                .replace
                .len(),
            1
        );
        // The replica caught up instead: nothing to do.
        let mut b = Book::new(2000, 10_000);
        let c = b.plan(vec![row(1, 5, 3)], true);
        b.judge(look(c, |_| Field::Version(4)), 0);
        let c = b.plan(vec![row(1, 6, 4)], false);
        let o = b.judge(look(c, |_| Field::Version(4)), 20_000);
        assert!(o.replace.is_empty() && o.write.is_empty());
        assert_eq!(b.watched(), 0);
    }

    #[test]
    fn a_sweep_forgets_deleted_rows_and_keeps_the_highest_duplicate() {
        let mut b = Book::new(0, 0);
        let c = b.plan(vec![row(1, 1, 1), row(2, 1, 1)], true);
        let o = b.judge(look(c, |_| Field::Version(1)), 0);
        assert!(o.write.is_empty());
        assert_eq!(b.len(), 2);
        let c = b.plan(vec![row(2, 1, 1)], true);
        assert_eq!(c.len(), 1);
        assert_eq!(b.len(), 1);
        let c = b.plan(vec![row(3, 1, 1), row(3, 2, 5), row(3, 1, 2)], false);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].snap.version, Some(5));
    }
}
