//! A JSON Web Key Set (RFC 7517) read into the signing keys it holds: taken as
//! a whole or refused as a whole, so a broken document never replaces a good one.

use super::keys::{Alg, KeyError, PublicKey};
use serde::Deserialize;

/// Largest JWKS document read (contract §4b: refused past it).
pub const MAX_JWKS_BYTES: usize = 1 << 20;

/// Most signing keys one set may hold: a kid-less token is tried against each.
pub const MAX_KEYS: usize = 64;

/// Why a JWKS fetch gave no key set.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// The server answered another status than 200.
    #[error("HTTP {0}")]
    Status(u16),
    /// The document is over [`MAX_JWKS_BYTES`].
    #[error("JWKS over {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    /// The whole fetch took longer than its deadline.
    #[error("timed out")]
    TimedOut,
    /// Resolve, connect, TLS or HTTP failed.
    #[error("{0}")]
    Fetch(#[source] ureq::Error),
    /// The body is no JWKS document.
    #[error("not a JWKS: {0}")]
    NotJwks(#[source] serde_json::Error),
    /// A key entry that is no JWK.
    #[error("key {index}: {source}")]
    NotAJwk {
        /// Its position in `keys`.
        index: usize,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A supported key with missing or broken fields: the whole set is refused.
    #[error("{key}: {source}")]
    Malformed {
        /// `key <i> (kid "...")`.
        key: String,
        /// What is wrong.
        #[source]
        source: KeyError,
    },
    /// More signing keys than [`MAX_KEYS`].
    #[error("{0} signing keys (at most {MAX_KEYS})")]
    TooManyKeys(usize),
}

/// A key held for verification, from a JWKS or a PEM file.
#[derive(Debug, Clone)]
pub struct HeldKey {
    /// Its `kid` (none for a PEM key, or a JWK without one).
    pub kid: Option<String>,
    /// The JWK's own `alg`, when it names one: then only that algorithm.
    pub alg: Option<Alg>,
    /// The key.
    pub key: PublicKey,
}

impl HeldKey {
    /// Whether a token with `alg` may be checked against this key.
    pub fn takes(&self, alg: Alg) -> bool {
        self.key.fits(alg) && self.alg.is_none_or(|a| a == alg)
    }
}

#[derive(Deserialize)]
struct Set {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// What a JWKS document yielded: the keys, and the keys passed over (and why).
#[derive(Debug, Default)]
pub struct Parsed {
    /// Signing keys to hold.
    pub keys: Vec<HeldKey>,
    /// Keys ignored: another use or type, RSA under 2048 bits.
    pub ignored: Vec<String>,
}

/// One key of a set: held, or passed over (and why).
enum Found {
    Held(HeldKey),
    Ignored(String),
}

fn one(i: usize, v: serde_json::Value) -> Result<Found, JwksError> {
    let jwk: Jwk =
        serde_json::from_value(v).map_err(|source| JwksError::NotAJwk { index: i, source })?;
    let name = || format!("key {i} (kid {:?})", jwk.kid.as_deref().unwrap_or(""));
    if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
        return Ok(Found::Ignored(format!("{}: use {:?}", name(), jwk.use_)));
    }
    let alg = match jwk.alg.as_deref() {
        None => None,
        Some(a) => match Alg::parse(a) {
            Some(Alg::Hs256) | None => return Ok(Found::Ignored(format!("{}: alg {a}", name()))),
            some => some,
        },
    };
    let key = match jwk.kty.as_str() {
        "RSA" => PublicKey::rsa(jwk.n.as_deref(), jwk.e.as_deref()),
        "EC" => PublicKey::ec(jwk.crv.as_deref(), jwk.x.as_deref(), jwk.y.as_deref()),
        "OKP" => PublicKey::okp(jwk.crv.as_deref(), jwk.x.as_deref()),
        other => Err(KeyError::Unsupported(format!("kty {other}"))),
    };
    match key {
        Ok(key) => Ok(Found::Held(HeldKey {
            kid: jwk.kid,
            alg,
            key,
        })),
        Err(e @ (KeyError::TooShort(_) | KeyError::Unsupported(_))) => {
            Ok(Found::Ignored(format!("{}: {e}", name())))
        }
        Err(source @ KeyError::Malformed(_)) => Err(JwksError::Malformed {
            key: name(),
            source,
        }),
    }
}

/// Reads a JWKS document; an error refuses the whole set.
pub fn parse(body: &[u8]) -> Result<Parsed, JwksError> {
    if body.len() > MAX_JWKS_BYTES {
        return Err(JwksError::TooLarge);
    }
    let set: Set = serde_json::from_slice(body).map_err(JwksError::NotJwks)?;
    let mut out = Parsed::default();
    for (i, v) in set.keys.into_iter().enumerate() {
        match one(i, v)? {
            Found::Held(k) => out.keys.push(k),
            Found::Ignored(why) => out.ignored.push(why),
        }
    }
    if out.keys.len() > MAX_KEYS {
        return Err(JwksError::TooManyKeys(out.keys.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    #[test]
    fn a_broken_document_or_key_refuses_the_set() {
        assert!(parse(b"not json").is_err());
        assert!(parse(b"{}").is_err(), "no keys");
        assert!(parse(br#"{"keys":{}}"#).is_err());
        assert!(parse(br#"{"keys":[{"kid":"a"}]}"#).is_err(), "no kty");
        assert!(parse(br#"{"keys":[{"kty":"RSA","kid":"a","e":"AQAB"}]}"#).is_err());
        assert!(parse(br#"{"keys":[{"kty":"EC","crv":"P-256","x":"AAAA"}]}"#).is_err());
        assert!(parse(br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA"}]}"#).is_err());
        assert!(parse(&vec![b' '; MAX_JWKS_BYTES + 1]).is_err());
    }

    #[test]
    fn other_uses_types_and_curves_are_ignored() {
        let doc = format!(
            r#"{{"keys":[
            {{"kty":"oct","k":"c2VjcmV0"}},
            {{"kty":"OKP","crv":"X25519","x":"{ED_X}"}},
            {{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","use":"enc"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","alg":"HS256"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"ed","alg":"EdDSA"}}
        ]}}"#
        );
        let p = parse(doc.as_bytes()).expect("parsed");
        assert_eq!(p.ignored.len(), 5, "{:?}", p.ignored);
        assert_eq!(p.keys.len(), 1);
        assert_eq!(p.keys[0].kid.as_deref(), Some("ed"));
        assert!(p.keys[0].takes(Alg::EdDsa));
        assert!(!p.keys[0].takes(Alg::Es256));
    }

    #[test]
    fn short_rsa_keys_are_ignored() {
        use base64::Engine as _;
        // A 1024-bit modulus (the size is all the check reads first).
        let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xffu8; 128]);
        let doc = format!(r#"{{"keys":[{{"kty":"RSA","kid":"short","n":"{n}","e":"AQAB"}}]}}"#);
        let p = parse(doc.as_bytes()).expect("parsed");
        assert!(p.keys.is_empty());
        assert!(p.ignored[0].contains("1024 bits"), "{:?}", p.ignored);
    }
}
