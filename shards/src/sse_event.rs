//! Server-Sent Events encoding (contract §4c): the same JSON messages as the
//! WebSocket text frames built in [`crate::server_msg`], each wrapped once as
//! `event: <type>\ndata: <JSON>\n\n` for the `/sse` transport.

use crate::ws_codec::server_frame_payload;
use bytes::Bytes;

/// The keepalive comment a stream gets when nothing else went out for a while.
pub const KEEPALIVE: &[u8] = b":\n\n";

/// The event carrying the JSON message of the server text frame `frame`
/// (built by [`crate::server_msg`]), or `None` for a control frame (close,
/// ping, pong), which has no SSE counterpart.
pub fn event(frame: &[u8]) -> Option<Bytes> {
    if frame.first() != Some(&0x81) {
        return None;
    }
    let json = server_frame_payload(frame)?;
    Some(event_of(json, b""))
}

/// The drain hint: `retry: <after_ms>` (the delay a plain `EventSource`
/// waits before it reconnects) with the `reconnect` event of the text frame
/// `reconnect`.
pub fn reconnect(after_ms: u64, reconnect: &[u8]) -> Option<Bytes> {
    let json = server_frame_payload(reconnect)?;
    Some(event_of(json, format!("retry: {after_ms}\n").as_bytes()))
}

/// `prefix` then `event: <type>\ndata: <json>\n\n`; the type is the message's
/// own `"type"` (every server message starts with it).
fn event_of(json: &[u8], prefix: &[u8]) -> Bytes {
    let kind = message_type(json).unwrap_or(b"message");
    let mut out = Vec::with_capacity(prefix.len() + json.len() + kind.len() + 16);
    out.extend_from_slice(prefix);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind);
    out.extend_from_slice(b"\ndata: ");
    // A raw line break can only be whitespace between JSON tokens (inside a
    // string it is escaped): a space keeps the same JSON on one `data:` line.
    out.extend(
        json.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The value of the leading `{"type":"..."` of a message built here.
fn message_type(json: &[u8]) -> Option<&[u8]> {
    let rest = json.strip_prefix(b"{\"type\":\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_msg;
    use crate::ws_codec::ping_frame;

    #[test]
    fn a_message_becomes_one_event_of_its_type_with_the_same_json() {
        let frame = server_msg::presence("CS101", 7);
        let ev = event(&frame).expect("text frame");
        assert_eq!(
            &ev[..],
            b"event: presence\ndata: {\"type\":\"presence\",\"course\":\"CS101\",\"viewers\":7}\n\n"
        );
        assert_eq!(
            event(&ping_frame(b"")),
            None,
            "control frames have no event"
        );
        let spaced = crate::ws_codec::text_frame("{\"type\":\"frame\",\n\"x\":\r\n1}");
        assert_eq!(
            &event(&spaced).expect("text frame")[..],
            b"event: frame\ndata: {\"type\":\"frame\", \"x\":  1}\n\n",
            "line breaks between tokens become spaces: one data line"
        );
    }

    #[test]
    fn the_drain_hint_sets_retry_before_its_event() {
        let ev = reconnect(1234, &server_msg::reconnect(1234)).expect("text frame");
        assert_eq!(
            &ev[..],
            b"retry: 1234\nevent: reconnect\ndata: {\"type\":\"reconnect\",\"after_ms\":1234}\n\n"
        );
    }
}
