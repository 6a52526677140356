//! A viewer's HS256 token (role `student`), for a deployment that checks
//! tokens with a shared secret and no tokens file was given.

/// The token of `user`, valid until `exp_unix_s`; empty if it cannot be made.
pub fn mint(secret: &[u8], user: &str, exp_unix_s: u64) -> String {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        role: &'a str,
        exp: u64,
    }
    let claims = Claims {
        sub: user,
        role: shards::Role::Student.as_str(),
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
