//! The viewers' side of a WebSocket: server frames read with the core's
//! [`shards::read_server_frame`], permessage-deflate messages inflated (no
//! context takeover), and the masked frames a viewer sends.

use shards::opcode;
use shards::ws_codec::client_frame;
use shards::{read_server_frame, FrameError};

/// The mask every viewer frame carries.
const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// What one server frame means to a viewer.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message (inflated if it came compressed).
    Text(&'a [u8]),
    /// A compressed message that does not inflate.
    BadDeflate,
    /// A ping: the payload to echo.
    Ping(&'a [u8]),
    /// A close frame and its code.
    Close(Option<u16>),
    /// Anything else (a pong, binary): skipped.
    Other,
}

/// One frame read: its meaning, whether it came compressed, its length.
#[derive(Debug, PartialEq, Eq)]
pub struct Read<'a> {
    /// What the frame carries.
    pub message: Message<'a>,
    /// RSV1 was set.
    pub compressed: bool,
    /// Bytes it took.
    pub len: usize,
}

/// Reads the server frames of one viewer loop's connections (one inflater
/// for them all, reset before each message: a fresh one per message would
/// allocate and clear its 32 KiB window).
pub struct Reader {
    inflater: flate2::Decompress,
    /// The last inflated message (its buffer reused).
    inflated: Vec<u8>,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            inflater: flate2::Decompress::new(false),
            inflated: Vec::new(),
        }
    }
}

impl Reader {
    /// The first frame in `buf`; `Ok(None)` while more bytes are needed.
    pub fn next<'a>(&'a mut self, buf: &'a [u8]) -> Result<Option<Read<'a>>, FrameError> {
        let Some(frame) = read_server_frame(buf)? else {
            return Ok(None);
        };
        let payload = frame.payload;
        let message = match frame.opcode {
            opcode::TEXT | opcode::CONT if frame.rsv1 => {
                match inflate(&mut self.inflater, payload, &mut self.inflated) {
                    Some(()) => Message::Text(&self.inflated),
                    None => Message::BadDeflate,
                }
            }
            opcode::TEXT | opcode::CONT => Message::Text(payload),
            opcode::PING => Message::Ping(payload),
            opcode::CLOSE => Message::Close(frame.close_code()),
            _ => Message::Other,
        };
        Ok(Some(Read {
            message,
            compressed: frame.rsv1,
            len: frame.len,
        }))
    }
}

/// Raw inflate of one permessage-deflate message into `out`, with the
/// context reset first (the server keeps none between messages either).
fn inflate(d: &mut flate2::Decompress, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    d.reset(false);
    out.clear();
    out.reserve(payload.len() * 4 + 64);
    for input in [payload, &[0, 0, 0xff, 0xff][..]] {
        let mut pos = 0;
        while pos < input.len() {
            let before = (d.total_in(), d.total_out());
            d.decompress_vec(&input[pos..], out, flate2::FlushDecompress::Sync)
                .ok()?;
            pos += (d.total_in() - before.0) as usize;
            if (d.total_in(), d.total_out()) == before {
                if out.len() < out.capacity() {
                    return None; // stuck with room to spare: not a deflate message
                }
                out.reserve(out.capacity().max(256));
            }
        }
    }
    Some(())
}

/// A viewer's `watch` of `course`.
pub fn watch(course: &str) -> Vec<u8> {
    let watch = format!("{{\"op\":\"watch\",\"course\":\"{course}\"}}");
    client_frame(true, opcode::TEXT, watch.as_bytes(), MASK)
}

/// The pong answering a ping's `payload`.
pub fn pong(payload: &[u8]) -> Vec<u8> {
    client_frame(true, opcode::PONG, payload, MASK)
}

/// A close 1000 (a viewer leaving).
pub fn goodbye() -> Vec<u8> {
    client_frame(true, opcode::CLOSE, &1000u16.to_be_bytes(), MASK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::deflate::Deflater;
    use shards::ws_codec::{close_frame, deflated_frame, ping_frame, text_frame};

    #[test]
    fn frames_are_read_one_by_one_compressed_or_not() {
        let text = format!(
            r#"{{"type":"frame","sections":[{}]}}"#,
            "{\"a\":1},".repeat(60)
        );
        let plain = text_frame(&text);
        let zipped = deflated_frame(&mut Deflater::default(), &plain);
        assert_ne!(zipped, plain, "compressed");
        let mut buf = zipped.to_vec();
        buf.extend_from_slice(&ping_frame(b"p"));
        buf.extend_from_slice(&plain);
        buf.extend_from_slice(&close_frame(1012, "restart"));
        let mut r = Reader::default();
        let mut got = Vec::new();
        let mut pos = 0;
        while let Some(read) = r.next(&buf[pos..]).expect("server frames") {
            pos += read.len;
            let m = match read.message {
                Message::Text(t) => format!("text {} {}", t.len(), read.compressed),
                Message::Ping(p) => format!("ping {p:?}"),
                Message::Close(c) => format!("close {c:?}"),
                other => format!("{other:?}"),
            };
            got.push(m);
        }
        assert_eq!(pos, buf.len());
        let n = text.len();
        assert_eq!(
            got,
            [
                format!("text {n} true"),
                "ping [112]".into(),
                format!("text {n} false"),
                "close Some(1012)".into()
            ]
        );
    }

    #[test]
    fn partial_frames_wait_and_bad_ones_are_named() {
        let frame = text_frame("hello");
        let mut r = Reader::default();
        for cut in 0..frame.len() {
            assert_eq!(r.next(&frame[..cut]), Ok(None));
        }
        let corrupt = [0x80 | opcode::RSV1 | opcode::TEXT, 3, 0xff, 0xff, 0xff];
        let read = r.next(&corrupt).unwrap().unwrap();
        assert_eq!(read.message, Message::BadDeflate);
        assert_eq!(r.next(&watch("C")), Err(FrameError::Masked));
        assert_eq!(pong(b"x")[0], 0x80 | opcode::PONG);
        assert_eq!(goodbye()[0], 0x80 | opcode::CLOSE);
    }
}
