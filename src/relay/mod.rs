//! `seatboard relay` (contract §10): the local publish relay beside the
//! selection API. Snapshots come in as datagrams (a Unix datagram socket and
//! loopback UDP, `recv.rs`, one thread each), the newest per section is held
//! in a bounded map (`pending.rs`), one writer thread writes it to Redis the
//! section 2 way (`writer.rs`), and `/metrics` + `/healthz` answer on a
//! loopback port (`crate::worker_http`, figures in `metrics.rs`). The receive threads
//! never wait on Redis: they only take the map's lock for one map operation.
//!
//! SIGTERM or SIGINT: the receive threads stop, the writer writes what is
//! held until [`DRAIN`] after the signal (the process is gone within 2 s,
//! whatever Redis does), and whatever Redis did not take by then is counted
//! `dropped{reason="redis_down"}`; exit 0.

pub mod error;
pub mod metrics;
pub mod pending;
pub mod recv;
pub mod writer;

use crate::channels::signals::Stop;
use crate::cli::RelayArgs;
use crate::clock;
use crate::logging::{usage, LogBudget};
use crate::redis::commands::Commands;
use crate::redis::Redis;
use crate::supervisor::{self, Policy};
use error::{BindError, FlagError, StartError};
use metrics::Shared;
use pending::Pending;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use writer::Writer;

/// How long after SIGTERM the relay writes what it holds: with the receive
/// threads' stop and the exit, within the contract's 2 s.
pub const DRAIN: Duration = Duration::from_millis(1500);

/// The flags checked; the error names the flag (exit 2).
struct Checked {
    socket: Option<PathBuf>,
    udp: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    redis: Arc<Redis>,
}

/// `value` as `IP:PORT`; the error names `flag`.
fn address(flag: &'static str, value: &str) -> Result<SocketAddr, FlagError> {
    value.parse().map_err(|source| FlagError::NotAnAddress {
        flag,
        value: value.to_owned(),
        source,
    })
}

fn check(args: &RelayArgs) -> Result<Checked, FlagError> {
    let udp = match args.udp.trim() {
        "" => None,
        a => {
            let addr = address("udp", a)?;
            // An IPv4-mapped address (`[::ffff:127.0.0.1]`) is the IPv4 one,
            // and is bound as such.
            let addr = SocketAddr::new(addr.ip().to_canonical(), addr.port());
            if !addr.ip().is_loopback() {
                return Err(FlagError::UdpNotLoopback {
                    value: a.to_owned(),
                });
            }
            Some(addr)
        }
    };
    let metrics = match args.metrics.trim() {
        "" => None,
        a => Some(address("metrics", a)?),
    };
    let socket = match args.socket.as_str() {
        "" => None,
        p => Some(PathBuf::from(p)),
    };
    // A path the relay may not take is a bad value, found before anything
    // opens (or its folder is made).
    if let Some(path) = socket
        .as_ref()
        .filter(|p| std::os::unix::net::SocketAddr::from_pathname(p).is_err())
    {
        return Err(FlagError::SocketPathTooLong { path: path.clone() });
    }
    if let Some((path, taken)) = socket.as_deref().and_then(|p| Some((p, recv::taken(p)?))) {
        let path = path.to_path_buf();
        return Err(match taken {
            recv::Taken::AnotherKind => FlagError::SocketOfAnotherKind { path },
            recv::Taken::InUse => FlagError::SocketInUse { path },
            recv::Taken::NotASocket => FlagError::NotASocket { path },
        });
    }
    if socket.is_none() && udp.is_none() {
        return Err(FlagError::NothingToReceive);
    }
    let redis = Redis::from_flags(&args.target.redis)?;
    Ok(Checked {
        socket,
        udp,
        metrics,
        redis,
    })
}

/// A spawn failure of the thread `what`.
fn thread(what: &'static str) -> impl Fn(std::io::Error) -> StartError {
    move |source| StartError::Thread { what, source }
}

/// Runs the relay until SIGTERM or SIGINT.
pub fn main(args: RelayArgs) -> ExitCode {
    let c = match check(&args) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    if let Err(e) = crate::logging::init(&args.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        ));
    }
    match run(args, c) {
        Ok(()) => ExitCode::SUCCESS,
        // Taken between the flag check and the bind: still a bad value.
        Err(StartError::Socket(BindError::InUse { path })) => {
            usage(&FlagError::SocketInUse { path })
        }
        Err(StartError::Socket(BindError::NotASocket { path })) => {
            usage(&FlagError::NotASocket { path })
        }
        Err(e) => {
            tracing::error!("cannot start: {e}");
            crate::logging::line(&format!("error: cannot start: {e}"));
            ExitCode::from(1)
        }
    }
}

