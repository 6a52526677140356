//! The selection-window simulator: Zipf-skewed courses whose sections fill up,
//! a few seats released now and then, looping when everything is full.

use shards::Snapshot;
use std::sync::Arc;

/// The demo's course codes, hottest first (also alphabetical, so a picker's first
/// entry is the busiest course).
pub const DEMO_COURSES: [&str; 24] = [
    "ART150", "BIO101", "BIO250", "CHEM101", "CHEM231", "CS101", "CS102", "CS201", "CS225",
    "CS301", "CS341", "ECON101", "ECON202", "ENG105", "HIST110", "MATH101", "MATH115", "MATH221",
    "MATH340", "PHIL120", "PHYS101", "PHYS211", "PSYC100", "STAT200",
];

struct Section {
    total: u32,
    taken: u32,
    version: u64,
    room: String,
}

struct Course {
    name: Arc<str>,
    sections: Vec<Section>,
}

/// A selection window in progress.
pub struct SelectionWindow {
    courses: Vec<Course>,
    /// Cumulative Zipf weights.
    cdf: Vec<f64>,
    rng: fastrand::Rng,
    /// Probability that an event releases a seat instead of taking one.
    release: f64,
}

impl SelectionWindow {
    /// A window over `names` (rank order = Zipf rank) with exponent `skew`.
    pub fn new(names: &[String], skew: f64, seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let courses: Vec<Course> = names
            .iter()
            .map(|n| Course {
                name: n.as_str().into(),
                sections: (0..rng.u32(3..=8))
                    .map(|i| Section {
                        total: rng.u32(20..=60),
                        taken: 0,
                        version: 0,
                        room: format!("{}{}", ['A', 'B', 'C', 'D'][rng.usize(0..4)], 10 + i * 7),
                    })
                    .collect(),
            })
            .collect();
        let mut acc = 0.0;
        let cdf = (1..=courses.len())
            .map(|k| {
                acc += 1.0 / (k as f64).powf(skew);
                acc
            })
            .collect();
        SelectionWindow {
            courses,
            cdf,
            rng,
            release: 0.08,
        }
    }

    /// Course codes `COURSE0000`.. for synthetic windows of any size.
    pub fn synthetic_names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("COURSE{i:04}")).collect()
    }

    /// The course codes, in rank order.
    pub fn names(&self) -> Vec<String> {
        self.courses.iter().map(|c| c.name.to_string()).collect()
    }

    /// Every section as it stands, stamped with `ts`: the whole window, each
    /// course and section once (before any seat event, all empty at version 0).
    pub fn opening(&self, ts_unix_ms: u64) -> Vec<Snapshot> {
        let mut out = Vec::new();
        for c in &self.courses {
            for si in 0..c.sections.len() {
                out.push(c.snapshot(si, ts_unix_ms));
            }
        }
        out
    }

    fn pick_course(&mut self) -> usize {
        let total = self.cdf.last().copied().unwrap_or(1.0);
        let x = self.rng.f64() * total;
        self.cdf
            .partition_point(|c| *c < x)
            .min(self.courses.len() - 1)
    }

    /// The next seat event as a full-section snapshot, stamped with `ts`.
    pub fn next(&mut self, ts_unix_ms: u64) -> Snapshot {
        let (taken, total) = self
            .courses
            .iter()
            .flat_map(|c| c.sections.iter())
            .fold((0u64, 0u64), |(a, b), s| {
                (a + s.taken as u64, b + s.total as u64)
            });
        // Nearly everything taken: the window closes and the next one opens.
        if taken * 100 >= total * 97 {
            for s in self.courses.iter_mut().flat_map(|c| c.sections.iter_mut()) {
                s.taken = 0;
            }
        }
        let mut ci = self.pick_course();
        let release = self.rng.f64() < self.release;
        // A full course passes a seat grab to the next one that still has seats.
        while !release && self.courses[ci].sections.iter().all(|s| s.taken >= s.total) {
            ci = (ci + 1) % self.courses.len();
        }
        let course = &mut self.courses[ci];
        let open: Vec<usize> = (0..course.sections.len())
            .filter(|i| {
                let s = &course.sections[*i];
                if release {
                    s.taken > 0
                } else {
                    s.taken < s.total
                }
            })
            .collect();
        let si = if open.is_empty() {
            0
        } else {
            open[self.rng.usize(0..open.len())]
        };
        let s = &mut course.sections[si];
        if release && s.taken > 0 {
            s.taken -= 1;
        } else if s.taken < s.total {
            s.taken += 1;
        }
        s.version += 1;
        course.snapshot(si, ts_unix_ms)
    }
}

impl Course {
    /// Section `si` as it stands, stamped with `ts`.
    fn snapshot(&self, si: usize, ts_unix_ms: u64) -> Snapshot {
        let s = &self.sections[si];
        let info = format!("{{\"room\":\"{}\"}}", s.room);
        Snapshot::build(
            Arc::clone(&self.name),
            si as u32,
            s.total,
            s.taken,
            Some(&info),
            Some(s.version),
            Some(ts_unix_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_and_the_protocol_page_list_the_demo_courses() {
        let listed = DEMO_COURSES.join(" ");
        for (name, text) in [
            ("README.md", include_str!("../../README.md")),
            ("docs/protocol.md", include_str!("../../docs/protocol.md")),
        ] {
            let words: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                words.contains(&format!("`{listed}`")),
                "{name} lists other codes"
            );
        }
    }

    #[test]
    fn skewed_and_fills_up() {
        let names: Vec<String> = DEMO_COURSES.iter().map(|s| s.to_string()).collect();
        let mut w = SelectionWindow::new(&names, 1.1, 7);
        let mut hits = std::collections::HashMap::<String, u32>::new();
        let mut last = std::collections::HashMap::new();
        for i in 0..20_000 {
            let s = w.next(i);
            assert!(s.seats_taken <= s.total_seats);
            *hits.entry(s.course.to_string()).or_default() += 1;
            let key = (s.course.clone(), s.section);
            if let Some(Some(v)) = last.insert(key, s.version) {
                assert!(s.version > Some(v));
            }
        }
        // Rank 1 is hit far more than the last rank.
        assert!(hits["ART150"] > 4 * hits["STAT200"], "{hits:?}");
        // Everything filled at least once and the window looped: all courses seen.
        assert_eq!(hits.len(), DEMO_COURSES.len());
    }
}
