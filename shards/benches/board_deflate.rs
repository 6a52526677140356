//! A course's whole board compressed by the two compressors a shard holds:
//! a render's ([`Deflater::default`], level 6) and a whole board's
//! ([`Deflater::quick`], level 1), at 2 to 60 sections. Prints a table and
//! JSON: the compressed bytes (deterministic) and the time per compression
//! of each, measured alternately in the same run.
//!
//! ```sh
//! cargo bench -p shards --bench board_deflate
//! ```

use shards::deflate::Deflater;
use shards::Snapshot;
use std::time::Instant;

/// Compressions per timed pass; passes alternate between the compressors.
const PER_PASS: u32 = 2_000;
const PASSES: u32 = 10;

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

/// Compressed length (0: sent plain) and µs per compression over `PER_PASS`.
fn pass(deflater: &mut Deflater, payload: &[u8]) -> (usize, f64) {
    let started = Instant::now();
    let mut len = 0;
    for _ in 0..PER_PASS {
        len = deflater
            .compress_message(std::hint::black_box(payload))
            .map_or(0, |c| c.len());
    }
    (
        len,
        started.elapsed().as_secs_f64() * 1e6 / f64::from(PER_PASS),
    )
}

fn main() {
    let mut render = Deflater::default();
    let mut whole = Deflater::quick();
    let mut rows = Vec::new();
    println!("sections  payload B  level 6 B  level 1 B  level 6 µs  level 1 µs  time 1/6");
    for sections in [2u32, 8, 20, 60] {
        let payload = board(sections);
        let (mut t6, mut t1) = (Vec::new(), Vec::new());
        let (mut b6, mut b1) = (0, 0);
        for _ in 0..PASSES {
            let (b, t) = pass(&mut render, &payload);
            b6 = b;
            t6.push(t);
            let (b, t) = pass(&mut whole, &payload);
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
