//! `seatboard relay` for tests and benches: on its own socket folder, a free
//! UDP port and a free metrics port, killed on drop; with the sender's side
//! (a datagram to the Unix socket or the UDP port) and the relay's figures.
#![allow(dead_code)]

use crate::http::http_get;
use crate::proc::{free_port, seatboard_command};
use crate::scrape::metric_value;
use crate::wait::wait_for;
use serde_json::Value;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// A running relay.
pub struct Relay {
    /// Its Unix datagram socket.
    pub socket: PathBuf,
    /// Its UDP address.
    pub udp: SocketAddr,
    /// Its `/metrics` and `/healthz` port.
    pub metrics_port: u16,
    /// The process.
    pub child: Child,
    sender: UnixDatagram,
    udp_sender: UdpSocket,
}

/// A fresh folder for a relay's socket.
pub fn socket_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "seatboard-relay-{tag}-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&d).expect("socket dir");
    d
}

impl Relay {
    /// `seatboard relay --redis <uri> <extra>` with a socket in a fresh folder.
    pub fn start(redis: &str, extra: &[&str]) -> Relay {
        Relay::start_at(
            &socket_dir("t").join("relay.sock"),
            free_port(),
            redis,
            extra,
        )
    }

    /// The same, on a given socket path and UDP port (a restart).
    pub fn start_at(socket: &Path, udp_port: u16, redis: &str, extra: &[&str]) -> Relay {
        let metrics_port = free_port();
        let udp: SocketAddr = format!("127.0.0.1:{udp_port}").parse().expect("addr");
        let child = seatboard_command()
            .arg("relay")
            .arg("--socket")
            .arg(socket)
            .args(["--udp", &udp.to_string()])
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .args(["--redis", redis])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn seatboard relay");
        let sender = UnixDatagram::unbound().expect("unix sender");
        sender.set_nonblocking(true).expect("nonblocking");
        let udp_sender = UdpSocket::bind("127.0.0.1:0").expect("udp sender");
        udp_sender.set_nonblocking(true).expect("nonblocking");
        let r = Relay {
            socket: socket.to_path_buf(),
            udp,
            metrics_port,
            child,
            sender,
            udp_sender,
        };
        wait_for(Duration::from_secs(15), || {
            (http_get(metrics_port, "/healthz").is_ok_and(|r| r.status == 200) && r.socket.exists())
                .then_some(())
        })
        .expect("the relay did not answer /healthz");
        r
    }

    /// Sends one datagram to the Unix socket (errors returned, not retried).
    pub fn send_unix(&self, payload: &[u8]) -> std::io::Result<usize> {
        self.sender.send_to(payload, &self.socket)
    }

    /// Sends one datagram to the UDP port.
    pub fn send_udp(&self, payload: &[u8]) -> std::io::Result<usize> {
        self.udp_sender.send_to(payload, self.udp)
    }

    /// `/metrics`.
    pub fn metrics(&self) -> String {
        http_get(self.metrics_port, "/metrics")
            .map(|r| r.body)
            .unwrap_or_default()
    }

    /// One metric's value (labels included in `name`).
    pub fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics(), name)
    }

    /// `/healthz` as JSON (null when it does not answer).
    pub fn healthz(&self) -> Value {
        http_get(self.metrics_port, "/healthz")
            .ok()
            .and_then(|r| serde_json::from_str(&r.body).ok())
            .unwrap_or(Value::Null)
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal (e.g. `libc::SIGTERM`).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for exit; None if still running after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        wait_for(timeout, || self.child.try_wait().ok().flatten())
    }

    /// Waits until every datagram received is accounted for (published,
    /// coalesced, rejected or dropped) and nothing is held.
    pub fn settled(&self, received: u64, timeout: Duration) -> bool {
        wait_for(timeout, || {
            let m = self.metrics();
            let got = metric_value(&m, "seatboard_relay_received_total");
            let done = metric_value(&m, "seatboard_relay_published_total")
                + metric_value(&m, "seatboard_relay_coalesced_total")
                + metric_value(&m, "seatboard_relay_rejected_total{")
                + metric_value(&m, "seatboard_relay_dropped_total{");
            (got >= received as f64
                && metric_value(&m, "seatboard_relay_pending") == 0.0
                && done == got)
                .then_some(())
        })
        .is_some()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
