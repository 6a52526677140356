//! The nodes watched while the rehearsal runs: each `--nodes` URL (else the
//! `--target`) has its `/metrics` scraped once a second on a thread of its
//! own, for the node's CPU (% of a core) and RSS over the run, and whether it
//! kept its Redis connection (`seatboard_redis_connected`,
//! `seatboard_redis_reconnects_total`), and what its distance to Redis
//! costs: the round trip it measures (`seatboard_redis_rtt_seconds`, the
//! largest of a cluster's nodes) and its time to seed a course over the run
//! (`seatboard_seed_seconds`). Answers at one URL from different
//! processes (a load balancer in front) are told apart by
//! `process_start_time_seconds`, each its own series. An `https://` URL is
//! scraped over TLS (the viewers' roots and name rules, `transport.rs`), by
//! the one scraper, `loadgen::scrape`.

use loadgen::scrape::Endpoint;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One scrape of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrape {
    /// `process_start_time_seconds`: which process answered.
    pub started: f64,
    /// `process_cpu_seconds_total`.
    pub cpu_s: f64,
    /// `process_resident_memory_bytes`.
    pub rss: f64,
    /// `seatboard_redis_connected` (1 while the pub/sub source is up).
    pub redis_up: f64,
    /// `seatboard_redis_reconnects_total`.
    pub reconnects: f64,
    /// `seatboard_redis_rtt_seconds` (the largest sample; NaN: none answered).
    pub rtt_s: f64,
    /// `seatboard_seed_seconds` buckets: (upper bound, cumulative count).
    pub seed: Vec<(f64, f64)>,
}

/// The `q` quantile (0..1) of the observations between two cumulative
/// bucket sets, as the upper bound of the bucket it falls in (`None`: none).
pub fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(b, _)| b == le).map_or(0.0, |b| b.1);
            (*le, (n - was).max(0.0))
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    counts
        .iter()
        .find(|(_, n)| *n >= (q * total).ceil().max(1.0))
        .map(|(le, _)| *le)
}

/// One second of a node's series.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    /// Seconds since the rehearsal started.
    pub t: f64,
    /// CPU since the scrape before, in % of one core.
    pub cpu_pct: f64,
    /// Resident memory.
    pub rss_bytes: u64,
}

/// Everything seen of one node process.
#[derive(Debug, Clone)]
pub struct NodeSeen {
    /// Where it answered.
    pub url: String,
    /// Its `process_start_time_seconds`.
    pub started: f64,
    /// Per second.
    pub series: Vec<Point>,
    /// Scrapes in which it had no Redis connection.
    pub redis_down: u64,
    /// Scrapes taken.
    pub scrapes: u64,
    /// Reconnects to Redis between its first and last scrape.
    pub reconnects: u64,
    /// The largest round trip to Redis it reported.
    pub rtt_max_s: f64,
    /// Seconds into the run it was first seen (a node behind a balancer may
    /// answer the first time late): its figures count from then.
    pub first_t: f64,
    first: Scrape,
    last: (Instant, Scrape),
}

impl NodeSeen {
    fn new(url: &str, t: f64, at: Instant, s: Scrape) -> NodeSeen {
        NodeSeen {
            first_t: t,
            url: url.to_string(),
            started: s.started,
            series: Vec::new(),
            redis_down: u64::from(s.redis_up < 1.0),
            scrapes: 1,
            reconnects: 0,
            rtt_max_s: nan_max(f64::NAN, s.rtt_s),
            first: s.clone(),
            last: (at, s),
        }
    }

    /// Adds a scrape taken `t` seconds into the run at `at`.
    fn add(&mut self, t: f64, at: Instant, s: Scrape) {
        let dt = at.duration_since(self.last.0).as_secs_f64();
        if dt > 0.0 {
            let cpu = (s.cpu_s - self.last.1.cpu_s).max(0.0) / dt * 100.0;
            self.series.push(Point {
                t,
                cpu_pct: (cpu * 10.0).round() / 10.0,
                rss_bytes: s.rss as u64,
            });
        }
        self.scrapes += 1;
        self.redis_down += u64::from(s.redis_up < 1.0);
        self.reconnects = (s.reconnects - self.first.reconnects).max(0.0) as u64;
        self.rtt_max_s = nan_max(self.rtt_max_s, s.rtt_s);
        self.last = (at, s);
    }

