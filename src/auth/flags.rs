//! The identity-provider flags of `serve` and `demo` (contract §1, §4b).

use clap::Args;
use std::path::PathBuf;

/// Where public keys come from and what the provider's tokens must say.
#[derive(Args, Debug, Clone, Default)]
pub struct IdpFlags {
    /// The identity provider's JSON Web Key Set (https://, or http:// to a loopback address).
    #[arg(long, env = "SEATBOARD_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// PEM bundle that verifies the --jwks-url server (default: the system roots).
    #[arg(long, env = "SEATBOARD_JWKS_CA")]
    pub jwks_ca: Option<PathBuf>,
    /// A PEM public key (RSA, EC P-256/P-384 or Ed25519) that signs tokens.
    #[arg(long, env = "SEATBOARD_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<PathBuf>,
    /// When set, a token's `iss` must equal it.
    #[arg(long, env = "SEATBOARD_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// When set, a token's `aud` (a string or an array) must contain it.
    #[arg(long, env = "SEATBOARD_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Dotted path of the role claim (`realm_access.roles`); `admin` when it is or contains `admin`.
    #[arg(long, env = "SEATBOARD_JWT_ROLE_CLAIM", default_value = "role")]
    pub jwt_role_claim: String,
}

impl IdpFlags {
    /// True when a public-key source is configured.
    pub fn any_key(&self) -> bool {
        self.jwks_url.as_deref().is_some_and(|u| !u.is_empty())
            || self
                .jwt_public_key
                .as_ref()
                .is_some_and(|p| !p.as_os_str().is_empty())
    }
}
