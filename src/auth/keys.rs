//! Public keys a token may be signed with: parsed and checked once (from a PEM
//! file or a JWK) with the RustCrypto crates, each bound to its own key type
//! and curve; signatures verified with ring (its P-256 is ~4x faster per
//! handshake than RustCrypto's, its RSA ~2x).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rsa::pkcs1::DecodeRsaPublicKey;
use spki::DecodePublicKey;

/// The signature algorithms a token may name (contract §4); anything else,
/// `none` included, is refused before any key is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// HMAC SHA-256 with `--jwt-secret` (never checked against a public key).
    Hs256,
    /// RSASSA-PKCS1-v1_5 SHA-256.
    Rs256,
    /// RSASSA-PKCS1-v1_5 SHA-384.
    Rs384,
    /// RSASSA-PKCS1-v1_5 SHA-512.
    Rs512,
    /// RSASSA-PSS SHA-256.
    Ps256,
    /// ECDSA P-256 SHA-256.
    Es256,
    /// ECDSA P-384 SHA-384.
    Es384,
    /// Ed25519.
    EdDsa,
}

impl Alg {
    /// The algorithm a JOSE `alg` names, if it is one of ours (case-sensitive, RFC 7515).
    pub fn parse(s: &str) -> Option<Alg> {
        Some(match s {
            "HS256" => Alg::Hs256,
            "RS256" => Alg::Rs256,
            "RS384" => Alg::Rs384,
            "RS512" => Alg::Rs512,
            "PS256" => Alg::Ps256,
            "ES256" => Alg::Es256,
            "ES384" => Alg::Es384,
            "EdDSA" => Alg::EdDsa,
            _ => return None,
        })
    }
}

/// Shortest RSA modulus accepted (NIST SP 800-131A); shorter keys are ignored.
pub const MIN_RSA_BITS: usize = 2048;

/// A public key of one type; it verifies only its own algorithms.
#[derive(Debug, Clone)]
pub enum PublicKey {
    /// RSA (RS256/RS384/RS512/PS256): big-endian modulus and exponent.
    Rsa {
        /// Modulus.
        n: Vec<u8>,
        /// Public exponent.
        e: Vec<u8>,
    },
    /// EC P-256 (ES256): the uncompressed SEC1 point.
    P256(Vec<u8>),
    /// EC P-384 (ES384): the uncompressed SEC1 point.
    P384(Vec<u8>),
    /// Ed25519 (EdDSA).
    Ed25519([u8; 32]),
}

/// Why a key was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// An RSA key shorter than [`MIN_RSA_BITS`]: ignored, not an error of the set.
    TooShort(usize),
    /// Not a key of a supported type (another `kty`, another curve): ignored.
    Unsupported(String),
    /// A supported key with missing or broken fields.
    Malformed(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::TooShort(bits) => {
                write!(f, "RSA key of {bits} bits (at least {MIN_RSA_BITS} needed)")
            }
            KeyError::Unsupported(what) => write!(f, "unsupported key: {what}"),
            KeyError::Malformed(what) => write!(f, "malformed key: {what}"),
        }
    }
}

impl std::error::Error for KeyError {}

fn b64(field: &str, v: Option<&str>) -> Result<Vec<u8>, KeyError> {
    let v = v.ok_or_else(|| KeyError::Malformed(format!("no `{field}`")))?;
    URL_SAFE_NO_PAD
        .decode(v.trim_end_matches('='))
        .map_err(|_| KeyError::Malformed(format!("`{field}` is not base64url")))
}

fn rsa_key(key: rsa::PublicKey) -> Result<PublicKey, KeyError> {
    use rsa::traits::PublicKeyParts;
    let bits = key.n().bit_width_vartime() as usize;
    if bits < MIN_RSA_BITS {
        return Err(KeyError::TooShort(bits));
    }
    Ok(PublicKey::Rsa {
        n: key.n_bytes().into_vec(),
        e: key.e_bytes().into_vec(),
    })
}

fn p256_key(k: p256::ecdsa::VerifyingKey) -> PublicKey {
    PublicKey::P256(k.to_sec1_point(false).as_bytes().to_vec())
}

fn p384_key(k: p384::ecdsa::VerifyingKey) -> PublicKey {
    PublicKey::P384(k.to_sec1_point(false).as_bytes().to_vec())
}

impl PublicKey {
    /// An RSA key from its JWK `n` and `e`.
    pub fn rsa(n: Option<&str>, e: Option<&str>) -> Result<PublicKey, KeyError> {
        let (n, e) = (b64("n", n)?, b64("e", e)?);
        let n = n.strip_prefix(&[0u8][..]).unwrap_or(&n);
        if n.len() * 8 < MIN_RSA_BITS {
            return Err(KeyError::TooShort(n.len() * 8));
        }
        let key = rsa::PublicKey::new(
            rsa::BoxedUint::from_be_slice_vartime(n),
            rsa::BoxedUint::from_be_slice_vartime(&e),
        )
        .map_err(|err| KeyError::Malformed(format!("RSA: {err}")))?;
        rsa_key(key)
    }

