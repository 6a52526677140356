//! Who is connecting: a JWT signed with `--jwt-secret` (HS256) or by the
//! university's identity provider (a `--jwt-public-key` PEM, a `--jwks-url`
//! key set), or `?user=` in `--auth none` mode.
//!
//! - [`keys`]: public keys and their algorithms; [`jwks`]: a key set document;
//! - [`fetch`]: the bounded HTTP(S) GET; [`refresh`]: the thread that keeps the set;
//! - [`claims`]: `sub`, times, `iss`, `aud`, the role; [`payload`]: the claims
//!   read from a token without a whole JSON tree; [`verifier`]: all of it per token;
//! - [`error`]: a refused flag, a JWKS that could not be had.
//!
//! `seatboard token` mints HS256 tokens with [`mint`] for trials and load tests.

pub mod claims;
pub mod error;
pub mod fetch;
pub mod flags;
pub mod jwks;
pub mod keys;
pub mod payload;
pub mod refresh;
pub mod verifier;

use crate::exposition::Family;
pub use error::FlagError;
pub use jwks::JwksError;
use shards::http_head::RequestHead;
use shards::Role;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
pub use verifier::{Verifier, MAX_TOKEN_BYTES};

/// The identity provider's figures at one scrape.
#[derive(Default)]
struct Reading {
    ok: u64,
    error: u64,
    keys: u64,
    unavailable: u64,
}

/// The auth families, in `/metrics` order (after the node's).
const FAMILIES: &[Family<Reading>] = &[
    Family::counter(
        "seatboard_jwks_fetches_total",
        "JWKS fetches by result.",
        |r, s| {
            s.labelled("result", "ok", r.ok);
            s.labelled("result", "error", r.error);
        },
    ),
    Family::gauge(
        "seatboard_jwks_keys",
        "Signing keys held from the JWKS now.",
        |r, s| s.one(r.keys),
    ),
    Family::counter(
        "seatboard_auth_key_unavailable_total",
        "Upgrades refused with 503 because their signing key was not held while the JWKS could not be fetched.",
        |r, s| s.one(r.unavailable),
    ),
];

/// The authenticated identity of an upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User id (`sub`), shared as the connection's user from the start.
    pub user: Arc<str>,
    /// Role from the token.
    pub role: Role,
}

/// Why a request carries no identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Missing, malformed, badly signed, expired, wrong `iss`/`aud`: 401.
    Invalid,
    /// Signed by a key the node does not hold while its JWKS cannot be
    /// fetched: 503 + `Retry-After` (the node's fault, retryable).
    KeyUnavailable {
        /// Seconds until a fetch may have brought the key.
        retry_after_s: u64,
    },
}

/// How identities are established.
pub enum Auth {
    /// Signed tokens.
    Jwt(Box<Verifier>),
    /// Trust `?user=` and `?role=` (tests, demo).
    None,
}

/// Longest user id accepted.
const MAX_USER: usize = claims::MAX_USER;

/// Shortest HS256 secret `serve` accepts: 256 bits, the hash's own size (RFC 7518 §3.2).
pub const MIN_SECRET: usize = 32;

fn role_of(s: Option<&str>) -> Option<Role> {
    match s {
        None | Some("student") => Some(Role::Student),
        Some("admin") => Some(Role::Admin),
        Some(_) => None,
    }
}

