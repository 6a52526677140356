//! Server-Sent Events (contract section 4c) over raw sockets against real
//! `redis-server` and `seatboard`: the stream's headers, its event sequence,
//! a live frame with the same JSON as the WebSocket frame of the same update,
//! presence across transports, the front door's refusals, CORS, the
//! connection count, drain, and a reader that stopped reading.

use crate::common;
use crate::raw;
use crate::redis_util;
use common::*;
use raw::*;
use redis_util::*;
use serde_json::Value;
use socket2::{Domain, Socket, Type};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// One event of the stream: its fields as sent (a comment has only `comment`).
#[derive(Debug, Default, Clone)]
struct Event {
    event: String,
    data: String,
    retry: Option<u64>,
    comment: bool,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {:?}", self.data))
    }
}

/// A raw `/sse` stream: its response head, then events as they arrive.
struct Sse {
    stream: TcpStream,
    head: HttpResponse,
    buf: Vec<u8>,
    eof: bool,
}

/// What reading the stream came to.
#[derive(Debug)]
enum Next {
    Event(Event),
    Timeout,
    Eof,
}

impl Sse {
    /// Sends `GET <path>` with `extra` headers (each ending CRLF) and reads the head.
    fn open(port: u16, path: &str, extra: &str) -> Sse {
        Self::open_on(
            TcpStream::connect(("127.0.0.1", port)).unwrap(),
            path,
            extra,
        )
    }

    fn open_on(mut stream: TcpStream, path: &str, extra: &str) -> Sse {
        stream.set_read_timeout(Some(T)).unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n{extra}\r\n"
        );
        stream.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = stream.read(&mut chunk).unwrap_or(0);
            assert!(
                n > 0,
                "closed before a head: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = parse_response(&buf[..end]).expect("a response head");
        Sse {
            stream,
            head,
            buf: buf.split_off(end),
            eof: false,
        }
    }

    /// The next event (comments included), waiting at most `timeout`.
    fn next(&mut self, timeout: Duration) -> Next {
        let end = Instant::now() + timeout;
        loop {
            if let Some(p) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..p + 2).collect();
                return Next::Event(parse_block(&block[..p]));
            }
            if self.eof {
                return Next::Eof;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Next::Timeout;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => self.eof = true,
            }
        }
    }

    /// The next event that is not a comment.
    fn next_event(&mut self, timeout: Duration) -> Option<Event> {
        let end = Instant::now() + timeout;
        loop {
            match self.next(end.saturating_duration_since(Instant::now())) {
                Next::Event(e) if e.comment => continue,
                Next::Event(e) => return Some(e),
                Next::Timeout | Next::Eof => return None,
            }
        }
    }

    /// Events until one satisfies `pred` (returned).
    fn until(&mut self, timeout: Duration, mut pred: impl FnMut(&Event) -> bool) -> Option<Event> {
        let end = Instant::now() + timeout;
        while let Some(e) = self.next_event(end.saturating_duration_since(Instant::now())) {
            if pred(&e) {
                return Some(e);
            }
        }
        None
    }
}

/// One event block's fields (lines `field: value`, `:` comments).
fn parse_block(block: &[u8]) -> Event {
    let text = std::str::from_utf8(block).expect("UTF-8 events");
    let mut ev = Event::default();
    let mut data: Vec<&str> = Vec::new();
    for line in text.split('\n') {
        if line.starts_with(':') {
            ev.comment = true;
            continue;
        }
        let (field, value) = line.split_once(": ").unwrap_or((line, ""));
        match field {
            "event" => ev.event = value.to_string(),
            "data" => data.push(value),
            "retry" => ev.retry = Some(value.parse().expect("retry is ms")),
            other => panic!("unknown field {other:?} in {text:?}"),
        }
    }
    ev.data = data.join("\n");
    ev
}

fn status_of(port: u16, path: &str, extra: &str) -> HttpResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n");
    http_raw(port, req.as_bytes()).expect("an answer")
}

