//! The figures of a rehearsal, its verdict against the targets, and its JSON
//! (contract section 9).

use loadgen::Hist;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One second of the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Second {
    /// Seconds since the start.
    pub t: u64,
    /// Viewers open.
    pub viewers: u64,
    /// Upgrades in this second.
    pub connects: u64,
    /// Refusals in this second.
    pub refused: u64,
    /// Snapshots published in this second.
    pub published: u64,
    /// Publish-to-screen latency p50 in this second (ms).
    pub p50_ms: f64,
    /// And p99.
    pub p99_ms: f64,
}

/// Everything the verdict is drawn from.
pub struct Figures {
    /// Viewers open at the peak.
    pub viewers: u64,
    /// Viewers asked for.
    pub asked: u64,
    /// Refusals by status.
    pub refused: BTreeMap<u64, u64>,
    /// Connect to upgrade (µs).
    pub connect: Hist,
    /// Publish to screen (µs).
    pub latency: Hist,
    /// Boards checked, and how many were true.
    pub boards: (u64, u64),
    /// Of the boards checked, those of viewers not connected at the end.
    pub not_live: u64,
    /// Snapshots published.
    pub published: u64,
    /// Snapshots the publisher dropped.
    pub dropped: u64,
    /// Keys of the rehearsal left in Redis, or why Redis could not be asked.
    pub left: Result<u64, String>,
    /// Seconds each key of the rehearsal lives at most (its TTL).
    pub key_ttl_s: u64,
    /// Per second.
    pub series: Vec<Second>,
}

/// Refusals by status as `3 x 429, 1 x 503`.
pub fn by_status(refused: &BTreeMap<u64, u64>) -> String {
    let by: Vec<String> = refused
        .iter()
        .map(|(status, n)| format!("{n} x {status}"))
        .collect();
    by.join(", ")
}

fn ms(h: &Hist) -> Value {
    json!({"p50": h.quantile(0.5) as f64 / 1e3, "p99": h.quantile(0.99) as f64 / 1e3, "max": h.max() as f64 / 1e3})
}

impl Figures {
    /// Fraction of boards true (1 when none were checked and none were expected).
    pub fn correct(&self) -> f64 {
        if self.boards.0 == 0 {
            return if self.asked == 0 { 1.0 } else { 0.0 };
        }
        self.boards.1 as f64 / self.boards.0 as f64
    }

    /// The run's figures as one line of stderr (the JSON has them too).
    pub fn summary(&self) -> String {
        let ms = |h: &Hist, q: f64| h.quantile(q) as f64 / 1e3;
        let refused = if self.refused.is_empty() {
            "none".to_string()
        } else {
            by_status(&self.refused)
        };
        format!(
            "figures: {} of {} viewers connected, connect p50 {:.0} ms, p99 {:.0} ms; refused {refused}; \
             publish to screen p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; boards correct {:.1} % ({} of {}); {} published",
            self.viewers,
            self.asked,
            ms(&self.connect, 0.5),
            ms(&self.connect, 0.99),
            ms(&self.latency, 0.5),
            ms(&self.latency, 0.99),
            self.latency.max() as f64 / 1e3,
            self.correct() * 100.0,
            self.boards.1,
            self.boards.0,
            self.published
        )
    }

    /// What fell short of `p99_ms` and `max_refused`, as sentences.
    pub fn short(&self, p99_ms: f64, max_refused: f64) -> Vec<String> {
        let mut out = Vec::new();
        let refused: u64 = self.refused.values().sum();
        let attempts = refused + self.viewers;
        let share = if attempts == 0 {
            0.0
        } else {
            refused as f64 / attempts as f64
        };
        if share > max_refused {
            out.push(format!(
                "refusals: {:.1} % of upgrades were refused ({}), over --max-refused {:.1} %",
                share * 100.0,
                by_status(&self.refused),
                max_refused * 100.0
            ));
        }
        if self.viewers < self.asked {
            out.push(format!(
                "viewers: only {} of {} connected",
                self.viewers, self.asked
            ));
        }
        let p99 = self.latency.quantile(0.99) as f64 / 1e3;
        if p99 > p99_ms {
            out.push(format!(
                "latency: publish-to-screen p99 {p99:.0} ms, over --p99-ms {p99_ms}"
            ));
        }
        if self.latency.total() == 0 && self.published > 0 {
            out.push("latency: no published snapshot reached a screen".into());
        }
        if self.boards.1 < self.boards.0 || self.boards.0 == 0 {
            let gone = match self.not_live {
                0 => String::new(),
                n => format!(" ({n} of them on viewers not connected at the end)"),
            };
            out.push(format!(
                "boards: {} of {} viewers' boards showed the last published state{gone}",
                self.boards.1, self.boards.0
            ));
        }
        if self.dropped > 0 {
            out.push(format!(
                "redis: {} snapshots could not be written to Redis",
                self.dropped
            ));
        }
        match &self.left {
            Ok(0) => {}
            Ok(n) => out.push(format!(
                "cleanup: {n} keys of the rehearsal are still in Redis"
            )),
            Err(e) => out.push(format!(
                "cleanup: Redis could not be reached to delete the rehearsal's keys ({e}); \
                 each expires within {} s",
                self.key_ttl_s
            )),
        }
        out
    }

