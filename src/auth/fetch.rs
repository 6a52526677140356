//! One bounded HTTP(S) GET of the JWKS, on ureq with rustls (ring):
//! `https://` verified against the system roots or `--jwks-ca`, `http://`
//! only to a loopback address; no proxy, no redirect, 5 s for the whole
//! fetch, the body capped at [`MAX_JWKS_BYTES`].

use super::error::{FlagError, ShownUrl, UrlProblem};
use super::jwks::{JwksError, MAX_JWKS_BYTES};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use ureq::http::uri::Scheme;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// Longest a whole fetch may take (resolve, connect, TLS, request, body).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest response head read.
const MAX_HEAD: usize = 16 * 1024;

/// Where the JWKS is, checked once at start, and the client that fetches it.
pub struct Target {
    url: String,
    agent: ureq::Agent,
}

fn loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The default resolver, refusing a plain `http://` name (`localhost`) that
/// resolves to anything but loopback.
#[derive(Debug, Default)]
struct PlainOnlyToLoopback(DefaultResolver);

impl Resolver for PlainOnlyToLoopback {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let addrs = self.0.resolve(uri, config, timeout)?;
        if uri.scheme() != Some(&Scheme::HTTPS) && !addrs.iter().all(|a| a.ip().is_loopback()) {
            let host = uri.host().unwrap_or_default();
            let e = std::io::Error::other(format!("{host} is not a loopback address"));
            return Err(ureq::Error::Io(e));
        }
        Ok(addrs)
    }
}

/// The client: never through a proxy, no redirect followed (a 3xx comes back
/// as the response), no idle connection kept, the deadline over everything.
fn agent(roots: Vec<rustls::pki_types::CertificateDer<'static>>) -> ureq::Agent {
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let roots = roots.iter().map(|c| Certificate::from_der(c).to_owned());
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::from(roots))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    let config = ureq::Agent::config_builder()
        .tls_config(tls)
        .proxy(None)
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(FETCH_TIMEOUT))
        .max_response_header_size(MAX_HEAD)
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .user_agent("seatboard")
        .accept("application/json, application/jwk-set+json")
        .build();
    ureq::Agent::with_parts(
        config,
        DefaultConnector::new(),
        PlainOnlyToLoopback::default(),
    )
}

impl Target {
    /// Checks a `--jwks-url` (with its `--jwks-ca` PEM bundle, if any); the
    /// error names the flag.
    pub fn parse(url: &str, ca_pem: Option<&[u8]>) -> Result<Target, FlagError> {
        let bad = |problem| FlagError::JwksUrl {
            url: ShownUrl::new(url),
            problem,
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad(UrlProblem::Scheme));
        };
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        if authority.contains('@') || rest.contains(['#', ' ', '\r', '\n']) {
            return Err(bad(UrlProblem::Extras));
        }
        let uri: Uri = url.parse().map_err(|e| bad(UrlProblem::Invalid(e)))?;
        let host = uri.host().unwrap_or_default();
        let port = authority.strip_prefix(host).unwrap_or(authority);
        if !port.is_empty()
            && port
                .strip_prefix(':')
                .and_then(|p| p.parse::<u16>().ok())
                .is_none()
        {
            return Err(bad(UrlProblem::Port));
        }
        if host.is_empty() {
            return Err(bad(UrlProblem::NoHost));
        }
        if !tls && !loopback(host) {
            return Err(bad(UrlProblem::PlainNotLoopback));
        }
        let roots = if tls {
            crate::redis::trust_roots(ca_pem).map_err(FlagError::JwksCa)?
        } else {
            Vec::new()
        };
        Ok(Target {
            url: url.to_owned(),
            agent: agent(roots),
        })
    }

    /// GETs the document: its body on a 200, an error otherwise.
    pub fn get(&self) -> Result<Vec<u8>, JwksError> {
        let mut response = self.agent.get(&self.url).call().map_err(describe)?;
        let code = response.status().as_u16();
        if code != 200 {
            return Err(JwksError::Status(code));
        }
        let body = response.body_mut();
        if body
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(JwksError::TooLarge);
        }
        body.with_config()
            .limit(MAX_JWKS_BYTES as u64)
            .read_to_vec()
            .map_err(describe)
    }
}

/// A failed fetch in the words of the log line.
fn describe(e: ureq::Error) -> JwksError {
    match e {
        ureq::Error::BodyExceedsLimit(_) => JwksError::TooLarge,
        ureq::Error::Timeout(_) => JwksError::TimedOut,
        e => JwksError::Fetch(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(Target::parse("http://127.0.0.1:8080/jwks", None).is_ok());
        assert!(Target::parse("http://localhost/jwks", None).is_ok());
        assert!(Target::parse("http://[::1]:9/certs", None).is_ok());
        assert!(Target::parse("http://127.0.0.1:81", None).is_ok());
        for bad in [
            "http://10.0.0.1/jwks",
            "http://idp.example.edu/jwks",
            "ftp://127.0.0.1/x",
            "127.0.0.1/jwks",
            "http://u:p@127.0.0.1/",
            "http://127.0.0.1:x/",
            "http://127.0.0.1:/",
            "http://127.0.0.1:70000/",
            "https:///x",
            "http://127.0.0.1/a#b",
        ] {
            let e = Target::parse(bad, None)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("--jwks-url"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_refused_url_never_shows_its_user_info() {
        for url in [
            "https://svc:S3cret@idp.example/jwks",
            "http://u:S3cret@127.0.0.1/",
            "https://u:p/S3cret@idp.example/jwks",
            "https://u:S3cret@idp.example/a#b",
            "ftp://u:S3cret@idp.example/",
        ] {
            let Err(e) = Target::parse(url, None) else {
                panic!("{url} accepted");
            };
            let text = e.to_string();
            assert!(text.contains("--jwks-url"), "{url}: {text}");
            assert!(!text.contains("S3cret"), "{url}: {text}");
            assert!(!format!("{e:?}").contains("S3cret"), "{url}: {e:?}");
        }
    }
}
