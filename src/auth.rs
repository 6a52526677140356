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

fn role_of(s: Option<&str>) -> Option<Role> {
    match s {
        None | Some("student") => Some(Role::Student),
        Some("admin") => Some(Role::Admin),
        Some(_) => None,
    }
}

impl Auth {
    /// HS256 verification with at most 30 s of leeway on `exp`/`nbf`.
    pub fn jwt(secret: &[u8]) -> Result<Auth, String> {
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
