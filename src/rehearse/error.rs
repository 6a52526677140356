//! Why `seatboard rehearse` refused a flag (exit 2): the first stderr line
//! names the flag.

use crate::auth::FlagError as SecretError;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

/// What an http:// or https:// URL given to `--target` or `--nodes` lacks.
#[derive(Debug, thiserror::Error)]
pub enum UrlProblem {
    /// Another scheme, or none.
    #[error("an http:// or https:// URL (the load balancer as browsers reach it, or a node)")]
    Scheme,
    /// The host has no address.
    #[error("{0} does not resolve")]
    Unresolved(String),
    /// The host is no name TLS can check (the load generator's reason).
    #[error("{0}")]
    ServerName(String),
}

/// A refused `rehearse` flag; the text names the flag.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// `--target` or `--nodes` is no usable URL.
    #[error("invalid value '{url}' for '{flag}': {problem}")]
    Url {
        /// The flag.
        flag: &'static str,
        /// The value given.
        url: String,
        /// What it lacks.
        problem: UrlProblem,
    },
    /// `--json` or `--report` names a file that cannot be written.
    #[error("invalid value '{}' for '{flag}': cannot write it: {source}", path.display())]
    Unwritable {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `--source-addrs` address this host does not have.
    #[error("invalid value '{ip}' for '--source-addrs': not an address of this host: {source}")]
    NotLocal {
        /// The address.
        ip: IpAddr,
        /// Why a socket could not be bound to it.
        #[source]
        source: io::Error,
    },
    /// `--rehearsal-prefix` empty, too long, or with other characters.
    #[error("invalid value '{0}' for '--rehearsal-prefix': 1-53 of [A-Za-z0-9_.-]")]
    Prefix(String),
    /// A `--jwt-secret` the nodes would refuse.
    #[error("--jwt-secret: {0}")]
    Secret(#[source] SecretError),
    /// `--token-file` cannot be read.
    #[error("--token-file {}: {source}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--token-file` holds no token.
    #[error("--token-file {}: no token in it", path.display())]
    NoToken {
        /// The file.
        path: PathBuf,
    },
}
