//! The receive side: a Unix datagram socket and a loopback UDP socket, each
//! read by a thread of its own that validates a datagram (section 2's rules,
//! by `Snapshot::parse`) and offers it to the pending map. Nothing here waits
//! on Redis: the map's lock is only ever held for a map operation.

use super::error::BindError;
use super::metrics::{Rejected, Shared};
use crate::supervisor::{self, Policy};
use shards::{Reject, Snapshot};
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Kernel receive buffer asked for each socket: bursts wait there, not in senders.
const RCVBUF: usize = 4 << 20;
/// How often a receive thread looks at the stop flag while idle.
const POLL: Duration = Duration::from_millis(100);

/// One datagram checked by the contract's rules (`Snapshot::parse`: a
/// version within 0..2^53 among them).
pub fn validate(payload: &[u8]) -> Result<Snapshot, Rejected> {
    match Snapshot::parse(payload, None) {
        // Only the reconciler replaces (contract §2, §10).
        Ok(s) if s.replace => Err(Rejected::Schema),
        Ok(s) => Ok(s),
        Err(Reject::Json) => Err(Rejected::Json),
        Err(Reject::TooLarge) => Err(Rejected::TooLarge),
        Err(Reject::Schema | Reject::ChannelMismatch | Reject::TooManySections) => {
            Err(Rejected::Schema)
        }
    }
}

/// One datagram in: counted, validated, offered.
pub fn handle(shared: &Shared, payload: &[u8]) {
    shared.received.fetch_add(1, Relaxed);
    match validate(payload) {
        Ok(s) => {
            // The writer is woken only when the map had nothing for it: it
            // takes all that is held before it sleeps again, so one wake-up
            // per batch, not per datagram.
            let wake = {
                let mut p = shared.pending();
                let idle = p.held() == 0;
                let offer = p.offer(s, std::time::Instant::now());
                idle && offer == super::pending::Offer::Held
            };
            if wake {
                shared.work.notify_one();
            }
        }
        Err(why) => {
            shared.reject(why);
            tracing::debug!(reason = why.label(), "datagram rejected");
        }
    }
}

/// What holds a `--socket` path so that the relay may not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A live socket of another kind (a stream or seqpacket listener of
    /// another service): a datagram connect to it fails with `EPROTOTYPE`.
    AnotherKind,
    /// A live datagram socket another process reads (another relay's, or
    /// one connected to a peer of its own).
    InUse,
    /// Something that is not a socket (a file, a folder).
    NotASocket,
}

/// Whether a datagram connect to a socket file found a live datagram socket
/// behind it: it connected, or it was refused with `EPERM`, which Linux
/// answers when the socket there is connected to a peer of its own (a
/// stale file answers `ECONNREFUSED`).
fn live_datagram(connect: &std::io::Result<()>) -> bool {
    match connect {
        Ok(()) => true,
        Err(e) => e.raw_os_error() == Some(libc::EPERM),
    }
}

/// Whether something the relay must never replace is at `path` (`None`:
/// nothing, or a stale socket file).
pub fn taken(path: &Path) -> Option<Taken> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_socket() {
        return Some(Taken::NotASocket);
    }
    let probe = UnixDatagram::unbound().ok()?;
    let connect = probe.connect(path);
    if live_datagram(&connect) {
        return Some(Taken::InUse);
    }
    match connect {
        Err(e) if e.raw_os_error() == Some(libc::EPROTOTYPE) => Some(Taken::AnotherKind),
        _ => std::os::unix::net::UnixStream::connect(path)
            .is_ok()
            .then_some(Taken::AnotherKind),
    }
}

