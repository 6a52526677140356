//! RFC 6455 framing: decodes what browsers send, encodes what the server sends.
//!
//! The decoder is fed bytes and yields whole client messages or the close code
//! the contract names for the violation; it never buffers more than one frame
//! header plus [`MAX_MESSAGE`] bytes of payload.

use crate::deflate::{inflate_message, Deflater, InflateError};
use crate::server_frame::read_server_frame;
use bytes::Bytes;

/// Largest client data message, in bytes, however it is fragmented.
pub const MAX_MESSAGE: usize = 4096;
/// Most frames one client message may take, empty continuations included:
/// past it the message closes with 1009, as past [`MAX_MESSAGE`] bytes.
pub const MAX_FRAGMENTS: usize = 4096;

/// Close codes the server sends.
pub mod close {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// Fast shutdown (second signal).
    pub const GOING_AWAY: u16 = 1001;
    /// Protocol violation.
    pub const PROTOCOL: u16 = 1002;
    /// Binary message.
    pub const UNSUPPORTED: u16 = 1003;
    /// Invalid UTF-8 in a text message or close reason.
    pub const INVALID_DATA: u16 = 1007;
    /// Policy: message flood.
    pub const POLICY: u16 = 1008;
    /// Message over [`super::MAX_MESSAGE`].
    pub const TOO_BIG: u16 = 1009;
    /// Internal error.
    pub const INTERNAL: u16 = 1011;
    /// Drain: reconnect elsewhere.
    pub const RESTART: u16 = 1012;
    /// Slow consumer.
    pub const SLOW_CONSUMER: u16 = 4001;
}

/// One complete client message or control frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsEvent {
    /// A whole text message, UTF-8 checked.
    Text(String),
    /// A ping; the payload must be echoed in a pong.
    Ping(Vec<u8>),
    /// A pong (only proves liveness).
    Pong,
    /// The peer's close frame: its code (none if the payload was empty) and reason.
    Close(Option<u16>),
}

/// A violation: the connection must be closed with this code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation(pub u16);

use crate::opcode::{
    BINARY as OP_BINARY, CLOSE as OP_CLOSE, CONT as OP_CONT, PING as OP_PING, PONG as OP_PONG,
    RSV1, TEXT as OP_TEXT,
};

/// Incremental decoder of masked client frames.
#[derive(Debug, Default)]
pub struct Decoder {
    input: Vec<u8>,
    message: Vec<u8>,
    in_message: bool,
    utf8_checked: usize,
    /// The connection negotiated permessage-deflate: RSV1 may mark a message.
    deflate: bool,
    /// The message being assembled is compressed (its first frame had RSV1).
    compressed: bool,
    /// Frames of the message being assembled so far.
    frames: u16,
}

/// Compressed bytes a client message may take on the wire besides
/// [`MAX_MESSAGE`]: stored (incompressible) deflate blocks add a few bytes.
const DEFLATE_SLACK: usize = 64;

/// Whether a close code received from a peer is allowed on the wire.
pub fn valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