    /// An EC key from its JWK `crv`, `x` and `y` (P-256 or P-384).
    pub fn ec(crv: Option<&str>, x: Option<&str>, y: Option<&str>) -> Result<PublicKey, KeyError> {
        let crv = crv.ok_or_else(|| KeyError::Malformed("EC key without `crv`".into()))?;
        let size = match crv {
            "P-256" => 32,
            "P-384" => 48,
            other => return Err(KeyError::Unsupported(format!("EC curve {other}"))),
        };
        let (x, y) = (b64("x", x)?, b64("y", y)?);
        if x.len() != size || y.len() != size {
            return Err(KeyError::Malformed(format!(
                "{crv} coordinates of the wrong size"
            )));
        }
        let mut sec1 = Vec::with_capacity(1 + 2 * size);
        sec1.push(4);
        sec1.extend_from_slice(&x);
        sec1.extend_from_slice(&y);
        let off_curve = |_| KeyError::Malformed(format!("not a point of {crv}"));
        Ok(if size == 32 {
            p256_key(p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).map_err(off_curve)?)
        } else {
            p384_key(p384::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).map_err(off_curve)?)
        })
    }

    /// An OKP key from its JWK `crv` and `x` (Ed25519 only).
    pub fn okp(crv: Option<&str>, x: Option<&str>) -> Result<PublicKey, KeyError> {
        match crv {
            Some("Ed25519") => {}
            Some(other) => return Err(KeyError::Unsupported(format!("OKP curve {other}"))),
            None => return Err(KeyError::Malformed("OKP key without `crv`".into())),
        }
        let x = b64("x", x)?;
        let bytes: &[u8; 32] = x
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Malformed("Ed25519 key not 32 bytes".into()))?;
        ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .map(|k| PublicKey::Ed25519(k.to_bytes()))
            .map_err(|_| KeyError::Malformed("not an Ed25519 point".into()))
    }

    /// The key of a PEM `PUBLIC KEY` (SubjectPublicKeyInfo: RSA, EC P-256/P-384
    /// or Ed25519) or `RSA PUBLIC KEY` (PKCS#1).
    pub fn from_pem(pem: &str) -> Result<PublicKey, KeyError> {
        if let Ok(k) = rsa::PublicKey::from_public_key_pem(pem) {
            return rsa_key(k);
        }
        if let Ok(k) = rsa::PublicKey::from_pkcs1_pem(pem) {
            return rsa_key(k);
        }
        if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_pem(pem) {
            return Ok(p256_key(k));
        }
        if let Ok(k) = p384::ecdsa::VerifyingKey::from_public_key_pem(pem) {
            return Ok(p384_key(k));
        }
        if let Ok(k) = ed25519_dalek::VerifyingKey::from_public_key_pem(pem) {
            return Ok(PublicKey::Ed25519(k.to_bytes()));
        }
        Err(KeyError::Unsupported(
            "not a PEM `PUBLIC KEY` of RSA, EC P-256/P-384 or Ed25519, nor an `RSA PUBLIC KEY`"
                .into(),
        ))
    }

    /// Whether this key's type and curve go with `alg`.
    pub fn fits(&self, alg: Alg) -> bool {
        matches!(
            (self, alg),
            (
                PublicKey::Rsa { .. },
                Alg::Rs256 | Alg::Rs384 | Alg::Rs512 | Alg::Ps256
            ) | (PublicKey::P256(_), Alg::Es256)
                | (PublicKey::P384(_), Alg::Es384)
                | (PublicKey::Ed25519(_), Alg::EdDsa)
        )
    }

    /// Checks `sig` over `msg` (the token's `header.payload`) with `alg`; false
    /// for an algorithm that does not fit the key.
    pub fn verify(&self, alg: Alg, msg: &[u8], sig: &[u8]) -> bool {
        use ring::signature as sg;
        let rsa = |n: &Vec<u8>, e: &Vec<u8>, params: &sg::RsaParameters| {
            sg::RsaPublicKeyComponents { n, e }
                .verify(params, msg, sig)
                .is_ok()
        };
        let unparsed = |params: &'static dyn sg::VerificationAlgorithm, key: &[u8]| {
            sg::UnparsedPublicKey::new(params, key)
                .verify(msg, sig)
                .is_ok()
        };
        match (self, alg) {
            (PublicKey::Rsa { n, e }, Alg::Rs256) => rsa(n, e, &sg::RSA_PKCS1_2048_8192_SHA256),
            (PublicKey::Rsa { n, e }, Alg::Rs384) => rsa(n, e, &sg::RSA_PKCS1_2048_8192_SHA384),
            (PublicKey::Rsa { n, e }, Alg::Rs512) => rsa(n, e, &sg::RSA_PKCS1_2048_8192_SHA512),
            (PublicKey::Rsa { n, e }, Alg::Ps256) => rsa(n, e, &sg::RSA_PSS_2048_8192_SHA256),
            (PublicKey::P256(k), Alg::Es256) => unparsed(&sg::ECDSA_P256_SHA256_FIXED, k),
            (PublicKey::P384(k), Alg::Es384) => unparsed(&sg::ECDSA_P384_SHA384_FIXED, k),
            (PublicKey::Ed25519(k), Alg::EdDsa) => unparsed(&sg::ED25519, k),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 2048-bit RSA public key as SubjectPublicKeyInfo (`openssl pkey -pubout`)...
    const SPKI: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAnnpWFqglxkIzelVbHA5K
SIT0ehYY1hP7H3Xj8VKNHnXuWWwUr/xXf3XD8scSM/Nn9ceF3V2A6OupihBrv9A8
5Aa9yQq3b1UCpNJRkLRhF1rKVHMIg8NyBC16nZFwrRlIX2r/7Y9QKBKNKaSkwcIo
i/xq/1wGExrV3yow37o9EvIxBSA5o50Puk9lRS3M/fDCXUix3LiV6Yn4xpFqDcOl
lkwVNgvW8K26U97lB04u/zoHxNVPGnWPj2HrnOTXTIB9MOCLS/A78xxGegqSEmaX
vzHTEu3SOgTnAIh+kidMV3/7tREqPZqraB/Xwth+1eP6w8ZrMFzZM7YVGCG5Gyqk
AQIDAQAB
-----END PUBLIC KEY-----
";

    /// ... and as PKCS#1 (`openssl rsa -pubin -RSAPublicKey_out`).
    const PKCS1: &str = "-----BEGIN RSA PUBLIC KEY-----
MIIBCgKCAQEAnnpWFqglxkIzelVbHA5KSIT0ehYY1hP7H3Xj8VKNHnXuWWwUr/xX
f3XD8scSM/Nn9ceF3V2A6OupihBrv9A85Aa9yQq3b1UCpNJRkLRhF1rKVHMIg8Ny
BC16nZFwrRlIX2r/7Y9QKBKNKaSkwcIoi/xq/1wGExrV3yow37o9EvIxBSA5o50P
uk9lRS3M/fDCXUix3LiV6Yn4xpFqDcOllkwVNgvW8K26U97lB04u/zoHxNVPGnWP
j2HrnOTXTIB9MOCLS/A78xxGegqSEmaXvzHTEu3SOgTnAIh+kidMV3/7tREqPZqr
aB/Xwth+1eP6w8ZrMFzZM7YVGCG5GyqkAQIDAQAB
-----END RSA PUBLIC KEY-----
";

    fn rsa_parts(k: &PublicKey) -> (Vec<u8>, Vec<u8>) {
        match k {
            PublicKey::Rsa { n, e } => (n.clone(), e.clone()),
            other => panic!("not RSA: {other:?}"),
        }
    }

    #[test]
    fn a_pkcs1_rsa_pem_is_the_same_key_as_its_spki_form() {
        let spki = PublicKey::from_pem(SPKI).expect("SPKI");
        let pkcs1 = PublicKey::from_pem(PKCS1).expect("PKCS#1");
        assert_eq!(rsa_parts(&spki), rsa_parts(&pkcs1));
        let (n, e) = rsa_parts(&pkcs1);
        assert_eq!((n.len(), e.as_slice()), (256, &[1u8, 0, 1][..]));
        assert!(pkcs1.fits(Alg::Rs256) && pkcs1.fits(Alg::Ps256));
        assert!(!pkcs1.fits(Alg::Es256));
    }

    #[test]
    fn a_pkcs1_pem_that_is_no_key_or_a_short_one_is_refused() {
        use base64::engine::general_purpose::STANDARD;
        let pem = |der: &[u8]| {
            let b64 = STANDARD.encode(der);
            let lines: Vec<&str> = b64
                .as_bytes()
                .chunks(64)
                .map(|l| std::str::from_utf8(l).expect("base64 is ASCII"))
                .collect();
            format!(
                "-----BEGIN RSA PUBLIC KEY-----\n{}\n-----END RSA PUBLIC KEY-----\n",
                lines.join("\n")
            )
        };
        assert!(PublicKey::from_pem(&pem(b"junk")).is_err());
        // SEQUENCE { INTEGER n (1024 bits), INTEGER 65537 }.
        let mut der = vec![0x30, 0x81, 0x89, 0x02, 0x81, 0x81, 0x00];
        der.extend([0xc5; 128]);
        der.extend([0x02, 0x03, 0x01, 0x00, 0x01]);
        assert_eq!(
            PublicKey::from_pem(&pem(&der)).err(),
            Some(KeyError::TooShort(1024))
        );
    }
}