/// The Unix datagram socket at `path`: its folder made (0750), a stale
/// socket file replaced, mode 0660. A socket another process still reads
/// (connected to a peer of its own or not) is an error, and so is a path
/// that is not a socket.
pub fn bind_unix(path: &Path) -> Result<UnixDatagram, BindError> {
    let failed = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| BindError::Path { what, path, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(failed("cannot make", dir))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            let probe = UnixDatagram::unbound().map_err(BindError::Socket)?;
            if live_datagram(&probe.connect(path)) {
                return Err(BindError::InUse { path: path.into() });
            }
            std::fs::remove_file(path).map_err(failed("cannot replace", path))?;
        }
        Ok(_) => return Err(BindError::NotASocket { path: path.into() }),
        Err(_) => {}
    }
    let sock = UnixDatagram::bind(path).map_err(failed("cannot bind", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(failed("cannot set the mode of", path))?;
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(RCVBUF);
    sock.set_read_timeout(Some(POLL))
        .map_err(BindError::Socket)?;
    Ok(sock)
}

/// The UDP socket on `addr` (loopback, checked by the caller).
pub fn bind_udp(addr: SocketAddr) -> Result<UdpSocket, BindError> {
    let sock = UdpSocket::bind(addr).map_err(|source| BindError::BindUdp { addr, source })?;
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(RCVBUF);
    sock.set_read_timeout(Some(POLL))
        .map_err(BindError::Socket)?;
    Ok(sock)
}

/// Starts the thread `relay-<name>` that reads datagrams with `recv` (one
/// into the buffer, its length) until the stop flag is set.
pub fn spawn(
    name: &str,
    recv: impl Fn(&mut [u8]) -> std::io::Result<usize> + Send + 'static,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    supervisor::spawn(format!("relay-{name}"), Policy::Logged, move || {
        // One byte past the limit: a longer datagram is cut there and
        // still seen as too large.
        let mut buf = vec![0u8; shards::snapshot::MAX_PAYLOAD + 1];
        while !shared.stop.load(Relaxed) {
            match recv(&mut buf) {
                Ok(n) => handle(&shared, &buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "receive failed");
                    std::thread::sleep(POLL);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_datagram_is_offered_while_others_are_held() {
        let shared = Shared::new(super::super::pending::Pending::new(10, usize::MAX));
        for (section, version) in [(1, 1), (2, 1), (1, 2), (1, 1)] {
            let p = format!(
                r#"{{"course":"C","section":{section},"total_seats":2,"seats_taken":1,"version":{version}}}"#
            );
            handle(&shared, p.as_bytes());
        }
        handle(&shared, b"{");
        assert_eq!(shared.received.load(Relaxed), 5);
        assert_eq!(shared.rejected(Rejected::Json), 1);
        let p = shared.pending();
        assert_eq!(p.len(), 2);
        assert_eq!(p.counts().coalesced, 2);
    }

    #[test]
    fn a_datagram_socket_connected_to_another_peer_is_in_use() {
        let dir = std::env::temp_dir().join(format!(
            "seatboard-relay-connected-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let (path, peer_path) = (dir.join("held.sock"), dir.join("peer.sock"));
        let _peer = UnixDatagram::bind(&peer_path).expect("peer");
        let held = UnixDatagram::bind(&path).expect("bind");
        held.connect(&peer_path).expect("connect");
        assert_eq!(taken(&path), Some(Taken::InUse));
        let bound = bind_unix(&path);
        assert!(matches!(bound, Err(BindError::InUse { .. })), "{bound:?}");
        assert!(path.exists(), "the socket file was removed");
        // Once nobody holds it, the stale file is the relay's to replace.
        drop(held);
        assert_eq!(taken(&path), None);
        assert!(bind_unix(&path).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn validation_by_the_contract() {
        let ok = br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":9007199254740992}"#;
        assert_eq!(
            validate(ok).unwrap().version,
            Some(shards::snapshot::MAX_VERSION)
        );
        let over = br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":9007199254740993}"#;
        assert_eq!(validate(over), Err(Rejected::Schema));
        assert_eq!(validate(b"{nope"), Err(Rejected::Json));
        assert_eq!(validate(b"[1]"), Err(Rejected::Schema));
        let big = vec![b' '; shards::snapshot::MAX_PAYLOAD + 1];
        assert_eq!(validate(&big), Err(Rejected::TooLarge));
        let go = br#"{"SharedCourseCode":"CS101","SectionID":1,"TotalSeats":2,"SeatsTaken":1,"Version":3}"#;
        assert_eq!(validate(go).unwrap().version, Some(3));
        // Only the reconciler replaces: the relay refuses it.
        let replace = br#"{"course":"CS101","section":1,"total_seats":2,"seats_taken":1,"version":3,"replace":true}"#;
        assert_eq!(validate(replace), Err(Rejected::Schema));
    }
}
