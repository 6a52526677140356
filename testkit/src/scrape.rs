//! The metrics scraper: a process's `/metrics` read over plain HTTP and its
//! lines summed by name, for the tests and the bench suite alike.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The body of a `GET path` answered 200 by 127.0.0.1:`port` (`timeout` to
/// read it), or `None`.
pub fn get_ok(port: u16, path: &str, timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: seatboard\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    if !text.starts_with("HTTP/1.1 200") {
        return None;
    }
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

/// The `/metrics` text of 127.0.0.1:`port` (empty when it does not answer).
pub fn metrics(port: u16) -> String {
    get_ok(port, "/metrics", Duration::from_secs(5)).unwrap_or_default()
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
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            keep(k).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}
