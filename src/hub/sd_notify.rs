//! systemd's notify protocol: READY=1 once every shard listens, STOPPING=1 on
//! drain, WATCHDOG=1 while the process is healthy. A no-op outside systemd.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends one notification to `$NOTIFY_SOCKET`, if set.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket: '@' stands for the leading NUL.
        abstract_addr(name).and_then(|a| sock.send_to_addr(state.as_bytes(), &a).ok())
    } else {
        sock.send_to(state.as_bytes(), &path).ok()
    };
    if sent.is_none() {
        tracing::debug!(state, "sd_notify failed");
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &[u8]) -> Option<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name).ok()
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &[u8]) -> Option<std::os::unix::net::SocketAddr> {
    None
}

/// Half the watchdog interval systemd asked for (`WATCHDOG_USEC`), if any.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    let pid_ok = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_none_or(|p| p == std::process::id());
    (pid_ok && usec > 0).then(|| Duration::from_micros(usec / 2))
}
