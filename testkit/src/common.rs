//! Test harness: a WebSocket client, a client's board, `/proc` readings;
//! and, re-exported where the tests import them, the processes
//! ([`crate::proc`]), the HTTP client ([`crate::http`]), the metrics
//! scraper ([`crate::scrape`]) and polling ([`crate::wait`]).
#![allow(dead_code)]

pub use crate::http::{http_get, http_raw, parse_response, HttpResponse};
pub use crate::proc::{
    bin, built_bin, free_port, loopback_tcp, seatboard_command, RedisServer, Seatboard, TcpRow,
};
pub use crate::scrape::metric_value;
pub use crate::wait::wait_for;

use serde_json::Value;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The HS256 secret of tests that run `--auth jwt` (`serve` refuses one under 32 bytes).
pub const TEST_SECRET: &str = "seatboard-test-secret-0123456789abcdef";

/// `seatboard publish` of one section (`taken` of `total` seats) into the
/// Redis at `uri`, as the selection API would; panics unless it exits 0.
pub fn publish_section(uri: &str, course: &str, section: &str, total: &str, taken: &str) {
    let st = seatboard_command()
        .args(["publish", "--redis", uri, "--course", course])
        .args(["--section", section, "--total", total, "--taken", taken])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("seatboard publish");
    assert!(st.success(), "publish {course} {section} {taken}/{total}");
}

/// Why a test that needs root and these tools on `PATH` cannot run here
/// (its skip message), or None when it can.
pub fn root_without(tools: &[&str]) -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    tools
        .iter()
        .find(|tool| {
            !std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|tool| format!("{tool} is not installed (tests/run.sh installs it)"))
}

pub type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// Opens a WebSocket to `path` (with its query) on `port`.
pub fn ws_connect(port: u16, path: &str) -> Result<Ws, tungstenite::Error> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(tungstenite::Error::Io)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(tungstenite::Error::Io)?;
    let (ws, _) = tungstenite::client(
        format!("ws://127.0.0.1:{port}{path}"),
        MaybeTlsStream::Plain(stream),
    )
    .map_err(|e| match e {
        tungstenite::HandshakeError::Failure(e) => e,
        tungstenite::HandshakeError::Interrupted(_) => tungstenite::Error::ConnectionClosed,
    })?;
    Ok(ws)
}

/// Reads the next JSON text message (skipping pings), or None on close/timeout.
pub fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return serde_json::from_str(&t).ok(),
            Ok(Message::Ping(_)) | Ok(Message::Pong(_)) => continue,
            _ => return None,
        }
    }
}

/// Reads until a message with `"type": ty` arrives (within `timeout`).
pub fn next_of_type(ws: &mut Ws, ty: &str, timeout: Duration) -> Option<Value> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        let v = next_json(ws)?;
        if v["type"] == ty {
            return Some(v);
        }
    }
    None
}

/// Reads until the server closes: whether a `reconnect` hint came before the
/// close, and the close code (a drain's check).
pub fn read_to_close(ws: &mut Ws) -> (bool, Option<u16>) {
    let mut hinted = false;
    while let Ok(msg) = ws.read() {
        match msg {
            Message::Text(t) => {
                hinted |= serde_json::from_str::<Value>(&t).is_ok_and(|v| v["type"] == "reconnect")
            }
            Message::Close(f) => return (hinted, f.map(|f| u16::from(f.code))),
            _ => {}
        }
    }
    (hinted, None)
}

pub fn send_json(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).expect("send");
}

/// A client's merged view of one course: section -> section object.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Board(pub BTreeMap<u64, Value>);

impl Board {
    /// Applies a frame: `full` replaces, otherwise upserts.
    pub fn apply(&mut self, frame: &Value) {
        if frame["full"] == true {
            self.0.clear();
        }
        for s in frame["sections"].as_array().into_iter().flatten() {
            if let Some(id) = s["section"].as_u64() {
                self.0.insert(id, s.clone());
            }
        }
    }

    pub fn version(&self, section: u64) -> u64 {
        self.0
            .get(&section)
            .and_then(|s| s["version"].as_u64())
            .unwrap_or(0)
    }
}

/// Wake-ups so far of the threads of `pid` whose name starts with `name`:
/// their voluntary context switches (`/proc/<pid>/task/*/status`), each a
/// sleep that something ended (preemptions are not counted).
pub fn thread_wakeups(pid: i32, name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(name))
        })
        .flat_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// `seats_taken` of `section` in a frame or an answer (its `sections` list).
pub fn seats_taken(frame: &Value, section: u64) -> Option<u64> {
    frame["sections"]
        .as_array()?
        .iter()
        .find(|s| s["section"] == section)?["seats_taken"]
        .as_u64()
}

/// The node's `/healthz` JSON.
pub fn healthz_json(port: u16) -> Value {
    serde_json::from_str(&http_get(port, "/healthz").expect("healthz").body).expect("healthz json")
}
