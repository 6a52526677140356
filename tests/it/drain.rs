//! Signals (contract section 8): the first SIGTERM/SIGINT drains — `/readyz`
//! 503 and upgrades 503 at once, every connection its reconnect hint and close
//! 1012 at its own moment spread over `--drain-ms`, exit 0 after the last — and
//! a second signal closes everything with 1001 and exits.

use crate::common;
use crate::raw;
use common::*;
use raw::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What one drained client saw, in ms since the signal.
#[derive(Debug)]
struct Seen {
    hint_at_ms: u128,
    after_ms: u64,
    code: Option<u16>,
}

fn drained_client(mut ws: RawWs, signal_at: mpsc::Receiver<Instant>) -> Seen {
    let hint = ws
        .next_of_type("reconnect", Duration::from_secs(20))
        .expect("a reconnect hint");
    let at = Instant::now();
    let t0 = signal_at.recv().expect("signal time");
    let after_ms = hint["after_ms"].as_u64().expect("after_ms is an integer");
    // The close follows the hint directly.
    let f = match ws.read(Duration::from_secs(5)) {
        Got::Frame(f) => f,
        other => panic!("expected the close after the hint, got {other:?}"),
    };
    assert_eq!(f.opcode, OP_CLOSE, "{f:?}");
    ws.close(1000, b"");
    ws.expect_eof(Duration::from_secs(3));
    Seen {
        hint_at_ms: at.duration_since(t0).as_millis(),
        after_ms,
        code: f.close_code(),
    }
}

#[test]
fn sigterm_drains_spread_over_the_window_then_exits_0() {
    let mut sb = Seatboard::start(&["demo", "--shards", "2", "--drain-ms", "3000"]);
    const N: usize = 20;
    let mut handles = Vec::new();
    let mut senders = Vec::new();
    for i in 0..N {
        let mut ws = RawWs::hello(sb.port, &format!("d{i}"));
        ws.text(r#"{"op":"watch","course":"CS101"}"#);
        let (tx, rx) = mpsc::channel();
        senders.push(tx);
        handles.push(std::thread::spawn(move || drained_client(ws, rx)));
    }
    assert_eq!(http_get(sb.port, "/readyz").unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    sb.signal(libc::SIGTERM);
    for tx in &senders {
        tx.send(t0).unwrap();
    }
    // At once: not ready, and new upgrades refused with 503 + Retry-After.
    let r = wait_for(Duration::from_secs(2), || {
        http_get(sb.port, "/readyz")
            .ok()
            .filter(|r| r.status == 503)
    });
    assert!(r.is_some(), "/readyz did not turn 503");
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    let r = http_raw(sb.port, upgrade_request("/ws?user=late", "").as_bytes()).unwrap();
    assert_eq!(r.status, 503);
    let ra: u64 = r
        .header("Retry-After")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(ra >= 1);
    let m = sb.metrics();
    assert_eq!(
        metric_value(
            &m,
            "seatboard_handshakes_refused_total{reason=\"draining\"}"
        ),
        1.0
    );
    let h = http_get(sb.port, "/healthz").unwrap();
    assert!(h.body.contains("\"draining\":true"), "{}", h.body);
    // Plain HTTP still answers while draining.
    assert_eq!(http_get(sb.port, "/metrics").unwrap().status, 200);

    let seen: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let exit = sb
        .wait_exit(Duration::from_secs(10))
        .expect("exits after the drain");
    let exited_ms = t0.elapsed().as_millis();
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    let mut at: Vec<u128> = seen.iter().map(|s| s.hint_at_ms).collect();
    at.sort();
    for s in &seen {
        assert_eq!(s.code, Some(1012), "{s:?}");
        assert!(s.after_ms <= 5000, "{s:?}");
    }
    // Spread over the 3 s window, not all at once and none after it.
    assert!(at[0] < 1200, "first hint at {at:?}");
    assert!(*at.last().unwrap() > 1800, "last hint at {at:?}");
    assert!(*at.last().unwrap() < 3000 + 1500, "hints {at:?}");
    let early = at.iter().filter(|t| **t < 1500).count();
    assert!((3..=17).contains(&early), "uneven spread {at:?}");
    let hints: std::collections::BTreeSet<u64> = seen.iter().map(|s| s.after_ms).collect();
    assert!(hints.len() > 1, "after_ms is jittered: {hints:?}");
    assert!(
        exited_ms >= *at.last().unwrap() && exited_ms < *at.last().unwrap() + 4000,
        "exited at {exited_ms} ms, last hint at {at:?}"
    );
}

#[test]
fn sigint_with_no_connections_exits_0_at_once() {
    let mut sb = Seatboard::start(&["demo", "--shards", "1", "--drain-ms", "60000"]);
    sb.signal(libc::SIGINT);
    let exit = sb.wait_exit(Duration::from_secs(5)).expect("exit");
    assert_eq!(exit.code(), Some(0));
}

#[test]
fn second_signal_closes_everything_with_1001_and_exits() {
    let mut sb = Seatboard::start(&["demo", "--shards", "2", "--drain-ms", "60000"]);
    let mut clients: Vec<RawWs> = (0..6)
        .map(|i| RawWs::hello(sb.port, &format!("s{i}")))
        .collect();
    sb.signal(libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(2), || {
        http_get(sb.port, "/readyz")
            .ok()
            .filter(|r| r.status == 503)
    })
    .is_some());
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    sb.signal(libc::SIGTERM);
    let mut codes = Vec::new();
    for ws in clients.iter_mut() {
        codes.push(ws.expect_close_frame(Duration::from_secs(5)));
        ws.expect_eof(Duration::from_secs(5));
    }
    let exit = sb.wait_exit(Duration::from_secs(5)).expect("exits");
    // The clients never answer the close: the node does not wait for them
    // (it waited 2 s for peers that never close).
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(exit.code(), Some(0));
    // A drain moment may have come first for one of them (60 s window: unlikely).
    let fast = codes.iter().filter(|c| **c == Some(1001)).count();
    assert!(fast >= 5, "{codes:?}");
    assert!(
        codes.iter().all(|c| matches!(c, Some(1001) | Some(1012))),
        "{codes:?}"
    );
}
