//! The one metrics table type: every `/metrics` of the product (the node's,
//! the relay's, the reconciler's, the identity provider's) is a list of
//! [`Family`] rendered by [`render`] in the Prometheus text format, each
//! family's `# HELP` and `# TYPE` then its samples, every series present
//! from start (at 0 until counted).

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One metric family: its name, type and help text, and how its samples are
/// written from the figures `F` it is rendered over.
pub struct Family<F> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: fn(&F, &mut Samples<'_>),
}

impl<F> Family<F> {
    /// A gauge.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        samples: fn(&F, &mut Samples<'_>),
    ) -> Self {
        Family {
            name,
            kind: "gauge",
            help,
            samples,
        }
    }

    /// A counter.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        samples: fn(&F, &mut Samples<'_>),
    ) -> Self {
        Family {
            name,
            kind: "counter",
            help,
            samples,
        }
    }

    /// A histogram (its samples written by [`Samples::histogram`]).
    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        samples: fn(&F, &mut Samples<'_>),
    ) -> Self {
        Family {
            name,
            kind: "histogram",
            help,
            samples,
        }
    }
}

/// The sample lines of the family being rendered.
pub struct Samples<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl Samples<'_> {
    /// One sample without labels.
    pub fn one(&mut self, value: impl Display) {
        let _ = writeln!(self.out, "{} {value}", self.name);
    }

    /// One sample with one label.
    pub fn labelled(&mut self, label: &str, label_value: impl Display, value: impl Display) {
        let _ = writeln!(
            self.out,
            "{}{{{label}=\"{label_value}\"}} {value}",
            self.name
        );
    }

    /// One sample per label value, zipped with their counters.
    pub fn each(&mut self, label: &str, label_values: &[&str], values: &[AtomicU64]) {
        for (l, v) in label_values.iter().zip(values) {
            self.labelled(label, l, v.load(Relaxed));
        }
    }

    /// A histogram's buckets, sum and count; `labels` (`shard="0"`, or
    /// empty) on each line.
    pub fn histogram(&mut self, h: &Histogram, labels: &str) {
        h.render(self.out, self.name, labels);
    }
}

/// Appends every family of `families`, in order, rendered over `figures`.
pub fn render<F>(figures: &F, families: &[Family<F>], out: &mut String) {
    for f in families {
        let name = f.name;
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {}", f.help, f.kind);
        (f.samples)(figures, &mut Samples { out, name });
    }
}

/// A fixed-bucket histogram of seconds, lock-free.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (seconds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Records one observation in microseconds.
    pub fn observe_us(&self, us: u64) {
        let secs = us as f64 / 1e6;
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        cum += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let lb = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{lb} {}",
            self.sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{lb} {cum}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two {
        n: AtomicU64,
        by: [AtomicU64; 2],
        h: Histogram,
    }

    const FAMILIES: &[Family<Two>] = &[
        Family::counter("t_total", "A counter.", |t, s| s.one(t.n.load(Relaxed))),
        Family::gauge("t_by", "By kind.", |t, s| {
            s.each("kind", &["a", "b"], &t.by)
        }),
        Family::histogram("t_seconds", "Times.", |t, s| s.histogram(&t.h, "")),
    ];

    #[test]
    fn every_family_is_help_type_then_its_samples() {
        let t = Two {
            n: AtomicU64::new(3),
            by: Default::default(),
            h: Histogram::new(&[0.001, 1.0]),
        };
        t.by[1].store(2, Relaxed);
        t.h.observe_us(2_500);
        let mut out = String::new();
        render(&t, FAMILIES, &mut out);
        assert_eq!(
            out,
            "# HELP t_total A counter.\n# TYPE t_total counter\nt_total 3\n\
             # HELP t_by By kind.\n# TYPE t_by gauge\nt_by{kind=\"a\"} 0\nt_by{kind=\"b\"} 2\n\
             # HELP t_seconds Times.\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{le=\"0.001\"} 0\nt_seconds_bucket{le=\"1\"} 1\n\
             t_seconds_bucket{le=\"+Inf\"} 1\nt_seconds_sum 0.0025\nt_seconds_count 1\n"
        );
    }
}
