//! Why the relay refused its flags ([`FlagError`], exit 2), could not bind a
//! receive socket ([`BindError`]) or could not start ([`StartError`], exit 1;
//! a `--socket` path found taken only at the bind still exits 2).

use crate::redis::ConfigError;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A refused relay flag; the text names the flag.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// `--udp` or `--metrics` is not `IP:PORT`.
    #[error("invalid value '{value}' for '--{flag}': not an IP:PORT address")]
    NotAnAddress {
        /// The flag, without its dashes.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The parser's complaint.
        #[source]
        source: std::net::AddrParseError,
    },
    /// `--udp` on a non-loopback address.
    #[error("invalid value '{value}' for '--udp': a loopback address only (127.0.0.1 or ::1)")]
    UdpNotLoopback {
        /// The value given.
        value: String,
    },
    /// `--socket` names a live socket of another kind (another service's).
    #[error("invalid value '{}' for '--socket': a live socket of another kind (another service's) is there; never replaced", path.display())]
    SocketOfAnotherKind {
        /// The path given.
        path: PathBuf,
    },
    /// `--socket` names a socket another process (another relay) still reads.
    #[error("invalid value '{}' for '--socket': another process (another relay?) reads the socket there; never replaced", path.display())]
    SocketInUse {
        /// The path given.
        path: PathBuf,
    },
    /// `--socket` names something that is not a socket (a file, a folder).
    #[error("invalid value '{}' for '--socket': it exists and is not a socket; never replaced", path.display())]
    NotASocket {
        /// The path given.
        path: PathBuf,
    },
    /// `--socket` is longer than a Unix socket's address holds.
    #[error("invalid value '{}' for '--socket': longer than a Unix socket path may be (107 bytes)", path.display())]
    SocketPathTooLong {
        /// The path given.
        path: PathBuf,
    },
    /// Both receivers off.
    #[error("'--socket' and '--udp' are both off: nothing to receive on")]
    NothingToReceive,
    /// A refused `--redis` or `--redis-ca` (a seed shown only redacted).
    #[error(transparent)]
    Redis(#[from] ConfigError),
}

/// Why a receive socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A call on the socket's path failed: making its folder ("cannot
    /// make"), replacing a stale socket ("cannot replace"), binding it
    /// ("cannot bind"), setting its mode ("cannot set the mode of").
    #[error("{what} {}: {source}", path.display())]
    Path {
        /// What could not be done.
        what: &'static str,
        /// The socket, or its folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Another process still reads the socket.
    #[error("{} is in use by another process", path.display())]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// The path holds something else.
    #[error("{} exists and is not a socket", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The UDP socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    BindUdp {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Any other socket call (making the probe, setting the read timeout).
    #[error(transparent)]
    Socket(io::Error),
}

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The signal handlers could not be installed.
    #[error("signals: {0}")]
    Signals(#[source] io::Error),
    /// `--metrics` could not be bound.
    #[error("--metrics {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--socket` could not be bound.
    #[error("--socket: {0}")]
    Socket(#[source] BindError),
    /// `--udp` could not be bound.
    #[error("--udp: {0}")]
    Udp(#[source] BindError),
    /// A thread could not be spawned.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}
