//! Deterministic "fuzz smoke": a few hundred thousand random and mutated inputs
//! for every parser that sees outside bytes (request heads and tokens, client
//! ops, Redis snapshots, WebSocket frames). No panic, and the invariants hold.
//! The coverage-guided targets live in `tests/fuzz/` (`cargo fuzz`).

use shards::client_op::ClientOp;
use shards::http_head::{self, MAX_HEAD};
use shards::snapshot::valid_course;
use shards::ws_codec::{client_frame, Decoder, WsEvent, MAX_MESSAGE};
use shards::Snapshot;

/// xorshift64*: reproducible across runs and machines.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Flips, inserts, deletes, duplicates or splices bytes of `seed`.
    fn mutate(&mut self, seed: &[u8], dict: &[&[u8]]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..=self.below(6) {
            let at = self.below(v.len() + 1);
            match self.below(7) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 => v.insert(at, self.next() as u8),
                2 if at < v.len() => {
                    v.remove(at);
                }
                3 => {
                    let d = dict[self.below(dict.len())];
                    v.splice(at..at, d.iter().copied());
                }
                4 if at < v.len() => {
                    let end = (at + self.below(64)).min(v.len());
                    let chunk = v[at..end].to_vec();
                    v.splice(at..at, chunk);
                }
                5 => v.truncate(at),
                _ => {
                    let i = self.below(v.len().max(1));
                    if i < v.len() {
                        v[i] =
                            [0, 0xff, b'"', b'\\', b'{', b'}', b'%', b'\r', b'\n'][self.below(9)];
                    }
                }
            }
        }
        v
    }
}

const HEAD_SEEDS: &[&[u8]] = &[
    b"GET /ws?user=u%201&token=abc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: http://a.example\r\nCookie: a=1\r\nCookie: seatboard_token=ck\r\nAuthorization: Bearer xyz\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n\r\n",
    b"HEAD / HTTP/1.0\r\nX: y\r\n\r\nbody",
];
const HEAD_DICT: &[&[u8]] = &[
    b"\r\n",
    b"\r\n\r\n",
    b": ",
    b"?token=",
    b"&",
    b"%",
    b"%zz",
    b"%c3%28",
    b"Bearer ",
    b"Cookie: seatboard_token=",
    b"Origin: https://[::1]:",
    b"Host: ",
    b"://",
    b":443",
    b"[",
    b"]",
    b"Sec-WebSocket-Key: ",
    b"==",
    b"\xff\xfe",
    b" ",
];

#[test]
fn http_heads_and_tokens() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for i in 0..150_000 {
        let input = match i % 4 {
            0 => {
                let n = rng.below(300);
                rng.bytes(n)
            }
            _ => {
                let seed = HEAD_SEEDS[rng.below(HEAD_SEEDS.len())];
                rng.mutate(seed, HEAD_DICT)
            }
        };
        check_head(&input);
    }
    // Oversized inputs are refused, never buffered as "need more".
    for n in [MAX_HEAD, MAX_HEAD + 1, 3 * MAX_HEAD] {
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(n, b'a');
        assert!(http_head::parse(&big).is_err(), "{n}");
    }
}

fn check_head(input: &[u8]) {
    match http_head::parse(input) {
        Ok(Some((h, used))) => {
            assert!(used <= input.len() && used <= MAX_HEAD);
            let _ = h.check_upgrade();
            if let Some(t) = h.token() {
                assert!(!t.is_empty());
                assert!(t.len() <= input.len() * 3);
            }
            let _ = h.query_param("user");
            let _ = h.cookie_value("seatboard_token");
            // The origin rule takes whatever Origin and Host the head carried.
            if let (Some(o), Some(host)) = (h.origin, h.host) {
                let _ = shards::origin::same_host(o, host);
            }
            let rule = shards::origin::OriginRule::default();
            let cookie = h.token_source() == Some(http_head::TokenSource::Cookie);
            if h.origin.is_none() {
                assert!(rule.allows(None, h.host, cookie));
            }
        }
        Ok(None) => assert!(
            input.len() < MAX_HEAD,
            "{} bytes still 'partial'",
            input.len()
        ),
        Err(_) => {}
    }
}

const OP_SEEDS: &[&[u8]] = &[
    br#"{"op":"watch","course":"CS101"}"#,
    br#" {"course":"X","op":"unwatch","extra":[1,{"a":null}]}"#,
    br#"{"op":"roster","course":"a.b-c_d"}"#,
];
const JSON_DICT: &[&[u8]] = &[
    b"\"",
    b"\\u0000",
    b"\\ud800",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"1e999",
    b"-0",
    b"\"op\"",
    b"\"course\"",
    "κόσμε".as_bytes(),
];