impl Decoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder for a connection that negotiated permessage-deflate: messages
    /// with RSV1 are inflated, bounded by [`MAX_MESSAGE`].
    pub fn with_deflate() -> Self {
        Decoder {
            deflate: true,
            ..Self::default()
        }
    }

    /// Appends bytes read from the socket.
    pub fn feed(&mut self, data: &[u8]) {
        self.input.extend_from_slice(data);
    }

    /// Bytes held (input not yet decoded plus a partial message).
    pub fn buffered(&self) -> usize {
        self.input.len() + self.message.len()
    }

    /// Holds nothing: no undecoded bytes and no partial message, so it is as
    /// good as a new one (the connection may drop it until its next read).
    pub fn is_idle(&self) -> bool {
        self.input.is_empty() && !self.in_message
    }

    /// Decodes the next event, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<WsEvent>, Violation> {
        loop {
            let Some(head) = self.head()? else {
                return Ok(None);
            };
            if self.input.len() < head.header + head.len {
                return Ok(None);
            }
            let payload = self.take_payload(&head);
            match head.opcode {
                OP_PING => return Ok(Some(WsEvent::Ping(payload))),
                OP_PONG => return Ok(Some(WsEvent::Pong)),
                OP_CLOSE => return decode_close(&payload).map(Some),
                _ => {}
            }
            if let Some(event) = self.data_frame(&head, payload)? {
                return Ok(Some(event));
            }
        }
    }

    /// The next frame's header, checked against the protocol and the size
    /// limit; `Ok(None)` when more bytes are needed.
    fn head(&self) -> Result<Option<Head>, Violation> {
        let buf = &self.input;
        if buf.len() < 2 {
            return Ok(None);
        }
        let (b0, b1) = (buf[0], buf[1]);
        let fin = b0 & 0x80 != 0;
        let opcode = b0 & 0x0f;
        // RSV2/RSV3 are never negotiated; RSV1 only marks the first frame of a
        // data message on a connection that negotiated permessage-deflate.
        let rsv1 = b0 & RSV1 != 0;
        if b0 & 0x30 != 0 || (rsv1 && (!self.deflate || !matches!(opcode, OP_TEXT | OP_BINARY))) {
            return Err(Violation(close::PROTOCOL));
        }
        if b1 & 0x80 == 0 {
            return Err(Violation(close::PROTOCOL));
        }
        let control = opcode >= 0x8;
        match opcode {
            OP_CONT | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG => {}
            _ => return Err(Violation(close::PROTOCOL)),
        }
        let len7 = (b1 & 0x7f) as usize;
        if control && (!fin || len7 > 125) {
            return Err(Violation(close::PROTOCOL));
        }
        match opcode {
            OP_CONT if !self.in_message => return Err(Violation(close::PROTOCOL)),
            OP_TEXT | OP_BINARY if self.in_message => return Err(Violation(close::PROTOCOL)),
            OP_BINARY => return Err(Violation(close::UNSUPPORTED)),
            _ => {}
        }
        let Some((len, ext)) = payload_len(buf, len7)? else {
            return Ok(None);
        };
        let compressed = if opcode == OP_CONT {
            self.compressed
        } else {
            rsv1
        };
        let wire_limit = MAX_MESSAGE + if compressed { DEFLATE_SLACK } else { 0 };
        if !control && self.message.len() as u64 + len > wire_limit as u64 {
            return Err(Violation(close::TOO_BIG));
        }
        // Empty continuations add no bytes: the frame count bounds them.
        if opcode == OP_CONT && usize::from(self.frames) >= MAX_FRAGMENTS {
            return Err(Violation(close::TOO_BIG));
        }
        Ok(Some(Head {
            fin,
            opcode,
            compressed,
            ext,
            len: len as usize,
            header: 2 + ext + 4,
        }))
    }

    /// Takes the frame `head` describes out of the input, unmasked.
    fn take_payload(&mut self, head: &Head) -> Vec<u8> {
        let mut mask = [0u8; 4];
        mask.copy_from_slice(&self.input[2 + head.ext..head.header]);
        let mut payload: Vec<u8> = self
            .input
            .drain(..head.header + head.len)
            .skip(head.header)
            .collect();
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i & 3];
        }
        payload
    }

    /// A data frame (text start or continuation): the whole message when
    /// this frame ends it, else `Ok(None)` (the message so far is kept).
    fn data_frame(&mut self, head: &Head, payload: Vec<u8>) -> Result<Option<WsEvent>, Violation> {
        let compressed = head.compressed;
        if head.opcode == OP_TEXT && head.fin {
            return text_message(payload, compressed).map(Some);
        }
        self.in_message = true;
        self.compressed = compressed;
        self.frames = self.frames.saturating_add(1);
        self.message.extend_from_slice(&payload);
        // Fail fast on bytes that can never become valid UTF-8 (compressed
        // bytes are checked once inflated).
        if !compressed {
            match std::str::from_utf8(&self.message[self.utf8_checked..]) {
                Ok(_) => self.utf8_checked = self.message.len(),
                Err(e) if e.error_len().is_some() => return Err(Violation(close::INVALID_DATA)),
                Err(e) => self.utf8_checked += e.valid_up_to(),
            }
        }
        if head.fin {
            self.in_message = false;
            self.compressed = false;
            self.utf8_checked = 0;
            self.frames = 0;
            let message = std::mem::take(&mut self.message);
            return text_message(message, compressed).map(Some);
        }
        Ok(None)
    }
}

/// A frame's checked header.
struct Head {
    fin: bool,
    opcode: u8,
    /// The message this frame belongs to is compressed (RSV1 on its first frame).
    compressed: bool,
    /// Bytes of extended payload length after the first two.
    ext: usize,
    len: usize,
    /// The header's whole length, mask included.
    header: usize,
}

