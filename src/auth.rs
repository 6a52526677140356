//! Who is connecting: HS256 JWT verification, or `?user=` in `--auth none` mode.

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use shards::http_head::{RequestHead, MAX_TOKEN};
use shards::Role;

/// The authenticated identity of an upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User id (`sub`).
    pub user: String,
    /// Role from the token.
    pub role: Role,
}

/// How identities are established.
pub enum Auth {
    /// HS256 with this key.
    Jwt(Box<DecodingKey>, Box<Validation>),
    /// Trust `?user=` and `?role=` (tests, demo).
    None,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    role: Option<String>,
}

/// Longest user id accepted.
const MAX_USER: usize = 256;

/// Shortest HS256 secret `serve` accepts: 256 bits, the hash's own size (RFC 7518 §3.2).
pub const MIN_SECRET: usize = 32;

fn role_of(s: Option<&str>) -> Option<Role> {
    match s {
        None | Some("student") => Some(Role::Student),
        Some("admin") => Some(Role::Admin),
        Some(_) => None,
    }
}

impl Auth {
    /// HS256 verification with at most 30 s of leeway on `exp`/`nbf`; a secret
    /// shorter than [`MIN_SECRET`] bytes is refused (it could be brute-forced offline
    /// from any one token).
    pub fn jwt(secret: &[u8]) -> Result<Auth, String> {
        if secret.len() < MIN_SECRET {
            return Err(format!(
                "--jwt-secret (SEATBOARD_JWT_SECRET) must be at least {MIN_SECRET} bytes, got {}; make one with `openssl rand -base64 48`",
                secret.len()
            ));
        }
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 30;
        v.validate_nbf = true;
        v.validate_exp = true;
        v.set_required_spec_claims(&["exp", "sub"]);
        let key =
            DecodingKey::from_secret(secret).map_err(|e| format!("invalid --jwt-secret: {e}"))?;
        Ok(Auth::Jwt(Box::new(key), Box::new(v)))
    }

    /// The identity behind a request head, or `None` (401).
    pub fn identify(&self, head: &RequestHead) -> Option<Identity> {
        match self {
            Auth::None => {
                let user = head
                    .query_param("user")
                    .filter(|u| !u.is_empty() && u.len() <= MAX_USER)?;
                let role = role_of(head.query_param("role").as_deref())?;
                Some(Identity { user, role })
            }
            Auth::Jwt(key, validation) => {
                let token = head.token().filter(|t| t.len() <= MAX_TOKEN)?;
                let data = jsonwebtoken::decode::<Claims>(&token, key, validation).ok()?;
                let c = data.claims;
                if c.sub.is_empty() || c.sub.len() > MAX_USER {
                    return None;
                }
                let role = role_of(c.role.as_deref())?;
                Some(Identity { user: c.sub, role })
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
    jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
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
        jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key).unwrap()
    }

    fn head(authorization: Option<&str>, query: &str, cookie: Option<&str>) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            path: "/ws".into(),
            query: query.into(),
            minor_version: 1,
            authorization: authorization.map(str::to_owned),
            cookie: cookie.map(str::to_owned),
            ..RequestHead::default()
        }
    }

    fn who(tok: &str) -> Option<Identity> {
        let auth = Auth::jwt(SECRET).unwrap();
        auth.identify(&head(Some(&format!("Bearer {tok}")), "", None))
    }

    fn student(user: &str) -> Option<Identity> {
        Some(Identity {
            user: user.into(),
            role: Role::Student,
        })
    }

    #[test]
    fn secrets_shorter_than_32_bytes_are_refused() {
        for short in [&b""[..], b"x", &[b'k'; MIN_SECRET - 1]] {
            let e = Auth::jwt(short).err().expect("short secret refused");
            assert!(e.starts_with("--jwt-secret"), "{e}");
        }
        assert!(Auth::jwt(&[b'k'; MIN_SECRET]).is_ok());
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
        // An unknown role is not silently a student.
        assert_eq!(
            who(&token(
                serde_json::json!({"sub":"u2","exp":exp,"role":"root"})
            )),
            None
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
        let id = |h: RequestHead| auth.identify(&h).map(|i| i.user);
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
        let pad = "a".repeat(MAX_TOKEN);
        let long = format!("Bearer {a}{pad}");
        assert_eq!(id(head(Some(&long), "", None)), None);
    }

    #[test]
    fn auth_none_trusts_the_query() {
        let auth = Auth::None;
        let id = |q: &str| auth.identify(&head(None, q, None));
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
