//! What the viewers see of a node filling its boards: per course, when this
//! process first watched it and when the first full frame of it came after
//! that (a course new to the node is answered once it is read from Redis),
//! and the frames delivered in each second. The runner merges the processes'
//! records ([`first_full_ms`], [`frames_by_second`], [`ramp`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// One process's record as its report carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SeedingRecord {
    /// [course, first watch µs, first full frame µs or 0].
    pub courses: Vec<[u64; 3]>,
    /// [Unix second, frames in it, viewers open at its last frame].
    pub per_second: Vec<[u64; 3]>,
}

/// One process's record: first watch and first full frame per course, and
/// frames per Unix second.
#[derive(Default)]
pub(crate) struct Seeding {
    /// Course index: (first watch, first full frame after it), Unix µs.
    courses: HashMap<u32, (u64, Option<u64>)>,
    /// [Unix second, frames in it, viewers open at its last frame].
    per_second: Vec<[u64; 3]>,
}

impl Seeding {
    /// A watch of `course` went out at `now_us`.
    pub(crate) fn watched(&mut self, course: u32, now_us: u64) {
        self.courses.entry(course).or_insert((now_us, None));
    }

    /// A frame of `course` came at `now_us`, with `open` viewers open.
    pub(crate) fn frame(&mut self, course: u32, full: bool, now_us: u64, open: u64) {
        if full {
            if let Some(e) = self.courses.get_mut(&course) {
                e.1.get_or_insert(now_us);
            }
        }
        let s = now_us / 1_000_000;
        match self.per_second.last_mut() {
            Some(last) if last[0] == s => {
                last[1] += 1;
                last[2] = open;
            }
            _ => self.per_second.push([s, 1, open]),
        }
    }

    /// What goes in the report.
    pub(crate) fn record(&self) -> SeedingRecord {
        let courses: Vec<[u64; 3]> = self
            .courses
            .iter()
            .map(|(&c, &(w, f))| [u64::from(c), w, f.unwrap_or(0)])
            .collect();
        SeedingRecord {
            courses,
            per_second: self.per_second.clone(),
        }
    }

    /// `{"courses": [[course, watch_us, full_us or 0]], "per_second": [[s, frames, open]]}`.
    #[cfg(test)]
    fn to_json(&self) -> Value {
        serde_json::to_value(self.record()).unwrap_or_default()
    }
}

/// Per course watched, from the processes' `seeding` records: the time from
/// its earliest watch to the first full frame the same process got after
/// it, in ms (`None`: no full frame came).
pub fn first_full_ms(records: &[&Value]) -> Vec<Option<f64>> {
    let mut first: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for r in records {
        for e in r["courses"].as_array().into_iter().flatten() {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            let (course, watch, full) = (f(0), f(1), f(2));
            let slot = first.entry(course).or_insert((watch, full));
            if watch < slot.0 {
                *slot = (watch, full);
            }
        }
    }
    first
        .values()
        .map(|&(w, f)| (f >= w && f > 0).then(|| (f - w) as f64 / 1e3))
        .collect()
}

/// Frames and open viewers per Unix second, summed over the processes'
/// records, every second from the first to the last (none: zeros).
pub fn frames_by_second(records: &[&Value]) -> Vec<[u64; 3]> {
    let mut by_s: BTreeMap<u64, [u64; 2]> = BTreeMap::new();
    for r in records {
        for e in r["per_second"].as_array().into_iter().flatten() {
            let f = |i: usize| e[i].as_u64().unwrap_or(0);
            let slot = by_s.entry(f(0)).or_default();
            slot[0] += f(1);
            slot[1] += f(2);
        }
    }
    let (Some(&a), Some(&b)) = (by_s.keys().next(), by_s.keys().next_back()) else {
        return Vec::new();
    };
    (a..=b)
        .map(|s| {
            let [n, open] = by_s.get(&s).copied().unwrap_or_default();
            [s, n, open]
        })
        .collect()
}

/// How the frame rate came up after the first frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Ramp {
    /// The steady frame rate: the median frames of the seconds in which
    /// the most viewers were open.
    pub steady: f64,
    /// The fewest frames of a whole second after the first frame's, over `steady`.
    pub min_ratio: f64,
    /// The same per open viewer: (frames / open) over its steady median.
    pub min_ratio_per_viewer: f64,
    /// Frames in each second from the first frame's, up to `end_s`.
    pub series: Vec<u64>,
}

/// The ramp over the whole seconds after the first frame's second and before
/// `end_s` (the Unix second the window ended in, itself partial); `None`
/// when there is no such second.
pub fn ramp(seconds: &[[u64; 3]], end_s: u64) -> Option<Ramp> {
    let first = seconds.iter().position(|e| e[1] > 0)?;
    let series: Vec<u64> = seconds[first..]
        .iter()
        .take_while(|e| e[0] < end_s)
        .map(|e| e[1])
        .collect();
    let whole: Vec<[u64; 3]> = seconds[first + 1..]
        .iter()
        .take_while(|e| e[0] < end_s)
        .copied()
        .collect();
    let most_open = whole.iter().map(|e| e[2]).max()?;
    let steady_secs: Vec<[u64; 3]> = whole
        .iter()
        .filter(|e| e[2] == most_open)
        .copied()
        .collect();
    let per_viewer = |e: &[u64; 3]| e[1] as f64 / e[2].max(1) as f64;
    let steady = median(steady_secs.iter().map(|e| e[1] as f64).collect());
    let steady_pv = median(steady_secs.iter().map(per_viewer).collect());
    let min_of = |f: &dyn Fn(&[u64; 3]) -> f64| whole.iter().map(f).fold(f64::INFINITY, f64::min);
    Some(Ramp {
        steady,
        min_ratio: min_of(&|e| e[1] as f64 / steady.max(1e-9)),
        min_ratio_per_viewer: min_of(&|e| per_viewer(e) / steady_pv.max(1e-9)),
        series,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_full_is_timed_from_the_earliest_watch_of_all_processes() {
        let mut a = Seeding::default();
        let mut b = Seeding::default();
        a.watched(1, 1_000_000);
        b.watched(1, 900_000);
        a.frame(1, true, 1_005_000, 1);
        b.frame(1, false, 950_000, 1);
        b.frame(1, true, 1_200_000, 1);
        b.frame(1, true, 1_300_000, 1);
        b.watched(2, 2_000_000);
        let (ja, jb) = (a.to_json(), b.to_json());
        assert_eq!(first_full_ms(&[&ja, &jb]), vec![Some(300.0), None]);
    }

    #[test]
    fn a_slow_second_after_the_first_frame_shows_in_the_ratios() {
        let mut a = Seeding::default();
        let frames = [
            (10, 5, 10),
            (11, 100, 20),
            (12, 30, 20),
            (13, 100, 20),
            (14, 80, 20),
        ];
        for &(s, n, open) in &frames {
            for _ in 0..n {
                a.frame(0, false, s * 1_000_000 + 1, open);
            }
        }
        let j = a.to_json();
        let secs = frames_by_second(&[&j, &j]);
        assert_eq!(secs[1], [11, 200, 40]);
        let r = ramp(&secs, 14).expect("whole seconds");
        assert_eq!(r.series, vec![10, 200, 60, 200]);
        assert_eq!(r.steady, 200.0);
        assert!((r.min_ratio - 0.3).abs() < 1e-9, "{r:?}");
        assert!((r.min_ratio_per_viewer - 0.3).abs() < 1e-9, "{r:?}");
        assert_eq!(ramp(&secs, 11), None);
    }
}
