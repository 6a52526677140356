//! The one `/metrics` scraper: a page read with one `GET` over plain TCP or
//! TLS ([`Endpoint::get`]), and an exposition's sample lines read by name
//! ([`samples`]). `seatboard rehearse` watches its nodes with it; the tests
//! and the bench suite read every process's `/metrics` and `/healthz` with it.

use crate::transport::Tls;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The most of an answer read.
const MAX_ANSWER: usize = 4 << 20;

/// Where a process's pages are: the address, the `Host` header, the path
/// they sit under, TLS for an `https://` URL.
#[derive(Clone)]
pub struct Endpoint {
    /// The URL as given (for the reader's words).
    pub url: String,
    /// Where to connect.
    pub addr: SocketAddr,
    /// The `Host` header.
    pub host: String,
    /// The path before `/metrics`.
    pub base: String,
    /// TLS, for an `https://` URL.
    pub tls: Option<Tls>,
}

impl Endpoint {
    /// Plain HTTP on 127.0.0.1:`port`.
    pub fn local(port: u16) -> Endpoint {
        Endpoint {
            url: format!("http://127.0.0.1:{port}"),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            host: "seatboard".into(),
            base: String::new(),
            tls: None,
        }
    }

    /// The body of `GET <base><path>` when answered 200, each of connect,
    /// write and read within `timeout` (at most 4 MiB read), else `None`.
    pub fn get(&self, path: &str, timeout: Duration) -> Option<String> {
        let sock = TcpStream::connect_timeout(&self.addr, timeout).ok()?;
        sock.set_read_timeout(Some(timeout)).ok()?;
        sock.set_write_timeout(Some(timeout)).ok()?;
        let req = format!(
            "GET {}{path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: seatboard-scrape\r\nConnection: close\r\n\r\n",
            self.base, self.host
        );
        let buf = match &self.tls {
            None => exchange(sock, &req)?,
            Some(tls) => exchange(tls.blocking(sock).ok()?, &req)?,
        };
        let text = String::from_utf8_lossy(&buf);
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    }
}

/// Sends `req` and reads the answer to its end (at most [`MAX_ANSWER`]).
fn exchange(mut sock: impl Read + Write, req: &str) -> Option<Vec<u8>> {
    sock.write_all(req.as_bytes()).ok()?;
    sock.flush().ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while buf.len() < MAX_ANSWER {
        match sock.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A TLS peer may close without close_notify: what came is kept.
            Err(_) => break,
        }
    }
    Some(buf)
}

/// The body of a `GET path` answered 200 by 127.0.0.1:`port` (`timeout` to
/// connect, write and each read), or `None`.
pub fn get_ok(port: u16, path: &str, timeout: Duration) -> Option<String> {
    Endpoint::local(port).get(path, timeout)
}

/// The `/metrics` text of 127.0.0.1:`port` (empty when it does not answer).
pub fn metrics(port: u16) -> String {
    get_ok(port, "/metrics", Duration::from_secs(5)).unwrap_or_default()
}

/// The sample lines of an exposition as (name with labels, value); comments
/// and lines without a number skipped.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k, v.trim().parse::<f64>().ok()?))
        })
}

/// Sums the lines of `text` whose name-and-labels are `prefix`, or start
/// with it when it ends with `{` (every label set of one metric).
pub fn metric_value(text: &str, prefix: &str) -> f64 {
    sum_lines(text, |k| {
        k == prefix || (k.starts_with(prefix) && prefix.ends_with('{'))
    })
}

/// Sums every label set of the metric `name` (no labels, or any).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    sum_lines(text, |k| k.split('{').next() == Some(name))
}

/// Sums the values of the sample lines whose name-and-labels `keep` takes.
pub fn sum_lines(text: &str, keep: impl Fn(&str) -> bool) -> f64 {
    samples(text).filter(|(k, _)| keep(k)).map(|(_, v)| v).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_by_name_and_labels() {
        let text = "# HELP a x\n# TYPE a counter\na 2\nb{k=\"1\"} 3\nb{k=\"2\"} 4.5\nc NaN\nnot a number\n";
        assert_eq!(metric_value(text, "a"), 2.0);
        assert_eq!(metric_value(text, "b{k=\"2\"}"), 4.5);
        assert_eq!(metric_value(text, "b{"), 7.5);
        assert_eq!(metric_sum(text, "b"), 7.5);
        assert!(metric_value(text, "c").is_nan());
        assert_eq!(samples(text).count(), 4);
    }

    #[test]
    fn a_page_is_its_body_when_answered_200() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            for status in ["200 OK", "404 Not Found"] {
                let (mut s, _) = listener.accept().expect("accept");
                let mut head = [0u8; 1024];
                let n = s.read(&mut head).expect("read");
                let head = String::from_utf8_lossy(&head[..n]).to_string();
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: 4\r\nConnection: close\r\n\r\nm 1\n"
                );
                assert!(head.starts_with("GET /metrics HTTP/1.1\r\n"), "{head}");
            }
        });
        assert_eq!(metrics(port), "m 1\n");
        assert_eq!(get_ok(port, "/metrics", Duration::from_secs(5)), None);
        server.join().expect("server");
    }
}