/// The payload length and how many extended length bytes carry it, from
/// the 7-bit length `len7`; `Ok(None)` when more bytes are needed.
fn payload_len(buf: &[u8], len7: usize) -> Result<Option<(u64, usize)>, Violation> {
    Ok(Some(match len7 {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u16::from_be_bytes([buf[2], buf[3]]) as u64, 2)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let v = u64::from_be_bytes(b);
            if v >> 63 != 0 {
                return Err(Violation(close::PROTOCOL));
            }
            (v, 8)
        }
        n => (n as u64, 0),
    }))
}

/// A whole text message's payload, inflated first if it was compressed.
fn text_message(payload: Vec<u8>, compressed: bool) -> Result<WsEvent, Violation> {
    let text = if compressed {
        inflate_message(&payload, MAX_MESSAGE).map_err(|e| {
            Violation(match e {
                InflateError::TooBig => close::TOO_BIG,
                InflateError::Corrupt => close::INVALID_DATA,
            })
        })?
    } else {
        payload
    };
    String::from_utf8(text)
        .map(WsEvent::Text)
        .map_err(|_| Violation(close::INVALID_DATA))
}

fn decode_close(payload: &[u8]) -> Result<WsEvent, Violation> {
    match payload.len() {
        0 => Ok(WsEvent::Close(None)),
        1 => Err(Violation(close::PROTOCOL)),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !valid_close_code(code) {
                return Err(Violation(close::PROTOCOL));
            }
            if std::str::from_utf8(&payload[2..]).is_err() {
                return Err(Violation(close::INVALID_DATA));
            }
            Ok(WsEvent::Close(Some(code)))
        }
    }
}

/// Room kept in front of a payload for the largest server frame header.
const HEADER_ROOM: usize = 10;

/// Builds one unmasked server text frame in a single buffer: the payload is
/// written first, the header slotted in front, so the JSON is never copied.
pub struct FrameBuf {
    buf: Vec<u8>,
}

impl Default for FrameBuf {
    fn default() -> Self {
        Self::with_capacity(256)
    }
}

impl FrameBuf {
    /// A frame buffer with room for `payload` bytes of payload.
    pub fn with_capacity(payload: usize) -> Self {
        let mut buf = Vec::with_capacity(HEADER_ROOM + payload);
        buf.resize(HEADER_ROOM, 0);
        FrameBuf { buf }
    }

