//! A "Redis" that cannot be reached: a listener that accepts every
//! connection and resets it at once, remembering when each came, so a test
//! sees when a process under test dials it (its reconnect schedule).

use crate::delay_proxy::set_linger_zero;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Resets every connection to 127.0.0.1:`port` until dropped.
pub struct ResettingListener {
    port: u16,
    accepted: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ResettingListener {
    /// Listens on a free loopback port.
    pub fn start() -> ResettingListener {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("its address").port();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (times, done) = (Arc::clone(&accepted), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            for c in l.incoming() {
                let at = Instant::now();
                if done.load(Relaxed) {
                    return;
                }
                if let Ok(c) = c {
                    times.lock().unwrap_or_else(|e| e.into_inner()).push(at);
                    set_linger_zero(&c);
                }
            }
        });
        ResettingListener {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// When each connection so far was accepted, in order.
    pub fn accepted(&self) -> Vec<Instant> {
        self.accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for ResettingListener {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // Wakes the blocked accept, which then sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
