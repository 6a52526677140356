//! Slow consumers (contract section 5): clients that stop reading are closed
//! 4001 after their queue stayed full for 5 s (best effort: their TCP connection
//! is dropped when the close frame cannot be written), while a healthy client on
//! the same shard keeps its frame rate.
//!
//! Flag-free load: each stuck client floods pings (control frames are not rate
//! limited) and never reads, so the server's pongs fill the kernel buffers of
//! the connection within a second; the course frames it watches then find its
//! queue full.

use crate::common;
use crate::raw;
use crate::redis_util;
use common::*;
use raw::*;
use socket2::{Domain, Socket, Type};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A connection whose receive buffer is tiny and which is never read.
fn stuck_client(port: u16, user: &str) -> RawWs {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    s.connect(&addr.into()).unwrap();
    let stream: TcpStream = s.into();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut ws = RawWs::connect_with(stream, &format!("/ws?user={user}"));
    // Every demo course (under the 20 messages/s limit): the most frames, so the
    // send queue fills in seconds even on a busy machine.
    for (i, c) in seatboard::cmd::simulator::DEMO_COURSES.iter().enumerate() {
        if i > 0 && i % 15 == 0 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        ws.text(&format!("{{\"op\":\"watch\",\"course\":\"{c}\"}}"));
    }
    ws
}

/// Frame arrival times of a healthy client over `dur`.
fn frame_times(ws: &mut RawWs, dur: Duration) -> Vec<Instant> {
    let end = Instant::now() + dur;
    let mut out = Vec::new();
    while Instant::now() < end {
        match ws.read(end.saturating_duration_since(Instant::now())) {
            Got::Frame(f)
                if f.opcode == OP_TEXT && f.json().is_some_and(|v| v["type"] == "frame") =>
            {
                out.push(Instant::now());
            }
            Got::Frame(f) if f.opcode == OP_PING => ws.send(true, OP_PONG, &f.payload),
            Got::Frame(_) | Got::Timeout => {}
            Got::Eof => panic!("the healthy client was disconnected"),
        }
    }
    out
}

/// The bytes the kernel still holds to send from the server's side of the
/// connection to `client` (`/proc/net/tcp`'s `tx_queue`), if that socket exists.
fn server_send_queue(server_port: u16, client: SocketAddr) -> Option<u64> {
    loopback_tcp()
        .into_iter()
        .find(|s| s.local_port == server_port && s.remote_port == client.port())
        .map(|s| s.tx_queue)
}

