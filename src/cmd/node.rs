//! `seatboard serve` and `seatboard demo`: the flags checked in the order the
//! contract names, the node's configuration built once, and the node started.

use super::{demo, serve};
use crate::auth::Auth;
use crate::cli::{AuthMode, HubArgs};
use crate::hub::ShardSet;
use crate::logging::{init as logging, usage};
use crate::node::{Node, NodeConfig};
use crate::redis::Redis;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

/// Where a node's seats come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Redis pub/sub and state hashes (`serve`).
    Redis,
    /// The embedded simulator (`demo`).
    Demo,
}

/// Checks the flags, starts the node, and waits until it exits.
pub fn run(args: HubArgs, feed: Feed) -> ExitCode {
    let shards = match ShardSet::new(args.shards.map(usize::from)) {
        Ok(set) => set,
        Err(e) => return usage(&e),
    };
    if let Err(e) = address_here(args.listen) {
        return usage(&e);
    }
    let redis = match feed {
        Feed::Redis => match Redis::from_flags(&args.redis) {
            Ok(r) => Some(r),
            Err(e) => return usage(&e),
        },
        Feed::Demo => None,
    };
    // Logging before the auth mode is chosen (`--auth none` warns), after
    // every check whose refusal must be the first line on stderr.
    if let Err(e) = logging(&args.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        ));
    }
    let auth = match auth_for(&args, feed) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    if let Err(e) = auth.start() {
        crate::logging::line(&format!("error: cannot start: {e}"));
        return ExitCode::from(1);
    }
    let node = Arc::new(Node::new(config(&args, shards.len()), auth));
    let started = match redis {
        Some(redis) => serve::start(Arc::clone(&node), redis, &args),
        None => demo::start(Arc::clone(&node)),
    };
    match started {
        Ok(hub) => {
            announce(&node, feed);
            ExitCode::from(hub.wait() as u8)
        }
        Err(e) => {
            tracing::error!("cannot start: {e}");
            crate::logging::line(&format!("error: cannot start: {e}"));
            ExitCode::from(1)
        }
    }
}

/// Refuses a `--listen` address this host does not have (a bad value, exit
/// 2), checked by binding its IP on a port of the kernel's choosing, so a
/// port another process holds is left to the bind that takes it.
fn address_here(listen: std::net::SocketAddr) -> Result<(), String> {
    let mut probe = listen;
    probe.set_port(0);
    match std::net::TcpListener::bind(probe) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => Err(format!(
            "invalid value '{listen}' for '--listen': this host has no such address ({e})"
        )),
        _ => Ok(()),
    }
}

/// The node's configuration from its flags.
fn config(args: &HubArgs, shards: usize) -> NodeConfig {
    NodeConfig {
        listen: args.listen,
        shards,
        driver: args.driver,
        compression: args.compression,
        tick_ms: args.tick_ms,
        admin_tick_ms: args.admin_tick_ms,
        presence_tick_ms: args.presence_tick_ms,
        presence_ttl_ms: args.presence_ttl_ms,
        accept_rate: args.accept_rate,
        accept_burst: args.accept_burst,
        max_connections: args.max_connections,
        max_conns_per_user: args.max_conns_per_user,
        drain_ms: args.drain_ms,
        origins: args.allowed_origins.clone(),
        session: args.session.clone(),
    }
}

/// How upgrades are authenticated: `serve` as its flags say, `demo` always
/// with `--auth none`. Without sign-on the node says so in a warning that
/// no `--log-level` silences.
fn auth_for(args: &HubArgs, feed: Feed) -> Result<Auth, crate::auth::FlagError> {
    match (feed, args.auth) {
        (Feed::Redis, AuthMode::Jwt) => {
            let secret = args.jwt_secret.as_deref().filter(|s| !s.is_empty());
            return Auth::from_flags(secret.map(str::as_bytes), &args.idp);
        }
        // A bad value (a short secret, a JWKS URL or key file `--auth jwt`
        // would refuse, a bad CA file) is refused before `--auth jwt` needs it.
        (Feed::Redis, AuthMode::None) => {
            args.idp.jwks_ca_pem()?;
            let secret = args.jwt_secret.as_deref().filter(|s| !s.is_empty());
            if secret.is_some() || args.idp.any_key() {
                Auth::from_flags(secret.map(str::as_bytes), &args.idp)?;
            }
        }
        (Feed::Demo, _) => {}
    }
    tracing::warn!(target: crate::logging::LOUD, "AUTH DISABLED (--auth none): anyone can connect as any user and role; never run this in production");
    Ok(Auth::None)
}

/// The line a started node prints: the demo's address on stdout, a log line for `serve`.
fn announce(node: &Node, feed: Feed) {
    let addr = node.config.listen;
    let shown = if addr.ip().is_unspecified() {
        format!("http://127.0.0.1:{}/", addr.port())
    } else {
        format!("http://{addr}/")
    };
    match feed {
        // Not `println!`: a closed stdout must not stop the node.
        Feed::Demo => {
            let _ = writeln!(
                std::io::stdout(),
                "seatboard demo running: open {shown}  (admin: {shown}admin)"
            );
        }
        Feed::Redis => {
            tracing::info!(listen = %addr, shards = node.config.shards, "seatboard serving");
        }
    }
}
