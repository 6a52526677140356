//! The bucket state machine of the analytics stream: fed snapshots, viewer
//! counts and the time, it says when a bucket closes and what (if anything) to
//! append for it. No I/O, so every rule is unit-tested without Redis. The
//! analytics worker runs it over Redis, the demo's `/api/history` in process.

use super::{CourseRow, Entry};
use shards::Snapshot;
use std::collections::{BTreeMap, HashMap};

/// The start of the bucket that holds `now_ms` (wall-clock multiples of `bucket_ms`).
pub fn align(now_ms: u64, bucket_ms: u64) -> u64 {
    let b = bucket_ms.max(1);
    now_ms - now_ms % b
}

#[derive(Debug, Clone, Copy)]
struct Seats {
    taken: u32,
    total: u32,
    version: Option<u64>,
}

/// The worker's state: the bucket in flight and the latest seats per section.
#[derive(Debug)]
pub struct Buckets {
    bucket_ms: u64,
    start_ms: u64,
    updates: HashMap<String, u64>,
    seats: HashMap<String, BTreeMap<u32, Seats>>,
    lost: bool,
    /// Courses beginning with it are a rehearsal's and not counted (section 7).
    rehearsal_prefix: String,
}

/// Why a closed bucket wrote nothing (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// An entry to append.
    Write,
    /// No update and no viewer: nothing to write.
    Idle,
    /// The bucket was marked lost (Redis went away during it).
    Lost,
}

impl Buckets {
    /// A worker whose first bucket is the one holding `now_ms`.
    pub fn new(bucket_ms: u64, now_ms: u64) -> Self {
        let bucket_ms = bucket_ms.max(1);
        Buckets {
            bucket_ms,
            start_ms: align(now_ms, bucket_ms),
            updates: HashMap::new(),
            seats: HashMap::new(),
            lost: false,
            rehearsal_prefix: String::new(),
        }
    }

    /// Leaves out courses beginning with `prefix` (`seatboard rehearse`'s).
    pub fn with_rehearsal_prefix(mut self, prefix: String) -> Self {
        self.rehearsal_prefix = prefix;
        self
    }

    fn rehearsal(&self, course: &str) -> bool {
        !self.rehearsal_prefix.is_empty() && course.starts_with(&self.rehearsal_prefix)
    }

    /// Bucket length in ms.
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Start of the bucket in flight (Unix ms).
    pub fn start_ms(&self) -> u64 {
        self.start_ms
    }

    /// When the bucket in flight closes (Unix ms).
    pub fn end_ms(&self) -> u64 {
        self.start_ms + self.bucket_ms
    }

    /// True once `now_ms` is past the bucket in flight.
    pub fn due(&self, now_ms: u64) -> bool {
        now_ms >= self.end_ms()
    }

    /// Counts one published snapshot into the bucket in flight and keeps its
    /// seats unless an equal or newer version of that section was seen before
    /// (one sent with `replace`, the reconciler's undoing of a forged
    /// version, is kept whatever came before, as a hub takes it); false for a
    /// rehearsal's, which is not counted (section 7).
    pub fn on_snapshot(&mut self, snap: &Snapshot) -> bool {
        if self.rehearsal(&snap.course) {
            return false;
        }
        match self.updates.get_mut(&*snap.course) {
            Some(n) => *n += 1,
            None => {
                self.updates.insert(snap.course.to_string(), 1);
            }
        }
        let sections = self.seats.entry(snap.course.to_string()).or_default();
        let newer = match sections.get(&snap.section) {
            Some(_) if snap.replace => true,
            Some(old) => match (old.version, snap.version) {
                (Some(o), Some(n)) => n > o,
                _ => true,
            },
            None => true,
        };
        if newer {
            sections.insert(
                snap.section,
                Seats {
                    taken: snap.seats_taken,
                    total: snap.total_seats,
                    version: snap.version,
                },
            );
        }
        true
    }

    /// Marks the bucket in flight as lost: it will write nothing when it closes.
    pub fn lose(&mut self) {
        self.lost = true;
    }

    /// True when the bucket in flight is marked lost.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Redis is back at `now_ms`. A bucket marked lost is given up now, not
    /// when it ends: what it counted is dropped and counting starts afresh,
    /// in what is left of it (a partial bucket, like the first after start)
    /// or in the bucket holding `now_ms` if it ended meanwhile. Snapshots
    /// read after the reconnect are counted. Returns the start of the bucket
    /// given up, if one was lost.
    pub fn resume(&mut self, now_ms: u64) -> Option<u64> {
        if !std::mem::replace(&mut self.lost, false) {
            return None;
        }
        let start = self.start_ms;
        self.updates.clear();
        self.start_ms = align(now_ms, self.bucket_ms).max(start);
        Some(start)
    }

