//! Reads the frames the server sends (unmasked, RFC 6455 5.2): the one parser
//! shared by the codec, the load generator and the tests.

use crate::opcode;
use std::fmt;

/// Largest payload a server frame may announce: past it the length is taken
/// as garbage on the wire, not as a frame to wait for.
pub const MAX_SERVER_PAYLOAD: u64 = 1 << 30;

/// One whole server frame, borrowed from the buffer it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFrame<'a> {
    /// The frame ends its message.
    pub fin: bool,
    /// RSV1: the message is permessage-deflate compressed.
    pub rsv1: bool,
    /// The opcode (see [`crate::opcode`]).
    pub opcode: u8,
    /// The payload, as sent (compressed if `rsv1`).
    pub payload: &'a [u8],
    /// Bytes of the buffer the frame took, header included.
    pub len: usize,
}

impl ServerFrame<'_> {
    /// The close code of a close frame (`None` for an empty close payload or
    /// another opcode).
    pub fn close_code(&self) -> Option<u16> {
        match self.payload {
            [hi, lo, ..] if self.opcode == opcode::CLOSE => Some(u16::from_be_bytes([*hi, *lo])),
            _ => None,
        }
    }
}

/// Bytes that cannot be a server frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The MASK bit is set: only clients mask.
    Masked,
    /// The announced payload length is past [`MAX_SERVER_PAYLOAD`].
    TooLong(u64),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Masked => f.write_str("masked server frame"),
            FrameError::TooLong(n) => write!(f, "server frame of {n} bytes is past the limit"),
        }
    }
}

impl std::error::Error for FrameError {}

/// The first frame in `buf`; `Ok(None)` while more bytes are needed.
pub fn read_server_frame(buf: &[u8]) -> Result<Option<ServerFrame<'_>>, FrameError> {
    let [b0, b1, rest @ ..] = buf else {
        return Ok(None);
    };
    if b1 & opcode::MASK != 0 {
        return Err(FrameError::Masked);
    }
    let (len, header) = match b1 & 0x7f {
        126 => match rest {
            [a, b, ..] => (u64::from(u16::from_be_bytes([*a, *b])), 4),
            _ => return Ok(None),
        },
        127 => match rest.get(..8) {
            Some(b) => {
                let mut be = [0u8; 8];
                be.copy_from_slice(b);
                (u64::from_be_bytes(be), 10)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    if len > MAX_SERVER_PAYLOAD {
        return Err(FrameError::TooLong(len));
    }
    // At most 1 GiB: fits a usize on every target this builds for.
    let end = header + len as usize;
    let Some(payload) = buf.get(header..end) else {
        return Ok(None);
    };
    Ok(Some(ServerFrame {
        fin: b0 & opcode::FIN != 0,
        rsv1: b0 & opcode::RSV1 != 0,
        opcode: b0 & 0x0f,
        payload,
        len: end,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws_codec::{close_frame, ping_frame, text_frame};

    /// Every prefix of `frame` short of its end needs more bytes; the whole
    /// of it (and more) reads as one frame of `frame.len()` bytes.
    fn check_splits(frame: &[u8]) -> ServerFrame<'_> {
        for cut in 0..frame.len() {
            assert_eq!(read_server_frame(&frame[..cut]), Ok(None), "cut at {cut}");
        }
        let f = read_server_frame(frame).expect("valid").expect("whole");
        assert_eq!(f.len, frame.len());
        f
    }

    #[test]
    fn each_length_form_at_every_split_point() {
        for n in [0usize, 1, 125, 126, 300, 65535, 65536, 70_000] {
            let text = "x".repeat(n);
            let frame = text_frame(&text);
            let f = check_splits(&frame);
            assert_eq!((f.fin, f.rsv1, f.opcode), (true, false, opcode::TEXT));
            assert_eq!(f.payload, text.as_bytes());
        }
        // A non-minimal 64-bit length for a short payload is still a frame.
        let mut f = vec![0x81, 127];
        f.extend_from_slice(&5u64.to_be_bytes());
        f.extend_from_slice(b"hello");
        assert_eq!(check_splits(&f).payload, b"hello");
    }

    #[test]
    fn frames_back_to_back_are_read_one_at_a_time() {
        let mut buf = text_frame("a").to_vec();
        buf.extend_from_slice(&ping_frame(b"p"));
        buf.extend_from_slice(&close_frame(1012, "bye"));
        let first = read_server_frame(&buf).unwrap().unwrap();
        assert_eq!((first.opcode, first.payload), (opcode::TEXT, &b"a"[..]));
        let rest = &buf[first.len..];
        let ping = read_server_frame(rest).unwrap().unwrap();
        assert_eq!((ping.opcode, ping.payload), (opcode::PING, &b"p"[..]));
        let close = read_server_frame(&rest[ping.len..]).unwrap().unwrap();
        assert_eq!(close.opcode, opcode::CLOSE);
        assert_eq!(close.close_code(), Some(1012));
        assert_eq!(ping.close_code(), None);
    }

    #[test]
    fn rsv1_and_fin_are_reported() {
        let f = [opcode::RSV1 | opcode::TEXT, 2, b'z', b'z'];
        let got = check_splits(&f);
        assert!(got.rsv1);
        assert!(!got.fin);
        assert_eq!(got.opcode, opcode::TEXT);
    }

    #[test]
    fn masked_frames_and_absurd_lengths_are_refused() {
        let masked = crate::ws_codec::client_frame(true, opcode::TEXT, b"hi", [1, 2, 3, 4]);
        assert_eq!(read_server_frame(&masked), Err(FrameError::Masked));
        assert_eq!(read_server_frame(&masked[..2]), Err(FrameError::Masked));
        let mut huge = vec![0x81, 127];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(read_server_frame(&huge), Err(FrameError::TooLong(u64::MAX)));
        let mut past = vec![0x81, 127];
        past.extend_from_slice(&(MAX_SERVER_PAYLOAD + 1).to_be_bytes());
        let err = read_server_frame(&past).unwrap_err();
        assert_eq!(err, FrameError::TooLong(MAX_SERVER_PAYLOAD + 1));
        assert!(err.to_string().contains("past the limit"));
        assert_eq!(FrameError::Masked.to_string(), "masked server frame");
    }
}
