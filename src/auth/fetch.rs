//! One bounded HTTP(S) GET of the JWKS: `https://` verified against the system
//! roots or `--jwks-ca`, `http://` only to a loopback address; connect, read
//! and total time capped, the body capped at [`MAX_JWKS_BYTES`].

use super::jwks::MAX_JWKS_BYTES;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a whole fetch may take (connect, TLS, request, body).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest response head read.
const MAX_HEAD: usize = 16 * 1024;

/// Where the JWKS is, checked once at start.
pub struct Target {
    host: String,
    port: u16,
    path: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `host[:port]` or `[v6][:port]`.
fn split_authority(authority: &str, default_port: u16) -> Option<(&str, u16)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(r) => {
            let end = r.find(']')? + 2;
            (&authority[..end], authority[end..].strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    match port {
        None if authority.len() == host.len() => Some((host, default_port)),
        None => None,
        Some(p) => p.parse().ok().map(|p| (host, p)),
    }
}

impl Target {
    /// Checks a `--jwks-url` (with its `--jwks-ca` PEM bundle, if any); the
    /// error names the flag.
    pub fn parse(url: &str, ca_pem: Option<&[u8]>) -> Result<Target, String> {
        let bad = |why: &str| format!("invalid value '{url}' for '--jwks-url': {why}");
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("use https:// (or http:// to a loopback address)"));
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = if path.is_empty() { "/" } else { path };
        if authority.contains('@') || path.contains(['#', ' ', '\r', '\n']) {
            return Err(bad("no user info, fragment or spaces"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = match split_authority(authority, default_port) {
            Some(hp) => hp,
            None => return Err(bad("bad port")),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if !tls && !loopback(host) {
            return Err(bad("plain http:// is allowed only to a loopback address"));
        }
        let tls = if tls {
            let config = crate::redis::tls_config(ca_pem)
                .map_err(|e| format!("invalid value for '--jwks-ca': {e}"))?;
            Some(Arc::new(config))
        } else {
            None
        };
        Ok(Target {
            host: host.to_owned(),
            port,
            path: path.to_owned(),
            tls,
        })
    }

    fn connect(&self, deadline: Instant) -> Result<TcpStream, String> {
        let addrs: Vec<SocketAddr> = (
            self.host.trim_start_matches('[').trim_end_matches(']'),
            self.port,
        )
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
            .collect();
        if self.tls.is_none() && !addrs.iter().all(|a| a.ip().is_loopback()) {
            return Err(format!("{} is not a loopback address", self.host));
        }
        let mut last = format!("{} has no address", self.host);
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&a, left) {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("cannot connect to {a}: {e}"),
            }
        }
        Err(last)
    }

    /// GETs the document: its body on a 200, an error otherwise.
    pub fn get(&self) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + FETCH_TIMEOUT;
        let tcp = self.connect(deadline)?;
        let _ = tcp.set_nodelay(true);
        let host = if (self.tls.is_some() && self.port == 443)
            || (self.tls.is_none() && self.port == 80)
        {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, application/jwk-set+json\r\nUser-Agent: seatboard\r\nConnection: close\r\n\r\n",
            self.path
        );
        // A second handle on the socket sets the timeouts while the stream reads.
        let timeouts = tcp.try_clone().map_err(|e| e.to_string())?;
        match &self.tls {
            None => read_response(tcp, &timeouts, request.as_bytes(), deadline),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(
                    self.host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                )
                .map_err(|e| format!("bad TLS server name {}: {e}", self.host))?;
                let conn = rustls::ClientConnection::new(Arc::clone(config), name)
                    .map_err(|e| format!("TLS: {e}"))?;
                let stream = rustls::StreamOwned::new(conn, tcp);
                read_response(stream, &timeouts, request.as_bytes(), deadline)
            }
        }
    }
}

/// Sends `request`, reads until the response is complete (by length, chunked
/// end, or close), within `deadline` and the size caps.
fn read_response(
    mut s: impl Read + Write,
    tcp: &TcpStream,
    request: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>, String> {
    let timeout = |d: Instant| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    tcp.set_write_timeout(Some(timeout(deadline)))
        .map_err(|e| e.to_string())?;
    s.write_all(request)
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(body) = complete(&buf, false)? {
            return Ok(body);
        }
        if Instant::now() >= deadline {
            return Err("timed out".into());
        }
        tcp.set_read_timeout(Some(timeout(deadline)))
            .map_err(|e| e.to_string())?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A TLS peer that closes without close_notify: judged by what arrived.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("read: {e}")),
        }
        if buf.len() > MAX_HEAD + MAX_JWKS_BYTES + 64 * 1024 {
            return Err(format!("JWKS over {MAX_JWKS_BYTES} bytes"));
        }
    }
    complete(&buf, true)?.ok_or_else(|| "connection closed before the response ended".into())
}

