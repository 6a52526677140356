//! A JSON Web Key Set (RFC 7517) read into the signing keys it holds. A key
//! that cannot be read is skipped and the others are used (RFC 7517 §5); a
//! document that is no key set, or holds no usable signing key, is refused as
//! a whole, so it never replaces a good one.

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
    /// A set in which no key is usable (every one ignored or unreadable):
    /// refused like a failed fetch, so the keys already held stay.
    #[error("no usable signing key ({})", summary(.0))]
    NoUsableKey(Vec<String>),
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
    /// Keys ignored: another use, type or curve, an `alg` not ours, RSA under 2048 bits.
    pub ignored: Vec<String>,
    /// Keys skipped because they cannot be read: no JWK, or a member missing or broken.
    pub unreadable: Vec<String>,
    /// The `kid`s of the keys ignored or skipped: published, but never usable here.
    pub unusable_kids: Vec<String>,
}

/// The first few of `reasons`, and how many more there are (for a log line).
pub fn summary(reasons: &[String]) -> String {
    const SHOWN: usize = 5;
    if reasons.is_empty() {
        return "the set has no keys".into();
    }
    let mut out = reasons
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if reasons.len() > SHOWN {
        out.push_str(&format!("; and {} more", reasons.len() - SHOWN));
    }
    out
}

/// One key of a set: held, or passed over (and why).
enum Found {
    Held(HeldKey),
    /// Not for us (another use, type, curve or `alg`; a short RSA key).
    Ignored(Option<String>, String),
    /// A key that cannot be read.
    Unreadable(Option<String>, String),
}

fn one(i: usize, v: serde_json::Value) -> Found {
    let kid = v.get("kid").and_then(|k| k.as_str()).map(str::to_owned);
    let name = format!("key {i} (kid {:?})", kid.as_deref().unwrap_or(""));
    let jwk: Jwk = match serde_json::from_value(v) {
        Ok(jwk) => jwk,
        Err(e) => return Found::Unreadable(kid, format!("{name}: not a JWK: {e}")),
    };
    if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
        return Found::Ignored(kid, format!("{name}: use {:?}", jwk.use_));
    }
    let alg = match jwk.alg.as_deref() {
        None => None,
        Some(a) => match Alg::parse(a) {
            Some(Alg::Hs256) | None => return Found::Ignored(kid, format!("{name}: alg {a}")),
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
        Ok(key) => Found::Held(HeldKey {
            kid: jwk.kid,
            alg,
            key,
        }),
        Err(e @ (KeyError::TooShort(_) | KeyError::Unsupported(_))) => {
            Found::Ignored(kid, format!("{name}: {e}"))
        }
        Err(e @ KeyError::Malformed(_)) => Found::Unreadable(kid, format!("{name}: {e}")),
    }
}

