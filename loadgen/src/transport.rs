//! A viewer's byte stream: plain TCP, or TLS (rustls) over the same
//! non-blocking mio socket for an `https://` target, so the viewers' loop
//! (the viewer loop) reads and writes bytes without caring which. The
//! plain path is the socket's own `read`/`write`, nothing more (the bench
//! suite's load generator runs it). TLS trusts the system's roots as
//! rustls-native-certs finds them (`SSL_CERT_FILE` / `SSL_CERT_DIR` when
//! set), sends the target's host as SNI and offers ALPN `http/1.1`; the
//! handshake runs inside the non-blocking loop (the upgrade request waits in
//! rustls until it is done). [`Tls::check`] is the blocking handshake the
//! rehearsal makes before it starts, and [`Tls::blocking`] the stream the
//! `/metrics` scraper reads.

use mio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to speak TLS to one `https://` host: the client configuration, the
/// name to send and verify, and where the trusted roots came from.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    /// The roots in words, for a certificate error.
    roots: String,
}

/// Where rustls-native-certs took the roots from, and how many.
fn roots_in_words(n: usize) -> String {
    let plural = if n == 1 { "" } else { "s" };
    // Both are read when both are set: each is named.
    let from: Vec<String> = ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .iter()
        .filter_map(|var| {
            let v = std::env::var_os(var).filter(|v| !v.is_empty())?;
            Some(format!("{var}={}", v.to_string_lossy()))
        })
        .collect();
    if from.is_empty() {
        return format!("the system's {n} root certificate{plural}");
    }
    format!("{n} certificate{plural} from {}", from.join(" and "))
}

impl Tls {
    /// TLS to `host` (a name or an IP address, no port): the system's roots,
    /// SNI and the certificate's name `host`, ALPN `http/1.1`.
    pub fn new(host: &str) -> Result<Tls, String> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(bare.to_owned())
            .map_err(|e| format!("{host} is not a server name: {e}"))?;
        let certs = rustls_native_certs::load_native_certs().certs;
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certs);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            config: Arc::new(config),
            name,
            roots: roots_in_words(added),
        })
    }

    /// A client connection to the host, its ClientHello queued.
    pub fn connection(&self) -> Result<ClientConnection, rustls::Error> {
        ClientConnection::new(Arc::clone(&self.config), self.name.clone())
    }

    /// A blocking TLS stream over `sock` (which has its timeouts set).
    pub fn blocking(
        &self,
        sock: std::net::TcpStream,
    ) -> io::Result<StreamOwned<ClientConnection, std::net::TcpStream>> {
        let conn = self.connection().map_err(io::Error::other)?;
        Ok(StreamOwned::new(conn, sock))
    }

    /// One handshake with `addr` within `timeout`: `Ok(true)` when the
    /// certificate verified, `Ok(false)` when nothing answered the TCP connect
    /// (the run says so later), and the reason, in an operator's words, when
    /// the TLS handshake failed (a certificate that does not verify, or no
    /// TLS on that port).
    pub fn check(&self, addr: SocketAddr, timeout: Duration) -> Result<bool, String> {
        let Ok(sock) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
            return Ok(false);
        };
        let end = Instant::now() + timeout;
        let mut s = self.blocking(sock).map_err(|e| e.to_string())?;
        while s.conn.is_handshaking() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "no TLS handshake within {timeout:?}: is it an https port?"
                ));
            }
            let _ = s.sock.set_read_timeout(Some(left));
            let _ = s.sock.set_write_timeout(Some(left));
            match s.conn.complete_io(&mut s.sock) {
                Ok(_) => {}
                Err(e) => return Err(self.describe(&e)),
            }
        }
        s.conn.send_close_notify();
        let _ = s.conn.complete_io(&mut s.sock);
        Ok(true)
    }

    /// A failed handshake in words: what rustls said and what was trusted.
    pub fn describe(&self, e: &io::Error) -> String {
        match tls_error(e) {
            Some(rustls::Error::InvalidCertificate(why)) => format!(
                "its certificate does not verify ({why}; trusting {}): browsers that do not trust its issuer refuse it too; if a private CA signed it, set SSL_CERT_FILE to that CA's PEM",
                self.roots
            ),
            Some(other) => format!("TLS handshake failed: {other}: is it an https port?"),
            None if e.kind() == ErrorKind::UnexpectedEof => {
                "the connection closed during the TLS handshake: is it an https port?".into()
            }
            None => format!("TLS handshake failed: {e}"),
        }
    }
}

/// The rustls error inside an I/O error from [`Transport::read`] or rustls's
/// own streams, if that is what it is.
pub fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// A viewer's connection: its socket, and the TLS session over it if any.
pub struct Transport {
    /// The socket (registered with the poll, options set on it directly).
    pub sock: TcpStream,
    tls: Option<Box<ClientConnection>>,
}

impl Transport {
    /// Plain TCP.
    pub fn plain(sock: TcpStream) -> Transport {
        Transport { sock, tls: None }
    }