#[test]
fn a_stream_has_the_contract_headers_then_hello_full_frames_and_presence() {
    let redis = RedisServer::start();
    redis.cli(&[
        "HSET",
        "seatstate:CS101",
        "3",
        &payload("CS101", 3, 42, 41, 17),
    ]);
    let sb = serve(&redis, &[]);
    let mut s = Sse::open(sb.port, "/sse?course=CS101&course=MATH1&user=alice", "");
    assert_eq!(s.head.status, 200);
    assert_eq!(s.head.header("Content-Type"), Some("text/event-stream"));
    assert_eq!(s.head.header("Cache-Control"), Some("no-store"));
    assert_eq!(s.head.header("X-Accel-Buffering"), Some("no"));
    for absent in ["Content-Encoding", "Content-Length", "Transfer-Encoding"] {
        assert_eq!(
            s.head.header(absent),
            None,
            "{absent}: close-delimited, as is"
        );
    }
    let hello = s.next_event(T).expect("hello");
    assert_eq!(hello.event, "hello");
    let h = hello.json();
    assert_eq!(
        (h["type"].as_str(), h["user"].as_str()),
        (Some("hello"), Some("alice"))
    );
    // Then, per course, its full frame and then its count.
    let mut seen: Vec<(String, String)> = Vec::new();
    for _ in 0..4 {
        let e = s.next_event(T).expect("a watch answer");
        let v = e.json();
        assert_eq!(
            v["type"].as_str(),
            Some(e.event.as_str()),
            "the event is named by its type"
        );
        if e.event == "frame" {
            assert_eq!(v["full"], true, "{v}");
        }
        let course = v["course"].as_str().expect("course").to_string();
        seen.push((course, e.event));
    }
    for c in ["CS101", "MATH1"] {
        let mine: Vec<&str> = seen
            .iter()
            .filter(|(k, _)| k == c)
            .map(|(_, e)| e.as_str())
            .collect();
        assert_eq!(mine, ["frame", "presence"], "{c}: {seen:?}");
    }
    // A live update arrives as a delta frame.
    publish(&redis, "CS101", &payload("CS101", 3, 42, 40, 18));
    let live = s
        .until(T, |e| e.event == "frame")
        .expect("live frame")
        .json();
    assert_eq!(live["full"], false);
    assert_eq!(section(&live, 3).expect("section 3")["seats_taken"], 40);
}