fn run(args: RelayArgs, c: Checked) -> Result<(), StartError> {
    // Caught before anything opens: a signal from then on drains.
    let stop = Stop::catch().map_err(StartError::Signals)?;
    let max = args.max_pending as usize;
    let max_bytes = usize::try_from(args.max_pending_bytes).unwrap_or(usize::MAX);
    let shared = Arc::new(Shared::new(Pending::new(max, max_bytes)));
    if let Some(path) = &c.socket {
        let s = recv::bind_unix(path).map_err(StartError::Socket)?;
        recv::spawn("unix", move |b| s.recv(b), Arc::clone(&shared))
            .map_err(thread("relay-unix"))?;
    }
    if let Some(addr) = c.udp {
        let s = recv::bind_udp(addr).map_err(StartError::Udp)?;
        recv::spawn("udp", move |b| s.recv(b), Arc::clone(&shared)).map_err(thread("relay-udp"))?;
    }
    // Served once the sockets are bound: `/healthz` answering means a
    // datagram sent now is taken.
    if let Some(addr) = c.metrics {
        let l = TcpListener::bind(addr).map_err(|source| StartError::Metrics { addr, source })?;
        crate::worker_http::spawn(l, Arc::clone(&shared)).map_err(thread("relay-http"))?;
    }
    // Set at the signal: the writer drains what is held until then.
    let drain: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    {
        let mut w = Writer {
            link: Commands::new(&c.redis, "relay"),
            channel_prefix: args.target.channel_prefix.clone(),
            state_prefix: args.target.state_prefix.clone(),
            shared: Arc::clone(&shared),
            refusal_log: LogBudget::new(writer::REFUSAL_LOGS_PER_SEC, clock::now_ms()),
        };
        let d = Arc::clone(&drain);
        supervisor::spawn("relay-writer", Policy::Logged, move || w.run(&d))
            .map_err(thread("relay-writer"))?;
    }
    tracing::info!(
        socket = ?c.socket,
        udp = ?c.udp,
        metrics = ?c.metrics,
        max_pending = max,
        max_pending_bytes = max_bytes,
        "seatboard relay running"
    );
    let sig = stop.next();
    let end = Instant::now() + DRAIN;
    tracing::info!(signal = ?sig, "stopping: writing what is held");
    shared.stop.store(true, Relaxed);
    supervisor::join("relay-unix", end);
    supervisor::join("relay-udp", end);
    if let Some(p) = &c.socket {
        let _ = std::fs::remove_file(p);
    }
    let _ = drain.set(end);
    shared.work.notify_all();
    // The writer stops at the deadline at the latest, but one Redis call
    // in progress may outlast it: nobody waits for that.
    supervisor::join("relay-writer", end);
    let left = shared.pending().drop_all();
    let counts = shared.pending().counts();
    if left > 0 {
        tracing::warn!(
            dropped = left,
            "Redis did not take everything held in time; dropped"
        );
    }
    tracing::info!(
        published = counts.published,
        dropped = left,
        "relay stopped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> RelayArgs {
        let argv = ["seatboard", "relay"].iter().chain(extra);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Relay(a)) => a,
            other => panic!("not relay args: {other:?}"),
        }
    }

    #[test]
    fn a_refused_flag_never_shows_the_redis_password() {
        for uri in [
            "redis://svc:Pw%2FS3cret@127.0.0.1:70000",
            "rediss://svc:PwS3cret@127.0.0.1:6380/#insecure",
            "redis://:PwS3cret@a:1,rediss://:PwS3cret@b:2",
        ] {
            let Err(e) = check(&args(&["--redis", uri])) else {
                panic!("{uri} accepted");
            };
            let text = e.to_string();
            assert!(text.contains("'--redis'"), "{text}");
            assert!(!text.contains("S3cret"), "{uri}: {text}");
            assert!(!format!("{e:?}").contains("S3cret"), "{uri}: {e:?}");
        }
    }

    #[test]
    fn a_refused_address_names_its_flag() {
        let e = check(&args(&["--udp", "10.0.0.1:7440"])).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("'--udp': a loopback address only"), "{text}");
        let e = check(&args(&["--metrics", "nowhere"])).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("for '--metrics': not an IP:PORT"), "{text}");
        let e = check(&args(&["--socket", "", "--udp", ""])).err();
        assert!(matches!(e, Some(FlagError::NothingToReceive)), "{e:?}");
    }

    #[test]
    fn an_ipv4_mapped_loopback_udp_address_is_loopback() {
        let udp = |value: &str| check(&args(&["--socket", "", "--metrics", "", "--udp", value]));
        let c = udp("[::ffff:127.0.0.1]:7440");
        let bound = c.as_ref().ok().and_then(|c| c.udp).map(|a| a.to_string());
        assert_eq!(bound.as_deref(), Some("127.0.0.1:7440"), "{:?}", c.err());
        let e = udp("[::ffff:10.0.0.1]:7440").err();
        assert!(matches!(e, Some(FlagError::UdpNotLoopback { .. })), "{e:?}");
        let c = udp("[::1]:7440");
        assert!(c.is_ok_and(|c| c.udp.is_some_and(|a| a.ip().is_loopback())));
    }

    #[test]
    fn a_socket_path_that_is_taken_is_a_refused_flag() {
        let dir =
            std::env::temp_dir().join(format!("seatboard-relay-taken-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let refusal = |path: &std::path::Path| {
            let path = path.to_str().expect("utf-8 path");
            let flags = [
                "--socket",
                path,
                "--metrics",
                "",
                "--redis",
                "redis://127.0.0.1:1",
            ];
            check(&args(&flags)).err()
        };
        let file = dir.join("file");
        std::fs::write(&file, b"kept").expect("file");
        let e = refusal(&file);
        assert!(matches!(e, Some(FlagError::NotASocket { .. })), "{e:?}");
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("for '--socket': it exists and is not a socket"),
            "{text}"
        );
        let live = dir.join("live.sock");
        let held = std::os::unix::net::UnixDatagram::bind(&live).expect("bind");
        let e = refusal(&live);
        assert!(matches!(e, Some(FlagError::SocketInUse { .. })), "{e:?}");
        // Once nobody reads it, the stale file is the relay's to replace.
        drop(held);
        let e = refusal(&live);
        assert!(e.is_none(), "{e:?}");
        // A path too long for a socket's address: refused, no folder made.
        let deep = dir.join("d".repeat(120));
        let e = refusal(&deep.join("s.sock"));
        assert!(
            matches!(e, Some(FlagError::SocketPathTooLong { .. })),
            "{e:?}"
        );
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("for '--socket': longer than"), "{text}");
        assert!(!deep.exists(), "the folder was made");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
