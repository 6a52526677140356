//! A raw-socket WebSocket client for conformance and close-code tests: it sends
//! exactly the bytes a test asks for and reports exactly what came back.
#![allow(dead_code)]

use serde_json::Value;
use shards::read_server_frame;
use shards::ws_codec::client_frame;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A valid `Sec-WebSocket-Key`.
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// A mask that changes every byte.
pub const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

pub use shards::opcode::{
    BINARY as OP_BINARY, CLOSE as OP_CLOSE, CONT as OP_CONT, PING as OP_PING, PONG as OP_PONG,
    TEXT as OP_TEXT,
};

/// One server frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    /// The payload, inflated if the frame came compressed.
    pub payload: Vec<u8>,
    /// RSV1 was set (permessage-deflate).
    pub compressed: bool,
}

impl Frame {
    /// The close code of a close frame.
    pub fn close_code(&self) -> Option<u16> {
        (self.opcode == OP_CLOSE && self.payload.len() >= 2)
            .then(|| u16::from_be_bytes([self.payload[0], self.payload[1]]))
    }

    pub fn json(&self) -> Option<Value> {
        (self.opcode == OP_TEXT)
            .then(|| serde_json::from_slice(&self.payload).ok())
            .flatten()
    }
}

/// What a read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    Frame(Frame),
    /// The server closed (or reset) the TCP connection.
    Eof,
    Timeout,
}

/// An upgraded connection driven byte by byte.
pub struct RawWs {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// The server answered a permessage-deflate offer: RSV1 may mark a message.
    pub deflate: bool,
}

/// Raw inflate of one message with a fresh context (no context takeover).
pub fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut d = flate2::Decompress::new(false);
    let mut out = Vec::with_capacity(1 << 20);
    // `decompress_vec` fills at most the spare capacity: grow until all is in.
    while (d.total_in() as usize) < input.len() {
        out.reserve(out.len().max(1 << 20));
        let at = d.total_in() as usize;
        d.decompress_vec(&input[at..], &mut out, flate2::FlushDecompress::Sync)
            .expect("server message inflates");
    }
    assert_eq!(d.total_in() as usize, input.len(), "whole message inflated");
    out
}

/// Raw deflate of one client message, sync tail removed (RFC 7692 7.2.1).
pub fn deflate(text: &[u8]) -> Vec<u8> {
    let mut c = flate2::Compress::new(flate2::Compression::new(6), false);
    let mut out = Vec::with_capacity(text.len() + 64);
    c.compress_vec(text, &mut out, flate2::FlushCompress::Sync)
        .unwrap();
    out.truncate(out.len() - 4);
    out
}

/// The upgrade request for `path` (with its query).
pub fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

impl RawWs {
    /// Connects and upgrades; panics unless the answer is 101.
    pub fn connect(port: u16, path: &str) -> RawWs {
        Self::connect_with(
            TcpStream::connect(("127.0.0.1", port)).expect("connect"),
            path,
        )
    }

    /// Upgrades an already connected socket.
    pub fn connect_with(stream: TcpStream, path: &str) -> RawWs {
        Self::upgrade(stream, path, "").0
    }

    /// Connects and upgrades with extra request headers (each ending in CRLF);
    /// returns the connection and the response head.
    pub fn connect_extra(port: u16, path: &str, extra: &str) -> (RawWs, String) {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        Self::upgrade(stream, path, extra)
    }