    /// Courses seeded during the run, and their time to seed (p50, p99), in ms.
    pub fn seed_ms(&self) -> (u64, Option<f64>, Option<f64>) {
        let (a, b) = (&self.first.seed, &self.last.1.seed);
        let total = b.last().map_or(0.0, |x| x.1) - a.last().map_or(0.0, |x| x.1);
        let ms = |q| quantile(a, b, q).map(|s| s * 1e3);
        (total.max(0.0) as u64, ms(0.5), ms(0.99))
    }

    /// The distance to Redis as one sentence of the report.
    pub fn distance(&self) -> String {
        let ms = |v: Option<f64>| match v {
            Some(x) if x.is_finite() => format!("{x:.1} ms"),
            // Past the histogram's last bound.
            Some(x) if x > 0.0 => "> 2.5 s".to_string(),
            _ => "-".to_string(),
        };
        let (n, p50, p99) = self.seed_ms();
        let courses = if n == 1 { "course" } else { "courses" };
        let since = if self.first_t >= 1.0 {
            format!(
                " since it was first seen {:.1} s into the run",
                self.first_t
            )
        } else {
            String::new()
        };
        let cpu = self.series.iter().map(|p| p.cpu_pct).fold(0.0, f64::max);
        let rss = self.series.iter().map(|p| p.rss_bytes).max().unwrap_or(0);
        format!(
            "{}: CPU up to {cpu:.0} % of a core, RSS up to {:.0} MiB; Redis round trip {} (largest {}); {n} {courses} seeded{since}, p50 {}, p99 {} (bucket bounds)",
            self.url,
            rss as f64 / f64::from(1 << 20),
            ms(Some(self.last.1.rtt_s * 1e3)),
            ms(Some(self.rtt_max_s * 1e3)),
            ms(p50),
            ms(p99)
        )
    }

    /// A node with `series` and nothing else (for the report's tests).
    #[cfg(test)]
    pub fn with_series(url: &str, started: f64, series: Vec<Point>) -> NodeSeen {
        let s = Scrape {
            started,
            cpu_s: 0.0,
            rss: 0.0,
            redis_up: 1.0,
            reconnects: 0.0,
            rtt_s: f64::NAN,
            seed: Vec::new(),
        };
        NodeSeen {
            series,
            ..NodeSeen::new(url, 0.0, Instant::now(), s)
        }
    }

    /// What this node fell short of, if anything.
    pub fn short(&self) -> Option<String> {
        if self.reconnects == 0 && self.redis_down == 0 {
            return None;
        }
        Some(format!(
            "redis: node {} lost its Redis connection during the run ({} reconnects, no Redis in {} of {} scrapes of /metrics)",
            self.url, self.reconnects, self.redis_down, self.scrapes
        ))
    }

    /// The node in the JSON's `nodes`.
    pub fn to_json(&self) -> Value {
        let finite_ms = |s: f64| s.is_finite().then(|| (s * 1e6).round() / 1e3);
        let (seeded, p50, p99) = self.seed_ms();
        json!({
            "url": self.url,
            "started": self.started,
            "series": self.series,
            "redis_reconnects": self.reconnects,
            "redis_down_scrapes": self.redis_down,
            "scrapes": self.scrapes,
            "redis_rtt_ms": {"last": finite_ms(self.last.1.rtt_s), "max": finite_ms(self.rtt_max_s)},
            "seed_ms": {"courses": seeded, "p50": p50, "p99": p99},
            "first_seen_s": self.first_t,
        })
    }
}

/// The larger of two values, a NaN counting as absent.
fn nan_max(a: f64, b: f64) -> f64 {
    match (a.is_nan(), b.is_nan()) {
        (true, _) => b,
        (_, true) => a,
        _ => a.max(b),
    }
}

