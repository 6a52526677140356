//! A token checked against the node's keys: HS256 against `--jwt-secret` only,
//! a public-key algorithm against held keys of its own type only (a PEM key,
//! the JWKS keys of its `kid`), then its claims.

use super::claims::Rules;
use super::error::FlagError;
use super::jwks::HeldKey;
use super::keys::{Alg, PublicKey};
use super::payload::{self, Claim};
use super::refresh::{JwksSource, Missing};
use super::{Denied, Identity};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Longest token accepted (contract §4b); longer ones are refused unparsed.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Decoded header and payload up to this size fit on the stack (a typical
/// token's do); a longer token's are decoded into one `Vec`.
const STACK_DECODE: usize = 1024;

/// Verifies tokens; shared by every shard, never blocking.
pub struct Verifier {
    /// HS256 key (`--jwt-secret`), its HMAC state prepared once.
    pub(super) secret: Option<ring::hmac::Key>,
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
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
    #[serde(default, borrow)]
    kid: Option<Cow<'a, str>>,
    /// No extension is understood, so any `crit` refuses the token (RFC 7515 §4.1.11).
    #[serde(default)]
    crit: Option<IgnoredAny>,
}

/// A token cut into its parts, nothing verified yet.
struct Parts<'a> {
    alg: Alg,
    kid: Option<Cow<'a, str>>,
    claims: Claim<'a>,
    signed: &'a [u8],
    /// The signature decoded, for the public-key algorithms (HS256 decodes its own).
    sig: Vec<u8>,
    sig_b64: &'a str,
}

/// The header and payload segments of `token`, with their decoded size.
fn segments(token: &str) -> Option<(&str, &str, &str, usize)> {
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let mut it = token.split('.');
    let (h, p, s) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let room = base64::decoded_len_estimate(h.len()) + base64::decoded_len_estimate(p.len());
    Some((h, p, s, room))
}

/// The header segments JWT libraries write for HS256 (`{"alg":"HS256","typ":"JWT"}`,
/// `{"typ":"JWT","alg":"HS256"}`, `{"alg":"HS256"}`): known without decoding
/// or parsing them, which is a fifth of a token's check.
const HS256_HEADERS: [&str; 3] = [
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9",
    "eyJhbGciOiJIUzI1NiJ9",
];

/// The algorithm and `kid` of header segment `h`, decoded into `hbuf`;
/// `None` for a header that is not JSON, names `crit`, or no known algorithm.
fn header<'a>(h: &str, hbuf: &'a mut [u8]) -> Option<(Alg, Option<Cow<'a, str>>)> {
    if HS256_HEADERS.contains(&h) {
        return Some((Alg::Hs256, None));
    }
    let hlen = URL_SAFE_NO_PAD.decode_slice(h, &mut *hbuf).ok()?;
    let hbuf: &'a [u8] = hbuf;
    let header: Header<'a> = serde_json::from_slice(hbuf.get(..hlen)?).ok()?;
    if header.crit.is_some() {
        return None;
    }
    Some((Alg::parse(&header.alg)?, header.kid))
}

/// Cuts `token` (its segments from [`segments`]), decoding header and payload into `buf`.
fn split<'a>(
    token: &'a str,
    (h, p, s): (&'a str, &'a str, &'a str),
    buf: &'a mut [u8],
    rules: &Rules,
) -> Option<Parts<'a>> {
    let (hbuf, pbuf) = buf.split_at_mut(base64::decoded_len_estimate(h.len()));
    let plen = URL_SAFE_NO_PAD.decode_slice(p, pbuf).ok()?;
    let pbuf: &'a [u8] = pbuf;
    let claims = payload::read(pbuf.get(..plen)?, rules)?;
    let (alg, kid) = header(h, hbuf)?;
    let sig = match alg {
        Alg::Hs256 => Vec::new(),
        _ => URL_SAFE_NO_PAD.decode(s).ok()?,
    };
    Some(Parts {
        alg,
        kid,
        claims,
        signed: &token.as_bytes()[..h.len() + 1 + p.len()],
        sig,
        sig_b64: s,
    })
}

