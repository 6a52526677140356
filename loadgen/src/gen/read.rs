//! Bytes in: the answer's head, then WebSocket frames or SSE events.

use super::{connect::flush, connect::say_goodbye, Gen, Phase};
use crate::backoff::Loss;
use crate::http_head::{read_head, Head};
use crate::transport::tls_error;
use crate::{now_us, sse, ws};
use std::io::ErrorKind;
use std::time::Instant;

impl Gen {
    /// A readiness event for connection `idx`; `closed`: the peer hung up
    /// (or the socket failed), so read until the end shows.
    pub(crate) fn handle(&mut self, idx: usize, closed: bool) {
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if conn.phase == Phase::Connecting && !self.connected(idx) {
            return;
        }
        let Some(conn) = self.conns[idx].as_mut() else {
            return;
        };
        if conn.io.wants_write(&conn.wbuf) && conn.io.send(&mut conn.wbuf).is_err() {
            self.fail_io(idx, None);
            return;
        }
        self.read(idx, closed);
    }

    /// Reads what connection `idx` has (to its end when `closed`).
    pub(crate) fn read(&mut self, idx: usize, closed: bool) {
        loop {
            let Some(conn) = self.conns[idx].as_mut() else {
                return;
            };
            let n = match conn.io.read(&mut self.scratch) {
                Ok(0) => {
                    self.fail_io(idx, None);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if let Some(why) = tls_error(&e) {
                        self.c.tls_failed += 1;
                        self.tls_error.get_or_insert_with(|| why.to_string());
                    }
                    self.fail_io(idx, None);
                    return;
                }
            };
            self.c.bytes += n as u64;
            conn.rbuf.extend_from_slice(&self.scratch[..n]);
            if !self.process(idx) {
                return;
            }
            // A short read emptied the socket: epoll (edge-triggered) reports
            // the next bytes as a new event, so no second read just to see
            // EAGAIN (one syscall per frame less). A hang-up is read to the end.
            if n < self.scratch.len() && !closed {
                return;
            }
        }
    }

    /// The connection ended (EOF, error, or a close frame with `code`).
    pub(crate) fn fail_io(&mut self, idx: usize, code: Option<u16>) {
        let Some(conn) = self.conns[idx].as_ref() else {
            return;
        };
        let (user, phase, opened, hint) = (conn.user, conn.phase, conn.opened_at, conn.hint_at);
        if phase == Phase::Open {
            self.c.closed_by_server += 1;
            *self.close_codes.entry(code.unwrap_or(1006)).or_default() += 1;
        } else {
            self.c.failed += 1;
        }
        self.close(idx);
        self.lost(user, phase == Phase::Open);
        self.retry(
            user,
            Loss {
                opened,
                code,
                hint_at: hint,
                retry_after_s: None,
            },
        );
    }

    /// Consumes buffered bytes; false if the connection went away.
    pub(crate) fn process(&mut self, idx: usize) -> bool {
        let mut rbuf = match self.conns[idx].as_mut() {
            Some(c) => std::mem::take(&mut c.rbuf),
            None => return false,
        };
        let mut pos = 0;
        let alive = 'outer: {
            if self.conns[idx].as_ref().map(|c| c.phase) == Some(Phase::Handshake) {
                let head = match read_head(&rbuf) {
                    Ok(Some(head)) => head,
                    Ok(None) => break 'outer true,
                    // Not an HTTP answer: refused, as one with no status.
                    Err(_) => Head {
                        len: rbuf.len(),
                        status: 0,
                        retry_after_s: None,
                    },
                };
                pos = head.len;
                if !self.on_head(idx, &head) {
                    break 'outer false;
                }
            }
            if self.cfg.sse {
                pos += self.sse_events(idx, &rbuf[pos..]);
                break 'outer true;
            }
            let (used, alive) = self.ws_frames(idx, &rbuf[pos..]);
            pos += used;
            alive
        };
        if alive {
            rbuf.drain(..pos);
            if let Some(c) = self.conns[idx].as_mut() {
                c.rbuf = rbuf;
            }
        }
        alive
    }

    /// The answer's head to the upgrade (or SSE request): refused, a churn
    /// viewer leaving, or open and watching; false if the connection went away.
    pub(crate) fn on_head(&mut self, idx: usize, head: &Head) -> bool {
        if head.status != if self.cfg.sse { 200 } else { 101 } {
            self.refused(idx, head.status, head.retry_after_s);
            return false;
        }
        self.c.upgrades += 1;
        if let Some(c) = self.conns[idx].as_ref() {
            self.connect
                .record(c.started_at.elapsed().as_micros() as u64);
        }
        let sec = self.started.elapsed().as_secs() as usize;
        if self.per_second.len() <= sec {
            self.per_second.resize(sec + 1, 0);
        }
        self.per_second[sec] += 1;
        if self.cfg.churn {
            // Two of three leave with a close frame and a FIN, the
            // third drops the socket (RST, SO_LINGER 0).
            if self.c.upgrades % 3 != 0 {
                if let Some(conn) = self.conns[idx].as_mut() {
                    say_goodbye(conn);
                }
            }
            self.close(idx);
            return false;
        }
        self.c.connecting -= 1;
        self.c.open += 1;
        let Some(conn) = self.conns[idx].as_mut() else {
            return false;
        };
        conn.phase = Phase::Open;
        conn.opened_at = Some(Instant::now());
        if self.cfg.watch && !self.cfg.sse && !self.cfg.upgrade_courses {
            let now = now_us();
            for &c in &conn.courses {
                self.seeding.watched(c, now);
                let watch = ws::watch(&self.cfg.courses[c as usize]);
                conn.wbuf.extend_from_slice(&watch);
            }
            flush(conn);
        }
        true
    }

    /// Handles the whole WebSocket frames in `buf`: the bytes consumed, and
    /// false if the connection went away (a close frame, or bytes that are
    /// no server frame).
    pub(crate) fn ws_frames(&mut self, idx: usize, buf: &[u8]) -> (usize, bool) {
        let Some(mut reader) = self.ws.take() else {
            return (0, true);
        };
        let mut pos = 0;
        let alive = loop {
            let read = match reader.next(&buf[pos..]) {
                Ok(Some(read)) => read,
                Ok(None) => break true,
                Err(_) => {
                    self.c.errors += 1;
                    self.fail_io(idx, None);
                    break false;
                }
            };
            if read.compressed {
                self.c.compressed += 1;
            }
            match read.message {
                ws::Message::Text(text) => self.on_text(idx, text),
                ws::Message::BadDeflate => self.c.errors += 1,
                ws::Message::Ping(payload) => {
                    if let Some(c) = self.conns[idx].as_mut() {
                        c.wbuf.extend_from_slice(&ws::pong(payload));
                        flush(c);
                    }
                }
                ws::Message::Close(code) => {
                    self.fail_io(idx, code);
                    break false;
                }
                ws::Message::Other => {}
            }
            pos += read.len;
        };
        self.ws = Some(reader);
        (pos, alive)
    }

    /// Handles the whole events in `buf`; returns the bytes consumed.
    pub(crate) fn sse_events(&mut self, idx: usize, buf: &[u8]) -> usize {
        sse::read_events(buf, |json| self.on_text(idx, json))
    }
}
