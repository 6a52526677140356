//! The read side: client bytes decoded under the frame rules and the rate
//! windows, and the client operations (watch, unwatch, roster) they carry.

use super::{Action, Reading, Shard};
use crate::client_op::{ClientOp, OpError};
use crate::conn::{ConnId, Role};
use crate::server_msg;
use crate::ws_codec::{close, pong_frame, Violation, WsEvent};

impl Shard {
    /// Any bytes arrived from the connection (pongs included): it is alive.
    pub fn handle_activity(&mut self, id: ConnId, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        if let Some(c) = self.conn_mut(id) {
            c.last_rx_ms = now_ms;
        }
    }

    /// Bytes read from a connection's socket (the first call may carry what was
    /// read past the request head): decodes them under the frame rules and the
    /// 4 KiB message limit (inflating permessage-deflate messages of a
    /// connection that negotiated it), answers pings, applies the 20-messages-per-second
    /// and 100-control-frames-per-second windows, and acts on every whole message. After our close frame only the
    /// peer's close counts. Returns whether the shell should read on.
    pub fn handle_read(&mut self, id: ConnId, data: &[u8], now_ms: u64) -> Reading {
        self.handle_activity(id, now_ms);
        let Some(c) = self.conn_mut(id) else {
            return Reading::Stop;
        };
        c.decoder().feed(data);
        loop {
            let Some(c) = self.conn_mut(id) else {
                return Reading::Stop;
            };
            let event = match c.decoder().next_event() {
                Ok(Some(e)) => e,
                Ok(None) => {
                    c.release_idle_decoder();
                    return Reading::More;
                }
                Err(Violation(code)) => {
                    self.close(id, code, "");
                    return Reading::Stop;
                }
            };
            if !c.phase.is_open() && !matches!(event, WsEvent::Close(_)) {
                continue;
            }
            match event {
                WsEvent::Close(code) => {
                    self.handle_peer_close(id, code, now_ms);
                    return Reading::Stop;
                }
                WsEvent::Text(text) => {
                    if c.window.admit(now_ms) {
                        self.handle_text(id, &text, now_ms);
                    } else {
                        self.close(id, close::POLICY, "too many messages");
                    }
                }
                WsEvent::Ping(_) | WsEvent::Pong if !c.control.admit(now_ms) => {
                    self.close(id, close::POLICY, "too many control frames");
                }
                WsEvent::Ping(payload) => self.deliver(id, pong_frame(&payload)),
                WsEvent::Pong => {}
            }
        }
    }

    /// A whole client text message.
    pub fn handle_text(&mut self, id: ConnId, text: &str, now_ms: u64) {
        self.handle_activity(id, now_ms);
        let Some(conn) = self.conn(id) else { return };
        if !conn.phase.is_open() {
            return;
        }
        let role = conn.role;
        let result = ClientOp::parse(text).and_then(|op| match op {
            ClientOp::Watch(course) => self.watch(id, &course, now_ms),
            ClientOp::Unwatch(course) => {
                self.unwatch(id, &course);
                Ok(())
            }
            ClientOp::Roster(course) if role == Role::Admin => {
                self.actions.push_back(Action::Roster {
                    conn: id,
                    course: course.into(),
                });
                Ok(())
            }
            ClientOp::Roster(_) => Err(OpError::Forbidden),
        });
        if let Err(e) = result {
            self.refuse_op(id, e, now_ms);
        }
    }

    /// Answers a refused client op (or a refused course of the upgrade) with
    /// its `error` message; the connection stays open.
    pub(super) fn refuse_op(&mut self, id: ConnId, e: OpError, now_ms: u64) {
        self.stats.client_errors += 1;
        // Bounded: a client that sends mistakes but never reads is a slow consumer.
        let reply = server_msg::error(e);
        if self.fits(id, reply.len()) {
            self.send_always(id, reply);
        } else if let Some(c) = self.conn_mut(id) {
            c.queue.refused(now_ms);
        }
    }

    /// The peer sent a close frame: echo it and end the connection.
    pub fn handle_peer_close(&mut self, id: ConnId, code: Option<u16>, now_ms: u64) {
        self.handle_activity(id, now_ms);
        self.close(id, code.unwrap_or(close::NORMAL), "");
    }
}