    /// Closes the bucket in flight with the viewer counts read at its end
    /// (course -> unexpired members) and opens the bucket holding `now_ms`.
    /// Returns the entry to append, or why there is none.
    pub fn close(
        &mut self,
        now_ms: u64,
        viewers: &HashMap<String, u64>,
    ) -> (Closed, Option<Entry>) {
        let updates = std::mem::take(&mut self.updates);
        let lost = std::mem::replace(&mut self.lost, false);
        let start = self.start_ms;
        self.start_ms = align(now_ms, self.bucket_ms).max(self.end_ms());
        if lost {
            return (Closed::Lost, None);
        }
        let mut rows: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (course, n) in &updates {
            rows.entry(course.as_str()).or_default().0 += n;
        }
        for (course, v) in viewers
            .iter()
            .filter(|(c, v)| **v > 0 && !self.rehearsal(c))
        {
            rows.entry(course.as_str()).or_default().1 += v;
        }
        if rows.is_empty() {
            return (Closed::Idle, None);
        }
        let courses = rows
            .into_iter()
            .map(|(course, (updates, viewers))| {
                let (taken, total) = self.seats.get(course).map_or((0, 0), |s| {
                    s.values().fold((0u64, 0u64), |(a, b), x| {
                        (a + u64::from(x.taken), b + u64::from(x.total))
                    })
                });
                CourseRow {
                    course: course.to_owned(),
                    updates,
                    viewers,
                    seats_taken: taken,
                    total_seats: total,
                }
            })
            .collect();
        (
            Closed::Write,
            Some(Entry {
                bucket_start_ms: start,
                bucket_ms: self.bucket_ms,
                courses,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn snap(course: &str, section: u32, taken: u32, total: u32, version: Option<u64>) -> Snapshot {
        Snapshot::build(
            Arc::from(course),
            section,
            total,
            taken,
            None,
            version,
            None,
        )
    }

    fn none() -> HashMap<String, u64> {
        HashMap::new()
    }

    #[test]
    fn buckets_align_to_wall_clock_multiples() {
        assert_eq!(align(0, 30_000), 0);
        assert_eq!(align(29_999, 30_000), 0);
        assert_eq!(align(30_000, 30_000), 30_000);
        assert_eq!(align(1_764_420_012_345, 30_000), 1_764_420_000_000);
        let b = Buckets::new(1000, 12_345);
        assert_eq!((b.start_ms(), b.end_ms()), (12_000, 13_000));
        assert!(!b.due(12_999));
        assert!(b.due(13_000));
    }

    #[test]
    fn idle_bucket_writes_nothing() {
        let mut b = Buckets::new(1000, 5_500);
        let (why, e) = b.close(6_000, &none());
        assert_eq!((why, e), (Closed::Idle, None));
        // A course whose viewers all expired is still idle.
        let zero: HashMap<String, u64> = [("CS101".to_string(), 0)].into();
        assert_eq!(b.close(7_000, &zero).0, Closed::Idle);
        assert_eq!(b.start_ms(), 7_000);
    }

    #[test]
    fn counts_and_sums_over_sections() {
        let mut b = Buckets::new(1000, 10_100);
        for i in 0..50u32 {
            b.on_snapshot(&snap("CS101", i % 2, i, 100, Some(u64::from(i) + 1)));
        }
        b.on_snapshot(&snap("MATH1", 0, 5, 10, None));
        let viewers: HashMap<String, u64> =
            [("CS101".to_string(), 3), ("HIST9".to_string(), 2)].into();
        let (why, e) = b.close(11_000, &viewers);
        assert_eq!(why, Closed::Write);
        let e = e.expect("entry");
        assert_eq!((e.bucket_start_ms, e.bucket_ms), (10_000, 1000));
        let names: Vec<&str> = e.courses.iter().map(|c| c.course.as_str()).collect();
        assert_eq!(names, ["CS101", "HIST9", "MATH1"]);
        // Latest of section 0 is taken 48, of section 1 taken 49.
        assert_eq!(
            e.courses[0],
            CourseRow {
                course: "CS101".into(),
                updates: 50,
                viewers: 3,
                seats_taken: 97,
                total_seats: 200
            }
        );
        assert_eq!(
            (
                e.courses[1].updates,
                e.courses[1].viewers,
                e.courses[1].total_seats
            ),
            (0, 2, 0)
        );
        // The next bucket starts from zero updates but keeps the seats.
        b.on_snapshot(&snap("CS101", 0, 50, 100, Some(100)));
        let (_, e) = b.close(12_000, &none());
        let e = e.expect("entry");
        assert_eq!(e.bucket_start_ms, 11_000);
        assert_eq!(e.courses.len(), 1);
        assert_eq!(
            (e.courses[0].updates, e.courses[0].seats_taken),
            (1, 50 + 49)
        );
        let json: serde_json::Value =
            serde_json::from_str(&e.courses_json()).expect("courses json");
        assert_eq!(json[0]["course"], "CS101");
        assert_eq!(json[0]["updates"], 1);
        assert_eq!(json[0]["seats_taken"], 99);
        assert_eq!(json[0]["total_seats"], 200);
        assert_eq!(json[0]["viewers"], 0);
        let back = Entry::from_fields("11000", "1000", &e.courses_json());
        assert_eq!(back, Some(e));
        assert_eq!(Entry::from_fields("x", "1000", "[]"), None);
        assert_eq!(Entry::from_fields("1", "1000", "{}"), None);
    }

    #[test]
    fn stale_versions_count_but_do_not_replace_seats() {
        let mut b = Buckets::new(1000, 0).with_rehearsal_prefix("REHEARSAL-".into());
        assert!(!b.on_snapshot(&snap("REHEARSAL-0001", 1, 5, 10, Some(3))));
        let v = HashMap::from([("REHEARSAL-0001".to_string(), 4u64)]);
        assert_eq!(
            b.close(2000, &v).0,
            Closed::Idle,
            "a rehearsal course is not counted"
        );
        let mut b = Buckets::new(1000, 0);
        b.on_snapshot(&snap("A", 0, 10, 20, Some(5)));
        b.on_snapshot(&snap("A", 0, 3, 20, Some(4)));
        let (_, e) = b.close(1000, &none());
        let row = &e.expect("entry").courses[0];
        assert_eq!((row.updates, row.seats_taken), (2, 10));
    }

    #[test]
    fn a_replacement_undoes_a_forged_version_and_later_ones_pass_it() {
        let mut b = Buckets::new(1000, 0);
        b.on_snapshot(&snap("A", 0, 10, 50, Some(20)));
        b.on_snapshot(&snap("A", 0, 39, 50, Some(1 << 53)));
        let mut undo = snap("A", 0, 11, 50, Some(21));
        undo.replace = true;
        b.on_snapshot(&undo);
        let (_, e) = b.close(1000, &none());
        let row = &e.expect("entry").courses[0];
        assert_eq!(
            (row.updates, row.seats_taken),
            (3, 11),
            "the replacement's seats"
        );
        b.on_snapshot(&snap("A", 0, 12, 50, Some(22)));
        b.on_snapshot(&snap("A", 0, 9, 50, Some(20)));
        let (_, e) = b.close(2000, &none());
        let row = &e.expect("entry").courses[0];
        assert_eq!(
            row.seats_taken, 12,
            "newer than the replacement passes, older does not"
        );
    }

    #[test]
    fn lost_bucket_writes_nothing_and_the_next_one_does() {
        let mut b = Buckets::new(1000, 0);
        b.on_snapshot(&snap("A", 0, 1, 2, None));
        b.lose();
        assert!(b.is_lost());
        assert_eq!(b.close(1000, &none()), (Closed::Lost, None));
        assert!(!b.is_lost());
        b.on_snapshot(&snap("A", 0, 2, 2, None));
        let (why, e) = b.close(2000, &none());
        assert_eq!(why, Closed::Write);
        assert_eq!(e.expect("entry").courses[0].updates, 1);
    }

    #[test]
    fn a_reconnect_inside_the_lost_bucket_counts_what_follows_it() {
        let mut b = Buckets::new(1000, 10_000);
        b.on_snapshot(&snap("A", 0, 1, 2, Some(1)));
        // The connection drops at 10,100 and is back at 10,400: the same bucket.
        b.lose();
        assert_eq!(b.resume(10_400), Some(10_000));
        assert!(!b.is_lost());
        assert_eq!(b.resume(10_450), None, "given up once");
        // Five snapshots after the reconnect: written for the rest of the bucket.
        for v in 2..7 {
            b.on_snapshot(&snap("A", 0, 1, 2, Some(v)));
        }
        let (why, e) = b.close(11_000, &none());
        assert_eq!(why, Closed::Write);
        let e = e.expect("entry");
        assert_eq!(e.bucket_start_ms, 10_000);
        assert_eq!(
            e.courses[0].updates, 5,
            "the one before the drop is not counted"
        );
    }

    #[test]
    fn a_reconnect_after_the_lost_bucket_counts_in_the_current_one() {
        let mut b = Buckets::new(1000, 10_000);
        b.on_snapshot(&snap("A", 0, 1, 2, None));
        b.lose();
        // Back 3.2 s later: the buckets that passed meanwhile are skipped.
        assert_eq!(b.resume(13_200), Some(10_000));
        assert_eq!(
            (b.start_ms(), b.due(13_999), b.due(14_000)),
            (13_000, false, true)
        );
        b.on_snapshot(&snap("A", 0, 2, 2, None));
        let (_, e) = b.close(14_000, &none());
        let e = e.expect("entry");
        assert_eq!((e.bucket_start_ms, e.courses[0].updates), (13_000, 1));
        // Without a loss a reconnect changes nothing.
        b.on_snapshot(&snap("A", 0, 2, 2, None));
        assert_eq!(b.resume(14_500), None);
        assert_eq!(
            b.close(15_000, &none()).1.expect("entry").courses[0].updates,
            1
        );
    }

    #[test]
    fn a_late_close_skips_to_the_current_bucket() {
        let mut b = Buckets::new(1000, 0);
        b.on_snapshot(&snap("A", 0, 1, 2, None));
        let (_, e) = b.close(5_300, &none());
        assert_eq!(e.expect("entry").bucket_start_ms, 0);
        assert_eq!(b.start_ms(), 5_000);
        // Closing early (clock stepped back) never reopens an old bucket.
        b.close(1_000, &none());
        assert_eq!(b.start_ms(), 6_000);
    }
}