#[test]
fn client_ops() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for i in 0..200_000 {
        let input = match i % 5 {
            0 => {
                let n = rng.below(64);
                rng.bytes(n)
            }
            _ => {
                let seed = OP_SEEDS[rng.below(OP_SEEDS.len())];
                rng.mutate(seed, JSON_DICT)
            }
        };
        let Ok(text) = std::str::from_utf8(&input) else {
            continue;
        };
        if let Ok(op) = ClientOp::parse(text) {
            let (ClientOp::Watch(c) | ClientOp::Unwatch(c) | ClientOp::Roster(c)) = op;
            assert!(valid_course(&c), "{c:?} from {text:?}");
        }
    }
}

const SNAP_SEEDS: &[&[u8]] = &[
    br#"{"course":"CS101","section":3,"total_seats":42,"seats_taken":41,"seat_info":{"room":"B12"},"version":17,"ts":1764420000123}"#,
    br#"{"SharedCourseCode":"CS101","SectionID":1,"TotalSeats":10,"SeatsTaken":0,"SeatInfo":{},"Version":2,"Ts":5}"#,
    br#"{"course":"CS101","section":0,"total_seats":0,"seats_taken":0}"#,
];

#[test]
fn snapshots() {
    let mut rng = Rng(0x0bad_5eed_0bad_5eed);
    let mut accepted = 0;
    for i in 0..200_000 {
        let input = match i % 5 {
            0 => {
                let n = rng.below(128);
                rng.bytes(n)
            }
            _ => {
                let seed = SNAP_SEEDS[rng.below(SNAP_SEEDS.len())];
                rng.mutate(seed, JSON_DICT)
            }
        };
        let channel = if i % 2 == 0 { Some("CS101") } else { None };
        if let Ok(s) = Snapshot::parse(&input, channel) {
            accepted += 1;
            assert!(valid_course(&s.course));
            if let Some(c) = channel {
                assert_eq!(&*s.course, c);
            }
            // What the hub re-publishes parses back to the same state.
            let again = Snapshot::parse(s.to_payload().as_bytes(), Some(&s.course))
                .unwrap_or_else(|e| panic!("{e:?}: {}", s.to_payload()));
            assert_eq!(
                (
                    again.section,
                    again.total_seats,
                    again.seats_taken,
                    again.version
                ),
                (s.section, s.total_seats, s.seats_taken, s.version)
            );
        }
    }
    assert!(
        accepted > 1000,
        "mutations still reach the accept path: {accepted}"
    );
}

#[test]
fn ws_decoder_stays_bounded() {
    let mut rng = Rng(0xfeed_face_1234_4321);
    const M: [u8; 4] = [1, 2, 3, 4];
    let mut events = 0u64;
    for _ in 0..20_000 {
        // A stream of plausible frames, some of them mutated, fed in random chunks.
        let mut stream = Vec::new();
        for _ in 0..rng.below(8) + 1 {
            let op = [0u8, 1, 1, 1, 2, 8, 9, 10, 3, 0xb][rng.below(10)];
            let len = [0usize, 1, 5, 125, 126, 300, 4096, 4097][rng.below(8)];
            let payload: Vec<u8> = if rng.below(3) == 0 {
                rng.bytes(len)
            } else {
                "κa{".bytes().cycle().take(len).collect()
            };
            let mut f = client_frame(rng.below(3) != 0, op, &payload, M);
            if rng.below(4) == 0 {
                f = rng.mutate(&f, &[&[0x80], &[0xff], &[0x7f], &[0x7e]]);
            }
            stream.extend(f);
        }
        let mut d = Decoder::new();
        let mut pos = 0;
        'feed: while pos < stream.len() {
            let n = (rng.below(700) + 1).min(stream.len() - pos);
            d.feed(&stream[pos..pos + n]);
            pos += n;
            loop {
                match d.next_event() {
                    Ok(Some(WsEvent::Text(t))) => {
                        assert!(t.len() <= MAX_MESSAGE);
                        events += 1;
                    }
                    Ok(Some(WsEvent::Ping(p))) => assert!(p.len() <= 125),
                    Ok(Some(_)) => events += 1,
                    Ok(None) => break,
                    Err(v) => {
                        assert!(matches!(v.0, 1002 | 1003 | 1007 | 1009), "{v:?}");
                        break 'feed;
                    }
                }
            }
            // Only an incomplete frame is held: at most a message, a control
            // frame and their headers.
            assert!(
                d.buffered() <= MAX_MESSAGE + 14 + 125 + 14,
                "decoder holds {} bytes",
                d.buffered()
            );
            // An idle decoder is dropped between reads (the connection makes a
            // new one at its next read): decoding goes on as if it had stayed.
            if d.is_idle() {
                assert_eq!(d.buffered(), 0);
                d = Decoder::new();
            }
        }
    }
    assert!(events > 1_000, "streams reach the event path: {events}");
}