    fn upgrade(mut stream: TcpStream, path: &str, extra: &str) -> (RawWs, String) {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(upgrade_request(path, extra).as_bytes())
            .unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = stream.read(&mut chunk).expect("read handshake");
            assert!(
                n > 0,
                "closed during handshake: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "not upgraded: {head}");
        assert!(
            head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
            "{head}"
        );
        let deflate = head
            .to_ascii_lowercase()
            .contains("\r\nsec-websocket-extensions: permessage-deflate");
        let ws = RawWs {
            stream,
            buf: buf.split_off(end),
            deflate,
        };
        (ws, head)
    }

    /// Connects, upgrades and reads the hello.
    pub fn hello(port: u16, user: &str) -> RawWs {
        let mut ws = Self::connect(port, &format!("/ws?user={user}"));
        let hello = ws.next_json(Duration::from_secs(10)).expect("hello");
        assert_eq!(hello["type"], "hello");
        ws
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        // The server may already have closed: tests check what came back.
        let _ = self.stream.write_all(bytes);
    }

    /// Sends one masked frame.
    pub fn send(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        self.send_raw(&client_frame(fin, opcode, payload, MASK));
    }

    pub fn text(&mut self, s: &str) {
        self.send(true, OP_TEXT, s.as_bytes());
    }

    /// Sends a close frame with a code and reason.
    pub fn close(&mut self, code: u16, reason: &[u8]) {
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice(reason);
        self.send(true, OP_CLOSE, &p);
    }

    fn parse(&mut self) -> Option<Frame> {
        let b = &self.buf;
        if b.len() < 2 {
            return None;
        }
        let frame = match read_server_frame(b) {
            Ok(frame) => frame?,
            Err(e) => panic!("server frames are never masked: {e}"),
        };
        assert_eq!(b[0] & 0x30, 0, "server frames have no RSV2/RSV3");
        let compressed = frame.rsv1;
        assert!(
            !compressed || (self.deflate && frame.opcode == OP_TEXT),
            "RSV1 only on text frames of a connection that negotiated permessage-deflate: {:#04x}",
            b[0]
        );
        let f = Frame {
            fin: frame.fin,
            opcode: frame.opcode,
            payload: if compressed {
                inflate(frame.payload)
            } else {
                frame.payload.to_vec()
            },
            compressed,
        };
        let used = frame.len;
        self.buf.drain(..used);
        Some(f)
    }

    /// The next frame, or EOF, or nothing within `timeout`.
    pub fn read(&mut self, timeout: Duration) -> Got {
        let end = Instant::now() + timeout;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(f) = self.parse() {
                return Got::Frame(f);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Got::Timeout;
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.stream.read(&mut chunk) {
                Ok(0) => return Got::Eof,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Got::Eof,
            }
        }
    }

    /// The next text message as JSON, skipping pings and pongs.
    pub fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        let end = Instant::now() + timeout;
        loop {
            match self.read(end.saturating_duration_since(Instant::now())) {
                Got::Frame(f) if f.opcode == OP_TEXT => return f.json(),
                Got::Frame(f) if f.opcode == OP_CLOSE => return None,
                Got::Frame(_) => continue,
                _ => return None,
            }
        }
    }

    /// The next message of type `ty`.
    pub fn next_of_type(&mut self, ty: &str, timeout: Duration) -> Option<Value> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let v = self.next_json(end.saturating_duration_since(Instant::now()))?;
            if v["type"] == ty {
                return Some(v);
            }
        }
        None
    }

    /// The next non-data frame (skipping text), e.g. a pong or a close.
    pub fn next_control(&mut self, timeout: Duration) -> Got {
        let end = Instant::now() + timeout;
        loop {
            match self.read(end.saturating_duration_since(Instant::now())) {
                Got::Frame(f) if f.opcode == OP_TEXT => continue,
                other => return other,
            }
        }
    }

    /// Reads until the close frame (skipping everything else) and returns its code
    /// (`None` for an empty close payload); panics on EOF or timeout first.
    pub fn expect_close_frame(&mut self, timeout: Duration) -> Option<u16> {
        let end = Instant::now() + timeout;
        loop {
            match self.read(end.saturating_duration_since(Instant::now())) {
                Got::Frame(f) if f.opcode == OP_CLOSE => return f.close_code(),
                Got::Frame(_) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    }

    /// Asserts the server closes the TCP connection within `timeout`, ignoring frames.
    pub fn expect_eof(&mut self, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            match self.read(end.saturating_duration_since(Instant::now())) {
                Got::Eof => return,
                Got::Frame(_) => continue,
                Got::Timeout => panic!("TCP connection still open after {timeout:?}"),
            }
        }
    }

    /// A close frame with `code`, then the TCP connection closed promptly.
    pub fn expect_closed_with(&mut self, code: u16) {
        let got = self.expect_close_frame(Duration::from_secs(10));
        assert_eq!(got, Some(code), "close code");
        self.expect_eof(Duration::from_secs(5));
    }

    /// An error reply with `code`, and the connection still usable afterwards.
    pub fn expect_error(&mut self, code: &str) {
        let v = self
            .next_of_type("error", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no error reply {code}"));
        assert_eq!(v["code"], code, "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }

    /// Proves the connection still answers: an unknown op gets its error reply.
    pub fn assert_alive(&mut self) {
        self.text(r#"{"op":"alive?","course":"X"}"#);
        self.expect_error("unknown_op");
    }
}