    /// Appends payload text.
    pub fn push_str(&mut self, s: &str) {
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// Finishes a text frame.
    pub fn finish_text(self) -> Bytes {
        self.finish(OP_TEXT)
    }

    fn finish(mut self, opcode: u8) -> Bytes {
        let len = self.buf.len() - HEADER_ROOM;
        let start = match len {
            0..=125 => {
                self.buf[HEADER_ROOM - 1] = len as u8;
                HEADER_ROOM - 2
            }
            126..=65535 => {
                self.buf[HEADER_ROOM - 3] = 126;
                self.buf[HEADER_ROOM - 2..HEADER_ROOM].copy_from_slice(&(len as u16).to_be_bytes());
                HEADER_ROOM - 4
            }
            _ => {
                self.buf[1] = 127;
                self.buf[2..HEADER_ROOM].copy_from_slice(&(len as u64).to_be_bytes());
                0
            }
        };
        self.buf[start] = 0x80 | opcode;
        Bytes::from(self.buf).slice(start..)
    }
}

impl std::fmt::Write for FrameBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// The payload of one whole unmasked server frame, `None` if `frame` is not
/// exactly one (the server keeps one frame per buffer).
pub fn server_frame_payload(frame: &[u8]) -> Option<&[u8]> {
    read_server_frame(frame)
        .ok()
        .flatten()
        .filter(|f| f.len == frame.len())
        .map(|f| f.payload)
}

/// A whole text frame with RSV1 set: `payload` is a permessage-deflate message.
fn text_frame_with_rsv1(payload: &[u8]) -> Bytes {
    let mut f = FrameBuf::with_capacity(payload.len());
    f.buf.extend_from_slice(payload);
    f.finish(RSV1 | OP_TEXT)
}

/// The compressed twin of the server text frame `frame` (RSV1 set), or
/// `frame` itself when its payload is too short or would not shrink, or it is
/// not a text frame (control frames are never compressed).
pub fn deflated_frame(deflater: &mut Deflater, frame: &Bytes) -> Bytes {
    let compressed = match server_frame_payload(frame) {
        Some(p) if frame[0] == 0x80 | OP_TEXT => deflater.compress_message(p),
        _ => None,
    };
    compressed.map_or_else(|| frame.clone(), |c| text_frame_with_rsv1(&c))
}

/// A whole text frame carrying `text`.
pub fn text_frame(text: &str) -> Bytes {
    let mut f = FrameBuf::with_capacity(text.len());
    f.push_str(text);
    f.finish_text()
}

/// A control frame (payload at most 125 bytes; longer is cut).
fn control_frame(opcode: u8, payload: &[u8]) -> Bytes {
    let payload = &payload[..payload.len().min(125)];
    let mut f = FrameBuf::with_capacity(payload.len());
    f.buf.extend_from_slice(payload);
    f.finish(opcode)
}

/// A close frame with a status code and a short reason.
pub fn close_frame(code: u16, reason: &str) -> Bytes {
    let mut p = Vec::with_capacity(2 + reason.len());
    p.extend_from_slice(&code.to_be_bytes());
    p.extend_from_slice(reason.as_bytes());
    control_frame(OP_CLOSE, &p)
}

/// A ping frame.
pub fn ping_frame(payload: &[u8]) -> Bytes {
    control_frame(OP_PING, payload)
}

/// A pong frame echoing a ping's payload.
pub fn pong_frame(payload: &[u8]) -> Bytes {
    control_frame(OP_PONG, payload)
}

/// A masked client frame, as a browser would send it: the encoder the load
/// generator's viewers and the tests write with (`opcode` from
/// [`crate::opcode`], RSV bits or-ed in for a compressed message; the mask is
/// the caller's, so a test can choose it).
pub fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | n as u8),
        n @ 126..=65535 => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    #[test]
    fn deflated_frames_set_rsv1_only_when_compressed() {
        let mut deflater = Deflater::default();
        let text = format!(
            r#"{{"type":"frame","sections":[{}]}}"#,
            "{\"a\":1},".repeat(60)
        );
        let frame = text_frame(&text);
        let twin = deflated_frame(&mut deflater, &frame);
        assert_eq!(twin[0], 0x80 | RSV1 | OP_TEXT);
        let payload = server_frame_payload(&twin).expect("a whole frame");
        assert!(payload.len() < text.len());
        assert_eq!(inflate_message(payload, 1 << 20), Ok(text.into_bytes()));
        // Short text, control frames: as they are.
        let short = text_frame("{}");
        assert_eq!(deflated_frame(&mut deflater, &short), short);
        let ping = ping_frame(&[b'x'; 100]);
        assert_eq!(deflated_frame(&mut deflater, &ping), ping);
    }

    fn decode_all(bytes: &[u8]) -> (Vec<WsEvent>, Option<Violation>) {
        decode_with(Decoder::new(), bytes)
    }

    fn decode_with(mut d: Decoder, bytes: &[u8]) -> (Vec<WsEvent>, Option<Violation>) {
        let mut out = Vec::new();
        // Feed one byte at a time: framing must not depend on read boundaries.
        for b in bytes {
            d.feed(std::slice::from_ref(b));
            loop {
                match d.next_event() {
                    Ok(Some(e)) => out.push(e),
                    Ok(None) => break,
                    Err(v) => return (out, Some(v)),
                }
            }
        }
        (out, None)
    }

    #[test]
    fn text_lengths_7_16_64() {
        for n in [0usize, 125, 126, 4096] {
            let text = "a".repeat(n);
            let (ev, err) = decode_all(&client_frame(true, 1, text.as_bytes(), M));
            assert_eq!(err, None);
            assert_eq!(ev, vec![WsEvent::Text(text)]);
        }
        // A 64-bit length is legal framing even for a small message.
        let mut f = vec![0x81, 0x80 | 127];
        f.extend_from_slice(&5u64.to_be_bytes());
        f.extend_from_slice(&[0; 4]);
        f.extend_from_slice(b"hello");
        assert_eq!(decode_all(&f).0, vec![WsEvent::Text("hello".into())]);
    }

    #[test]
    fn violations() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (
                vec![0x81, 0x05, b'h', b'e', b'l', b'l', b'o'],
                close::PROTOCOL,
            ), // unmasked
            (client_frame(true, 0x1 | 0x40, b"x", M), close::PROTOCOL), // RSV1
            (client_frame(true, 0x3, b"x", M), close::PROTOCOL),        // reserved data op
            (client_frame(true, 0xB, b"x", M), close::PROTOCOL),        // reserved control op
            (client_frame(true, 0x9, &[0; 126], M), close::PROTOCOL),   // big ping
            (client_frame(false, 0x9, b"x", M), close::PROTOCOL),       // fragmented ping
            (client_frame(true, 0x0, b"x", M), close::PROTOCOL),        // stray continuation
            (client_frame(true, 0x2, b"x", M), close::UNSUPPORTED),     // binary
            (client_frame(true, 0x1, &[b'a'; 4097], M), close::TOO_BIG),
            (
                client_frame(true, 0x1, &[0xce, 0xba, 0xff], M),
                close::INVALID_DATA,
            ),
            (client_frame(true, 0x8, &[0x03], M), close::PROTOCOL), // 1-byte close
            (
                client_frame(true, 0x8, &1005u16.to_be_bytes(), M),
                close::PROTOCOL,
            ),
            (
                client_frame(true, 0x8, &999u16.to_be_bytes(), M),
                close::PROTOCOL,
            ),
            (
                client_frame(true, 0x8, &[0x03, 0xe8, 0xff], M),
                close::INVALID_DATA,
            ),
        ];
        for (bytes, code) in cases {
            assert_eq!(decode_all(&bytes).1, Some(Violation(code)), "{bytes:02x?}");
        }
        // A 64-bit length with the top bit set.
        let mut f = vec![0x81, 0xff];
        f.extend_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(decode_all(&f).1, Some(Violation(close::PROTOCOL)));
    }

    /// A client's compressed message: raw deflate, sync tail removed.
    fn deflated(text: &[u8]) -> Vec<u8> {
        let mut c = flate2::Compress::new(flate2::Compression::new(6), false);
        let mut out = Vec::with_capacity(text.len() + 64);
        c.compress_vec(text, &mut out, flate2::FlushCompress::Sync)
            .unwrap();
        assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
        out.truncate(out.len() - 4);
        out
    }

    fn decode_deflate(bytes: &[u8]) -> (Vec<WsEvent>, Option<Violation>) {
        decode_with(Decoder::with_deflate(), bytes)
    }

    #[test]
    fn compressed_client_messages() {
        let watch = br#"{"op":"watch","course":"CS101"}"#;
        let z = deflated(watch);
        let text = WsEvent::Text(String::from_utf8(watch.to_vec()).unwrap());
        // Whole, and fragmented (RSV1 on the first frame only) around a ping.
        assert_eq!(
            decode_deflate(&client_frame(true, 0x41, &z, M)),
            (vec![text.clone()], None)
        );
        let mut bytes = client_frame(false, 0x41, &z[..3], M);
        bytes.extend(client_frame(true, 0x9, b"p", M));
        bytes.extend(client_frame(true, 0x0, &z[3..], M));
        assert_eq!(
            decode_deflate(&bytes),
            (vec![WsEvent::Ping(b"p".to_vec()), text.clone()], None)
        );
        // Uncompressed messages still pass on a deflate connection.
        assert_eq!(
            decode_deflate(&client_frame(true, 0x1, watch, M)),
            (vec![text], None)
        );
        let cases: Vec<(Vec<u8>, u16)> = vec![
            // RSV1 on a control frame, on a continuation, RSV2/RSV3.
            (client_frame(true, 0x49, b"p", M), close::PROTOCOL),
            (
                [
                    client_frame(false, 0x1, b"a", M),
                    client_frame(true, 0x40, b"b", M),
                ]
                .concat(),
                close::PROTOCOL,
            ),
            (client_frame(true, 0x21, &z, M), close::PROTOCOL),
            (client_frame(true, 0x11, &z, M), close::PROTOCOL),
            // Inflates past 4 KiB (a bomb too), does not inflate, not UTF-8.
            (
                client_frame(true, 0x41, &deflated(&[b'a'; 4097]), M),
                close::TOO_BIG,
            ),
            (
                client_frame(true, 0x41, &deflated(&vec![b' '; 1 << 20]), M),
                close::TOO_BIG,
            ),
            (
                client_frame(true, 0x41, &[0xff, 0xff, 0xff], M),
                close::INVALID_DATA,
            ),
            (
                client_frame(true, 0x41, &deflated(&[0xce, 0xba, 0xff]), M),
                close::INVALID_DATA,
            ),
            // Binary stays refused, compressed or not.
            (client_frame(true, 0x42, &z, M), close::UNSUPPORTED),
        ];
        for (bytes, code) in cases {
            assert_eq!(
                decode_deflate(&bytes).1,
                Some(Violation(code)),
                "{bytes:02x?}"
            );
        }
        // Exactly 4 KiB inflated is fine.
        let big = "a".repeat(MAX_MESSAGE);
        assert_eq!(
            decode_deflate(&client_frame(true, 0x41, &deflated(big.as_bytes()), M)).0,
            vec![WsEvent::Text(big)]
        );
        // Without negotiation, RSV1 is a protocol error.
        assert_eq!(
            decode_all(&client_frame(true, 0x41, &z, M)).1,
            Some(Violation(close::PROTOCOL))
        );
    }

    #[test]
    fn fragments_with_interleaved_control() {
        let mut bytes = client_frame(false, 0x1, b"hel", M);
        bytes.extend(client_frame(true, 0x9, b"p", M));
        bytes.extend(client_frame(false, 0x0, b"l", M));
        bytes.extend(client_frame(true, 0x0, b"o", M));
        let (ev, err) = decode_all(&bytes);
        assert_eq!(err, None);
        assert_eq!(
            ev,
            vec![WsEvent::Ping(b"p".to_vec()), WsEvent::Text("hello".into())]
        );
    }

    #[test]
    fn utf8_split_across_fragments_is_fine_and_bad_fails_fast() {
        let s = "κόσμε".as_bytes();
        let mut bytes = client_frame(false, 0x1, &s[..3], M);
        bytes.extend(client_frame(true, 0x0, &s[3..], M));
        assert_eq!(decode_all(&bytes).0, vec![WsEvent::Text("κόσμε".into())]);
        // Invalid in the first fragment: fails before the message completes.
        let (ev, err) = decode_all(&client_frame(false, 0x1, &[0xed, 0xa0, 0x80], M));
        assert!(ev.is_empty());
        assert_eq!(err, Some(Violation(close::INVALID_DATA)));
        // Truncated at the end of the message.
        let mut bytes = client_frame(false, 0x1, b"a", M);
        bytes.extend(client_frame(true, 0x0, &[0xce], M));
        assert_eq!(decode_all(&bytes).1, Some(Violation(close::INVALID_DATA)));
    }

    #[test]
    fn fragmented_size_counts_the_whole_message() {
        let mut bytes = Vec::new();
        for _ in 0..4 {
            bytes.extend(client_frame(
                false,
                if bytes.is_empty() { 1 } else { 0 },
                &[b'a'; 1024],
                M,
            ));
        }
        bytes.extend(client_frame(true, 0x0, b"b", M));
        assert_eq!(decode_all(&bytes).1, Some(Violation(close::TOO_BIG)));
    }

    #[test]
    fn new_message_inside_fragmented_one_is_protocol_error() {
        let mut bytes = client_frame(false, 0x1, b"a", M);
        bytes.extend(client_frame(true, 0x1, b"b", M));
        assert_eq!(decode_all(&bytes).1, Some(Violation(close::PROTOCOL)));
    }

    #[test]
    fn close_codes() {
        for code in [1000u16, 1001, 1003, 1007, 1011, 1012, 3000, 4999] {
            let (ev, err) = decode_all(&client_frame(true, 0x8, &code.to_be_bytes(), M));
            assert_eq!(err, None, "{code}");
            assert_eq!(ev, vec![WsEvent::Close(Some(code))]);
        }
        for code in [0u16, 1004, 1005, 1006, 1015, 1016, 2999, 5000] {
            assert!(!valid_close_code(code), "{code}");
        }
        assert_eq!(
            decode_all(&client_frame(true, 0x8, b"", M)).0,
            vec![WsEvent::Close(None)]
        );
    }

    #[test]
    fn server_frames() {
        let f = text_frame("hi");
        assert_eq!(&f[..], b"\x81\x02hi");
        let long = "x".repeat(300);
        let f = text_frame(&long);
        assert_eq!(&f[..4], &[0x81, 126, 0x01, 0x2c]);
        assert_eq!(f.len(), 304);
        let huge = "y".repeat(70_000);
        let f = text_frame(&huge);
        assert_eq!(f[1], 127);
        assert_eq!(f.len(), 70_010);
        assert_eq!(&close_frame(1012, "")[..], &[0x88, 2, 0x03, 0xf4]);
        assert_eq!(&pong_frame(b"ab")[..], &[0x8a, 2, b'a', b'b']);
    }
}
