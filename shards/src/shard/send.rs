//! Queueing frames to one connection: in the form its transport takes
//! (plain, compressed or as an event), past the bound or within it, and the
//! ready list that tells the shell whom to write to.

use super::Shard;
use crate::conn::{Conn, ConnId, Transport};
use crate::sse_event;
use crate::ws_codec::{deflated_frame, server_frame_payload};
use bytes::Bytes;

/// `plain`, `deflated` or `sse` as connection `c` takes it: `None` for a
/// control frame on a Server-Sent Events stream (which has no counterpart).
fn encoded_for(c: &Conn, plain: &Bytes, deflated: &Bytes, sse: Option<&Bytes>) -> Option<Bytes> {
    match c.transport {
        Transport::Sse => sse.cloned().or_else(|| sse_event::event(plain)),
        Transport::WebSocket { deflate: true } => Some(deflated.clone()),
        Transport::WebSocket { deflate: false } => Some(plain.clone()),
    }
}

/// The payload length of a server frame built here (its size before compression).
pub(super) fn payload_len(frame: &[u8]) -> u64 {
    server_frame_payload(frame).map_or(0, |p| p.len() as u64)
}

impl Shard {
    /// Lists `id` in the ready list, once.
    pub(super) fn mark_ready(&mut self, id: ConnId) {
        if let Some(c) = self.conn_mut(id) {
            if !c.in_ready {
                c.in_ready = true;
                self.ready.push_back(id);
            }
        }
    }

    /// Queues past the bound (control answers, hints, close frames), uncompressed.
    pub(super) fn send_always(&mut self, id: ConnId, frame: Bytes) {
        self.send_always_as(id, &frame, &frame, None);
    }

    /// Queues past the bound: `deflated` if the connection negotiated
    /// permessage-deflate, `sse` (or, without one, `plain` wrapped as an
    /// event here) on a Server-Sent Events stream, else `plain`.
    pub(super) fn send_always_as(
        &mut self,
        id: ConnId,
        plain: &Bytes,
        deflated: &Bytes,
        sse: Option<&Bytes>,
    ) {
        let Some(c) = self.conn_mut(id) else { return };
        if !c.phase.is_open() {
            return;
        }
        let Some(frame) = encoded_for(c, plain, deflated, sse) else {
            return;
        };
        let len = frame.len() as u64;
        c.queue.push_always(frame);
        self.stats.frames_queued += 1;
        self.stats.bytes_queued += len;
        self.stats.payload_bytes += payload_len(plain);
        self.mark_ready(id);
    }

    /// Small informational messages: dropped when the queue is full (the next
    /// count supersedes them), never counted as a missed frame; a compressed
    /// twin for deflate connections and an event twin for SSE streams.
    /// False when it was dropped.
    pub(super) fn send_or_drop_as(
        &mut self,
        id: ConnId,
        plain: &Bytes,
        deflated: &Bytes,
        sse: Option<&Bytes>,
    ) -> bool {
        let Some(c) = self.conn(id) else {
            return false;
        };
        let len = match (c.transport, sse) {
            (Transport::Sse, Some(e)) => e.len(),
            // An event is its JSON plus at most 32 bytes of field names.
            (Transport::Sse, None) => plain.len() + 32,
            (Transport::WebSocket { deflate: true }, _) => deflated.len(),
            (Transport::WebSocket { deflate: false }, _) => plain.len(),
        };
        if !c.queue.within_bound(len) {
            return false;
        }
        self.send_always_as(id, plain, deflated, sse);
        true
    }

    /// Delivers a reply built outside (a roster, a pong) to one connection.
    pub fn deliver(&mut self, id: ConnId, frame: Bytes) {
        let deflated = match self.conn(id) {
            Some(c) if c.transport.deflates() => deflated_frame(&mut self.deflater, &frame),
            _ => frame.clone(),
        };
        self.send_or_drop_as(id, &frame, &deflated, None);
    }
}