/// A one-shard node on its own Redis, with `wsuser` watching CS101 over a
/// WebSocket (its watch answer read) and `sseuser` on an SSE stream of it.
fn ws_and_sse_watching_cs101() -> (RedisServer, Seatboard, RawWs, Sse) {
    let redis = RedisServer::start();
    let sb = serve(&redis, &["--shards", "1"]);
    let mut ws = RawWs::hello(sb.port, "wsuser");
    ws.text(r#"{"op":"watch","course":"CS101"}"#);
    ws.next_of_type("frame", T).expect("ws watch answer");
    let s = Sse::open(sb.port, "/sse?course=CS101&user=sseuser", "");
    (redis, sb, ws, s)
}

#[test]
fn a_live_frame_is_the_same_json_as_the_websocket_frame_and_presence_is_shared() {
    let (redis, _sb, mut ws, mut s) = ws_and_sse_watching_cs101();
    s.until(T, |e| e.event == "frame")
        .expect("sse watch answer");
    // Both users are counted on both transports.
    let two = |v: &Value| v["type"] == "presence" && v["viewers"] == 2;
    s.until(T, |e| two(&e.json()))
        .expect("SSE sees two viewers");
    ws.next_of_type("presence", T)
        .filter(two)
        .or_else(|| ws.next_of_type("presence", T).filter(two))
        .expect("WebSocket sees two viewers");
    publish(&redis, "CS101", &payload("CS101", 1, 30, 7, 5));
    let ws_json = loop {
        match ws.read(T) {
            Got::Frame(f)
                if f.opcode == OP_TEXT
                    && f.json()
                        .is_some_and(|v| v["type"] == "frame" && v["full"] == false) =>
            {
                break String::from_utf8(f.payload).unwrap();
            }
            Got::Frame(_) => {}
            other => panic!("no live frame on the WebSocket: {other:?}"),
        }
    };
    let sse = s
        .until(T, |e| e.event == "frame")
        .expect("live frame on SSE");
    assert_eq!(sse.data, ws_json, "byte for byte the same JSON");
}

#[test]
fn refusals_follow_the_front_door_and_allowed_origins_get_cors() {
    use seatboard::auth::mint;
    use shards::Role;
    let redis = RedisServer::start();
    let uri = redis.uri();
    let jwt = |extra: &[&str]| {
        let mut a = vec!["serve", "--redis", &uri, "--shards", "1", "--auth", "jwt"];
        a.extend_from_slice(&["--jwt-secret", TEST_SECRET]);
        a.extend_from_slice(extra);
        Seatboard::start(&a)
    };
    let sb = jwt(&[]);
    let exp = crate::jwt_util::now() + 600;
    let tok = mint(TEST_SECRET.as_bytes(), "stu", Role::Student, exp);
    let before_bad = metric_value(
        &sb.metrics(),
        "seatboard_handshakes_refused_total{reason=\"bad_request\"}",
    );
    assert_eq!(
        status_of(sb.port, "/sse?course=CS101", "").status,
        401,
        "no token"
    );
    assert_eq!(
        status_of(sb.port, &format!("/sse?course=a%20b&token={tok}"), "").status,
        400,
        "bad course"
    );
    assert_eq!(
        status_of(sb.port, &format!("/sse?token={tok}"), "").status,
        400,
        "no course"
    );
    let q33: Vec<String> = (0..33).map(|i| format!("course=C{i}")).collect();
    assert_eq!(
        status_of(sb.port, &format!("/sse?{}&token={tok}", q33.join("&")), "").status,
        400,
        "33 courses"
    );
    let after_bad = metric_value(
        &sb.metrics(),
        "seatboard_handshakes_refused_total{reason=\"bad_request\"}",
    );
    assert_eq!(after_bad - before_bad, 3.0, "counted");
    // A foreign page riding the cookie.
    let cookie = format!("Cookie: seatboard_token={tok}\r\nOrigin: http://evil.example\r\n");
    assert_eq!(status_of(sb.port, "/sse?course=CS101", &cookie).status, 403);
    // The same cookie from the page's own origin passes, and Authorization too.
    let own = format!("Cookie: seatboard_token={tok}\r\nOrigin: http://localhost\r\n");
    assert_eq!(
        Sse::open(sb.port, "/sse?course=CS101", &own).head.status,
        200
    );
    let bearer = format!("Authorization: Bearer {tok}\r\n");
    assert_eq!(
        Sse::open(sb.port, "/sse?course=CS101", &bearer).head.status,
        200
    );
    assert_eq!(
        status_of(sb.port, "/sse?course=CS101", "").header("Allow"),
        None
    );
    let post = http_raw(
        sb.port,
        b"POST /sse?course=CS101 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    assert_eq!(post.status, 405);

    let allow = jwt(&["--allowed-origins", "https://uni.example"]);
    let from_uni = format!("Origin: https://uni.example\r\nCookie: seatboard_token={tok}\r\n");
    let mut s = Sse::open(allow.port, "/sse?course=CS101", &from_uni);
    assert_eq!(s.head.status, 200);
    assert_eq!(
        s.head.header("Access-Control-Allow-Origin"),
        Some("https://uni.example")
    );
    assert_eq!(
        s.head.header("Access-Control-Allow-Credentials"),
        Some("true")
    );
    assert_eq!(s.head.header("Vary"), Some("Origin"));
    assert_eq!(s.next_event(T).expect("hello").event, "hello");
    let other = status_of(
        allow.port,
        &format!("/sse?course=CS101&token={tok}"),
        "Origin: https://other.example\r\n",
    );
    assert_eq!(other.status, 403);
    assert_eq!(
        other.header("Access-Control-Allow-Origin"),
        None,
        "no CORS for a refused origin"
    );
}

#[test]
fn streams_count_as_connections_and_drain_with_retry_then_reconnect() {
    let redis = RedisServer::start();
    let mut sb = serve(&redis, &["--drain-ms", "500", "--max-conns-per-user", "2"]);
    let mut a = Sse::open(sb.port, "/sse?course=CS101&user=u", "");
    let mut b = Sse::open(sb.port, "/sse?course=CS101&user=u", "");
    a.next_event(T).expect("hello");
    b.next_event(T).expect("hello");
    // The per-user cap counts streams.
    assert_eq!(
        status_of(sb.port, "/sse?course=CS101&user=u", "").status,
        429
    );
    let counted = wait_for(T, || {
        (healthz_json(sb.port)["connections"] == 2).then_some(())
    });
    assert!(counted.is_some(), "{}", healthz_json(sb.port));
    let by_transport = wait_for(T, || {
        let m = sb.metrics();
        (metric_value(&m, "seatboard_connections_by_transport{transport=\"sse\"}") == 2.0
            && metric_value(
                &m,
                "seatboard_connections_by_transport{transport=\"websocket\"}",
            ) == 0.0)
            .then_some(())
    });
    assert!(by_transport.is_some(), "{}", sb.metrics());
    drop(b);
    sb.signal(libc::SIGTERM);
    let hint = a
        .until(T, |e| e.event == "reconnect")
        .expect("reconnect event");
    let after = hint.json()["after_ms"].as_u64().expect("after_ms");
    assert!(after <= 5000);
    assert_eq!(hint.retry, Some(after), "retry: carries the hint");
    assert!(
        matches!(a.next(T), Next::Eof),
        "the server closes after the hint"
    );
    assert!(sb.wait_exit(T).is_some_and(|s| s.success()));
}

#[test]
fn a_reader_that_stops_is_closed_after_its_buffer_stays_full() {
    let sb = Seatboard::start(&["demo", "--shards", "1", "--tick-ms", "50"]);
    let courses: Vec<String> = seatboard::cmd::simulator::DEMO_COURSES
        .iter()
        .map(|c| format!("course={c}"))
        .collect();
    let path = format!("/sse?{}&user=stuck", courses.join("&"));
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", sb.port).parse().unwrap();
    sock.connect(&addr.into()).unwrap();
    let before = sb.metric("seatboard_slow_consumer_closes_total");
    let mut stuck = Sse::open_on(sock.into(), &path, "");
    assert_eq!(stuck.head.status, 200);
    // Stuck: its socket takes nothing (and its queue fills, dropping frames
    // with a full frame owed), until it is closed as a slow consumer.
    let closed = wait_for(Duration::from_secs(60), || {
        (sb.metric("seatboard_slow_consumer_closes_total") > before).then_some(())
    });
    assert!(closed.is_some(), "a stuck stream was not closed");
    // Reading at last, it finds its stream ended, not an open one.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match stuck.next(Duration::from_secs(5)) {
            Next::Eof => break,
            Next::Event(_) => {}
            Next::Timeout => panic!("the stuck stream is still open"),
        }
        assert!(Instant::now() < end, "never ended");
    }
    assert!(wait_for(T, || (healthz_json(sb.port)["connections"] == 0)
        .then_some(()))
    .is_some());
}

