//! Why a presence store call failed; the worker counts it and retries.

/// A failed presence store call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The Redis store's command client failed (Redis down, timed out, or an
    /// error reply); its text names the client and never a credential.
    #[error(transparent)]
    Redis(#[from] crate::redis::Error),
}
