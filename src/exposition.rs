//! The one metrics table type: every `/metrics` of the product (the node's,
//! the relay's, the reconciler's, the identity provider's) is a list of
//! [`Family`] rendered by [`render`] in the Prometheus text format, each
//! family's `# HELP` and `# TYPE` then its samples, every series present
//! from start (at 0 until counted). The common families (one counter, a
//! counter per label value, a 0/1 flag) name the atomic they read; any other
//! writes its samples with a function of its own.

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// One metric family: its name, type and help text, and how its samples are
/// written from the figures `F` it is rendered over.
pub struct Family<F> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Sampler<F>,
}

/// A function that writes a family's samples from its figures `F`.
pub type Write<F> = fn(&F, &mut Samples<'_>);

/// How a family's samples are read from its figures.
enum Sampler<F> {
    /// Written by a function of the family's own.
    With(Write<F>),
    /// One sample: a counter.
    Count(fn(&F) -> &AtomicU64),
    /// One sample per label value, zipped with its counters.
    Counts(
        &'static str,
        &'static [&'static str],
        fn(&F) -> &[AtomicU64],
    ),
    /// One sample, 1 or 0: a flag.
    Flag(fn(&F) -> &AtomicBool),
}

impl<F> Family<F> {
    const fn new(
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        samples: Sampler<F>,
    ) -> Self {
        Family {
            name,
            kind,
            help,
            samples,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str, samples: Write<F>) -> Self {
        Family::new(name, "gauge", help, Sampler::With(samples))
    }

    /// A counter.
    pub const fn counter(name: &'static str, help: &'static str, samples: Write<F>) -> Self {
        Family::new(name, "counter", help, Sampler::With(samples))
    }

    /// A histogram (its samples written by [`Samples::histogram`]).
    pub const fn histogram(name: &'static str, help: &'static str, samples: Write<F>) -> Self {
        Family::new(name, "histogram", help, Sampler::With(samples))
    }

    /// A counter without labels, read from one atomic.
    pub const fn count(
        name: &'static str,
        help: &'static str,
        counter: fn(&F) -> &AtomicU64,
    ) -> Self {
        Family::new(name, "counter", help, Sampler::Count(counter))
    }

    /// A counter with one label: a series per label value, each read from
    /// the counter at its place.
    pub const fn counts(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: &'static [&'static str],
        counters: fn(&F) -> &[AtomicU64],
    ) -> Self {
        Family::new(
            name,
            "counter",
            help,
            Sampler::Counts(label, values, counters),
        )
    }

    /// A gauge of 1 while a flag is set, else 0.
    pub const fn flag(name: &'static str, help: &'static str, flag: fn(&F) -> &AtomicBool) -> Self {
        Family::new(name, "gauge", help, Sampler::Flag(flag))
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
        let s = &mut Samples { out, name };
        match f.samples {
            Sampler::With(write) => write(figures, s),
            Sampler::Count(counter) => s.one(counter(figures).load(Relaxed)),
            Sampler::Counts(label, values, counters) => s.each(label, values, counters(figures)),
            Sampler::Flag(flag) => s.one(u64::from(flag(figures).load(Relaxed))),
        }
    }
}

/// Every family of `families` rendered over `figures`: a whole `/metrics` body.
pub fn text<F>(figures: &F, families: &[Family<F>]) -> String {
    let mut out = String::with_capacity(families.len() * 160);
    render(figures, families, &mut out);
    out
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
        up: AtomicBool,
    }

    const FAMILIES: &[Family<Two>] = &[
        Family::counter("t_total", "A counter.", |t, s| s.one(t.n.load(Relaxed))),
        Family::gauge("t_by", "By kind.", |t, s| {
            s.each("kind", &["a", "b"], &t.by)
        }),
        Family::histogram("t_seconds", "Times.", |t, s| s.histogram(&t.h, "")),
    ];

    const READ: &[Family<Two>] = &[
        Family::count("r_total", "One counter.", |t| &t.n),
        Family::counts("r_by_total", "By kind.", "kind", &["a", "b"], |t| &t.by),
        Family::flag("r_up", "A flag.", |t| &t.up),
    ];

    #[test]
    fn the_common_families_read_their_atomics() {
        let t = Two {
            n: AtomicU64::new(7),
            by: Default::default(),
            h: Histogram::new(&[1.0]),
            up: AtomicBool::new(false),
        };
        t.by[0].store(4, Relaxed);
        let body = |t: &Two| text(t, READ);
        assert_eq!(
            body(&t),
            "# HELP r_total One counter.\n# TYPE r_total counter\nr_total 7\n\
             # HELP r_by_total By kind.\n# TYPE r_by_total counter\n\
             r_by_total{kind=\"a\"} 4\nr_by_total{kind=\"b\"} 0\n\
             # HELP r_up A flag.\n# TYPE r_up gauge\nr_up 0\n"
        );
        t.up.store(true, Relaxed);
        assert!(body(&t).ends_with("\nr_up 1\n"));
    }

    #[test]
    fn every_family_is_help_type_then_its_samples() {
        let t = Two {
            n: AtomicU64::new(3),
            by: Default::default(),
            h: Histogram::new(&[0.001, 1.0]),
            up: AtomicBool::new(false),
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
