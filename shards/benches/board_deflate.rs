//! A course's whole board compressed by the two compressors a shard holds:
//! a render's ([`Deflater::default`], level 6) and a whole board's
//! ([`Deflater::quick`], level 1), at 2 to 60 sections. Prints a table and
//! JSON: the compressed bytes (deterministic) and the time per compression
//! of each, measured alternately in the same run.
//!
//! ```sh
//! cargo bench -p shards --bench board_deflate
//! ```
//!
//! Run without `--bench` (as `cargo test --all-targets` does), it makes one
//! short pass and checks that every compressed board inflates back.

use shards::deflate::{inflate_message, Deflater};
use shards::Snapshot;
use std::time::Instant;

/// Compressions per timed pass, and passes (alternating between the
/// compressors): as a bench, and as a test.
const BENCH: (u32, u32) = (2_000, 10);
const SMOKE: (u32, u32) = (20, 1);

/// The full frame of a course of `sections` sections, as the protocol shapes
/// it (section 5), with the fields the selection API's snapshots carry.
fn board(sections: u32) -> Vec<u8> {
    let parts: Vec<String> = (1..=sections)
        .map(|s| {
            let info = format!(
                r#"{{"room":"R{s}","t":{}}}"#,
                1_796_000_000_123_456u64 + u64::from(s) * 7_919
            );
            let snap = Snapshot::build(
                "CS101".into(),
                s,
                40,
                17 + s % 23,
                Some(&info),
                Some(1_000 + u64::from(s) * 3),
                None,
            );
            snap.json.into_string()
        })
        .collect();
    format!(
        r#"{{"type":"frame","course":"CS101","full":true,"sections":[{}]}}"#,
        parts.join(",")
    )
    .into_bytes()
}

/// Compressed length and µs per compression over `times` compressions; the
/// last one must inflate back to `payload`.
fn pass(deflater: &mut Deflater, payload: &[u8], times: u32) -> (usize, f64) {
    let started = Instant::now();
    let mut last = None;
    for _ in 0..times {
        last = deflater.compress_message(std::hint::black_box(payload));
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / f64::from(times);
    let compressed = last.expect("every board here is long enough to compress");
    let back = inflate_message(&compressed, payload.len()).expect("a board inflates back");
    assert_eq!(back, payload, "a board inflates back to itself");
    (compressed.len(), us)
}

fn main() {
    let (per_pass, passes) = if std::env::args().any(|a| a == "--bench") {
        BENCH
    } else {
        SMOKE
    };
    let mut render = Deflater::default();
    let mut whole = Deflater::quick();
    let mut rows = Vec::new();
    println!("sections  payload B  level 6 B  level 1 B  level 6 µs  level 1 µs  time 1/6");
    for sections in [2u32, 8, 20, 60] {
        let payload = board(sections);
        let (mut t6, mut t1) = (Vec::new(), Vec::new());
        let (mut b6, mut b1) = (0, 0);
        for _ in 0..passes {
            let (b, t) = pass(&mut render, &payload, per_pass);
            b6 = b;
            t6.push(t);
            let (b, t) = pass(&mut whole, &payload, per_pass);
            b1 = b;
            t1.push(t);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (m6, m1) = (median(&mut t6), median(&mut t1));
        println!(
            "{sections:>8}  {:>9}  {b6:>9}  {b1:>9}  {m6:>10.2}  {m1:>10.2}  {:>7.2}x",
            payload.len(),
            m1 / m6
        );
        rows.push(format!(
            r#"{{"sections":{sections},"payload_bytes":{},"level6_bytes":{b6},"level1_bytes":{b1},"level6_us":{m6:.3},"level1_us":{m1:.3}}}"#,
            payload.len()
        ));
    }
    println!("{{\"board_deflate\":[{}]}}", rows.join(","));
}
