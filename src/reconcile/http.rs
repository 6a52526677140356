//! `GET /metrics` and `GET /healthz` on `--metrics`: one connection at a
//! time on a thread of its own, a request head over 8 KiB or slower than
//! 2 s dropped (the relay's answer, for the reconciler's figures).

use super::metrics::Shared;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const HEAD_MAX: usize = 8 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(2);

fn answer(stream: &mut TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 || head.len() + n > HEAD_MAX {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or_default());
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, target.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            shared.render(),
        ),
        ("GET" | "HEAD", "/healthz") => ("200 OK", "application/json", shared.healthz()),
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
    stream.write_all(&out)
}

/// Serves `listener` on a thread of its own for the life of the process.
pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("reconcile-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(mut s) => {
                        if let Err(e) = answer(&mut s, &shared) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "metrics accept failed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
        .map(|_| ())
}
