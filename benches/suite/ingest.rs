//! `ingest`: the ingest path alone, in process, no sockets and no clients.
//! `seatboard::ingest::Ingest` is fed pre-built pub/sub messages (as the Redis
//! source would hand them over: an owned course and payload each) and routes
//! them into two shard inboxes, which are drained between batches. It measures
//! parse + validate + dedupe + board update + routing, and `Snapshot::parse`
//! alone for reference.

use crate::Outcome;
use loadgen::{zipf_cdf, zipf_pick};
use seatboard::channels::{Inbox, IngestCmd, Outlet};
use seatboard::ingest::Ingest;
use seatboard::metrics::Metrics;
use seatboard::redis::pubsub::{Source, SourceEvent};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source that yields nothing by itself: the bench hands events in directly.
struct Quiet;

impl Source for Quiet {
    fn poll(&mut self) -> Option<SourceEvent> {
        None
    }
    fn subscribe(&mut self, _course: &str) {}
    fn unsubscribe(&mut self, _course: &str) {}
    fn set_firehose(&mut self, _on: bool) {}
    fn topology(
        &mut self,
        _moved: Option<&seatboard::slots::SlotMap>,
        _down: &[seatboard::slots::Addr],
    ) {
    }
    fn subscribed(&self, _course: &str) -> bool {
        true
    }
    fn connected(&self) -> bool {
        true
    }
    fn poll_timeout(&mut self) -> Option<Duration> {
        None
    }
    fn wait_fds(&self, _fds: &mut Vec<std::os::fd::RawFd>) {}
}

const SHARDS: usize = 2;

/// Runs the microbench over `n` snapshots.
pub fn run(n: usize, courses: usize, sections: u32, skew: f64) -> Outcome {
    let mut out = Outcome::new("ingest");
    let metrics = Arc::new(Metrics::new(SHARDS));
    let inboxes: Vec<Arc<Inbox>> = (0..SHARDS).map(|_| Inbox::new()).collect();
    let outlets = inboxes.iter().map(|i| Outlet::new(Arc::clone(i))).collect();
    // State reads go nowhere: the bench measures routing alone.
    let (reads, _) = crossbeam_channel::unbounded();
    let mut ingest = Ingest::new(Quiet, outlets, Arc::clone(&metrics), None, reads, 750, 0);
    let names: Vec<String> = (0..courses).map(|i| format!("C{i:04}")).collect();
    watch_all(&mut ingest, &names);
    drain(&inboxes);
    let msgs = messages(n, &names, sections, skew);
    let bytes: usize = msgs.iter().map(|m| m.1.len()).sum();

    // Parse alone.
    let t = Instant::now();
    let mut parsed = 0u64;
    for (c, p) in &msgs {
        if shards::Snapshot::parse(p, Some(c)).is_ok() {
            parsed += 1;
        }
    }
    let parse_s = t.elapsed().as_secs_f64();

    // The ingest path: parse, dedupe, board, route, flush every 1024 like the thread does.
    let before = metrics.ingest_messages.load(Relaxed);
    let t = Instant::now();
    let mut routed = 0u64;
    for (i, (course, payload)) in msgs.into_iter().enumerate() {
        ingest.event(
            SourceEvent::Message { course, payload },
            200,
            1_764_420_000_200,
        );
        if i % 1024 == 1023 {
            ingest.flush();
            routed += drain(&inboxes);
        }
    }
    ingest.flush();
    routed += drain(&inboxes);
    let ingest_s = t.elapsed().as_secs_f64();
    let accepted = metrics.ingest_messages.load(Relaxed) - before;

    let rate = n as f64 / ingest_s;
    out.row(
        "snapshots",
        format!(
            "{n} ({:.0} B avg) over {courses} courses x {sections} sections, Zipf {skew}",
            bytes as f64 / n.max(1) as f64
        ),
        json!(n),
    );
    out.row(
        "ingest_snapshots_per_s",
        format!("{rate:.0} /s (parse + route into {SHARDS} shard inboxes, one thread)"),
        json!(rate),
    );
    out.row(
        "ingest_ns_per_snapshot",
        format!("{:.0} ns", ingest_s * 1e9 / n.max(1) as f64),
        json!(ingest_s * 1e9 / n.max(1) as f64),
    );
    out.row(
        "parse_only_per_s",
        format!("{:.0} /s", parsed as f64 / parse_s),
        json!(parsed as f64 / parse_s),
    );
    out.row("accepted", accepted.to_string(), json!(accepted));
    out.row("routed_to_shards", routed.to_string(), json!(routed));
    out.check(accepted == n as u64, "not every snapshot was accepted");
    out.check(routed >= n as u64, "not every snapshot reached a shard");
    out
}

/// Every course watched by one shard; the hottest tenth by both.
fn watch_all(ingest: &mut Ingest<Quiet>, names: &[String]) {
    let courses = names.len();
    for (i, c) in names.iter().enumerate() {
        let mut on = vec![i % SHARDS];
        if i < courses / 10 {
            on = (0..SHARDS).collect();
        }
        for shard in on {
            ingest.command(
                IngestCmd::Interest {
                    shard,
                    course: c.as_str().into(),
                    watching: true,
                    gate: None,
                },
                0,
            );
        }
    }
}

/// Empties the shard inboxes; returns the snapshots they held.
fn drain(inboxes: &[Arc<Inbox>]) -> u64 {
    let mut k = 0;
    for i in inboxes {
        while let Some(b) = i.try_snapshots() {
            k += b.len() as u64;
        }
        while i.try_control().is_some() {}
    }
    k
}

/// `n` messages as a Redis source hands them over (course, payload), over
/// `names` by Zipf `skew`, versions rising per section.
fn messages(n: usize, names: &[String], sections: u32, skew: f64) -> Vec<(String, Vec<u8>)> {
    let courses = names.len();
    let cdf = zipf_cdf(courses, skew);
    let mut rng = fastrand::Rng::with_seed(11);
    let mut versions = vec![0u64; courses * sections as usize];
    let mut msgs: Vec<(String, Vec<u8>)> = Vec::with_capacity(n);
    for _ in 0..n {
        let c = zipf_pick(&cdf, &mut rng);
        let s = rng.u32(0..sections);
        let v = &mut versions[c * sections as usize + s as usize];
        *v += 1;
        let name = &names[c];
        let payload = format!(
            "{{\"course\":\"{name}\",\"section\":{s},\"total_seats\":60,\"seats_taken\":{},\"seat_info\":{{\"room\":\"R{s}\",\"t\":1764420000123456}},\"version\":{v},\"ts\":1764420000123}}",
            *v % 61
        );
        msgs.push((name.clone(), payload.into_bytes()));
    }
    msgs
}
