//! Identity-provider stand-ins for tests and benches: signing keys made with
//! openssl (RSA, EC P-256/P-384, Ed25519), their public JWK and PEM, tokens
//! signed with them, and a JWKS server on loopback (plain or TLS).
#![allow(dead_code)]

use crate::tls_util::openssl;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Key types the identity provider may sign with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// RSA of this many bits.
    Rsa(u32),
    /// EC P-256.
    P256,
    /// EC P-384.
    P384,
    /// Ed25519.
    Ed25519,
}

/// A signing key and its public halves.
pub struct Key {
    /// Its type.
    pub kind: Kind,
    /// The `kid` it is published under.
    pub kid: String,
    /// The PEM `PUBLIC KEY` file.
    pub public_pem: PathBuf,
    encoding: jsonwebtoken::EncodingKey,
}

/// Unix seconds now.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Key {
    /// Makes a key of `kind` in `dir` (files named after `kid`).
    pub fn new(dir: &Path, kind: Kind, kid: &str) -> Key {
        std::fs::create_dir_all(dir).expect("key dir");
        let private = format!("{kid}.pem");
        let bits;
        let gen: Vec<&str> = match kind {
            Kind::Rsa(b) => {
                bits = format!("rsa_keygen_bits:{b}");
                vec!["-algorithm", "RSA", "-pkeyopt", &bits]
            }
            Kind::P256 => vec!["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Kind::P384 => vec!["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
            Kind::Ed25519 => vec!["-algorithm", "ed25519"],
        };
        let mut args = vec!["genpkey"];
        args.extend(gen);
        args.extend(["-out", &private]);
        openssl(dir, &args);
        let public = format!("{kid}.pub.pem");
        openssl(dir, &["pkey", "-in", &private, "-pubout", "-out", &public]);
        let der = format!("{kid}.der");
        match kind {
            Kind::Rsa(_) => openssl(
                dir,
                &[
                    "rsa",
                    "-in",
                    &private,
                    "-traditional",
                    "-outform",
                    "DER",
                    "-out",
                    &der,
                ],
            ),
            _ => openssl(
                dir,
                &[
                    "pkcs8", "-topk8", "-nocrypt", "-in", &private, "-outform", "DER", "-out", &der,
                ],
            ),
        }
        let der = std::fs::read(dir.join(&der)).expect("der");
        let encoding = match kind {
            Kind::Rsa(_) => jsonwebtoken::EncodingKey::from_rsa_der(&der),
            Kind::P256 | Kind::P384 => jsonwebtoken::EncodingKey::from_ec_der(&der),
            Kind::Ed25519 => jsonwebtoken::EncodingKey::from_ed_der(&der),
        };
        Key {
            kind,
            kid: kid.into(),
            public_pem: dir.join(public),
            encoding,
        }
    }

    /// The algorithm names this key signs with.
    pub fn algs(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Rsa(_) => &["RS256", "RS384", "RS512", "PS256"],
            Kind::P256 => &["ES256"],
            Kind::P384 => &["ES384"],
            Kind::Ed25519 => &["EdDSA"],
        }
    }

    /// The public key as a PKCS#1 PEM (`RSA PUBLIC KEY`, as `openssl rsa
    /// -RSAPublicKey_out` writes it) next to the `PUBLIC KEY` file; RSA only.
    pub fn public_pkcs1_pem(&self) -> PathBuf {
        assert!(matches!(self.kind, Kind::Rsa(_)), "PKCS#1 is RSA only");
        let dir = self.public_pem.parent().expect("key dir");
        let out = format!("{}.pkcs1.pem", self.kid);
        let public = self.public_pem.to_string_lossy().into_owned();
        openssl(
            dir,
            &[
                "rsa",
                "-pubin",
                "-in",
                &public,
                "-RSAPublicKey_out",
                "-out",
                &out,
            ],
        );
        dir.join(out)
    }

    /// The public JWK (with `kid`, `use: sig`, no `alg`).
    pub fn jwk(&self) -> Value {
        use spki::DecodePublicKey;
        let pem = std::fs::read_to_string(&self.public_pem).expect("pem");
        let b = |x: &[u8]| URL_SAFE_NO_PAD.encode(x);
        match self.kind {
            Kind::Rsa(_) => {
                use rsa::traits::PublicKeyParts;
                let k = rsa::PublicKey::from_public_key_pem(&pem).expect("rsa pem");
                json!({"kty":"RSA","kid":self.kid,"use":"sig","n":b(&k.n_bytes()),"e":b(&k.e_bytes())})
            }
            Kind::P256 => {
                let k = p256::ecdsa::VerifyingKey::from_public_key_pem(&pem).expect("p256");
                let p = k.to_sec1_point(false);
                let xy = &p.as_bytes()[1..];
                json!({"kty":"EC","crv":"P-256","kid":self.kid,"use":"sig","x":b(&xy[..32]),"y":b(&xy[32..])})
            }
            Kind::P384 => {
                let k = p384::ecdsa::VerifyingKey::from_public_key_pem(&pem).expect("p384");
                let p = k.to_sec1_point(false);
                let xy = &p.as_bytes()[1..];
                json!({"kty":"EC","crv":"P-384","kid":self.kid,"use":"sig","x":b(&xy[..48]),"y":b(&xy[48..])})
            }
            Kind::Ed25519 => {
                let k = ed25519_dalek::VerifyingKey::from_public_key_pem(&pem).expect("ed25519");
                json!({"kty":"OKP","crv":"Ed25519","kid":self.kid,"use":"sig","x":b(k.as_bytes())})
            }
        }
    }

    /// A token with this header and these claims, signed with this key as `alg`.
    pub fn sign_raw(&self, header: &Value, claims: &Value, alg: &str) -> String {
        let alg: jsonwebtoken::Algorithm = alg.parse().expect("alg");
        sign_with(&self.encoding, header, claims, alg)
    }

    /// A token for `sub` with `extra` claims, `exp` in 10 minutes, this key's
    /// `kid`, signed as `alg`.
    pub fn token(&self, alg: &str, sub: &str, extra: Value) -> String {
        let mut claims = json!({"sub": sub, "exp": now() + 600});
        if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        let header = json!({"alg": alg, "typ": "JWT", "kid": self.kid});
        self.sign_raw(&header, &claims, alg)
    }
}

