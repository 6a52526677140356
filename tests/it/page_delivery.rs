//! How the pages travel: size, gzip when accepted, ETag + If-None-Match → 304,
//! `Cache-Control: no-cache` (revalidate), `Vary: Accept-Encoding`.

use crate::common;
use common::*;
use flate2::read::GzDecoder;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The page budget for a phone: the board page with its script, uncompressed.
const PAGE_BUDGET: usize = 40 * 1024;

/// A response read whole off the socket.
pub(crate) struct Raw {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Raw {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request with extra header lines; the body kept as bytes.
pub(crate) fn fetch(port: u16, method: &str, path: &str, extra: &[&str]) -> Raw {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    for h in extra {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of head");
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Raw {
        status,
        headers,
        body: buf[split + 4..].to_vec(),
    }
}

/// The inflated body of a gzip answer.
pub(crate) fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzDecoder::new(b).read_to_end(&mut out).expect("valid gzip");
    out
}

#[test]
fn pages_are_small_gzipped_when_accepted_and_revalidated_with_304() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    for path in ["/", "/admin"] {
        let plain = fetch(sb.port, "GET", path, &[]);
        assert_eq!(plain.status, 200, "{path}");
        assert_eq!(plain.header("Content-Encoding"), None, "{path}");
        assert_eq!(
            plain.header("Content-Length"),
            Some(plain.body.len().to_string().as_str())
        );
        assert_eq!(plain.header("Cache-Control"), Some("no-cache"), "{path}");
        assert_eq!(plain.header("Vary"), Some("Accept-Encoding"), "{path}");
        let etag = plain.header("ETag").expect("ETag").to_string();
        assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");

        let gz = fetch(
            sb.port,
            "GET",
            path,
            &["Accept-Encoding: gzip, deflate, br"],
        );
        assert_eq!(gz.status, 200);
        assert_eq!(gz.header("Content-Encoding"), Some("gzip"), "{path}");
        assert_eq!(
            gunzip(&gz.body),
            plain.body,
            "{path}: gzip inflates to the page"
        );
        assert!(
            gz.body.len() * 2 < plain.body.len(),
            "{path}: gzip saves at least half"
        );
        let gz_etag = gz.header("ETag").expect("ETag").to_string();
        assert_ne!(gz_etag, etag, "each coding has its own tag");
        println!(
            "{path}: {} B, gzip {} B, ETag {etag} / {gz_etag}",
            plain.body.len(),
            gz.body.len()
        );

        // The same bytes every time: compressed once, not per request.
        let again = fetch(sb.port, "GET", path, &["Accept-Encoding: gzip"]);
        assert_eq!(again.body, gz.body);
        assert_eq!(again.header("ETag"), Some(gz_etag.as_str()));

        // A refused coding (q=0) gets the page as written.
        let no = fetch(
            sb.port,
            "GET",
            path,
            &["Accept-Encoding: gzip;q=0, identity"],
        );
        assert_eq!(no.header("Content-Encoding"), None);
        assert_eq!(no.body, plain.body);

        // Revalidation: 304, no body, the validator of the coding that would be sent.
        for (inm, ae, want) in [
            (etag.as_str(), None, etag.as_str()),
            (
                gz_etag.as_str(),
                Some("Accept-Encoding: gzip"),
                gz_etag.as_str(),
            ),
        ] {
            let inm = format!("If-None-Match: \"nope\", {inm}");
            let mut extra = vec![inm.as_str()];
            extra.extend(ae);
            let nm = fetch(sb.port, "GET", path, &extra);
            assert_eq!(nm.status, 304, "{path} {extra:?}");
            assert!(nm.body.is_empty());
            assert_eq!(nm.header("ETag"), Some(want));
            assert_eq!(nm.header("Content-Encoding"), None);
        }
        // Another coding's validator is another representation's (RFC 9110
        // section 13.1.2): the representation that would be sent, in full.
        for (inm, ae, want) in [
            (gz_etag.as_str(), None, etag.as_str()),
            (
                etag.as_str(),
                Some("Accept-Encoding: gzip"),
                gz_etag.as_str(),
            ),
        ] {
            let inm = format!("If-None-Match: {inm}");
            let mut extra = vec![inm.as_str()];
            extra.extend(ae);
            let full = fetch(sb.port, "GET", path, &extra);
            assert_eq!(full.status, 200, "{path} {extra:?}");
            assert_eq!(full.header("ETag"), Some(want));
            let body = if ae.is_some() { &gz.body } else { &plain.body };
            assert_eq!(&full.body, body, "{path} {extra:?}");
        }
        let stale = fetch(
            sb.port,
            "GET",
            path,
            &["If-None-Match: \"0123456789abcdef\""],
        );
        assert_eq!(stale.status, 200);
        assert_eq!(stale.body, plain.body);

        // HEAD: the head of the representation, no body.
        let head = fetch(sb.port, "HEAD", path, &["Accept-Encoding: gzip"]);
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        assert_eq!(
            head.header("Content-Length"),
            Some(gz.body.len().to_string().as_str())
        );
    }

    let board = fetch(sb.port, "GET", "/", &[]);
    assert!(
        board.body.len() < PAGE_BUDGET,
        "the board page is {} B, budget {PAGE_BUDGET} B",
        board.body.len()
    );
    // Nothing the page loads lives on another host.
    let html = String::from_utf8_lossy(&board.body);
    for needle in [
        "http://",
        "https://",
        "//cdn",
        "<script src",
        "<link rel=\"stylesheet",
    ] {
        assert!(!html.contains(needle), "the board page mentions {needle:?}");
    }
    // JSON answers are still never cached.
    let health = fetch(sb.port, "GET", "/healthz", &["Accept-Encoding: gzip"]);
    assert_eq!(health.header("Cache-Control"), Some("no-store"));
    assert_eq!(health.header("Content-Encoding"), None);
}
