//! The delay proxy against small servers of its own (echo, sink).

use super::*;
use std::sync::mpsc;

const MS: Duration = Duration::from_millis(1);

/// An echo server: every connection's bytes come back until it half-closes.
fn echo_server() -> SocketAddr {
    serve(|mut s| {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    })
}

/// A server that runs `f` on a thread per accepted connection.
fn serve(f: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let f = Arc::new(f);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let f = f.clone();
            std::thread::spawn(move || f(s));
        }
    });
    addr
}

/// What a sink reports: a chunk and when it was read, or `None` at EOF.
type Arrivals = mpsc::Receiver<Option<(Instant, Vec<u8>)>>;

/// A sink: sends each chunk it reads, stamped, then `None` at EOF.
fn sink_server() -> (SocketAddr, Arrivals) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let addr = serve(move |mut s| {
        let tx = lock(&tx).clone();
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = tx.send(Some((Instant::now(), buf[..n].to_vec())));
        }
        let _ = tx.send(None);
    });
    (addr, rx)
}

fn connect(p: &DelayProxy) -> TcpStream {
    let s = TcpStream::connect(p.addr()).expect("connect to proxy");
    s.set_nodelay(true).expect("nodelay");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s
}

/// One byte there and back; the time it took.
fn round_trip(s: &mut TcpStream, b: u8) -> Duration {
    let t = Instant::now();
    s.write_all(&[b]).expect("write");
    let mut got = [0u8; 1];
    s.read_exact(&mut got).expect("echo");
    assert_eq!(got[0], b);
    t.elapsed()
}

#[test]
fn round_trip_pays_the_delay_both_ways_and_follows_set_delay() {
    let p = DelayProxy::start(echo_server(), 25 * MS);
    let mut s = connect(&p);
    for i in 0..3 {
        let rtt = round_trip(&mut s, i);
        assert!(rtt >= 50 * MS, "round trip {rtt:?} under 2 x 25 ms");
        assert!(rtt < 550 * MS, "round trip {rtt:?}");
    }
    p.set_delay(60 * MS);
    assert_eq!(p.delay(), 60 * MS);
    let rtt = round_trip(&mut s, 9);
    assert!(rtt >= 120 * MS, "round trip {rtt:?} after set_delay(60 ms)");
}

#[test]
fn chunks_are_not_serialized_behind_one_another() {
    let (up, rx) = sink_server();
    let p = DelayProxy::start(up, 20 * MS);
    let mut s = connect(&p);
    let t0 = Instant::now();
    for _ in 0..100 {
        s.write_all(b"x").expect("write");
        std::thread::sleep(MS); // pacing the sender, not waiting on anything
    }
    let span = t0.elapsed();
    let (mut first, mut last, mut bytes) = (None, t0, 0);
    while bytes < 100 {
        let (at, chunk) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("chunk")
            .expect("no EOF yet");
        first.get_or_insert(at);
        (last, bytes) = (at, bytes + chunk.len());
    }
    let first = first.expect("a chunk") - t0;
    assert!(
        first >= 20 * MS,
        "first byte after {first:?}, under the delay"
    );
    let total = last - t0;
    assert!(
        total < span + 20 * MS + 250 * MS,
        "100 writes over {span:?} all arrived only after {total:?}: serialized?"
    );
}

#[test]
fn jitter_never_reorders_a_direction() {
    let (up, rx) = sink_server();
    let p = DelayProxy::start(up, 2 * MS).with_jitter(30 * MS);
    let mut s = connect(&p);
    let mut sent = Vec::new();
    for i in 0u32..300 {
        s.write_all(&i.to_be_bytes()).expect("write");
        sent.extend_from_slice(&i.to_be_bytes());
        std::thread::sleep(Duration::from_micros(200));
    }
    s.shutdown(Shutdown::Write).expect("half-close");
    let mut got = Vec::new();
    while let Some((_, chunk)) = rx.recv_timeout(Duration::from_secs(10)).expect("chunk") {
        got.extend_from_slice(&chunk);
    }
    assert!(got == sent, "bytes arrived out of order");
}

#[test]
fn blackhole_keeps_connections_open_and_silent_until_lifted() {
    let p = DelayProxy::start(echo_server(), 10 * MS);
    let mut s = connect(&p);
    round_trip(&mut s, b'a');
    p.blackhole(true);
    s.write_all(b"b").expect("write into the hole");
    let mut fresh = connect(&p);
    fresh.write_all(b"c").expect("write on a held connection");
    let quiet = Some(Duration::from_millis(300));
    for c in [&mut s, &mut fresh] {
        c.set_read_timeout(quiet).expect("timeout");
        let mut buf = [0u8; 8];
        match c.read(&mut buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            other => panic!("a black hole answered or closed: {other:?}"),
        }
    }
    assert_eq!(p.connections(), 1, "the held connection reached upstream");
    p.blackhole(false);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    round_trip(&mut s, b'd');
}

#[test]
fn half_close_reaches_the_other_side_after_the_delay() {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let up = serve(move |mut s| {
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let _ = s.write_all(b"bye");
        let _ = lock(&tx).send(got);
    });
    let p = DelayProxy::start(up, 15 * MS);
    let mut s = connect(&p);
    let t = Instant::now();
    s.write_all(b"abc").expect("write");
    s.shutdown(Shutdown::Write).expect("half-close");
    let mut back = Vec::new();
    s.read_to_end(&mut back).expect("read to EOF");
    assert_eq!(back, b"bye");
    assert!(t.elapsed() >= 30 * MS, "EOF both ways in {:?}", t.elapsed());
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).expect("upstream"),
        b"abc"
    );
}

#[test]
fn dropping_the_proxy_closes_its_connections_and_port() {
    let p = DelayProxy::start(echo_server(), 5 * MS);
    let mut s = connect(&p);
    round_trip(&mut s, 1);
    let addr = p.addr();
    drop(p);
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection still open after the drop: {other:?}"),
    }
    assert!(TcpStream::connect(addr).is_err(), "port still accepts");
}

#[test]
fn redis_at_distance_answers_far_slower_than_near() {
    let r = RedisAtDistance::start(20 * MS);
    let ping = |port: u16| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let t = Instant::now();
        s.write_all(b"PING\r\n").expect("ping");
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).expect("pong");
        assert_eq!(&buf, b"+PONG\r\n");
        t.elapsed()
    };
    assert!(ping(r.proxy.port()) >= 40 * MS);
    assert!(r.far_uri().ends_with(&r.proxy.port().to_string()));
    assert_eq!(r.near_uri(), r.redis.uri());
}
