//! A TCP forwarder in front of Redis that the test can cut: every
//! connection through it is shut down at once on [`CutProxy::cut`], as a
//! flapping link or a proxy's idle timeout would, while new connections are
//! still forwarded (the node reconnects through it) unless the test holds
//! the link down with [`CutProxy::hold`].

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The forwarder: listening on `port`, forwarding to Redis.
pub struct CutProxy {
    /// Where to point a node's `--redis`.
    pub port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
    /// Connections forwarded so far.
    pub accepted: Arc<AtomicU64>,
}

/// Copies `from` to `to` until either end goes, then shuts both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.flush();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl CutProxy {
    /// Forwards 127.0.0.1:`port` (picked free) to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the cut proxy");
        let port = listener.local_addr().expect("local addr").port();
        let open = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (o, s, a) = (Arc::clone(&open), Arc::clone(&stop), Arc::clone(&accepted));
        let h = Arc::clone(&held);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if h.load(Ordering::SeqCst) {
                    // Held down: the connection is closed as it comes.
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                if let (Ok(c3), Ok(mut held)) = (client.try_clone(), o.lock()) {
                    held.push(c3);
                }
                a.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || pump(client, server));
                std::thread::spawn(move || pump(s2, c2));
            }
        });
        CutProxy {
            port,
            open,
            stop,
            held,
            accepted,
        }
    }

    /// `redis://` URI of the forwarder.
    pub fn uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// While `down`, every new connection is closed as it comes (the link
    /// is down until the test lets it up again).
    pub fn hold(&self, down: bool) {
        self.held.store(down, Ordering::SeqCst);
    }

    /// Shuts every connection forwarded so far; how many there were.
    pub fn cut(&self) -> usize {
        let Ok(mut held) = self.open.lock() else {
            return 0;
        };
        for c in held.iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
        let n = held.len();
        held.clear();
        n
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the accept loop so it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
