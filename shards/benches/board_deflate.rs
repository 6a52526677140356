//! A course's whole board compressed by the two compressors a shard holds:
//! a render's ([`Deflater::default`], zlib level 6) and a whole board's
//! ([`Deflater::quick`], fixed codes), and by zlib at level 1 (what a whole
//! board's compressor was before), at 2 to 60 sections. Prints a table and
//! JSON: the compressed bytes (deterministic) and the time per compression
//! of each, measured alternately in the same run.
//!
//! ```sh
//! cargo bench -p shards --bench board_deflate
//! ```
//!
//! Run without `--bench` (as `cargo test --all-targets` does), it makes one
//! short pass and checks that every compressed board inflates back.

use flate2::{Compress, Compression, FlushCompress};
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
fn pass(compress: &mut dyn FnMut(&[u8]) -> Vec<u8>, payload: &[u8], times: u32) -> (usize, f64) {
    let started = Instant::now();
    let mut last = Vec::new();
    for _ in 0..times {
        last = compress(std::hint::black_box(payload));
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / f64::from(times);
    let back = inflate_message(&last, payload.len()).expect("a board inflates back");
    assert_eq!(back, payload, "a board inflates back to itself");
    (last.len(), us)
}

/// zlib at level 1, raw, reset and sync-flushed per message, its tail removed.
fn zlib_level_1() -> impl FnMut(&[u8]) -> Vec<u8> {
    let mut z = Compress::new(Compression::new(1), false);
    move |payload| {
        z.reset();
        let mut out = Vec::with_capacity(payload.len() + 64);
        z.compress_vec(payload, &mut out, FlushCompress::Sync)
            .expect("compresses");
        out.truncate(out.len() - 4);
        out
    }
}

/// One way of compressing a message, timed against the others.
type Compressor = Box<dyn FnMut(&[u8]) -> Vec<u8>>;

/// A [`Deflater`] as a compressing function.
fn by(mut d: Deflater) -> impl FnMut(&[u8]) -> Vec<u8> {
    move |payload| {
        d.compress_message(payload)
            .expect("every board here is long enough to compress")
    }
}

fn main() {
    let (per_pass, passes) = if std::env::args().any(|a| a == "--bench") {
        BENCH
    } else {
        SMOKE
    };
    let mut ways: [(&str, Compressor); 3] = [
        ("level6", Box::new(by(Deflater::default()))),
        ("level1", Box::new(zlib_level_1())),
        ("fixed", Box::new(by(Deflater::quick()))),
    ];
    let mut rows = Vec::new();
    println!(
        "sections  payload B  level 6 B  level 1 B  fixed B  level 6 µs  level 1 µs  fixed µs  fixed/level 1 time"
    );
    for sections in [2u32, 8, 20, 60] {
        let payload = board(sections);
        let mut times = [(); 3].map(|_| Vec::new());
        let mut bytes = [0; 3];
        for _ in 0..passes {
            for (i, (_, way)) in ways.iter_mut().enumerate() {
                let (b, t) = pass(way.as_mut(), &payload, per_pass);
                bytes[i] = b;
                times[i].push(t);
            }
        }
        let m = times.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        });
        println!(
            "{sections:>8}  {:>9}  {:>9}  {:>9}  {:>7}  {:>10.2}  {:>10.2}  {:>8.2}  {:>17.2}x",
            payload.len(),
            bytes[0],
            bytes[1],
            bytes[2],
            m[0],
            m[1],
            m[2],
            m[2] / m[1]
        );
        let fields: Vec<String> = ways
            .iter()
            .enumerate()
            .map(|(i, (name, _))| format!(r#""{name}_bytes":{},"{name}_us":{:.3}"#, bytes[i], m[i]))
            .collect();
        rows.push(format!(
            r#"{{"sections":{sections},"payload_bytes":{},{}}}"#,
            payload.len(),
            fields.join(",")
        ));
    }
    println!("{{\"board_deflate\":[{}]}}", rows.join(","));
}
