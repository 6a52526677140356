//! The analytics stream of a session (contract section 7): its key, the
//! entry one non-idle bucket appends, the bucket machine that makes the
//! entries ([`buckets`]) and the reads of the stream back ([`read`]). The
//! analytics worker writes it; `seatboard analytics report` and a node's
//! `/api/history` read it, and the demo's in-process series runs the same
//! bucket machine. Below all three, so none of them imports another.

pub mod buckets;
pub mod read;

pub use buckets::{Buckets, Closed};
use serde::{Deserialize, Serialize};

/// The stream key of a session.
pub fn stream_key(prefix: &str, session: &str) -> String {
    format!("{prefix}{session}")
}

/// The fields of an entry, in the order they are written.
pub const FIELDS: [&str; 3] = ["bucket_start_ms", "bucket_ms", "courses"];

/// One course's line in a stream entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CourseRow {
    /// Course code.
    pub course: String,
    /// Snapshots published for the course during the bucket.
    pub updates: u64,
    /// Unexpired presence members of the course when the bucket closed.
    pub viewers: u64,
    /// Seats taken, summed over the course's sections (latest snapshots seen).
    pub seats_taken: u64,
    /// Seats, summed over the course's sections (latest snapshots seen).
    pub total_seats: u64,
}

/// What one non-idle bucket appends to the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Bucket start, Unix ms, a multiple of `bucket_ms`.
    pub bucket_start_ms: u64,
    /// Bucket length in ms.
    pub bucket_ms: u64,
    /// Every course with an update or a viewer in the bucket, by course code.
    pub courses: Vec<CourseRow>,
}

impl Entry {
    /// Its stream fields, as `XADD` writes them: [`FIELDS`] and their values.
    pub fn fields(&self) -> [(&'static str, String); 3] {
        let [start, length, courses] = FIELDS;
        [
            (start, self.bucket_start_ms.to_string()),
            (length, self.bucket_ms.to_string()),
            (courses, self.courses_json()),
        ]
    }

    /// The `courses` field: a JSON array of [`CourseRow`].
    pub fn courses_json(&self) -> String {
        serde_json::to_string(&self.courses).unwrap_or_else(|_| "[]".into())
    }

    /// Reads an entry back from its stream fields; `None` when one is missing or malformed.
    pub fn from_fields(bucket_start_ms: &str, bucket_ms: &str, courses: &str) -> Option<Entry> {
        Some(Entry {
            bucket_start_ms: bucket_start_ms.trim().parse().ok()?,
            bucket_ms: bucket_ms.trim().parse().ok()?,
            courses: serde_json::from_str(courses).ok()?,
        })
    }
}