    /// The JSON of section 9.
    pub fn to_json(&self, short: &[String], nodes: Value) -> Value {
        let refused: serde_json::Map<String, Value> = self
            .refused
            .iter()
            .map(|(s, n)| (s.to_string(), json!(n)))
            .collect();
        json!({
            "viewers": self.viewers,
            "refused": refused,
            "connect_ms": ms(&self.connect),
            "latency_ms": ms(&self.latency),
            "correct": self.correct(),
            "boards": {"checked": self.boards.0, "correct": self.boards.1},
            "published": self.published,
            "dropped": self.dropped,
            "left_in_redis": self.left.as_ref().ok(),
            "verdict": if short.is_empty() { "pass" } else { "fail" },
            "short": short,
            "series": self.series,
            "nodes": nodes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run where everything held: 10 viewers, 20 boards true.
    fn held() -> Figures {
        let mut latency = Hist::default();
        latency.record(50_000);
        Figures {
            viewers: 10,
            asked: 10,
            refused: BTreeMap::new(),
            connect: Hist::default(),
            latency,
            boards: (20, 20),
            not_live: 0,
            published: 100,
            dropped: 0,
            left: Ok(0),
            key_ttl_s: 660,
            series: Vec::new(),
        }
    }

    #[test]
    fn a_run_that_held_falls_short_of_nothing() {
        assert_eq!(held().short(1000.0, 0.01), Vec::<String>::new());
    }

    #[test]
    fn the_summary_line_names_every_figure() {
        let mut connect = Hist::default();
        connect.record(3_000);
        let f = Figures {
            viewers: 9,
            refused: BTreeMap::from([(503, 1)]),
            connect,
            boards: (20, 19),
            ..held()
        };
        let line = f.summary();
        for part in [
            "9 of 10 viewers connected",
            "connect p50 3 ms",
            "refused 1 x 503",
            "publish to screen p50 50 ms, p99 50 ms, max 50 ms",
            "boards correct 95.0 % (19 of 20)",
            "100 published",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
    }

    #[test]
    fn every_upgrade_refused_is_a_share_of_100_percent() {
        let f = Figures {
            viewers: 0,
            refused: BTreeMap::from([(401, 309)]),
            boards: (0, 0),
            ..held()
        };
        let short = f.short(1000.0, 0.01);
        assert!(
            short[0].starts_with("refusals: 100.0 % of upgrades were refused (309 x 401)"),
            "{short:?}"
        );
    }

    #[test]
    fn boards_of_viewers_gone_at_the_end_are_not_true() {
        let f = Figures {
            boards: (20 + 7, 20),
            not_live: 7,
            ..held()
        };
        let short = f.short(1000.0, 0.01);
        assert_eq!(
            short,
            ["boards: 20 of 27 viewers' boards showed the last published state (7 of them on viewers not connected at the end)"]
        );
        assert!((f.correct() - 20.0 / 27.0).abs() < 1e-9);
    }

    #[test]
    fn a_cleanup_redis_did_not_answer_says_so_and_leaves_the_count_out() {
        let f = Figures {
            left: Err("connection refused".into()),
            ..held()
        };
        assert_eq!(
            f.short(1000.0, 0.01),
            ["cleanup: Redis could not be reached to delete the rehearsal's keys (connection refused); each expires within 660 s"]
        );
        let j = f.to_json(&[], json!([]));
        assert!(j["left_in_redis"].is_null(), "{j}");
        let j = held().to_json(&[], json!([]));
        assert_eq!(j["left_in_redis"], 0);
    }
}