/// The body once the response in `buf` is whole (`eof`: nothing more will come).
fn complete(buf: &[u8], eof: bool) -> Result<Option<Vec<u8>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err("response head too large".into())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("not an HTTP response: {e}")),
    };
    let code = resp.code.unwrap_or(0);
    if code != 200 {
        return Err(format!("HTTP {code}"));
    }
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let body = &buf[head_len..];
    if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        return dechunk(body, eof);
    }
    if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| "bad Content-Length".to_string())?;
        if len > MAX_JWKS_BYTES {
            return Err(format!("JWKS over {MAX_JWKS_BYTES} bytes"));
        }
        return match body.len() >= len {
            true => Ok(Some(body[..len].to_vec())),
            false if eof => Err("body shorter than its Content-Length".into()),
            false => Ok(None),
        };
    }
    Ok(eof.then(|| body.to_vec()))
}

/// A chunked body once its last chunk arrived.
fn dechunk(mut body: &[u8], eof: bool) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return if eof {
                Err("truncated chunk".into())
            } else {
                Ok(None)
            };
        };
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size".to_string())?;
        if size == 0 {
            return Ok(Some(out));
        }
        if out.len() + size > MAX_JWKS_BYTES {
            return Err(format!("JWKS over {MAX_JWKS_BYTES} bytes"));
        }
        let data = &body[eol + 2..];
        if data.len() < size + 2 {
            return if eof {
                Err("truncated chunk".into())
            } else {
                Ok(None)
            };
        }
        out.extend_from_slice(&data[..size]);
        body = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(Target::parse("http://127.0.0.1:8080/jwks", None).is_ok());
        assert!(Target::parse("http://localhost/jwks", None).is_ok());
        assert!(Target::parse("http://[::1]:9/certs", None).is_ok());
        for bad in [
            "http://10.0.0.1/jwks",
            "http://idp.example.edu/jwks",
            "ftp://127.0.0.1/x",
            "127.0.0.1/jwks",
            "http://u:p@127.0.0.1/",
            "http://127.0.0.1:x/",
            "https:///x",
        ] {
            let e = Target::parse(bad, None).err().unwrap_or_default();
            assert!(e.contains("--jwks-url"), "{bad}: {e}");
        }
        let t = Target::parse("http://127.0.0.1:81", None).unwrap();
        assert_eq!((t.port, t.path.as_str()), (81, "/"));
    }

    #[test]
    fn response_framing() {
        let ok = |r: &[u8], eof| complete(r, eof).unwrap();
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", false),
            Some(b"{}".to_vec())
        );
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{}", false),
            None
        );
        assert_eq!(ok(b"HTTP/1.0 200 OK\r\n\r\n{}", false), None);
        assert_eq!(ok(b"HTTP/1.0 200 OK\r\n\r\n{}", true), Some(b"{}".to_vec()));
        assert_eq!(
            ok(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1;x=y\r\n}\r\n0\r\n\r\n", false),
            Some(b"{}".to_vec())
        );
        assert_eq!(
            ok(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{",
                false
            ),
            None
        );
        assert!(complete(b"HTTP/1.1 404 Not Found\r\n\r\n", true).is_err());
        assert!(complete(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", false).is_err());
        assert!(complete(b"garbage\r\n\r\n", true).is_err());
    }
}