    /// TLS over `sock` with `conn` (its ClientHello goes out on the first write).
    pub fn tls(sock: TcpStream, conn: ClientConnection) -> Transport {
        Transport {
            sock,
            tls: Some(Box::new(conn)),
        }
    }

    /// Whether there is anything to send: `wbuf`, or TLS records (a
    /// handshake message, an alert, records that did not fit the socket).
    pub fn wants_write(&self, wbuf: &[u8]) -> bool {
        !wbuf.is_empty() || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Sends what it can of `wbuf` (draining what was taken) and of the TLS
    /// records pending; a full socket is not an error.
    pub fn send(&mut self, wbuf: &mut Vec<u8>) -> io::Result<()> {
        let Some(tls) = self.tls.as_mut() else {
            return match self.sock.write(wbuf) {
                Ok(n) => {
                    wbuf.drain(..n);
                    Ok(())
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
                Err(e) => Err(e),
            };
        };
        loop {
            if !wbuf.is_empty() {
                let n = tls.writer().write(wbuf)?;
                wbuf.drain(..n);
            }
            if !tls.wants_write() {
                return Ok(());
            }
            match tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads into `buf`, as a socket's `read`: `Ok(0)` at the end. Over TLS,
    /// a result shorter than `buf` means the socket said `WouldBlock` (as a
    /// short plain read does, for the edge-triggered loop); a TLS error
    /// comes back as an `InvalidData` error holding it ([`tls_error`]).
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.as_mut() {
            None => self.sock.read(buf),
            Some(tls) => read_tls(tls, &mut self.sock, buf),
        }
    }

    /// The end of the writing side: TLS's close_notify first, then a FIN.
    pub fn shutdown(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            tls.send_close_notify();
            let _ = self.send(&mut Vec::new());
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}

/// Plaintext from `tls` over `sock` into `buf`, until `buf` is full or the
/// socket has nothing more.
fn read_tls(tls: &mut ClientConnection, sock: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    let mut eof = false;
    loop {
        match tls.reader().read(&mut buf[filled..]) {
            Ok(0) => return Ok(filled),
            Ok(n) => {
                filled += n;
                if filled == buf.len() {
                    return Ok(filled);
                }
                continue;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return if filled > 0 { Ok(filled) } else { Err(e) },
        }
        if eof {
            return Ok(filled);
        }
        match tls.read_tls(sock) {
            Ok(0) => eof = true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                return if filled > 0 { Ok(filled) } else { Err(e) };
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if let Err(e) = tls.process_new_packets() {
            // The alert rustls queued, best effort.
            let _ = tls.write_tls(sock);
            return Err(io::Error::new(ErrorKind::InvalidData, e));
        }
        // Handshake messages (the client's Finished and, once the handshake
        // is done, the request that waited for it) go out at once.
        while tls.wants_write() {
            match tls.write_tls(sock) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_plain_http_port_is_named_and_a_closed_one_left_to_the_run() {
        let tls = Tls::new("localhost").expect("tls");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut hello = [0u8; 512];
                let _ = s.read(&mut hello);
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
            }
        });
        let why = tls
            .check(addr, Duration::from_secs(5))
            .expect_err("not TLS");
        assert!(why.contains("is it an https port?"), "{why}");
        let _ = server.join();
        // Nothing listens there any more: not a TLS failure.
        assert_eq!(tls.check(addr, Duration::from_secs(1)), Ok(false));
    }

    #[test]
    fn viewers_whose_handshake_fails_count_it_and_say_why() {
        // A plain HTTP server where the viewers expect TLS: every handshake
        // fails in the non-blocking loop, and the report says why.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let mut hello = [0u8; 512];
                let _ = s.read(&mut hello);
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
            }
        });
        let cfg = crate::Config {
            port,
            clients: 3,
            courses: vec!["C".into()],
            connect_rate: 100.0,
            auth_none: true,
            tls: Some("localhost".into()),
            ..Default::default()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (out_tx, out_rx) = std::sync::mpsc::channel();
        let run = std::thread::spawn(move || crate::run_with(cfg, rx, |v| drop(out_tx.send(v))));
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let Ok(v) = out_rx.recv_timeout(Duration::from_secs(1)) else {
                continue;
            };
            if matches!(v, crate::Output::Progress(p) if p.counters.tls_failed >= 3) {
                break;
            }
        }
        let _ = tx.send(crate::Command::Report);
        let report = out_rx
            .iter()
            .find_map(|v| match v {
                crate::Output::Report(r) => Some(serde_json::to_value(&r).expect("json")),
                _ => None,
            })
            .expect("a report");
        let _ = run.join();
        assert!(
            report["counters"]["tls_failed"].as_u64().unwrap_or(0) >= 3,
            "{report}"
        );
        assert_eq!(report["counters"]["open"], 0, "{report}");
        let why = report["tls_error"].as_str().unwrap_or("");
        assert!(why.contains("corrupt message"), "{why}");
    }
}