/// Reads a JWKS document: each key it can use, the others skipped with the
/// reason; an error refuses the whole set (no key set, no usable key, too many).
pub fn parse(body: &[u8]) -> Result<Parsed, JwksError> {
    if body.len() > MAX_JWKS_BYTES {
        return Err(JwksError::TooLarge);
    }
    let set: Set = serde_json::from_slice(body).map_err(JwksError::NotJwks)?;
    let mut out = Parsed::default();
    for (i, v) in set.keys.into_iter().enumerate() {
        let (kid, why, list) = match one(i, v) {
            Found::Held(k) => {
                out.keys.push(k);
                continue;
            }
            Found::Ignored(kid, why) => (kid, why, &mut out.ignored),
            Found::Unreadable(kid, why) => (kid, why, &mut out.unreadable),
        };
        list.push(why);
        out.unusable_kids.extend(kid);
    }
    if out.keys.is_empty() {
        let mut skipped = out.unreadable;
        skipped.extend(out.ignored);
        return Err(JwksError::NoUsableKey(skipped));
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
    fn a_document_that_is_no_key_set_is_refused() {
        assert!(parse(b"not json").is_err());
        assert!(parse(b"{}").is_err(), "no keys");
        assert!(parse(br#"{"keys":{}}"#).is_err());
        assert!(parse(&vec![b' '; MAX_JWKS_BYTES + 1]).is_err());
    }

    #[test]
    fn a_key_that_cannot_be_read_is_skipped_and_the_others_are_used() {
        let doc = format!(
            r#"{{"keys":[
            {{"kid":"no-kty"}},
            {{"kty":"RSA","kid":"x5","use":"sig","x5c":["MIIB"]}},
            {{"kty":"RSA","kid":"no-n","e":"AQAB"}},
            {{"kty":"EC","kid":"short-xy","crv":"P-256","x":"AAAA","y":"AAAA"}},
            {{"kty":"EC","kid":"p384-sized-for-p256","crv":"P-256","x":"{x48}","y":"{x48}"}},
            {{"kty":"OKP","kid":"short-ed","crv":"Ed25519","x":"AAAA"}},
            {{"kty":"RSA","kid":7}},
            42,
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"good"}}
        ]}}"#,
            x48 = "A".repeat(64)
        );
        let p = parse(doc.as_bytes()).expect("a key set with one usable key");
        assert_eq!(p.keys.len(), 1);
        assert_eq!(p.keys[0].kid.as_deref(), Some("good"));
        assert_eq!(p.unreadable.len(), 8, "{:#?}", p.unreadable);
        assert!(p.ignored.is_empty(), "{:?}", p.ignored);
        // Each named by its index and kid.
        assert!(
            p.unreadable[1].starts_with(r#"key 1 (kid "x5"): malformed key: no `n`"#),
            "{}",
            p.unreadable[1]
        );
        assert!(p.unreadable[4].contains("key 4"), "{}", p.unreadable[4]);
        assert!(p.unreadable[7].starts_with("key 7 "), "{}", p.unreadable[7]);
        assert_eq!(
            p.unusable_kids,
            [
                "no-kty",
                "x5",
                "no-n",
                "short-xy",
                "p384-sized-for-p256",
                "short-ed"
            ]
        );
    }

    #[test]
    fn a_set_with_no_usable_key_is_refused() {
        for doc in [
            r#"{"keys":[]}"#,
            r#"{"keys":[{"kty":"RSA","kid":"x5","x5c":["MIIB"]}]}"#,
            r#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0"}]}"#,
        ] {
            let e = parse(doc.as_bytes()).expect_err(doc);
            assert!(matches!(e, JwksError::NoUsableKey(_)), "{doc}: {e}");
            assert!(e.to_string().starts_with("no usable signing key"), "{e}");
        }
        let e = parse(br#"{"keys":[{"kty":"RSA","kid":"x5","x5c":["MIIB"]}]}"#)
            .expect_err("no usable key")
            .to_string();
        assert!(e.contains(r#"key 0 (kid "x5")"#), "{e}");
        let many: Vec<String> = (0..9).map(|i| format!("k{i}")).collect();
        assert_eq!(summary(&many), "k0; k1; k2; k3; k4; and 4 more");
    }

    #[test]
    fn other_uses_types_and_curves_are_ignored() {
        let doc = format!(
            r#"{{"keys":[
            {{"kty":"oct","k":"c2VjcmV0"}},
            {{"kty":"OKP","crv":"X25519","x":"{ED_X}"}},
            {{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","use":"enc","kid":"enc"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","alg":"HS256"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"ed","alg":"EdDSA"}}
        ]}}"#
        );
        let p = parse(doc.as_bytes()).expect("parsed");
        assert_eq!(p.ignored.len(), 5, "{:?}", p.ignored);
        assert!(p.unreadable.is_empty(), "{:?}", p.unreadable);
        assert_eq!(p.unusable_kids, ["enc"]);
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
        let doc = format!(
            r#"{{"keys":[{{"kty":"RSA","kid":"short","n":"{n}","e":"AQAB"}},
            {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"ed"}}]}}"#
        );
        let p = parse(doc.as_bytes()).expect("parsed");
        assert_eq!(p.keys.len(), 1);
        assert!(p.ignored[0].contains("1024 bits"), "{:?}", p.ignored);
    }
}
