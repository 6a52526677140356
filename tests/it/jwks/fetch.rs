//! The JWKS fetch's own limits (contract §4b) against real providers on
//! loopback that misbehave: a redirect is not followed, a body that never
//! ends is cut at the cap, a provider that drips its answer is cut at the 5 s
//! deadline of the whole fetch. Each case: the fetch counts as an error,
//! nothing is held, the node stays up. And a proxy named in the environment
//! is never used.

use super::{auth_state, dir, serve, status, url, wait_auth_ok};
use crate::common::*;
use crate::jwt_util::{jwks, JwksServer, Key, Kind};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a provider's answer did to one connection.
type Outcome = (usize, Duration, bool);

/// A provider on 127.0.0.1 that reads each request head and then runs
/// `answer` on the connection; each answer's [`Outcome`] (bytes written, time
/// from accept to the end, whether a write failed) comes out of `outcomes`.
struct Provider {
    port: u16,
    outcomes: Receiver<Outcome>,
    stop: Arc<AtomicBool>,
}

impl Provider {
    fn start(answer: impl Fn(&mut TcpStream) -> (usize, bool) + Send + Sync + 'static) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let (tx, outcomes) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (answer, halt) = (Arc::new(answer), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !halt.load(Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let (answer, tx) = (Arc::clone(&answer), tx.clone());
                std::thread::spawn(move || {
                    let accepted = Instant::now();
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut head = Vec::new();
                    let mut b = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut b) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&b[..n]),
                        }
                    }
                    let (sent, cut) = answer(&mut conn);
                    let _ = tx.send((sent, accepted.elapsed(), cut));
                });
            }
        });
        Provider {
            port,
            outcomes,
            stop,
        }
    }

    /// The first connection's outcome.
    fn first(&self, within: Duration) -> Outcome {
        self.outcomes
            .recv_timeout(within)
            .expect("the node fetched and the answer ended")
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Writes `head`, then `piece` again and again (pausing `pause` between two)
/// until a write fails or `most` bytes went: (bytes written, whether cut).
fn stream(
    s: &mut TcpStream,
    head: &str,
    piece: &[u8],
    pause: Duration,
    most: usize,
) -> (usize, bool) {
    if s.write_all(head.as_bytes()).is_err() {
        return (0, true);
    }
    let mut sent = 0;
    while sent < most {
        if s.write_all(piece).is_err() {
            return (sent, true);
        }
        sent += piece.len();
        std::thread::sleep(pause);
    }
    (sent, false)
}

/// The node fetched from `p`, counted an error, holds nothing, still serves,
/// and a token signed with `key` gets 503.
fn refused(sb: &Seatboard, key: &Key) {
    wait_for(Duration::from_secs(15), || {
        (sb.metric("seatboard_jwks_fetches_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .expect("the fetch counts as an error");
    assert_eq!(
        sb.metric("seatboard_jwks_fetches_total{result=\"ok\"}"),
        0.0
    );
    assert_eq!(sb.metric("seatboard_jwks_keys"), 0.0);
    assert_eq!(auth_state(sb.port), "degraded");
    assert_eq!(status(sb.port, &key.token("ES256", "s", json!({}))), 503);
}

#[test]
fn a_redirect_is_not_followed() {
    let d = dir("redirect");
    let key = Key::new(&d, Kind::P256, "k");
    let elsewhere = JwksServer::start(&jwks(&[&key]));
    let location = format!("http://127.0.0.1:{}/certs", elsewhere.port);
    let redirecting = Provider::start(move |s| {
        let head = format!(
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        (head.len(), s.write_all(head.as_bytes()).is_err())
    });
    let u = format!("http://127.0.0.1:{}/certs", redirecting.port);
    let sb = serve(&["--jwks-url", &u]);
    redirecting.first(Duration::from_secs(15));
    refused(&sb, &key);
    assert_eq!(elsewhere.hits(), 0, "the Location was never fetched");
}

#[test]
fn a_body_that_never_ends_is_cut_at_the_cap() {
    let d = dir("endless");
    let key = Key::new(&d, Kind::P256, "k");
    // 64 KiB chunks of a JSON string that never closes, up to 128 MiB.
    let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
    chunk.extend(std::iter::repeat_n(b'x', 64 * 1024));
    chunk.extend(b"\r\n");
    let endless = Provider::start(move |s| {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n";
        stream(s, head, &chunk, Duration::ZERO, 128 << 20)
    });
    let u = format!("http://127.0.0.1:{}/certs", endless.port);
    let sb = serve(&["--jwks-url", &u]);
    let (sent, _, cut) = endless.first(Duration::from_secs(30));
    assert!(cut, "the node closed the connection ({sent} bytes sent)");
    // The cap (1 MiB) plus what the two socket buffers held when it closed.
    assert!(sent < 32 << 20, "the node read {sent} bytes before closing");
    refused(&sb, &key);
}

#[test]
fn a_provider_that_drips_is_cut_at_5_s() {
    let d = dir("drip");
    let key = Key::new(&d, Kind::P256, "k");
    // A byte every 200 ms: every read gets something, the whole never ends in time.
    let drip = Provider::start(|s| {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
        stream(s, head, b" ", Duration::from_millis(200), 150)
    });
    let u = format!("http://127.0.0.1:{}/certs", drip.port);
    let sb = serve(&["--jwks-url", &u]);
    let (sent, took, cut) = drip.first(Duration::from_secs(40));
    assert!(
        cut,
        "the node closed the connection ({sent} bytes in {took:?})"
    );
    // Closed 5 s after the fetch began (the accept here is a little later);
    // seen on the next write or the one after (200 ms apart).
    assert!(
        took >= Duration::from_secs(4) && took <= Duration::from_secs(8),
        "cut after {took:?}"
    );
    refused(&sb, &key);
}

#[test]
fn a_proxy_in_the_environment_is_not_used() {
    let d = dir("proxy");
    let key = Key::new(&d, Kind::P256, "k");
    let provider = JwksServer::start(&jwks(&[&key]));
    let proxy = Provider::start(|_| (0, false));
    let p = format!("http://127.0.0.1:{}", proxy.port);
    let redis = format!("redis://127.0.0.1:{}", free_port());
    let mut env = vec![("NO_PROXY", ""), ("no_proxy", "")];
    for name in [
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        env.push((name, &p));
    }
    let sb = Seatboard::start_env(
        &[
            "serve",
            "--redis",
            &redis,
            "--shards",
            "1",
            "--jwks-url",
            &url(&provider),
        ],
        &env,
    );
    wait_auth_ok(&sb);
    assert_eq!(status(sb.port, &key.token("ES256", "s", json!({}))), 101);
    assert!(provider.hits() >= 1);
    assert!(
        proxy.outcomes.try_recv().is_err(),
        "the proxy got a request"
    );
}
