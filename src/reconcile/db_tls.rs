//! How a database connection's TLS checks the server, as the URL's mode asks:
//! PostgreSQL's `sslmode` in libpq's terms (the `postgres` client itself
//! knows only `disable`, `prefer` and `require`), and the system roots handed
//! to the MySQL client as a file (it takes roots no other way).

use crate::redis::{trust_roots, TrustError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, SignatureScheme};
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;

/// What is checked of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing: the connection is encrypted, the server not authenticated
    /// (libpq's `prefer` and `require` without a root certificate).
    Nothing,
    /// Its chain up to a trusted root, not its name (`verify-ca`, and
    /// `prefer`/`require` given `--db-ca`, as libpq does with a root file).
    Chain,
    /// Its chain and that it names the host connected to (`verify-full`).
    Full,
}

/// A PostgreSQL `sslmode` as the `postgres` client takes it, and what TLS
/// checks of the server (None: no TLS).
pub fn pg_mode(
    sslmode: Option<&str>,
    has_ca: bool,
) -> Option<(tokio_postgres::config::SslMode, Option<Verify>)> {
    use tokio_postgres::config::SslMode;
    let unverified = if has_ca {
        Verify::Chain
    } else {
        Verify::Nothing
    };
    Some(match sslmode.unwrap_or("prefer") {
        "disable" => (SslMode::Disable, None),
        // `allow` (plain first, TLS if the server insists) is taken as
        // `prefer`: the client can try only one order.
        "allow" | "prefer" => (SslMode::Prefer, Some(unverified)),
        "require" => (SslMode::Require, Some(unverified)),
        "verify-ca" => (SslMode::Require, Some(Verify::Chain)),
        "verify-full" => (SslMode::Require, Some(Verify::Full)),
        _ => return None,
    })
}

/// A TLS client checking servers as `verify` says, against `ca_pem` (each
/// certificate a root) or else the system's roots.
pub fn client_config(verify: Verify, ca_pem: Option<&[u8]>) -> Result<ClientConfig, TrustError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = match verify {
        Verify::Nothing => None,
        Verify::Chain | Verify::Full => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(trust_roots(ca_pem)?);
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .map_err(|e| TrustError::Unusable(Error::General(e.to_string())))?;
            Some(webpki)
        }
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (verify, webpki) {
        (Verify::Full, Some(webpki)) => webpki,
        (_, chain) => Arc::new(Lenient {
            provider: Arc::clone(&provider),
            chain,
        }),
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TrustError::Unusable)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(config)
}

/// Checks less than webpki: the chain only (`chain`), or nothing. The
/// handshake's signatures are checked either way, so the session is
/// encrypted to whoever holds the certificate's key.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(webpki) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The name is checked only once the chain has passed.
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algs = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algs = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Trust roots as a PEM file the MySQL client can open by path (it takes
/// roots no other way): `ca_pem` as given, else the system's roots, in an
/// anonymous in-memory file named through `/proc/self/fd`, open as long as
/// the returned `File` lives. None when there are no roots to give.
pub fn roots_file(ca_pem: Option<&[u8]>) -> std::io::Result<Option<(File, PathBuf)>> {
    let text = match ca_pem {
        Some(pem) => pem.to_vec(),
        None => {
            let certs = rustls_native_certs::load_native_certs().certs;
            if certs.is_empty() {
                return Ok(None);
            }
            pem(&certs).into_bytes()
        }
    };
    // SAFETY: memfd_create(2) with a NUL-terminated name and valid flags; the
    // descriptor it returns is owned by the `File` made from it below.
    let fd = unsafe { libc::memfd_create(c"seatboard-db-roots".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(&text)?;
    Ok(Some((file, PathBuf::from(format!("/proc/self/fd/{fd}")))))
}

/// `certs` as PEM text.
fn pem(certs: &[CertificateDer<'_>]) -> String {
    use base64::Engine;
    let mut out = String::new();
    for c in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use tokio_postgres::config::SslMode;

    #[test]
    fn each_sslmode_is_what_libpq_makes_of_it() {
        let n = Some(Verify::Nothing);
        let c = Some(Verify::Chain);
        let f = Some(Verify::Full);
        let table = [
            (None, false, SslMode::Prefer, n),
            (Some("disable"), false, SslMode::Disable, None),
            (Some("allow"), false, SslMode::Prefer, n),
            (Some("prefer"), false, SslMode::Prefer, n),
            (Some("prefer"), true, SslMode::Prefer, c),
            (Some("require"), false, SslMode::Require, n),
            (Some("require"), true, SslMode::Require, c),
            (Some("verify-ca"), false, SslMode::Require, c),
            (Some("verify-ca"), true, SslMode::Require, c),
            (Some("verify-full"), false, SslMode::Require, f),
            (Some("verify-full"), true, SslMode::Require, f),
        ];
        for (mode, ca, want_mode, want_verify) in table {
            assert_eq!(
                pg_mode(mode, ca),
                Some((want_mode, want_verify)),
                "{mode:?} with a CA: {ca}"
            );
        }
        assert_eq!(pg_mode(Some("verify_full"), false), None);
        assert_eq!(pg_mode(Some("REQUIRE"), false), None);
    }

    #[test]
    fn pem_text_reads_back_as_the_same_certificates() {
        // Lengths that end a base64 line exactly (48 bytes: 64 characters) and mid-line.
        let certs: Vec<CertificateDer<'static>> = [48usize, 130, 1]
            .iter()
            .map(|&n| CertificateDer::from((0..n).map(|i| (i * 7) as u8).collect::<Vec<u8>>()))
            .collect();
        let text = pem(&certs);
        let back: Vec<_> = CertificateDer::pem_slice_iter(text.as_bytes())
            .collect::<Result<_, _>>()
            .expect("pem");
        assert_eq!(back, certs);
        assert!(text.lines().all(|l| l.len() <= 64), "{text}");
        assert_eq!(text.matches("BEGIN CERTIFICATE").count(), 3);
    }
}
