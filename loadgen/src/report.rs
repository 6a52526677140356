//! A viewer loop's report, and what the rehearsal and the bench suite sum
//! over several loops' reports.

use crate::counters::Counters;
use crate::hist::Hist;
use crate::seeding::SeedingRecord;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Viewers whose board of one course had one digest: (course, digest, viewers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boards(pub u32, pub u64, pub u64);

/// Everything one viewer loop saw, sent once at its end.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    /// Why the loop could not run at all (then nothing else is filled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Ended blind intervals, (start, end) in Unix ms.
    pub intervals: Vec<(u64, u64)>,
    /// Starts (Unix ms) of the blind intervals still running.
    pub still_blind: Vec<u64>,
    /// Latency per phase (`Command::Lat`), survivors only in `during`.
    pub phases: BTreeMap<String, Hist>,
    /// Close codes of the connections the server ended: (code, count).
    pub close_codes: Vec<(u16, u64)>,
    /// The counters at the end.
    pub counters: Counters,
    /// Latency (µs) of every newer section of a live frame.
    pub latency: Hist,
    /// Connect to upgrade (or SSE head), µs.
    pub connect: Hist,
    /// Connect to each connection's first full frame, µs.
    pub first_board: Hist,
    /// The open viewers' boards, by course and digest.
    pub digests: Vec<Boards>,
    /// Boards (a viewer's courses) of the viewers started whose connection
    /// was not open at the end: boards that could not be true.
    pub boards_not_live: u64,
    /// Refusals by status: (status, count).
    pub refusals: Vec<(u16, u64)>,
    /// When the first refusal came, ms after the start.
    pub first_refusal_ms: Option<u64>,
    /// The first TLS failure, in words.
    pub tls_error: Option<String>,
    /// Upgrades per second since the start.
    pub per_second: Vec<u64>,
    /// First watch and first full frame per course, frames per second.
    pub seeding: SeedingRecord,
}

impl Report {
    /// The report of a loop that could not start.
    pub fn failed(why: String) -> Report {
        Report {
            error: Some(why),
            ..Report::default()
        }
    }
}

/// Refusals by status summed over several (status, count) lists.
pub fn sum_refusals<'a>(lists: impl IntoIterator<Item = &'a [(u16, u64)]>) -> BTreeMap<u16, u64> {
    let mut m = BTreeMap::new();
    for list in lists {
        for &(status, n) in list {
            *m.entry(status).or_default() += n;
        }
    }
    m
}

/// The reports' latency and connect histograms merged, and their boards:
/// (viewers with a board, those whose digest is `expected(course)`).
pub fn merge(
    reports: &[Report],
    expected: impl Fn(u32) -> Option<u64>,
) -> (Hist, Hist, (u64, u64)) {
    let (mut latency, mut connect) = (Hist::default(), Hist::default());
    let mut boards = (0u64, 0u64);
    for r in reports {
        latency.merge(&r.latency);
        connect.merge(&r.connect);
        for &Boards(course, digest, n) in &r.digests {
            boards.0 += n;
            if expected(course) == Some(digest) {
                boards.1 += n;
            }
        }
    }
    (latency, connect, boards)
}

/// Open viewers' boards counted by (course, digest).
pub fn count_boards(boards: impl Iterator<Item = (u32, u64)>) -> Vec<Boards> {
    let mut m: HashMap<(u32, u64), u64> = HashMap::new();
    for key in boards {
        *m.entry(key).or_default() += 1;
    }
    m.into_iter().map(|((c, d), n)| Boards(c, d, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(lat: &[u64], digests: Vec<Boards>, refusals: Vec<(u16, u64)>) -> Report {
        let mut latency = Hist::default();
        for &v in lat {
            latency.record(v);
        }
        Report {
            latency,
            digests,
            refusals,
            ..Report::default()
        }
    }

    #[test]
    fn reports_sum_their_boards_refusals_and_percentiles() {
        let a = report(
            &[100, 200, 300],
            vec![Boards(0, 7, 10), Boards(1, 8, 2)],
            vec![(503, 2)],
        );
        let b = report(
            &(1..=97).collect::<Vec<_>>(),
            vec![Boards(0, 6, 5)],
            vec![(503, 1), (429, 4)],
        );
        let (lat, _, boards) = merge(&[a.clone(), b.clone()], |c| [7, 8].get(c as usize).copied());
        assert_eq!(lat.total(), 100);
        assert_eq!(lat.max(), 300);
        assert_eq!(lat.quantile(0.5), 50);
        assert_eq!(lat.quantile(1.0), 300);
        assert!(
            lat.quantile(0.99) >= 197 && lat.quantile(0.99) <= 200,
            "{}",
            lat.quantile(0.99)
        );
        assert_eq!(
            boards,
            (17, 12),
            "one course's 5 viewers hold another board"
        );
        let refusals = sum_refusals([a.refusals.as_slice(), b.refusals.as_slice()]);
        assert_eq!(
            refusals.into_iter().collect::<Vec<_>>(),
            vec![(429, 4), (503, 3)]
        );
        let mut counted = count_boards([(0, 7), (0, 7), (1, 8)].into_iter());
        counted.sort_by_key(|b| b.0);
        assert_eq!(counted, vec![Boards(0, 7, 2), Boards(1, 8, 1)]);
    }

    #[test]
    fn a_report_reads_back_in_its_json_shape() {
        let r = report(&[5], vec![Boards(2, 9, 1)], vec![]);
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["digests"], serde_json::json!([[2, 9, 1]]));
        assert_eq!(json["latency"]["max"], 5);
        assert!(json.get("error").is_none());
        let back: Report = serde_json::from_value(json).expect("report");
        assert_eq!(back.latency.total(), 1);
        let failed: Report = serde_json::from_str(r#"{"error":"no epoll"}"#).expect("failed");
        assert_eq!(failed.error.as_deref(), Some("no epoll"));
    }
}