fn max_gap(t: &[Instant]) -> Duration {
    t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

#[test]
fn stuck_clients_are_closed_4001_and_a_healthy_one_keeps_its_rate() {
    let sb = Seatboard::start(&["demo", "--shards", "1", "--tick-ms", "100"]);
    let mut healthy = RawWs::hello(sb.port, "healthy");
    // The 15 hottest demo courses (within the 20 messages/s limit): one hot
    // course alone goes quiet for seconds once it is full (the simulator
    // then passes seat grabs on and only releases touch it).
    for c in &seatboard::cmd::simulator::DEMO_COURSES[..15] {
        healthy.text(&format!("{{\"op\":\"watch\",\"course\":\"{c}\"}}"));
    }
    let f = healthy
        .next_of_type("frame", Duration::from_secs(10))
        .expect("watch answer");
    assert_eq!(f["full"], true);
    let baseline = frame_times(&mut healthy, Duration::from_secs(3));
    assert!(
        baseline.len() >= 6,
        "the hot course moves: {}",
        baseline.len()
    );

    let before = sb.metric("seatboard_slow_consumer_closes_total");
    let mut stuck: Vec<RawWs> = (0..3)
        .map(|i| stuck_client(sb.port, &format!("stuck{i}")))
        .collect();
    // Stuff: 60 pings a second per client (under the 100 control frames a
    // second that close a connection 1008) for up to 15 s, their pongs on top
    // of the frames of every demo course; written from threads so a blocked
    // write does not stop the healthy client's reads.
    let stuffers: Vec<_> = stuck
        .iter()
        .map(|ws| {
            let mut s = ws.stream.try_clone().unwrap();
            std::thread::spawn(move || {
                use std::io::Write;
                let ping = shards::ws_codec::client_frame(true, OP_PING, &[b'p'; 125], MASK);
                let batch: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 6).collect();
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(15) {
                    if s.write_all(&batch).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    let stall = Instant::now();
    // The healthy client's frames keep coming meanwhile.
    let during = frame_times(&mut healthy, Duration::from_secs(5));
    let closed = wait_for(Duration::from_secs(45), || {
        let n = sb.metric("seatboard_slow_consumer_closes_total") - before;
        (n >= 3.0).then_some(n)
    });
    let took = stall.elapsed();
    assert!(
        closed.is_some(),
        "stuck clients were not closed within {took:?}"
    );
    assert!(took >= Duration::from_secs(5), "closed too early: {took:?}");
    for t in stuffers {
        t.join().unwrap();
    }
    let rate = |t: &[Instant], secs: f64| t.len() as f64 / secs;
    assert!(
        rate(&during, 5.0) >= rate(&baseline, 3.0) * 0.5,
        "healthy frame rate fell from {:.1}/s to {:.1}/s",
        rate(&baseline, 3.0),
        rate(&during, 5.0)
    );
    assert!(
        max_gap(&during) < Duration::from_millis(1500),
        "gap {:?}",
        max_gap(&during)
    );
    assert!(metric_value(&sb.metrics(), "seatboard_ws_closes_total{code=\"4001\"}") >= 3.0);
    // Once the close grace is over, the server holds nothing for them: a
    // connection cut with bytes the peer never took is reset, not left to
    // an orphaned socket that keeps its send buffer.
    let peers: Vec<SocketAddr> = stuck
        .iter()
        .map(|ws| ws.stream.local_addr().unwrap())
        .collect();
    let held = wait_for(Duration::from_secs(15), || {
        let held: Vec<u64> = peers
            .iter()
            .filter_map(|p| server_send_queue(sb.port, *p))
            .filter(|q| *q > 0)
            .collect();
        held.is_empty().then_some(())
    });
    assert!(
        held.is_some(),
        "the server still holds unsent bytes for cut stuck clients: {:?}",
        peers
            .iter()
            .map(|p| server_send_queue(sb.port, *p))
            .collect::<Vec<_>>()
    );
    // Each stuck client, reading at last, finds either the 4001 close frame or
    // its connection dropped — never an open connection.
    for ws in stuck.iter_mut() {
        ws.stream.set_write_timeout(None).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let outcome = loop {
            match ws.read(Duration::from_secs(5)) {
                Got::Frame(f) if f.opcode == OP_CLOSE => break Some(f.close_code()),
                Got::Frame(_) => {}
                Got::Eof => break None,
                Got::Timeout => panic!("a stuck client is still connected"),
            }
            assert!(Instant::now() < end, "never ended");
        };
        assert!(matches!(outcome, None | Some(Some(4001))), "{outcome:?}");
    }
    // The healthy client is still served.
    let after = frame_times(&mut healthy, Duration::from_secs(2));
    assert!(!after.is_empty());
    assert!(wait_for(Duration::from_secs(10), || {
        (metric_value(&sb.metrics(), "seatboard_connections{") == 1.0).then_some(())
    })
    .is_some());
}

#[test]
fn a_client_that_reads_nothing_behind_a_board_past_the_bound_is_closed_4001() {
    // The course's board (10 sections of ~40 KB) is past the 64 KiB queue
    // bound: it goes out alone and the socket holds it. Then only a small
    // section changes, so the queue itself never fills.
    let redis = RedisServer::start();
    let sb = redis_util::serve(&redis, &["--shards", "1"]);
    let course = "BIGQ1";
    let blob = "b".repeat(40_000);
    for s in 1..=10u32 {
        let p = serde_json::json!({"course":course,"section":s,"total_seats":40,
            "seats_taken":1,"version":1,"seat_info":{"b":blob}})
        .to_string();
        redis.cli(&["HSET", &format!("seatstate:{course}"), &s.to_string(), &p]);
    }
    let before = sb.metric("seatboard_slow_consumer_closes_total");
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", sb.port).parse().unwrap();
    s.connect(&addr.into()).unwrap();
    let _stuck = RawWs::connect_with(s.into(), &format!("/ws?user=stuck&course={course}"));
    let start = Instant::now();
    let mut version = 1;
    let closed = wait_for(Duration::from_secs(20), || {
        version += 1;
        redis_util::publish(
            &redis,
            course,
            &redis_util::payload(course, 99, 40, (version % 40) as u32, version),
        );
        (sb.metric("seatboard_slow_consumer_closes_total") > before).then_some(start.elapsed())
    });
    let took = closed.expect("a client reading nothing for 20 s was not closed 4001");
    assert!(took >= Duration::from_secs(5), "closed after {took:?}");
}
