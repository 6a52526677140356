//! A small log-linear latency histogram (about 1.5 % precision), mergeable
//! across load-generator processes.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two.
const SUB: u64 = 64;
/// Values below this are counted exactly.
const LINEAR: u64 = 2 * SUB;

/// Counts of microsecond values.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "Sparse", into = "Sparse")]
pub struct Hist {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

/// The histogram on the wire: `{"buckets": [[bucket, count], ...], "max": m}`.
#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
struct Sparse {
    buckets: Vec<[u64; 2]>,
    max: u64,
}

impl From<Hist> for Sparse {
    fn from(h: Hist) -> Sparse {
        Sparse {
            buckets: h.pairs(),
            max: h.max,
        }
    }
}

impl From<Sparse> for Hist {
    fn from(s: Sparse) -> Hist {
        let mut h = Hist::default();
        for [b, c] in s.buckets {
            // A bucket past any u64 value is not one this histogram wrote.
            let Ok(b) = usize::try_from(b) else { continue };
            if b > bucket(u64::MAX) {
                continue;
            }
            if h.counts.len() <= b {
                h.counts.resize(b + 1, 0);
            }
            h.counts[b] += c;
            h.total += c;
        }
        h.max = s.max;
        h
    }
}

fn bucket(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as u64; // >= 7
    let m = (v >> (e - 6)) & (SUB - 1);
    (LINEAR + (e - 7) * SUB + m) as usize
}

fn value(b: usize) -> u64 {
    let b = b as u64;
    if b < LINEAR {
        return b;
    }
    let k = (b - LINEAR) / SUB;
    let m = (b - LINEAR) % SUB;
    (SUB + m) << (k + 1)
}

impl Hist {
    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let b = bucket(v);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// How many values were counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0..=1), or 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let want = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= want {
                return value(b).min(self.max);
            }
        }
        self.max
    }

    /// The largest value counted.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Adds `other`'s counts into this one.
    pub fn merge(&mut self, other: &Hist) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// Sparse form for the report: `[[bucket, count], ...]` plus the max.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "buckets": self.pairs(), "max": self.max })
    }

    /// `[bucket, count]` of every bucket that counted something.
    fn pairs(&self) -> Vec<[u64; 2]> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(b, &c)| [b as u64, c])
            .collect()
    }

    /// Adds a report's histogram into this one.
    pub fn merge_json(&mut self, v: &serde_json::Value) {
        for pair in v["buckets"].as_array().into_iter().flatten() {
            let (Some(b), Some(c)) = (pair[0].as_u64(), pair[1].as_u64()) else {
                continue;
            };
            let b = b as usize;
            if self.counts.len() <= b {
                self.counts.resize(b + 1, 0);
            }
            self.counts[b] += c;
            self.total += c;
        }
        self.max = self.max.max(v["max"].as_u64().unwrap_or(0));
    }
}
