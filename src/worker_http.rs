//! `GET /metrics` and `GET /healthz` on a loopback port, for the relay and any
//! worker whose figures implement [`Figures`]: one thread serves many
//! connections at once (non-blocking sockets under `poll(2)`), so one client
//! that sends slowly delays no other's answer. A request head must be whole
//! within [`HEAD_DEADLINE`] of the accept and within 8 KiB, and the answer
//! taken within the same time once written, or the connection is dropped;
//! past [`MAX_CONNS`] open connections the oldest is dropped for a new one.

use crate::channels::poll;
use crate::supervisor::{self, Policy};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the endpoint serves: the Prometheus text and the health JSON.
pub trait Figures: Send + Sync + 'static {
    /// The name of the endpoint's thread (`relay-http`, ...).
    fn thread(&self) -> &'static str;
    /// The body of `GET /metrics`.
    fn metrics(&self) -> String;
    /// The body of `GET /healthz`.
    fn healthz(&self) -> String;
}

/// A worker's `/healthz` body: `{"status":"ok"}` when `ok`, else
/// `"degraded"`, then `fields` (JSON values written as they display: bools
/// and numbers).
pub fn health(ok: bool, fields: &[(&str, &dyn std::fmt::Display)]) -> String {
    let mut out = format!("{{\"status\":\"{}\"", if ok { "ok" } else { "degraded" });
    for (name, value) in fields {
        out.push_str(&format!(",\"{name}\":{value}"));
    }
    out.push('}');
    out
}

/// The largest request head read.
const HEAD_MAX: usize = 8 * 1024;
/// How long a request head may take from the accept to its blank line (and
/// an answer to be taken by its reader).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Connections held open at once; past it the oldest is dropped.
pub const MAX_CONNS: usize = 512;

/// One connection: reading its head, then writing its answer.
struct Conn {
    stream: TcpStream,
    head: Vec<u8>,
    /// The answer, once the head is whole.
    out: Option<Vec<u8>>,
    sent: usize,
    deadline: Instant,
}

/// What a turn on a connection left it as.
enum Step {
    /// Waiting for more bytes or room.
    Open,
    /// Answered, refused or gone: closed.
    Done,
}

/// The answer to the request head `head`.
fn answer(head: &[u8], figures: &dyn Figures) -> Vec<u8> {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            figures.metrics(),
        ),
        ("GET" | "HEAD", "/healthz") => ("200 OK", "application/json", figures.healthz()),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".into(),
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

impl Conn {
    /// Reads what has arrived, answers once the head is whole, writes what
    /// the socket takes.
    fn turn(&mut self, figures: &dyn Figures) -> Step {
        let mut buf = [0u8; 2048];
        while self.out.is_none() {
            match self.stream.read(&mut buf) {
                Ok(0) => return Step::Done,
                Ok(n) => {
                    if self.head.len() + n > HEAD_MAX {
                        return Step::Done;
                    }
                    self.head.extend_from_slice(&buf[..n]);
                    if self.head.windows(4).any(|w| w == b"\r\n\r\n") {
                        self.out = Some(answer(&self.head, figures));
                        self.deadline = Instant::now() + HEAD_DEADLINE;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Open,
                Err(_) => return Step::Done,
            }
        }
        let Some(out) = &self.out else {
            return Step::Open;
        };
        while self.sent < out.len() {
            match self.stream.write(&out[self.sent..]) {
                Ok(0) => return Step::Done,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Open,
                Err(_) => return Step::Done,
            }
        }
        Step::Done
    }
}

/// Takes every connection waiting on `listener`, dropping the oldest held
/// past [`MAX_CONNS`].
fn accept_all(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNS {
                    // The oldest is the one whose deadline comes first.
                    if let Some(i) = (0..conns.len()).min_by_key(|&i| conns[i].deadline) {
                        conns.swap_remove(i);
                    }
                }
                conns.push(Conn {
                    stream,
                    head: Vec::with_capacity(256),
                    out: None,
                    sent: 0,
                    deadline: Instant::now() + HEAD_DEADLINE,
                });
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) => {
                // Out of descriptors or the like: the next turn tries again,
                // a moment later (the listener stays readable meanwhile).
                tracing::debug!(error = %e, "metrics accept failed");
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        }
    }
}

/// Serves `listener` until the process ends.
fn serve(listener: TcpListener, figures: &dyn Figures) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        conns.retain(|c| c.deadline > now);
        fds.clear();
        fds.push(poll::interest(listener.as_raw_fd(), libc::POLLIN));
        fds.extend(conns.iter().map(|c| {
            let events = if c.out.is_some() {
                libc::POLLOUT
            } else {
                libc::POLLIN
            };
            poll::interest(c.stream.as_raw_fd(), events)
        }));
        let wait = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(HEAD_DEADLINE)
            .max(Duration::from_millis(1));
        if poll::poll(&mut fds, Some(wait)) == 0 {
            continue;
        }
        // Connections first (their indices match `fds[1..]`), then new ones.
        let mut ready = fds[1..].iter().map(|p| p.revents != 0);
        conns.retain_mut(|c| {
            !ready.next().unwrap_or(false) || matches!(c.turn(figures), Step::Open)
        });
        if fds[0].revents != 0 {
            let before = conns.len();
            accept_all(&listener, &mut conns);
            // A new connection's head has usually arrived with it.
            let mut fresh = conns.split_off(before.min(conns.len()));
            fresh.retain_mut(|c| matches!(c.turn(figures), Step::Open));
            conns.append(&mut fresh);
        }
    }
}

/// Serves `listener` on a thread of its own ([`Figures::thread`]) for the
/// life of the process.
pub fn spawn<F: Figures>(listener: TcpListener, figures: Arc<F>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    supervisor::spawn(figures.thread(), Policy::Logged, move || {
        serve(listener, &*figures)
    })
}

#[cfg(test)]
mod tests {
    use super::health;

    #[test]
    fn health_is_the_status_then_each_field_as_json() {
        assert_eq!(
            health(true, &[("redis", &true), ("pending", &3usize)]),
            r#"{"status":"ok","redis":true,"pending":3}"#
        );
        assert_eq!(health(false, &[]), r#"{"status":"degraded"}"#);
    }
}
