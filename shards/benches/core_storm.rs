//! The storm through one shard's sans-IO core, no sockets: viewers watch
//! Zipf-chosen courses, snapshot batches arrive every millisecond, and every
//! frame is drained as a writer would. Deterministic (fixed seed, simulated
//! clock), so its instruction count under callgrind compares builds exactly:
//!
//! ```sh
//! cargo bench -p shards --bench core_storm --no-run
//! valgrind --tool=callgrind --toggle-collect='*storm_loop*' \
//!     target/release/deps/core_storm-* 2500 2
//! ```
//!
//! Arguments: viewers (2500, one shard's half of the 5,000-viewer storm) and
//! simulated seconds (5); `--deflate`: every viewer negotiated
//! permessage-deflate, so each render compresses its frame once. Prints wall
//! time per snapshot and per delivered frame.

use shards::{Role, Shard, ShardConfig, Snapshot, WsOptions};
use std::sync::Arc;
use std::time::Instant;

/// Courses, sections per course, snapshots per second into this shard, Zipf skew:
/// the suite's storm as one of its two shards sees it.
const COURSES: usize = 500;
const SECTIONS: u32 = 8;
const SNAPSHOTS_PER_SEC: u64 = 7_500;
const SKEW: f64 = 1.1;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A Zipf-distributed course index.
fn zipf(cdf: &[f64], rng: &mut Rng) -> usize {
    let u = rng.unit();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

/// Pops every action and frame, as the shell's flush and writers do; frames
/// popped and their bytes on the wire.
fn drain(shard: &mut Shard) -> (u64, u64) {
    let (mut frames, mut bytes) = (0, 0);
    while shard.poll_action().is_some() {}
    while let Some(id) = shard.poll_ready() {
        while let Some(frame) = shard.poll_frame(id) {
            frames += 1;
            bytes += frame.len() as u64;
        }
    }
    (frames, bytes)
}

/// The measured part (callgrind: `--toggle-collect=*storm_loop*`): one batch
/// per millisecond (the ingest thread's flush), then the driver's turn:
/// timeout, drain, next deadline. Returns (frames, their bytes, wakes).
#[inline(never)]
fn storm_loop(shard: &mut Shard, snaps: &[Arc<Snapshot>], seconds: u64) -> (u64, u64, u64) {
    let per_ms = (SNAPSHOTS_PER_SEC / 1000) as usize;
    let (mut frames, mut bytes, mut wakes, mut next) = (0, 0, 0, 0);
    for now in 1..=seconds * 1000 {
        let end = (next + per_ms + (now % 2) as usize).min(snaps.len());
        for s in &snaps[next..end] {
            shard.handle_snapshot(s);
        }
        next = end;
        shard.handle_timeout(now);
        let (f, b) = drain(shard);
        frames += f;
        bytes += b;
        std::hint::black_box(shard.poll_timeout());
        wakes += 1;
    }
    (frames, bytes, wakes)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let viewers: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_500);
    let seconds: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let deflate = std::env::args().any(|a| a == "--deflate");
    let weights: Vec<f64> = (1..=COURSES).map(|k| 1.0 / (k as f64).powf(SKEW)).collect();
    let sum: f64 = weights.iter().sum();
    let cdf: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / sum;
            Some(*acc)
        })
        .collect();
    let names: Vec<Arc<str>> = (0..COURSES).map(|i| format!("C{i:03}").into()).collect();
    let mut rng = Rng(0x5eed_f00d);
    let mut shard = Shard::new(ShardConfig::default());
    let mut ids = Vec::with_capacity(viewers);
    for i in 0..viewers {
        let options = WsOptions::VIEWER.with_deflate(deflate);
        let id = shard.connect(format!("u{i}"), Role::Student, options, 0);
        let course = &names[zipf(&cdf, &mut rng)];
        shard.handle_text(id, &format!(r#"{{"op":"watch","course":"{course}"}}"#), 0);
        ids.push(id);
    }
    let mut versions = vec![0u64; COURSES * SECTIONS as usize];
    for (c, name) in names.iter().enumerate() {
        let seed: Vec<Arc<Snapshot>> = (0..SECTIONS)
            .map(|s| {
                Arc::new(Snapshot::build(
                    Arc::clone(name),
                    s,
                    100,
                    0,
                    None,
                    Some(0),
                    None,
                ))
            })
            .collect();
        shard.handle_seed(name, &seed, 0);
        let _ = c;
    }
    drain(&mut shard);
    // Snapshots built up front, like the ingest thread does, outside the timing.
    let total = SNAPSHOTS_PER_SEC * seconds;
    let snaps: Vec<Arc<Snapshot>> = (0..total)
        .map(|_| {
            let c = zipf(&cdf, &mut rng);
            let s = (rng.next() % SECTIONS as u64) as u32;
            let v = &mut versions[c * SECTIONS as usize + s as usize];
            *v += 1;
            Arc::new(Snapshot::build(
                Arc::clone(&names[c]),
                s,
                100,
                (*v % 100) as u32,
                None,
                Some(*v),
                None,
            ))
        })
        .collect();
    let started = Instant::now();
    let (frames, bytes, wakes) = storm_loop(&mut shard, &snaps, seconds);
    let next = snaps.len();
    let el = started.elapsed();
    println!(
        "core_storm: {viewers} viewers{}, {COURSES} courses, {next} snapshots, {wakes} wakes over {seconds} s simulated: {frames} frames ({} rendered, {bytes} bytes); {:.0} ms wall, {:.2} us per frame, {:.2} us per snapshot",
        if deflate { " (permessage-deflate)" } else { "" },
        shard.stats().frames_rendered,
        el.as_secs_f64() * 1e3,
        el.as_secs_f64() * 1e6 / frames.max(1) as f64,
        el.as_secs_f64() * 1e6 / next.max(1) as f64,
    );
    std::hint::black_box(&ids);
}
