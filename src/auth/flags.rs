//! The identity-provider flags of `serve` and `demo` (contract §1, §4b).

use super::FlagError;
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
    /// The `--jwks-ca` bundle, read and checked whether or not a
    /// `--jwks-url` is given: a bad file is refused before it is needed.
    pub fn jwks_ca_pem(&self) -> Result<Option<Vec<u8>>, FlagError> {
        let Some(path) = &self.jwks_ca else {
            return Ok(None);
        };
        let pem = std::fs::read(path).map_err(|source| FlagError::JwksCaUnreadable {
            path: path.clone(),
            source,
        })?;
        crate::redis::trust_roots(Some(&pem)).map_err(FlagError::JwksCa)?;
        Ok(Some(pem))
    }

    /// True when a public-key source is configured.
    pub fn any_key(&self) -> bool {
        self.jwks_url.as_deref().is_some_and(|u| !u.is_empty())
            || self
                .jwt_public_key
                .as_ref()
                .is_some_and(|p| !p.as_os_str().is_empty())
    }
}