/// The values of a `/metrics` exposition that the rehearsal reads, or `None`
/// when it is not one (no `process_start_time_seconds`).
pub fn parse(text: &str) -> Option<Scrape> {
    let mut s = Scrape {
        started: f64::NAN,
        cpu_s: 0.0,
        rss: 0.0,
        redis_up: 1.0,
        reconnects: 0.0,
        rtt_s: f64::NAN,
        seed: Vec::new(),
    };
    for (name, v) in loadgen::scrape::samples(text) {
        if name.starts_with("seatboard_redis_rtt_seconds") {
            s.rtt_s = nan_max(s.rtt_s, v);
            continue;
        }
        if let Some(le) = name
            .strip_prefix("seatboard_seed_seconds_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            if !le.is_nan() {
                s.seed.push((le, v));
            }
            continue;
        }
        match name {
            "process_start_time_seconds" => s.started = v,
            "process_cpu_seconds_total" => s.cpu_s = v,
            "process_resident_memory_bytes" => s.rss = v,
            "seatboard_redis_connected" => s.redis_up = v,
            "seatboard_redis_reconnects_total" => s.reconnects = v,
            _ => {}
        }
    }
    (!s.started.is_nan()).then_some(s)
}

/// One `GET /metrics`, within about two seconds.
fn scrape(e: &Endpoint) -> Option<Scrape> {
    parse(&e.get("/metrics", Duration::from_secs(2))?)
}

/// The most scrapes of one endpoint for the baseline (a balancer's nodes).
const BASELINE_SCRAPES: usize = 12;

/// The scraping thread and what it saw.
pub struct Watch {
    nodes: Arc<Mutex<Vec<NodeSeen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Files one scrape of `url` into `nodes`.
fn file(nodes: &Mutex<Vec<NodeSeen>>, url: &str, start: Instant, s: Scrape) {
    let now = Instant::now();
    let t = now.duration_since(start).as_secs_f64();
    let t = (t * 10.0).round() / 10.0;
    let Ok(mut nodes) = nodes.lock() else {
        return;
    };
    match nodes
        .iter_mut()
        .find(|n| n.url == url && n.started == s.started)
    {
        Some(n) => n.add(t, now, s),
        None => nodes.push(NodeSeen::new(url, t, now, s)),
    }
}

impl Watch {
    /// Scrapes every endpoint now (the baseline), then once a second. An
    /// endpoint that is a balancer in front of several nodes is asked again
    /// until the same nodes answer twice in a row (at most
    /// [`BASELINE_SCRAPES`] times), so each node's figures count from the
    /// start of the run, not from its first turn behind the balancer.
    pub fn start(endpoints: Vec<Endpoint>, start: Instant) -> Watch {
        let nodes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        for e in &endpoints {
            let mut repeats = 0;
            for _ in 0..BASELINE_SCRAPES {
                let Some(s) = scrape(e) else { break };
                let seen = nodes
                    .lock()
                    .is_ok_and(|n: std::sync::MutexGuard<'_, Vec<NodeSeen>>| {
                        n.iter().any(|n| n.url == e.url && n.started == s.started)
                    });
                file(&nodes, &e.url, start, s);
                repeats = if seen { repeats + 1 } else { 0 };
                if repeats == 2 {
                    break;
                }
            }
        }
        let (n, st) = (Arc::clone(&nodes), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("rehearse-nodes".into())
            .spawn(move || {
                let mut next = Instant::now() + Duration::from_secs(1);
                while !st.load(Ordering::Relaxed) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    next += Duration::from_secs(1);
                    for e in &endpoints {
                        if let Some(s) = scrape(e) {
                            file(&n, &e.url, start, s);
                        }
                    }
                }
                // The last scrape, so what happened up to the end is seen.
                for e in &endpoints {
                    if let Some(s) = scrape(e) {
                        file(&n, &e.url, start, s);
                    }
                }
            })
            .ok();
        Watch {
            nodes,
            stop,
            thread,
        }
    }