/// The `--jwt-secret` check: at least [`MIN_SECRET`] bytes (a shorter one could
/// be brute-forced offline from any one token).
pub fn check_secret(secret: &[u8]) -> Result<(), FlagError> {
    if secret.len() < MIN_SECRET {
        return Err(FlagError::SecretTooShort { len: secret.len() });
    }
    Ok(())
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Auth {
    /// HS256 verification only, with the default claim rules.
    pub fn jwt(secret: &[u8]) -> Result<Auth, FlagError> {
        Auth::from_flags(
            Some(secret),
            &flags::IdpFlags {
                jwt_role_claim: "role".into(),
                ..Default::default()
            },
        )
    }

    /// Verification for these flags: any of the secret, the PEM key and the
    /// JWKS, at least one. Errors name the flag (exit 2). Nothing is fetched
    /// until [`Auth::start`].
    pub fn from_flags(secret: Option<&[u8]>, f: &flags::IdpFlags) -> Result<Auth, FlagError> {
        let secret = secret.filter(|s| !s.is_empty());
        if secret.is_none() && !f.any_key() {
            return Err(FlagError::NoKeySource);
        }
        let secret = match secret {
            Some(s) => {
                check_secret(s)?;
                Some(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, s))
            }
            None => None,
        };
        let pem = match f
            .jwt_public_key
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            Some(path) => vec![verifier::pem_key(path)?],
            None => Vec::new(),
        };
        let ca = f.jwks_ca_pem()?;
        let jwks = match f.jwks_url.as_deref().filter(|u| !u.is_empty()) {
            Some(url) => {
                let target = fetch::Target::parse(url, ca.as_deref())?;
                Some(Arc::new(refresh::JwksSource::new(target)))
            }
            None => None,
        };
        if f.jwt_role_claim.is_empty() || f.jwt_role_claim.split('.').any(str::is_empty) {
            return Err(FlagError::RoleClaim {
                claim: f.jwt_role_claim.clone(),
            });
        }
        let rules = claims::Rules::new(
            f.jwt_issuer.clone(),
            f.jwt_audience.clone(),
            &f.jwt_role_claim,
        );
        Ok(Auth::Jwt(Box::new(Verifier {
            secret,
            pem,
            jwks,
            rules,
            unavailable: AtomicU64::new(0),
        })))
    }

    /// Starts fetching the JWKS, if one is configured.
    pub fn start(&self) -> std::io::Result<()> {
        match self {
            Auth::Jwt(v) => v.jwks.as_ref().map_or(Ok(()), |j| j.start()),
            Auth::None => Ok(()),
        }
    }

    /// Ends the JWKS thread, if one runs (at shutdown).
    pub fn stop(&self) {
        if let Auth::Jwt(v) = self {
            if let Some(j) = &v.jwks {
                j.stop();
            }
        }
    }

    /// `/healthz` `auth`: false until the JWKS (when there is one) was fetched once.
    pub fn healthy(&self) -> bool {
        match self {
            Auth::Jwt(v) => v.jwks.as_ref().is_none_or(|j| j.ready()),
            Auth::None => true,
        }
    }

    /// Appends the auth metrics to a `/metrics` exposition.
    pub fn render_metrics(&self, out: &mut String) {
        let reading = match self {
            Auth::Jwt(v) => Reading {
                ok: v.jwks.as_ref().map_or(0, |j| j.fetches_ok.load(Relaxed)),
                error: v.jwks.as_ref().map_or(0, |j| j.fetches_error.load(Relaxed)),
                keys: v.jwks_keys() as u64,
                unavailable: v.unavailable.load(Relaxed),
            },
            Auth::None => Reading::default(),
        };
        crate::exposition::render(&reading, FAMILIES, out);
    }

    /// The identity behind a request head: 401 ([`Denied::Invalid`]) or 503
    /// ([`Denied::KeyUnavailable`]) otherwise.
    pub fn identify(&self, head: &RequestHead<'_>) -> Result<Identity, Denied> {
        match self {
            Auth::None => {
                let user = head
                    .query_param("user")
                    .filter(|u| !u.is_empty() && u.len() <= MAX_USER)
                    .ok_or(Denied::Invalid)?;
                let user = Arc::from(&*user);
                let role = role_of(head.query_param("role").as_deref()).ok_or(Denied::Invalid)?;
                Ok(Identity { user, role })
            }
            Auth::Jwt(v) => {
                let token = head.token().ok_or(Denied::Invalid)?;
                v.verify(&token, now_s())
            }
        }
    }
}

