//! The rehearsal's progress on a terminal: one status line, rewritten in
//! place once a second (viewers live, connects and refusals by status,
//! publishes/s, latency p50/p99 of the last seconds). Nothing at all when
//! stdout is not a terminal.

use loadgen::Hist;
use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};

/// Seconds of latency the status line's p50/p99 cover.
const RECENT_S: usize = 5;

/// What one status line shows.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Seconds since the start.
    pub t: u64,
    /// `ramping`, `publishing` or `checking`.
    pub phase: &'static str,
    /// Viewers open, and asked for.
    pub viewers: (u64, u64),
    /// Upgrades so far.
    pub connects: u64,
    /// Refusals so far, by status.
    pub refused: BTreeMap<u64, u64>,
    /// Snapshots published in the last second.
    pub published_per_s: u64,
    /// Publish-to-screen p50 and p99 over the last seconds (ms), if any.
    pub latency_ms: Option<(f64, f64)>,
}

/// The status line for `s` (no control characters).
pub fn line(s: &Status) -> String {
    let refused = if s.refused.is_empty() {
        "0".to_string()
    } else {
        super::verdict::by_status(&s.refused)
    };
    let latency = match s.latency_ms {
        Some((p50, p99)) => format!("p50 {p50:.0} ms p99 {p99:.0} ms ({RECENT_S} s)"),
        None => "-".to_string(),
    };
    format!(
        "{:>4} s {:<10} viewers {}/{}  connects {}  refused {}  published {}/s  latency {}",
        s.t, s.phase, s.viewers.0, s.viewers.1, s.connects, refused, s.published_per_s, latency
    )
}

/// The status line on stdout when it is a terminal.
pub struct Progress {
    tty: bool,
    recent: VecDeque<Hist>,
    shown: bool,
}

impl Progress {
    /// Progress on stdout if it is a terminal, else nothing.
    pub fn new() -> Progress {
        Progress {
            tty: std::io::stdout().is_terminal(),
            recent: VecDeque::new(),
            shown: false,
        }
    }

    /// Keeps `h`, the latency of the second that ended, for the recent figures.
    pub fn second(&mut self, h: &Hist) {
        if !self.tty {
            return;
        }
        self.recent.push_back(h.clone());
        if self.recent.len() > RECENT_S {
            self.recent.pop_front();
        }
    }

    /// p50 and p99 (ms) over the last seconds kept, if any latency was.
    pub fn recent_ms(&self) -> Option<(f64, f64)> {
        let mut all = Hist::default();
        for h in &self.recent {
            all.merge(h);
        }
        (all.total() > 0).then(|| {
            (
                all.quantile(0.5) as f64 / 1e3,
                all.quantile(0.99) as f64 / 1e3,
            )
        })
    }

    /// Rewrites the status line with `s` (cut to the terminal's width).
    pub fn show(&mut self, s: &Status) {
        if !self.tty {
            return;
        }
        let mut text = line(s);
        if let Some(w) = width() {
            text = text.chars().take(w.saturating_sub(1)).collect();
        }
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{text}");
        let _ = out.flush();
        self.shown = true;
    }

    /// Ends the status line, so what follows starts on a line of its own.
    pub fn done(&mut self) {
        if self.tty && self.shown {
            let _ = writeln!(std::io::stdout());
            self.shown = false;
        }
    }
}

/// The terminal's width in columns.
fn width() -> Option<usize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on stdout fills the `winsize` we pass; nothing else is written.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_viewers_connects_refusals_publishes_and_latency() {
        let mut s = Status {
            t: 12,
            phase: "publishing",
            viewers: (280, 300),
            connects: 295,
            refused: BTreeMap::from([(429, 3), (503, 12)]),
            published_per_s: 2000,
            latency_ms: Some((21.4, 80.6)),
        };
        assert_eq!(
            line(&s),
            "  12 s publishing viewers 280/300  connects 295  refused 3 x 429, 12 x 503  published 2000/s  latency p50 21 ms p99 81 ms (5 s)"
        );
        s.refused.clear();
        s.latency_ms = None;
        s.phase = "ramping";
        let l = line(&s);
        assert!(l.contains("ramping    viewers"), "{l}");
        assert!(l.contains("refused 0 ") && l.ends_with("latency -"), "{l}");
        assert!(!l.chars().any(char::is_control));
    }

    #[test]
    fn recent_latency_covers_the_last_five_seconds_only() {
        let mut p = Progress {
            tty: true,
            recent: VecDeque::new(),
            shown: false,
        };
        assert_eq!(p.recent_ms(), None);
        let mut slow = Hist::default();
        slow.record(900_000);
        p.second(&slow);
        for _ in 0..RECENT_S {
            let mut fast = Hist::default();
            fast.record(10_000);
            p.second(&fast);
        }
        let (p50, p99) = p.recent_ms().expect("latency");
        assert!(
            (9.8..=10.0).contains(&p50) && (9.8..=10.0).contains(&p99),
            "{p50} {p99}"
        );
    }
}
