//! A token checked against the node's keys: HS256 against `--jwt-secret` only,
//! a public-key algorithm against held keys of its own type only (a PEM key,
//! the JWKS keys of its `kid`), then its claims.

use super::claims::Rules;
use super::error::FlagError;
use super::jwks::HeldKey;
use super::keys::{Alg, PublicKey};
use super::refresh::{JwksSource, Missing};
use super::{Denied, Identity};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Longest token accepted (contract §4b); longer ones are refused unparsed.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Verifies tokens; shared by every shard, never blocking.
pub struct Verifier {
    /// HS256 key (`--jwt-secret`).
    pub(super) secret: Option<jsonwebtoken::DecodingKey>,
    /// The `--jwt-public-key` key.
    pub(super) pem: Vec<HeldKey>,
    /// The `--jwks-url` source.
    pub(super) jwks: Option<Arc<JwksSource>>,
    /// Claim rules.
    pub(super) rules: Rules,
    /// Tokens refused with 503 because their key was not held.
    pub(super) unavailable: AtomicU64,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    /// No extension is understood, so any `crit` refuses the token (RFC 7515 §4.1.11).
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// A token cut into its parts, nothing verified yet.
struct Parts<'a> {
    alg: Alg,
    kid: Option<String>,
    claims: serde_json::Value,
    signed: &'a [u8],
    sig: Vec<u8>,
    sig_b64: &'a str,
}

fn split(token: &str) -> Option<Parts<'_>> {
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let mut it = token.split('.');
    let (h, p, s) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let header: Header = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).ok()?).ok()?;
    if header.crit.is_some() {
        return None;
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).ok()?).ok()?;
    if !claims.is_object() {
        return None;
    }
    Some(Parts {
        alg: Alg::parse(&header.alg)?,
        kid: header.kid,
        claims,
        signed: &token.as_bytes()[..h.len() + 1 + p.len()],
        sig: URL_SAFE_NO_PAD.decode(s).ok()?,
        sig_b64: s,
    })
}

fn kid_fits(key: &HeldKey, kid: Option<&str>) -> bool {
    match (key.kid.as_deref(), kid) {
        (Some(held), Some(asked)) => held == asked,
        _ => true,
    }
}

impl Verifier {
    /// The identity behind `token` at Unix time `now_s`.
    pub fn verify(&self, token: &str, now_s: f64) -> Result<Identity, Denied> {
        let t = split(token).ok_or(Denied::Invalid)?;
        let signed = match t.alg {
            Alg::Hs256 => self.secret.as_ref().is_some_and(|key| {
                let hs256 = jsonwebtoken::Algorithm::HS256;
                jsonwebtoken::crypto::verify(t.sig_b64, t.signed, key, hs256).unwrap_or(false)
            }),
            alg => match self.signed_by_held_key(&t, alg) {
                Ok(signed) => signed,
                Err(retry_after_s) => {
                    // Tell a student to come back only for a token that could pass.
                    self.rules.check(&t.claims, now_s).ok_or(Denied::Invalid)?;
                    self.unavailable.fetch_add(1, Relaxed);
                    return Err(Denied::KeyUnavailable { retry_after_s });
                }
            },
        };
        if !signed {
            return Err(Denied::Invalid);
        }
        self.rules.check(&t.claims, now_s).ok_or(Denied::Invalid)
    }

    /// Whether a held key of the token's type (and `kid`) signed it; `Err`
    /// with seconds to wait when its key is not held while the JWKS cannot be fetched.
    fn signed_by_held_key(&self, t: &Parts<'_>, alg: Alg) -> Result<bool, u64> {
        let kid = t.kid.as_deref();
        let fits = |k: &&HeldKey| k.takes(alg) && kid_fits(k, kid);
        let ok = |k: &HeldKey| k.key.verify(alg, t.signed, &t.sig);
        if self.pem.iter().filter(fits).any(ok) {
            return Ok(true);
        }
        let Some(jwks) = &self.jwks else {
            return Ok(false);
        };
        let held = jwks.keys();
        if held.iter().filter(fits).any(ok) {
            return Ok(true);
        }
        let known = match kid {
            Some(kid) => held.iter().any(|k| k.kid.as_deref() == Some(kid)),
            None => !held.is_empty(),
        };
        if known {
            return Ok(false);
        }
        match jwks.missing(kid.unwrap_or("")) {
            Missing::RetryAfter(s) => Err(s),
            Missing::NotPublished => Ok(false),
        }
    }

    /// Signing keys held from the JWKS now.
    pub fn jwks_keys(&self) -> usize {
        self.jwks.as_ref().map_or(0, |j| j.keys().len())
    }
}

/// Loads a `--jwt-public-key` file.
pub fn pem_key(path: &std::path::Path) -> Result<HeldKey, FlagError> {
    let text = std::fs::read_to_string(path).map_err(|source| FlagError::PublicKeyUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let key = PublicKey::from_pem(&text).map_err(|source| FlagError::PublicKey {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(HeldKey {
        kid: None,
        alg: None,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &[u8] = b"unit-test-secret-0123456789abcdef";

    fn verifier() -> Verifier {
        Verifier {
            secret: jsonwebtoken::DecodingKey::from_secret(SECRET).ok(),
            pem: Vec::new(),
            jwks: None,
            rules: Rules::new(None, None, "role"),
            unavailable: AtomicU64::new(0),
        }
    }

    fn hs256(claims: serde_json::Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET).expect("key");
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        jsonwebtoken::encode(&header, &claims, &key).expect("token")
    }

    #[test]
    fn tokens_over_8_kib_are_refused_unparsed() {
        let v = verifier();
        let now = 1_800_000_000.0;
        let fits = hs256(json!({"sub":"u","exp":now + 60.0,"pad":"x".repeat(5000)}));
        assert!(fits.len() <= MAX_TOKEN_BYTES);
        assert!(v.verify(&fits, now).is_ok());
        let long = hs256(json!({"sub":"u","exp":now + 60.0,"pad":"x".repeat(MAX_TOKEN_BYTES)}));
        assert!(long.len() > MAX_TOKEN_BYTES);
        assert_eq!(v.verify(&long, now), Err(Denied::Invalid));
    }

    #[test]
    fn a_public_key_algorithm_without_a_public_key_is_a_401() {
        let v = verifier();
        let good = hs256(json!({"sub":"u","exp":1_800_000_060}));
        let (_, rest) = good.split_once('.').expect("token");
        for alg in ["RS256", "ES256", "EdDSA", "PS256"] {
            let h = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}"}}"#));
            assert_eq!(
                v.verify(&format!("{h}.{rest}"), 1_800_000_000.0),
                Err(Denied::Invalid)
            );
        }
        // A `crit` header the node does not understand, properly signed.
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","crit":["exp"]}"#);
        let p = URL_SAFE_NO_PAD.encode(r#"{"sub":"u","exp":1800000060}"#);
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET).expect("key");
        let msg = format!("{h}.{p}");
        let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
            .expect("sign");
        assert_eq!(
            v.verify(&format!("{msg}.{sig}"), 1_800_000_000.0),
            Err(Denied::Invalid)
        );
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#);
        let msg = format!("{h}.{p}");
        let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
            .expect("sign");
        assert!(
            v.verify(&format!("{msg}.{sig}"), 1_800_000_000.0).is_ok(),
            "the same without crit"
        );
    }
}