/// Mints an HS256 token (for `seatboard token`, tests and benches).
pub fn mint(secret: &[u8], user: &str, role: Role, exp_unix_s: u64) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        sub: &'a str,
        role: &'a str,
        exp: u64,
    }
    let claims = Out {
        sub: user,
        role: role.as_str(),
        exp: exp_unix_s,
    };
    let Ok(key) = jsonwebtoken::EncodingKey::from_secret(secret) else {
        return String::new();
    };
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &key,
    )
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use std::time::{SystemTime, UNIX_EPOCH};

    const SECRET: &[u8] = b"unit-test-secret-0123456789abcdef";

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn b64url(data: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for c in data.chunks(3) {
            let n = c.iter().fold(0u32, |n, b| n << 8 | *b as u32) << (8 * (3 - c.len()));
            for i in 0..=c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    /// An HS256 token with these claims.
    fn token(claims: serde_json::Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap();
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &key,
        )
        .unwrap()
    }

    fn head<'a>(
        authorization: Option<&'a str>,
        query: &'a str,
        cookie: Option<&'a str>,
    ) -> RequestHead<'a> {
        RequestHead {
            method: "GET",
            path: "/ws",
            query,
            minor_version: 1,
            authorization,
            cookie: cookie.map(Cow::Borrowed),
            ..RequestHead::default()
        }
    }

    fn who(tok: &str) -> Option<Identity> {
        let auth = Auth::jwt(SECRET).unwrap();
        auth.identify(&head(Some(&format!("Bearer {tok}")), "", None))
            .ok()
    }

    fn student(user: &str) -> Option<Identity> {
        Some(Identity {
            user: user.into(),
            role: Role::Student,
        })
    }

    #[test]
    fn secrets_shorter_than_32_bytes_are_refused() {
        for short in [&b"x"[..], &[b'k'; MIN_SECRET - 1]] {
            let e = Auth::jwt(short)
                .err()
                .expect("short secret refused")
                .to_string();
            assert!(e.starts_with("--jwt-secret"), "{e}");
        }
        // No secret and no public key at all: every source is named.
        let e = Auth::jwt(b"")
            .err()
            .expect("nothing to verify with")
            .to_string();
        for flag in ["--jwt-secret", "--jwks-url", "--jwt-public-key"] {
            assert!(e.contains(flag), "{e}");
        }
        assert!(Auth::jwt(&[b'k'; MIN_SECRET]).is_ok());
    }

    #[test]
    fn a_refused_secret_is_never_shown() {
        let e = Auth::jwt(b"S3cret-too-short").err().expect("refused");
        assert!(!e.to_string().contains("S3cret"), "{e}");
        assert!(!format!("{e:?}").contains("S3cret"), "{e:?}");
        let e = check_secret(b"S3cret").expect_err("refused");
        assert!(!e.to_string().contains("S3cret"), "{e}");
    }

    #[test]
    fn valid_tokens_and_roles() {
        let exp = now() + 600;
        assert_eq!(who(&mint(SECRET, "u1", Role::Student, exp)), student("u1"));
        assert_eq!(
            who(&mint(SECRET, "boss", Role::Admin, exp)),
            Some(Identity {
                user: "boss".into(),
                role: Role::Admin
            })
        );
        // No role claim: student.
        assert_eq!(
            who(&token(serde_json::json!({"sub":"u2","exp":exp}))),
            student("u2")
        );
        // A role other than `admin` is a student's (v3).
        assert_eq!(
            who(&token(
                serde_json::json!({"sub":"u2","exp":exp,"role":"root"})
            )),
            student("u2")
        );
    }

    #[test]
    fn exp_and_nbf_with_30_s_leeway() {
        let t = now();
        let at = |exp: u64| who(&token(serde_json::json!({"sub":"u","exp":exp})));
        assert_eq!(at(t - 10), student("u"), "expired 10 s ago: within leeway");
        assert_eq!(at(t - 120), None, "expired 2 min ago");
        assert_eq!(at(t - 31 - 5), None, "expired past the 30 s leeway");
        let nbf = |nbf: u64| {
            who(&token(
                serde_json::json!({"sub":"u","exp":t + 600,"nbf":nbf}),
            ))
        };
        assert_eq!(nbf(t - 5), student("u"));
        assert_eq!(nbf(t + 10), student("u"), "nbf 10 s ahead: within leeway");
        assert_eq!(nbf(t + 120), None, "not valid yet");
    }

    #[test]
    fn required_claims() {
        let t = now() + 600;
        assert_eq!(who(&token(serde_json::json!({"sub":"u"}))), None, "no exp");
        assert_eq!(who(&token(serde_json::json!({"exp":t}))), None, "no sub");
        assert_eq!(who(&token(serde_json::json!({"sub":"","exp":t}))), None);
        assert_eq!(who(&token(serde_json::json!({"sub":7,"exp":t}))), None);
        assert_eq!(
            who(&token(serde_json::json!({"sub":"u","exp":"soon"}))),
            None
        );
        let long = "x".repeat(MAX_USER + 1);
        assert_eq!(who(&token(serde_json::json!({"sub":long,"exp":t}))), None);
    }

    #[test]
    fn algorithm_is_pinned_and_signature_checked() {
        let good = mint(SECRET, "u", Role::Admin, now() + 600);
        let parts: Vec<&str> = good.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims = parts[1];
        // alg none, with and without a signature.
        let none = b64url(br#"{"alg":"none","typ":"JWT"}"#);
        assert_eq!(who(&format!("{none}.{claims}.")), None);
        assert_eq!(who(&format!("{none}.{claims}.{}", parts[2])), None);
        // Other algorithms in the header, the HS256 signature kept (confusion).
        for alg in [
            "RS256", "ES256", "HS384", "HS512", "PS256", "EdDSA", "hs256",
        ] {
            let h = b64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            assert_eq!(who(&format!("{h}.{claims}.{}", parts[2])), None, "{alg}");
        }
        // Wrong secret, tampered claims, tampered signature.
        assert_eq!(who(&mint(b"other", "u", Role::Admin, now() + 600)), None);
        let forged =
            b64url(format!(r#"{{"sub":"admin","role":"admin","exp":{}}}"#, now() + 600).as_bytes());
        assert_eq!(who(&format!("{}.{forged}.{}", parts[0], parts[2])), None);
        let mut sig = parts[2].to_owned();
        let last = if sig.ends_with('A') { 'B' } else { 'A' };
        sig.pop();
        sig.push(last);
        assert_eq!(who(&format!("{}.{}.{sig}", parts[0], parts[1])), None);
        // Garbage.
        for junk in ["", ".", "..", "a.b.c", "not a token", "ü.ü.ü"] {
            assert_eq!(who(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn token_lookup_order_and_length_cap() {
        let auth = Auth::jwt(SECRET).unwrap();
        let exp = now() + 600;
        let a = mint(SECRET, "from-bearer", Role::Student, exp);
        let b = mint(SECRET, "from-query", Role::Student, exp);
        let c = mint(SECRET, "from-cookie", Role::Student, exp);
        let bearer = format!("Bearer {a}");
        let query = format!("x=1&token={b}");
        let cookie = format!("other=1; seatboard_token={c}");
        let id = |h: RequestHead| auth.identify(&h).ok().map(|i| i.user);
        assert_eq!(
            id(head(Some(&bearer), &query, Some(&cookie))).as_deref(),
            Some("from-bearer")
        );
        assert_eq!(
            id(head(None, &query, Some(&cookie))).as_deref(),
            Some("from-query")
        );
        assert_eq!(
            id(head(None, "", Some(&cookie))).as_deref(),
            Some("from-cookie")
        );
        assert_eq!(
            id(head(Some(&format!("bearer {a}")), "", None)).as_deref(),
            Some("from-bearer"),
            "the scheme is case-insensitive"
        );
        assert_eq!(id(head(None, "", None)), None);
        // A bad token found first is not skipped in favour of a later good one.
        assert_eq!(id(head(Some("Bearer junk"), &query, None)), None);
        // Over-long tokens are refused before any parsing.
        let pad = "a".repeat(MAX_TOKEN_BYTES);
        let long = format!("Bearer {a}{pad}");
        assert_eq!(id(head(Some(&long), "", None)), None);
    }

    #[test]
    fn an_empty_bearer_or_query_token_is_skipped() {
        let auth = Auth::jwt(SECRET).unwrap();
        let c = mint(SECRET, "from-cookie", Role::Student, now() + 600);
        let cookie = format!("seatboard_token={c}");
        let id = |h: RequestHead| auth.identify(&h).ok().map(|i| i.user);
        for (authorization, query) in [
            (None, "token="),
            (None, "x=1&token=&y=2"),
            (Some("Bearer "), "token="),
            (Some("Bearer "), ""),
        ] {
            assert_eq!(
                id(head(authorization, query, Some(&cookie))).as_deref(),
                Some("from-cookie"),
                "{authorization:?} {query:?}"
            );
        }
    }

    #[test]
    fn auth_none_trusts_the_query() {
        let auth = Auth::None;
        let id = |q: &str| auth.identify(&head(None, q, None)).ok();
        assert_eq!(id("user=u1"), student("u1"));
        assert_eq!(
            id("user=a%20b&role=admin"),
            Some(Identity {
                user: "a b".into(),
                role: Role::Admin
            })
        );
        assert_eq!(id(""), None);
        assert_eq!(id("user="), None);
        assert_eq!(id("role=admin"), None);
        assert_eq!(id(&format!("user={}", "x".repeat(MAX_USER + 1))), None);
        assert_eq!(id("user=u&role=root"), None);
    }
}
