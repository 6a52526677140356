//! The auth boundary's errors: a refused identity-provider flag
//! ([`FlagError`], exit 2 naming the flag) and a JWKS that could not be had
//! (a JWKS that could not be had is `jwks::JwksError`, logged; the keys
//! already held stay in use). A `--jwks-url`
//! appears in them only as [`ShownUrl`], without its user info; no variant
//! holds the `--jwt-secret`.

use super::keys::KeyError;
use super::MIN_SECRET;
use crate::redis::TrustError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// A `--jwks-url` as an error may show it: user info (refused anyway)
/// replaced by `***`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownUrl(String);

impl ShownUrl {
    /// `url` with everything between the scheme and the last `@` hidden.
    pub fn new(url: &str) -> ShownUrl {
        match (url.split_once("://"), url.rfind('@')) {
            (Some((scheme, _)), Some(at)) => ShownUrl(format!("{scheme}://***{}", &url[at..])),
            (None, Some(at)) => ShownUrl(format!("***{}", &url[at..])),
            _ => ShownUrl(url.to_owned()),
        }
    }
}

impl fmt::Display for ShownUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What is wrong with a `--jwks-url`.
#[derive(Debug, thiserror::Error)]
pub enum UrlProblem {
    /// Neither `https://` nor `http://`.
    #[error("use https:// (or http:// to a loopback address)")]
    Scheme,
    /// User info, a fragment or white space.
    #[error("no user info, fragment or spaces")]
    Extras,
    /// Not a URI at all.
    #[error("{0}")]
    Invalid(#[source] ureq::http::uri::InvalidUri),
    /// A port that is not a number up to 65535.
    #[error("bad port")]
    Port,
    /// No host.
    #[error("no host")]
    NoHost,
    /// `http://` to a name or address that is not loopback.
    #[error("plain http:// is allowed only to a loopback address")]
    PlainNotLoopback,
}

/// A refused auth flag; the text names it.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// `--auth jwt` with nothing to verify with.
    #[error("--auth jwt needs at least one of --jwt-secret (SEATBOARD_JWT_SECRET), --jwks-url (SEATBOARD_JWKS_URL), --jwt-public-key (SEATBOARD_JWT_PUBLIC_KEY)")]
    NoKeySource,
    /// A `--jwt-secret` shorter than [`MIN_SECRET`] (its length only, never its bytes).
    #[error("--jwt-secret (SEATBOARD_JWT_SECRET) must be at least {MIN_SECRET} bytes, got {len}; make one with `openssl rand -base64 48`")]
    SecretTooShort {
        /// Its length in bytes.
        len: usize,
    },
    /// The `--jwt-public-key` file could not be read.
    #[error("invalid value '{}' for '--jwt-public-key': {source}", path.display())]
    PublicKeyUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The `--jwt-public-key` file holds no usable key.
    #[error("invalid value '{}' for '--jwt-public-key': {source}", path.display())]
    PublicKey {
        /// The file.
        path: PathBuf,
        /// What is wrong with the key.
        #[source]
        source: KeyError,
    },
    /// The `--jwks-ca` file could not be read.
    #[error("invalid value '{}' for '--jwks-ca': {source}", path.display())]
    JwksCaUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The `--jwks-ca` bundle holds no usable certificate.
    #[error("invalid value for '--jwks-ca': {0}")]
    JwksCa(#[source] TrustError),
    /// A refused `--jwks-url`.
    #[error("invalid value '{url}' for '--jwks-url': {problem}")]
    JwksUrl {
        /// The URL, without user info.
        url: ShownUrl,
        /// What is wrong with it.
        #[source]
        problem: UrlProblem,
    },
    /// A `--jwt-role-claim` that is no dotted path.
    #[error("invalid value '{claim}' for '--jwt-role-claim': a dotted path of claim names")]
    RoleClaim {
        /// The value given.
        claim: String,
    },
}

/// For callers that report a failure as text (command-line messages).
impl From<FlagError> for String {
    fn from(e: FlagError) -> String {
        e.to_string()
    }
}
