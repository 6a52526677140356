//! The one Redis layer every Redis client of seatboard goes through: seed
//! URIs, TLS (`rediss://`, rustls, verified against `--redis-ca` or the
//! system roots), AUTH from the URI, standalone or cluster mode, timeouts and
//! the reconnect backoff. A command connection to a node is opened one way
//! ([`Redis::connect_node`]); `commands` is the command client (slot-routed in
//! a cluster), `pubsub` the pub/sub source of `serve` and `analytics` (its raw
//! connection and streaming RESP reader, its dialer), `state_keys` the scan
//! for the courses with a state hash.

pub mod backoff;
pub mod commands;
pub mod config;
pub mod error;
pub mod pubsub;
pub mod state_keys;

pub use config::{PubSubMode, RedisFlags, RedisMode, RedisTarget};
pub use error::{ConfigError, ConnectError, Error, NodeError, TrustError};

use crate::slots::{Addr, SlotMap};
use redis::{ConnectionAddr, ConnectionInfo, TlsCertificates};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long a TCP connect (and the TLS/AUTH handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one command or pipeline may wait on a read or a write.
pub const IO_TIMEOUT: Duration = Duration::from_millis(1000);

/// The mode actually in use once known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One Redis.
    Standalone,
    /// A Redis Cluster.
    Cluster,
}

