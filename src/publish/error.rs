//! Why a [`crate::publisher::Publisher`] could not start.

use crate::redis::ConfigError;

/// A `Publisher` that did not start: its Redis flags were refused, or its
/// thread could not be made. (Redis being unreachable is no error: snapshots
/// are dropped, counted, until it is back.)
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A refused `--redis` or `--redis-ca` value; it names the flag and shows
    /// a seed only redacted.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The background thread could not be spawned.
    #[error("cannot start the publisher thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// For callers that report a failure as text (command-line messages).
impl From<PublisherError> for String {
    fn from(e: PublisherError) -> String {
        e.to_string()
    }
}