    /// Stops the thread after one last scrape; every node seen.
    pub fn finish(mut self) -> Vec<NodeSeen> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.nodes.lock().map(|n| n.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP process_start_time_seconds x\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1764420000.5\nprocess_cpu_seconds_total 12.5\nprocess_resident_memory_bytes 52428800\nseatboard_redis_connected 1\nseatboard_redis_reconnects_total 2\nseatboard_connections{shard=\"0\"} 7\nseatboard_redis_rtt_seconds{node=\"10.0.0.1:7000\"} 0.0021\nseatboard_redis_rtt_seconds{node=\"10.0.0.2:7000\"} 0.0042\nseatboard_seed_seconds_bucket{le=\"0.005\"} 10\nseatboard_seed_seconds_bucket{le=\"0.01\"} 18\nseatboard_seed_seconds_bucket{le=\"+Inf\"} 20\n";

    #[test]
    fn an_exposition_gives_the_figures_and_anything_else_none() {
        let s = parse(TEXT).expect("parsed");
        assert_eq!(
            s,
            Scrape {
                started: 1764420000.5,
                cpu_s: 12.5,
                rss: 52428800.0,
                redis_up: 1.0,
                reconnects: 2.0,
                rtt_s: 0.0042,
                seed: vec![(0.005, 10.0), (0.01, 18.0), (f64::INFINITY, 20.0)],
            }
        );
        assert_eq!(parse("<html>not metrics</html>"), None);
    }

    #[test]
    fn cpu_is_a_share_of_a_core_and_a_lost_redis_is_named() {
        let t0 = Instant::now();
        let s = parse(TEXT).expect("parsed");
        let mut n = NodeSeen::new("http://n1", 0.0, t0, s.clone());
        assert_eq!(n.short(), None);
        let later = Scrape {
            cpu_s: s.cpu_s + 0.5,
            ..s.clone()
        };
        n.add(1.0, t0 + Duration::from_secs(1), later.clone());
        assert_eq!(n.series[0].cpu_pct, 50.0);
        assert_eq!(n.series[0].rss_bytes, 52428800);
        assert_eq!(n.short(), None);
        let cut = Scrape {
            redis_up: 0.0,
            reconnects: s.reconnects + 3.0,
            ..later.clone()
        };
        n.add(2.0, t0 + Duration::from_secs(2), cut);
        let why = n.short().expect("named");
        assert!(
            why.contains("http://n1") && why.contains("3 reconnects"),
            "{why}"
        );
        assert!(why.contains("1 of 3 scrapes"), "{why}");
    }

    #[test]
    fn the_distance_to_redis_is_the_largest_round_trip_and_seeds_over_the_run() {
        let t0 = Instant::now();
        let s = parse(TEXT).expect("parsed");
        let mut n = NodeSeen::new("http://n1", 0.0, t0, s.clone());
        // Over the run: 100 more seeds, 90 within 5 ms, 8 within 10 ms, 2 slower.
        let later = Scrape {
            rtt_s: 0.003,
            seed: vec![(0.005, 100.0), (0.01, 116.0), (f64::INFINITY, 120.0)],
            ..s.clone()
        };
        n.add(1.0, t0 + Duration::from_secs(1), later);
        assert_eq!(n.seed_ms(), (100, Some(5.0), Some(f64::INFINITY)));
        let j = n.to_json();
        assert_eq!(j["redis_rtt_ms"]["max"], 4.2);
        assert_eq!(j["redis_rtt_ms"]["last"], 3.0);
        assert_eq!(j["seed_ms"]["courses"], 100);
        let line = n.distance();
        assert!(
            line.contains("round trip 3.0 ms (largest 4.2 ms)"),
            "{line}"
        );
        assert!(!line.contains("first seen"), "{line}");
        // A node first seen late (its first turn behind a balancer) says so.
        let late = NodeSeen::new("http://lb", 2.5, t0, s.clone());
        let line = late.distance();
        assert!(
            line.contains("0 courses seeded since it was first seen 2.5 s into the run"),
            "{line}"
        );
        assert_eq!(late.to_json()["first_seen_s"], 2.5);
        assert_eq!(
            quantile(&[], &[(0.001, 0.0), (0.002, 0.0)], 0.99),
            None,
            "no seeds, no figure"
        );
    }
}