/// Whether `sig_b64` is the HMAC-SHA256 of `signed` under `key` (compared in constant time).
fn hs256_signed(key: &ring::hmac::Key, signed: &[u8], sig_b64: &str) -> bool {
    // 43 characters for the 32 bytes of a genuine tag; anything that does not
    // decode into this buffer is no tag.
    let mut tag = [0u8; 48];
    match URL_SAFE_NO_PAD.decode_slice(sig_b64, &mut tag) {
        Ok(n) => tag
            .get(..n)
            .is_some_and(|tag| ring::hmac::verify(key, signed, tag).is_ok()),
        Err(_) => false,
    }
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
        let (h, p, s, room) = segments(token).ok_or(Denied::Invalid)?;
        let mut stack = [0u8; STACK_DECODE];
        let mut heap = Vec::new();
        let buf = if room <= STACK_DECODE {
            &mut stack[..room]
        } else {
            heap.resize(room, 0);
            &mut heap[..]
        };
        let t = split(token, (h, p, s), buf, &self.rules).ok_or(Denied::Invalid)?;
        let signed = match t.alg {
            Alg::Hs256 => self
                .secret
                .as_ref()
                .is_some_and(|key| hs256_signed(key, t.signed, t.sig_b64)),
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
        if held.keys.iter().filter(fits).any(ok) {
            return Ok(true);
        }
        // A `kid` of the set (held, or published for another use): no fetch helps.
        if held.names(kid) {
            return Ok(false);
        }
        match jwks.missing(kid.unwrap_or("")) {
            Missing::RetryAfter(s) => Err(s),
            // A fetch that ended since `held` was read may have brought it.
            Missing::NotPublished => {
                let now = jwks.keys();
                Ok(!Arc::ptr_eq(&held, &now) && now.keys.iter().filter(fits).any(ok))
            }
        }
    }

    /// Signing keys held from the JWKS now.
    pub fn jwks_keys(&self) -> usize {
        self.jwks.as_ref().map_or(0, |j| j.keys().keys.len())
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
            secret: Some(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET)),
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
    fn a_kid_the_set_publishes_for_another_use_is_a_401_not_a_503() {
        use super::super::fetch::Target;
        use super::super::refresh::Held;
        let target = Target::parse("http://127.0.0.1:9/jwks", None).expect("a target");
        let source = Arc::new(JwksSource::new(target));
        source.hold(Held {
            keys: Vec::new(),
            unusable_kids: vec!["enc".into()],
        });
        let v = Verifier {
            jwks: Some(source),
            ..verifier()
        };
        let token = |kid: &str| {
            let h = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"ES256","kid":"{kid}"}}"#));
            let p = URL_SAFE_NO_PAD.encode(r#"{"sub":"u","exp":1800000060}"#);
            format!("{h}.{p}.AAAA")
        };
        // Never fetched: a kid the node knows nothing of waits for the JWKS.
        assert!(matches!(
            v.verify(&token("ghost"), NOW),
            Err(Denied::KeyUnavailable { .. })
        ));
        assert_eq!(v.verify(&token("enc"), NOW), Err(Denied::Invalid));
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

    #[test]
    fn the_known_hs256_headers_are_what_they_say_and_others_are_still_parsed() {
        let texts = HS256_HEADERS
            .map(|h| String::from_utf8(URL_SAFE_NO_PAD.decode(h).expect("base64")).expect("utf-8"));
        for text in &texts {
            let parsed: Header<'_> = serde_json::from_str(text).expect("a header");
            assert_eq!(parsed.alg, "HS256", "{text}");
            assert!(parsed.kid.is_none() && parsed.crit.is_none(), "{text}");
        }
        let v = verifier();
        // Each known segment, and the same header spelled otherwise (parsed).
        let spaced = r#"{ "alg": "HS256", "typ": "JWT" }"#;
        for header in texts.iter().map(String::as_str).chain([spaced]) {
            let token = with(header);
            let (msg, sig) = token.rsplit_once('.').expect("token");
            let h = msg.split_once('.').expect("token").0;
            assert_eq!(HS256_HEADERS.contains(&h), header != spaced, "{h}");
            assert!(v.verify(&token, NOW).is_ok(), "{header}");
            // The known header with a bad signature or payload is still refused.
            assert_eq!(
                v.verify(&format!("{msg}.x{sig}"), NOW),
                Err(Denied::Invalid)
            );
            assert_eq!(
                v.verify(&format!("{h}.e30.{sig}"), NOW),
                Err(Denied::Invalid)
            );
        }
        // An unknown segment that is not a header is refused.
        let p = URL_SAFE_NO_PAD.encode(r#"{"sub":"u","exp":1800000060}"#);
        assert_eq!(v.verify(&format!("eyJ.{p}.sig"), NOW), Err(Denied::Invalid));
    }

    const NOW: f64 = 1_800_000_000.0;

    /// `header.payload.signature` from raw JSON texts, signed with [`SECRET`].
    /// A token with `header` and a plain valid payload, signed with the test secret.
    fn with(header: &str) -> String {
        signed(header, r#"{"sub":"u","exp":1800000060}"#)
    }

    fn signed(header: &str, payload: &str) -> String {
        let msg = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET).expect("key");
        let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
            .expect("sign");
        format!("{msg}.{sig}")
    }

    fn with_rules(rules: Rules) -> Verifier {
        Verifier {
            rules,
            ..verifier()
        }
    }

    /// A token's user and role, or its refusal.
    type Outcome = Result<(String, shards::Role), Denied>;

    /// What `v` makes of `payload` (signed, HS256 header).
    fn outcome(v: &Verifier, payload: &str) -> Outcome {
        v.verify(&signed(r#"{"alg":"HS256","typ":"JWT"}"#, payload), NOW)
            .map(|i| (i.user.to_string(), i.role))
    }

    #[test]
    fn claims_table() {
        use shards::Role::{Admin, Student};
        let plain = verifier();
        let at = |exp: f64| format!(r#"{{"sub":"u","exp":{exp}}}"#);
        let long = |n: usize| format!(r#"{{"sub":"{}","exp":1800000060}}"#, "u".repeat(n));
        let ok = |user: &str, role| Ok((user.to_owned(), role));
        let cases: Vec<(&str, String, Outcome)> = vec![
            ("plain", r#"{"sub":"u","exp":1800000060}"#.into(), ok("u", Student)),
            ("array claims", r#"[{"sub":"u","exp":1800000060}]"#.into(), Err(Denied::Invalid)),
            ("string claims", r#""u""#.into(), Err(Denied::Invalid)),
            ("null claims", "null".into(), Err(Denied::Invalid)),
            ("not JSON", "sub=u;exp=1800000060".into(), Err(Denied::Invalid)),
            ("trailing bytes", r#"{"sub":"u","exp":1800000060} x"#.into(), Err(Denied::Invalid)),
            ("truncated", r#"{"sub":"u","exp":1800000060"#.into(), Err(Denied::Invalid)),
            ("sub missing", r#"{"exp":1800000060}"#.into(), Err(Denied::Invalid)),
            ("sub empty", r#"{"sub":"","exp":1800000060}"#.into(), Err(Denied::Invalid)),
            ("sub a number", r#"{"sub":7,"exp":1800000060}"#.into(), Err(Denied::Invalid)),
            ("sub at MAX_USER", long(super::super::claims::MAX_USER), ok(&"u".repeat(super::super::claims::MAX_USER), Student)),
            ("sub past MAX_USER", long(super::super::claims::MAX_USER + 1), Err(Denied::Invalid)),
            ("sub escaped", r#"{"sub":"\u0075\n","exp":1800000060}"#.into(), ok("u\n", Student)),
            ("exp missing", r#"{"sub":"u"}"#.into(), Err(Denied::Invalid)),
            ("exp a string", r#"{"sub":"u","exp":"1800000060"}"#.into(), Err(Denied::Invalid)),
            ("exp null", r#"{"sub":"u","exp":null}"#.into(), Err(Denied::Invalid)),
            ("exp fractional", at(NOW + 0.5), ok("u", Student)),
            ("exp in the leeway", at(NOW - 29.5), ok("u", Student)),
            ("exp past the leeway", at(NOW - 30.5), Err(Denied::Invalid)),
            ("exp negative", at(-1.0), Err(Denied::Invalid)),
            ("exp 1e3 notation", r#"{"sub":"u","exp":1.8e9}"#.into(), ok("u", Student)),
            ("nbf a string", r#"{"sub":"u","exp":1800000060,"nbf":"0"}"#.into(), Err(Denied::Invalid)),
            ("nbf null", r#"{"sub":"u","exp":1800000060,"nbf":null}"#.into(), Err(Denied::Invalid)),
            ("nbf past", r#"{"sub":"u","exp":1800000060,"nbf":1}"#.into(), ok("u", Student)),
            ("nbf in the leeway", r#"{"sub":"u","exp":1800000060,"nbf":1800000029.5}"#.into(), ok("u", Student)),
            ("nbf past the leeway", r#"{"sub":"u","exp":1800000060,"nbf":1800000030.5}"#.into(), Err(Denied::Invalid)),
            ("role admin", r#"{"sub":"u","exp":1800000060,"role":"admin"}"#.into(), ok("u", Admin)),
            ("role in an array", r#"{"sub":"u","exp":1800000060,"role":["x","admin"]}"#.into(), ok("u", Admin)),
            ("role nested array", r#"{"sub":"u","exp":1800000060,"role":[["admin"]]}"#.into(), ok("u", Student)),
            ("role an object", r#"{"sub":"u","exp":1800000060,"role":{"admin":"admin"}}"#.into(), ok("u", Student)),
            ("role escaped", r#"{"sub":"u","exp":1800000060,"r\u006fle":"\u0061dmin"}"#.into(), ok("u", Admin)),
            ("duplicate sub, last wins", r#"{"sub":"","exp":1800000060,"sub":"v"}"#.into(), ok("v", Student)),
            ("duplicate sub, last empty", r#"{"sub":"v","exp":1800000060,"sub":""}"#.into(), Err(Denied::Invalid)),
            ("duplicate exp, last wins", r#"{"sub":"u","exp":1,"exp":1800000060}"#.into(), ok("u", Student)),
            ("duplicate exp, last expired", r#"{"sub":"u","exp":1800000060,"exp":1}"#.into(), Err(Denied::Invalid)),
            ("duplicate role, last wins", r#"{"sub":"u","role":"admin","exp":1800000060,"role":"student"}"#.into(), ok("u", Student)),
            ("extra claims ignored", r#"{"a":{"b":[1,{"c":null}],"sub":""},"sub":"u","exp":1800000060,"z":[true,false,-0.5e-3,"\u00e9"]}"#.into(), ok("u", Student)),
            ("extra claim out of f64 range", r#"{"sub":"u","exp":1800000060,"x":1e400}"#.into(), Err(Denied::Invalid)),
            ("extra claim lone surrogate", r#"{"sub":"u","exp":1800000060,"x":"\ud800"}"#.into(), Err(Denied::Invalid)),
            ("extra claim bad escape", r#"{"sub":"u","exp":1800000060,"x":"\q"}"#.into(), Err(Denied::Invalid)),
            ("extra claim raw control char", "{\"sub\":\"u\",\"exp\":1800000060,\"x\":\"\u{1}\"}".into(), Err(Denied::Invalid)),
            ("extra claim trailing comma", r#"{"sub":"u","exp":1800000060,"x":[1,]}"#.into(), Err(Denied::Invalid)),
            ("extra claim 200 deep", format!(r#"{{"sub":"u","exp":1800000060,"x":{}{}}}"#, "[".repeat(200), "]".repeat(200)), Err(Denied::Invalid)),
            ("extra claim 100 deep", format!(r#"{{"sub":"u","exp":1800000060,"x":{}{}}}"#, "[".repeat(100), "]".repeat(100)), ok("u", Student)),
            // `serde_json::Value` reads an object whose first key is its raw
            // value token as the JSON text of that key's string.
            ("raw value token", r#"{"$serde_json::private::RawValue":"{\"sub\":\"r\",\"exp\":1800000060}"}"#.into(), ok("r", Student)),
            ("raw value token, not JSON", r#"{"$serde_json::private::RawValue":"{"}"#.into(), Err(Denied::Invalid)),
            ("raw value token second", r#"{"sub":"u","exp":1800000060,"$serde_json::private::RawValue":"{"}"#.into(), ok("u", Student)),
        ];
        for (what, payload, want) in &cases {
            assert_eq!(&outcome(&plain, payload), want, "{what}: {payload}");
        }
    }

    #[test]
    fn issuer_audience_and_nested_role_table() {
        use shards::Role::{Admin, Student};
        let v = with_rules(Rules::new(
            Some("https://idp".into()),
            Some("seatboard".into()),
            "realm_access.roles",
        ));
        let ok = |role| Ok(("u".to_owned(), role));
        let cases: Vec<(&str, &str, Outcome)> = vec![
            (
                "all there",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard"}"#,
                ok(Student),
            ),
            (
                "aud in an array",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":["x","seatboard"]}"#,
                ok(Student),
            ),
            (
                "aud array without it",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":["x"]}"#,
                Err(Denied::Invalid),
            ),
            (
                "aud nested array",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":[["seatboard"]]}"#,
                Err(Denied::Invalid),
            ),
            (
                "aud another",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"other"}"#,
                Err(Denied::Invalid),
            ),
            (
                "aud a number",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":1}"#,
                Err(Denied::Invalid),
            ),
            (
                "aud missing",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp"}"#,
                Err(Denied::Invalid),
            ),
            (
                "iss another",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp2","aud":"seatboard"}"#,
                Err(Denied::Invalid),
            ),
            (
                "iss in an array",
                r#"{"sub":"u","exp":1800000060,"iss":["https://idp"],"aud":"seatboard"}"#,
                Err(Denied::Invalid),
            ),
            (
                "iss missing",
                r#"{"sub":"u","exp":1800000060,"aud":"seatboard"}"#,
                Err(Denied::Invalid),
            ),
            (
                "duplicate iss, last wins",
                r#"{"sub":"u","exp":1800000060,"iss":"x","aud":"seatboard","iss":"https://idp"}"#,
                ok(Student),
            ),
            (
                "duplicate iss, last wrong",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","iss":"x"}"#,
                Err(Denied::Invalid),
            ),
            (
                "nested role",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":{"roles":["admin"]}}"#,
                ok(Admin),
            ),
            (
                "nested role string",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":{"x":1,"roles":"admin"}}"#,
                ok(Admin),
            ),
            (
                "intermediate a string",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":"admin"}"#,
                ok(Student),
            ),
            (
                "intermediate an array",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":[{"roles":["admin"]}]}"#,
                ok(Student),
            ),
            (
                "intermediate null",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":null}"#,
                ok(Student),
            ),
            (
                "duplicate intermediate, last wins",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":{"roles":["admin"]},"realm_access":{}}"#,
                ok(Student),
            ),
            (
                "duplicate inner key, last wins",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","realm_access":{"roles":[],"roles":["admin"]}}"#,
                ok(Admin),
            ),
            (
                "role at the top level is not the path",
                r#"{"sub":"u","exp":1800000060,"iss":"https://idp","aud":"seatboard","roles":["admin"]}"#,
                ok(Student),
            ),
        ];
        for (what, payload, want) in &cases {
            assert_eq!(&outcome(&v, payload), want, "{what}: {payload}");
        }
        // The role path may name a claim the other rules read too.
        let on_sub = with_rules(Rules::new(None, None, "sub"));
        assert_eq!(
            outcome(&on_sub, r#"{"sub":"admin","exp":1800000060}"#),
            Ok(("admin".to_owned(), Admin))
        );
        let on_iss = with_rules(Rules::new(None, None, "iss"));
        assert_eq!(
            outcome(&on_iss, r#"{"sub":"u","exp":1800000060,"iss":["admin"]}"#),
            Ok(("u".to_owned(), Admin)),
            "iss read for the role even when no issuer is configured"
        );
    }

    #[test]
    fn header_and_signature_table() {
        let v = verifier();
        let good = with(r#"{"alg":"HS256"}"#);
        assert!(v.verify(&good, NOW).is_ok());
        let (h, rest) = good.split_once('.').expect("token");
        let (p, s) = rest.split_once('.').expect("token");
        let other_key = {
            let key = jsonwebtoken::EncodingKey::from_secret(b"another-secret-0123456789abcdefgh")
                .expect("key");
            let sig = jsonwebtoken::crypto::sign(
                format!("{h}.{p}").as_bytes(),
                &key,
                jsonwebtoken::Algorithm::HS256,
            )
            .expect("sign");
            format!("{h}.{p}.{sig}")
        };
        // The same 32 bytes with the unused low bits of the last character set.
        const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let last = ALPHABET.find(&s[s.len() - 1..]).expect("alphabet");
        let flipped = &ALPHABET[last + 1..last + 2];
        let bad: Vec<(&str, String)> = vec![
            ("bad base64 header", format!("{h}*.{p}.{s}")),
            ("bad base64 payload", format!("{h}.{p}*.{s}")),
            ("bad base64 signature", format!("{h}.{p}.{s}*")),
            ("padded signature", format!("{h}.{p}.{s}=")),
            ("padded payload", format!("{h}.{p}=.{s}")),
            (
                "signature one character short",
                format!("{h}.{p}.{}", &s[..s.len() - 1]),
            ),
            ("signature longer", format!("{h}.{p}.{s}AAAA")),
            (
                "signature non-canonical last character",
                format!("{h}.{p}.{}{}", &s[..s.len() - 1], flipped),
            ),
            ("signature empty", format!("{h}.{p}.")),
            ("signature of another key", other_key),
            ("two parts", format!("{h}.{p}")),
            ("four parts", format!("{h}.{p}.{s}.")),
            (
                "header not JSON",
                signed("alg=HS256", r#"{"sub":"u","exp":1800000060}"#),
            ),
            ("header without alg", with(r#"{"typ":"JWT"}"#)),
            ("alg none", with(r#"{"alg":"none"}"#)),
            ("alg lower case", with(r#"{"alg":"hs256"}"#)),
            ("alg HS384", with(r#"{"alg":"HS384"}"#)),
            ("alg a number", with(r#"{"alg":256}"#)),
            ("alg twice", with(r#"{"alg":"HS256","alg":"HS256"}"#)),
            ("crit empty", with(r#"{"alg":"HS256","crit":[]}"#)),
            ("crit a string", with(r#"{"alg":"HS256","crit":"exp"}"#)),
            ("kid a number", with(r#"{"alg":"HS256","kid":1}"#)),
        ];
        for (what, token) in &bad {
            assert_eq!(
                v.verify(token, NOW),
                Err(Denied::Invalid),
                "{what}: {token}"
            );
        }
        let fine: Vec<(&str, String)> = vec![
            ("alg escaped", with(r#"{"alg":"HS\u0032\u00356"}"#)),
            (
                "kid and typ",
                with(r#"{"typ":"JWT","kid":"k1","alg":"HS256"}"#),
            ),
            ("kid null", with(r#"{"alg":"HS256","kid":null}"#)),
            // `Option` reads a JSON null as absent: a null `crit` is no extension.
            ("crit null", with(r#"{"alg":"HS256","crit":null}"#)),
            (
                "unknown header member",
                with(r#"{"alg":"HS256","x":{"y":[1e400]}}"#),
            ),
            ("header as an array", with(r#"["HS256"]"#)),
        ];
        for (what, token) in &fine {
            assert!(v.verify(token, NOW).is_ok(), "{what}: {token}");
        }
        let no_secret = Verifier {
            secret: None,
            ..verifier()
        };
        assert_eq!(no_secret.verify(&good, NOW), Err(Denied::Invalid));
    }
}