/// The server's side of the client socket whose local port is `client`,
/// as a `socket:[inode]` link target, while the kernel lists it.
fn server_socket(server: u16, client: u16) -> Option<String> {
    loopback_tcp()
        .into_iter()
        .find(|r| r.local_port == server && r.remote_port == client)
        .map(|r| format!("socket:[{}]", r.inode))
}

/// Whether `pid` holds a descriptor pointing at `target`.
fn holds(pid: i32, target: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy() == target))
    })
}

/// Opens a stream next to a WebSocket watcher of the same course, closes it
/// the way `close` does, and checks that everything it held is released
/// within a second of the close: the count, `/metrics`, presence, the socket.
fn a_closed_stream_is_released_at_once(close: impl FnOnce(Sse)) {
    let (_redis, sb, mut ws, mut s) = ws_and_sse_watching_cs101();
    s.until(T, |e| {
        e.json()["type"] == "presence" && e.json()["viewers"] == 2
    })
    .expect("SSE sees two viewers");
    // Bytes a client sends on the stream are read and dropped.
    s.stream.write_all(&[b'x'; 64 * 1024]).unwrap();
    let client = s.stream.local_addr().unwrap().port();
    let socket = server_socket(sb.port, client).expect("the stream's server socket");
    assert!(holds(sb.pid(), &socket), "{socket} not held");
    let closed = Instant::now();
    close(s);
    let within = Duration::from_secs(1);
    let released = wait_for(within, || {
        let m = sb.metrics();
        (healthz_json(sb.port)["connections"] == 1
            && metric_value(&m, "seatboard_connections_by_transport{transport=\"sse\"}") == 0.0
            && !holds(sb.pid(), &socket))
        .then_some(())
    });
    assert!(
        released.is_some(),
        "not released {:?} after the close: {} {socket} held: {}",
        closed.elapsed(),
        healthz_json(sb.port),
        holds(sb.pid(), &socket)
    );
    let one = |v: &Value| v["type"] == "presence" && v["viewers"] == 1;
    let left = loop {
        match ws.next_of_type("presence", T) {
            Some(v) if one(&v) => break closed.elapsed(),
            Some(_) => {}
            None => panic!("the stream's member never left"),
        }
    };
    assert!(
        left < Duration::from_secs(2),
        "presence dropped after {left:?}"
    );
}

#[test]
fn a_stream_closed_with_fin_is_released_within_a_second() {
    a_closed_stream_is_released_at_once(|s| {
        s.stream.shutdown(std::net::Shutdown::Both).unwrap();
        drop(s);
    });
}

#[test]
fn a_stream_closed_with_rst_is_released_within_a_second() {
    a_closed_stream_is_released_at_once(|s| {
        let sock = Socket::from(s.stream);
        sock.set_linger(Some(Duration::ZERO)).unwrap();
        drop(sock);
    });
}