/// `header.claims.signature` with `key` as `alg`.
pub fn sign_with(
    key: &jsonwebtoken::EncodingKey,
    header: &Value,
    claims: &Value,
    alg: jsonwebtoken::Algorithm,
) -> String {
    let msg = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), key, alg).expect("sign");
    format!("{msg}.{sig}")
}

/// A JWKS document of these keys.
pub fn jwks(keys: &[&Key]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}).to_string()
}

/// What the JWKS server answers.
#[derive(Clone)]
pub enum Reply {
    /// 200 with this body.
    Body(Vec<u8>),
    /// Close the connection without answering (the provider is down).
    Hang,
}

/// A JWKS server on 127.0.0.1 (plain HTTP, or TLS with a given cert), one
/// thread per connection; stops when dropped.
pub struct JwksServer {
    /// Its port.
    pub port: u16,
    reply: Arc<Mutex<Reply>>,
    hits: Arc<AtomicU64>,
    times: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl JwksServer {
    /// Serves `body` over plain HTTP on a free port.
    pub fn start(body: &str) -> JwksServer {
        Self::start_on(TcpListener::bind("127.0.0.1:0").expect("bind"), body, None)
    }

    /// Serves `body` on `listener`, over TLS when `tls` is given.
    pub fn start_on(
        listener: TcpListener,
        body: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> JwksServer {
        let port = listener.local_addr().expect("addr").port();
        let s = JwksServer {
            port,
            reply: Arc::new(Mutex::new(Reply::Body(body.as_bytes().to_vec()))),
            hits: Arc::new(AtomicU64::new(0)),
            times: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (reply, hits, times, stop) = (
            Arc::clone(&s.reply),
            Arc::clone(&s.hits),
            Arc::clone(&s.times),
            Arc::clone(&s.stop),
        );
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let conn = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                let _ = conn.set_nonblocking(false);
                let reply = reply.lock().unwrap().clone();
                hits.fetch_add(1, Relaxed);
                times.lock().unwrap().push(Instant::now());
                let tls = tls.clone();
                std::thread::spawn(move || serve(conn, reply, tls));
            }
        });
        s
    }

    /// Replaces what it answers.
    pub fn set(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    /// Serves this JWKS from now on.
    pub fn publish(&self, body: &str) {
        self.set(Reply::Body(body.as_bytes().to_vec()));
    }

    /// Requests received so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Relaxed)
    }

    /// How long ago the last request came (None: none yet).
    pub fn since_last(&self) -> Option<Duration> {
        self.times.lock().unwrap().last().map(|t| t.elapsed())
    }

    /// When each request came, in order.
    pub fn hit_times(&self) -> Vec<Instant> {
        self.times.lock().unwrap().clone()
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

fn serve(conn: TcpStream, reply: Reply, tls: Option<Arc<rustls::ServerConfig>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    match tls {
        None => answer(conn, reply),
        Some(cfg) => {
            let Ok(session) = rustls::ServerConnection::new(cfg) else {
                return;
            };
            answer(rustls::StreamOwned::new(session, conn), reply);
        }
    }
}

fn answer(mut s: impl Read + Write, reply: Reply) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&byte[..n]),
        }
    }
    let Reply::Body(body) = reply else {
        return;
    };
    let _ = s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let _ = s.write_all(&body);
    let _ = s.flush();
}

/// A TLS server config from a PEM certificate chain and PEM private key.
pub fn tls_server(cert: &Path, key: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("cert")
        .map(|c| c.expect("cert"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config"),
    )
}