/// Escapes glob metacharacters so a prefix matches itself in PSUBSCRIBE/SCAN MATCH.
pub fn glob_escape(prefix: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

/// One Redis deployment as configured: shared by every client of a process.
pub struct Redis {
    seeds: Vec<ConnectionInfo>,
    tls: Option<Tls>,
    flag_mode: RedisMode,
    /// The pub/sub flavour asked for (meaningful in cluster mode).
    pub pubsub: PubSubMode,
    resolved: OnceLock<Mode>,
    /// Nodes learned from slot maps (seeds for later reconnects).
    known: Mutex<Vec<Addr>>,
    /// Cluster primaries reachable at the last check (for `/healthz`).
    pub nodes_up: AtomicU64,
}

/// A deployment's one TLS configuration, built once from one source of trust
/// (the `--redis-ca` PEM, or the system roots without it): as rustls's
/// configuration for the connections opened here, and as the redis crate's
/// certificates for the command client (the crate takes PEM only, never a
/// rustls configuration).
struct Tls {
    /// The crate's form: the same PEM (`None`: the system roots, which the
    /// crate loads as [`trust_roots`] does).
    certs: Option<TlsCertificates>,
    rustls: Arc<rustls::ClientConfig>,
}

pub(crate) fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, TrustError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(trust_roots(ca_pem)?);
    Ok(rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The certificates a TLS client trusts: every one of `ca_pem` (each checked
/// as a trust anchor), or the system's roots without it.
pub(crate) fn trust_roots(
    ca_pem: Option<&[u8]>,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TrustError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let Some(pem) = ca_pem else {
        return Ok(rustls_native_certs::load_native_certs().certs);
    };
    let mut roots = rustls::RootCertStore::empty();
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(TrustError::NotPem)?;
        roots.add(cert.clone()).map_err(TrustError::Unusable)?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(TrustError::Empty);
    }
    Ok(certs)
}

impl Redis {
    /// Checks the flags; the error names the flag (for a usage error, exit 2).
    pub fn from_flags(f: &RedisFlags) -> Result<Arc<Redis>, ConfigError> {
        let seeds = config::seeds(&f.redis)?;
        let tls = seeds
            .first()
            .is_some_and(|s| matches!(s.addr(), ConnectionAddr::TcpTls { .. }));
        let ca_pem = match &f.redis_ca {
            Some(p) => Some(
                std::fs::read(p).map_err(|source| ConfigError::CaUnreadable {
                    path: p.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        let unusable = |source| ConfigError::CaUnusable {
            path: f.redis_ca.clone().unwrap_or_default(),
            source,
        };
        // A `--redis-ca` is checked without a TLS URI too: a bad file should
        // not wait for one to fail.
        let cfg = (tls || ca_pem.is_some())
            .then(|| tls_config(ca_pem.as_deref()).map_err(unusable))
            .transpose()?;
        let tls = cfg.filter(|_| tls).map(|cfg| Tls {
            certs: ca_pem.map(|root_cert| TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            }),
            rustls: Arc::new(cfg),
        });
        Ok(Arc::new(Redis {
            seeds,
            tls,
            flag_mode: f.redis_mode,
            pubsub: f.pubsub,
            resolved: OnceLock::new(),
            known: Mutex::new(Vec::new()),
            nodes_up: AtomicU64::new(0),
        }))
    }

    fn certs(&self) -> Option<TlsCertificates> {
        self.tls.as_ref()?.certs.clone()
    }

    /// The seed's connection details moved to `addr` (same TLS and credentials).
    fn info_for(&self, addr: &Addr) -> ConnectionInfo {
        let (host, port) = addr.clone();
        let a = if self.tls.is_some() {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        self.seeds[0].clone().set_addr(a)
    }

    fn addr_of(info: &ConnectionInfo) -> Option<Addr> {
        match info.addr() {
            ConnectionAddr::Tcp(h, p) => Some((h.clone(), *p)),
            ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
            _ => None,
        }
    }

    /// Seeds first, then nodes learned from slot maps.
    pub fn candidates(&self) -> Vec<Addr> {
        let mut v: Vec<Addr> = self.seeds.iter().filter_map(Self::addr_of).collect();
        for a in self.known.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if !v.contains(a) {
                v.push(a.clone());
            }
        }
        v
    }

    /// Remembers the nodes of a fresh slot map (reconnect seeds after a failover).
    pub fn learn(&self, map: &SlotMap) {
        let mut k = self.known.lock().unwrap_or_else(|e| e.into_inner());
        k.clear();
        k.extend(map.nodes().iter().cloned());
    }

    /// The one way a connection to one node is opened (TCP, TLS, `AUTH` from
    /// the URI): within [`CONNECT_TIMEOUT`], then every read and write
    /// bounded by [`IO_TIMEOUT`].
    pub fn connect_node(&self, addr: &Addr) -> redis::RedisResult<redis::Connection> {
        let info = self.info_for(addr);
        let client = match self.certs() {
            Some(c) => redis::Client::build_with_tls(info, c)?,
            None => redis::Client::open(info)?,
        };
        let con = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        con.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(con)
    }

    /// A cluster client seeded with every candidate node (its connections
    /// opened as [`Redis::connect_node`]'s are, slot map and all).
    pub(crate) fn cluster_client(&self) -> redis::RedisResult<redis::cluster::ClusterClient> {
        let infos: Vec<ConnectionInfo> =
            self.candidates().iter().map(|a| self.info_for(a)).collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(infos)
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(IO_TIMEOUT)
            .retries(3)
            .min_retry_wait(20)
            .max_retry_wait(200);
        if let Some(c) = self.certs() {
            b = b.certs(c);
        }
        b.build()
    }

    /// The mode in use, if known yet.
    pub fn mode(&self) -> Option<Mode> {
        self.resolved.get().copied()
    }

    /// True in cluster mode with sharded pub/sub.
    pub fn sharded(&self) -> bool {
        self.mode() == Some(Mode::Cluster) && self.pubsub == PubSubMode::Sharded
    }

    fn set_mode(&self, m: Mode) -> Mode {
        *self.resolved.get_or_init(|| m)
    }

    /// The mode, asking the first reachable node (`INFO cluster`) under `auto`.
    pub fn resolve(&self) -> Result<Mode, ConnectError> {
        if let Some(m) = self.mode() {
            return Ok(m);
        }
        match self.flag_mode {
            RedisMode::Standalone => return Ok(self.set_mode(Mode::Standalone)),
            RedisMode::Cluster => return Ok(self.set_mode(Mode::Cluster)),
            RedisMode::Auto => {}
        }
        let (addr, info) = self
            .first_node(|addr| {
                let mut con = self.connect_node(addr)?;
                redis::cmd("INFO").arg("cluster").query::<String>(&mut con)
            })
            .map_err(ConnectError::ModeUnknown)?;
        let m = if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
            Mode::Cluster
        } else {
            Mode::Standalone
        };
        tracing::info!(mode = ?m, node = %format!("{}:{}", addr.0, addr.1), "Redis mode detected");
        Ok(self.set_mode(m))
    }

    /// `f` on each candidate node in turn: the first that succeeds, with its
    /// node, or the last failure.
    pub(crate) fn first_node<T>(
        &self,
        mut f: impl FnMut(&Addr) -> redis::RedisResult<T>,
    ) -> Result<(Addr, T), NodeError> {
        let mut last = NodeError::NoNode;
        for addr in self.candidates() {
            match f(&addr) {
                Ok(v) => return Ok((addr, v)),
                Err(source) => {
                    last = NodeError::Failed {
                        host: addr.0,
                        port: addr.1,
                        source,
                    }
                }
            }
        }
        Err(last)
    }

    /// The AUTH credentials from the URI.
    pub fn auth(&self) -> Option<(Option<String>, String)> {
        let r = self.seeds[0].redis_settings();
        r.password()
            .map(|p| (r.username().map(str::to_owned), p.to_owned()))
    }

    /// The rustls configuration of `rediss://` connections, if TLS is on.
    pub fn tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|t| Arc::clone(&t.rustls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(redis: &str) -> RedisFlags {
        RedisFlags {
            redis: redis.into(),
            redis_mode: RedisMode::Auto,
            pubsub: PubSubMode::Sharded,
            redis_ca: None,
        }
    }

    #[test]
    fn glob_escapes_metacharacters() {
        assert_eq!(glob_escape("seats:"), "seats:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn seeds_and_credentials() {
        let r = Redis::from_flags(&flags(
            "redis://u:p@127.0.0.1:7000, redis://u:p@127.0.0.1:7001",
        ))
        .expect("valid");
        assert_eq!(r.candidates().len(), 2);
        assert_eq!(r.auth(), Some((Some("u".into()), "p".into())));
        assert!(Redis::from_flags(&flags("redis://a:7000,rediss://b:7001")).is_err());
        let e = Redis::from_flags(&flags("http://x"))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("'--redis'"), "{e}");
        let mut f = flags("rediss://127.0.0.1:6380");
        f.redis_ca = Some("/nonexistent/ca.pem".into());
        let e = Redis::from_flags(&f).err().expect("refused");
        assert!(e.to_string().contains("'--redis-ca'"), "{e}");
    }
}
