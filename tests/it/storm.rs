//! A connection storm against `--accept-rate 300`: a few thousand upgrade
//! attempts in about a second from loopback. The bucket lets through what its
//! rate and burst allow and refuses the rest with 503 + Retry-After, cheaply,
//! while existing clients keep receiving their frames on time.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One attempt: the status and Retry-After of the answer.
fn attempt(port: u16, user: usize) -> Option<(u16, Option<u64>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(upgrade_request(&format!("/ws?user=storm{user}"), "").as_bytes())
        .ok()?;
    let mut buf = Vec::with_capacity(256);
    let mut b = [0u8; 256];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    let r = parse_response(&buf).ok()?;
    let ra = r.header("Retry-After").and_then(|v| v.parse().ok());
    Some((r.status, ra))
}

#[test]
fn storm_is_refused_503_while_existing_clients_keep_their_frames() {
    let sb = Seatboard::start(&[
        "demo",
        "--shards",
        "2",
        "--accept-rate",
        "300",
        "--accept-burst",
        "200",
        "--tick-ms",
        "200",
    ]);
    // Existing viewers of the hottest course, timing their frames.
    let stop = Arc::new(AtomicBool::new(false));
    let viewers: Vec<_> = (0..4)
        .map(|i| {
            let mut ws = RawWs::hello(sb.port, &format!("viewer{i}"));
            ws.text(r#"{"op":"watch","course":"ART150"}"#);
            ws.next_of_type("frame", Duration::from_secs(10))
                .expect("watch answer");
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut times = Vec::new();
                while !stop.load(Relaxed) {
                    match ws.read(Duration::from_millis(200)) {
                        Got::Frame(f)
                            if f.opcode == OP_TEXT
                                && f.json().is_some_and(|v| v["type"] == "frame") =>
                        {
                            times.push(Instant::now());
                        }
                        Got::Eof => panic!("viewer {i} lost its connection"),
                        _ => {}
                    }
                }
                times
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));

    const ATTEMPTS: usize = 4000;
    const THREADS: usize = 16;
    let next = Arc::new(AtomicUsize::new(0));
    let storm_start = Instant::now();
    let deadline = storm_start + Duration::from_secs(4);
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let next = Arc::clone(&next);
            let port = sb.port;
            std::thread::spawn(move || {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= ATTEMPTS || Instant::now() > deadline {
                        break;
                    }
                    out.push(attempt(port, i));
                }
                out
            })
        })
        .collect();
    let results: Vec<Option<(u16, Option<u64>)>> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let storm = storm_start.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Relaxed);
    let frame_times: Vec<Vec<Instant>> = viewers.into_iter().map(|v| v.join().unwrap()).collect();

    let accepted = results
        .iter()
        .filter(|r| matches!(r, Some((101, _))))
        .count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Some((503, _))))
        .count();
    let failed = results.iter().filter(|r| r.is_none()).count();
    eprintln!(
        "storm: {} attempts in {storm:?}: {accepted} accepted, {refused} refused, {failed} failed",
        results.len()
    );
    assert!(results.len() >= 2000, "only {} attempts", results.len());
    assert_eq!(failed, 0, "every attempt got an answer");
    assert_eq!(accepted + refused, results.len(), "only 101 or 503");
    for (status, ra) in results.iter().flatten() {
        if *status == 503 {
            assert!(ra.is_some_and(|s| s >= 1), "503 without Retry-After >= 1");
        }
    }
    // Burst plus rate over the storm's duration (both shards' shares), with
    // slack. The storm offers well over that however slow the machine (at
    // least 2,000 attempts within 4 s, the bucket at most ~1,560), so every
    // attempt past the bucket's share is refused.
    let allowed = 200.0 + 300.0 * storm.as_secs_f64();
    let most = allowed * 1.1 + 20.0;
    assert!(
        (accepted as f64) <= most,
        "{accepted} accepted, the bucket allows ~{allowed:.0}"
    );
    assert!(accepted >= 150, "the burst was let through: {accepted}");
    assert!(
        refused as f64 >= results.len() as f64 - most && refused > 0,
        "{refused} refused of {}",
        results.len()
    );
    let counted = sb.metric("seatboard_handshakes_refused_total{reason=\"rate_limited\"}");
    assert_eq!(counted as usize, refused);
    // The viewers' frames kept coming during the storm.
    for (i, t) in frame_times.iter().enumerate() {
        let during: Vec<&Instant> = t
            .iter()
            .filter(|x| **x >= storm_start && **x <= storm_start + storm)
            .collect();
        let gap = t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        assert!(
            gap < Duration::from_millis(1500),
            "viewer {i}: a {gap:?} gap in its frames"
        );
        // At least 1.5 frames a second of storm, in whole frames: a storm
        // shorter than a tick may rightly see none (the gap check above
        // still holds it to the pace).
        assert!(
            during.len() as f64 >= (storm.as_secs_f64() * 1.5).floor(),
            "viewer {i}: {} frames during a {storm:?} storm",
            during.len()
        );
    }
    // Health endpoints still answer, and the node is healthy afterwards.
    assert_eq!(http_get(sb.port, "/healthz").unwrap().status, 200);
}
