//! The rehearsal from flags to verdict: check the flags, clean the courses,
//! ramp the viewers, publish for the duration, wait two ticks, check every
//! board, close the viewers, clean up, and say what fell short. An
//! `https://` target's certificate is checked first: one that does not
//! verify fails the rehearsal at once (exit 1, named), before anything is
//! written to Redis.

use super::cleanup;
use super::error::{FlagError, UrlProblem};
use super::feed::Feed;
use super::nodes::{NodeSeen, Watch};
use super::progress::{Progress, Status};
use super::verdict::{Figures, Second};
use super::workers::{per_process, Workers};
use crate::cli::RehearseArgs;
use crate::clock;
use crate::logging::{line, usage};
use crate::publisher::{Publisher, PublisherConfig};
use crate::redis::commands::Commands;
use crate::redis::Redis;
use loadgen::report::Report;
use loadgen::scrape::Endpoint;
use loadgen::transport::Tls;
use loadgen::{raise_nofile, Config, Hist};
use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where an http:// or https:// URL points.
struct Url {
    addr: std::net::SocketAddr,
    /// The `Host` header (the authority as given).
    host: String,
    /// The path before `/ws`, `/sse`, `/metrics`.
    base: String,
    /// The host without its port (SNI and the certificate's name).
    name: String,
    /// TLS, for https://.
    tls: Option<Tls>,
    /// The origin of a page the deployment serves (`https://seats.example.edu`,
    /// a default port left out), as a browser names it in its upgrade.
    origin: String,
}

/// The host of an authority without its port (`[::1]:443` gives `[::1]`).
fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// Where an http:// or https:// URL given as `flag` points.
fn endpoint(url: &str, flag: &'static str) -> Result<Url, FlagError> {
    let bad = |problem| FlagError::Url {
        flag,
        url: url.to_owned(),
        problem,
    };
    // A scheme is case-insensitive (RFC 3986).
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let https = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return Err(bad(UrlProblem::Scheme)),
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let name = host_name(host);
    let with_port = if host.len() > name.len() {
        host.to_string()
    } else {
        format!("{host}:{}", if https { 443 } else { 80 })
    };
    let addr = with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| bad(UrlProblem::Unresolved(host.to_owned())))?;
    let tls = https
        .then(|| Tls::new(name))
        .transpose()
        .map_err(|e| bad(UrlProblem::ServerName(e)))?;
    let default_port = if https { ":443" } else { ":80" };
    let origin = format!(
        "{}://{}",
        if https { "https" } else { "http" },
        host.strip_suffix(default_port).unwrap_or(host)
    );
    Ok(Url {
        addr,
        origin,
        host: host.to_string(),
        base: path.trim_end_matches('/').to_string(),
        name: name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        tls,
    })
}

/// The nodes to watch: `--nodes`, else the target.
fn endpoints(args: &RehearseArgs) -> Result<Vec<Endpoint>, FlagError> {
    let urls = if args.nodes.is_empty() {
        vec![args.target.clone()]
    } else {
        args.nodes.clone()
    };
    let flag = if args.nodes.is_empty() {
        "--target"
    } else {
        "--nodes"
    };
    urls.into_iter()
        .map(|url| {
            let u = endpoint(&url, flag)?;
            Ok(Endpoint {
                url: url.trim_end_matches('/').to_string(),
                addr: u.addr,
                host: u.host,
                base: u.base,
                tls: u.tls,
            })
        })
        .collect()
}

/// The rehearsal's course codes: `<prefix><run>-0000`, ... where `<run>` is
/// the start second in base 36 (five characters, a new one every second for
/// 700 days). Nodes keep a course's board in memory while it is watched, and
/// a second rehearsal soon after a first would otherwise meet the first
/// one's sections there, which its own hashes no longer hold.
fn course_names(prefix: &str, courses: u32, unix_ms: u64) -> Vec<String> {
    let mut s = unix_ms / 1000;
    let mut run = [b'0'; 5];
    for c in run.iter_mut().rev() {
        *c = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[(s % 36) as usize];
        s /= 36;
    }
    let run = String::from_utf8_lossy(&run).into_owned();
    (0..courses)
        .map(|i| format!("{prefix}{run}-{i:04}"))
        .collect()
}

/// How long every key the rehearsal writes lives: its duration plus 10
/// minutes, so a rehearsal killed with SIGKILL leaves nothing for long.
fn key_ttl(duration_s: f64) -> Duration {
    Duration::try_from_secs_f64(duration_s)
        .unwrap_or(Duration::MAX)
        .saturating_add(Duration::from_secs(600))
}

/// Whether `path` can be written, found by opening it for writing without
/// truncating it (a file made for the check is removed again).
fn writable(path: &std::path::Path, flag: &'static str) -> Result<(), FlagError> {
    let existed = path.exists();
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path);
    match opened {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(source) => Err(FlagError::Unwritable {
            flag,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Whether this host has `ip` (a socket can be bound to it).
fn local_address(ip: std::net::IpAddr) -> Result<(), FlagError> {
    match std::net::UdpSocket::bind((ip, 0)) {
        Ok(_) => Ok(()),
        Err(source) => Err(FlagError::NotLocal { ip, source }),
    }
}

/// The flags checked as the contract asks: the first stderr line names the flag.
fn check(args: &RehearseArgs) -> Result<(), FlagError> {
    let p = &args.rehearsal_prefix;
    if p.is_empty()
        || p.len() > 53
        || !p
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        return Err(FlagError::Prefix(p.clone()));
    }
    if let Some(s) = args.jwt_secret.as_deref().filter(|s| !s.is_empty()) {
        crate::auth::check_secret(s.as_bytes()).map_err(FlagError::Secret)?;
    }
    if let Some(f) = &args.token_file {
        let text = std::fs::read_to_string(f).map_err(|source| FlagError::TokenFile {
            path: f.clone(),
            source,
        })?;
        if text.lines().all(|l| l.trim().is_empty()) {
            return Err(FlagError::NoToken { path: f.clone() });
        }
    }
    for (path, flag) in [(&args.json, "--json"), (&args.report, "--report")] {
        if let Some(p) = path {
            writable(p, flag)?;
        }
    }
    args.source_addrs
        .iter()
        .try_for_each(|&ip| local_address(ip))
}

/// The TLS handshake with an https:// target and each https:// node: what
/// did not verify, as sentences (a target that answers no TCP connect is
/// left to the run, which says so).
fn preflight(target: &Url, url: &str, endpoints: &[Endpoint]) -> Vec<String> {
    let mut checks = vec![(url.trim_end_matches('/'), target.addr, target.tls.as_ref())];
    checks.extend(
        endpoints
            .iter()
            .map(|e| (e.url.as_str(), e.addr, e.tls.as_ref())),
    );
    checks.dedup_by_key(|c| c.0);
    checks
        .into_iter()
        .filter_map(|(url, addr, tls)| {
            let why = tls?.check(addr, Duration::from_secs(5)).err()?;
            Some(format!("tls: {url}: {why}"))
        })
        .collect()
}

/// A rehearsal that cannot start (the target's certificate): the verdict at
/// once, in the JSON too when asked.
fn refuse(args: &RehearseArgs, short: &[String]) -> ExitCode {
    if let Some(path) = &args.json {
        let none = Figures {
            viewers: 0,
            asked: u64::from(args.viewers),
            refused: Default::default(),
            connect: Hist::default(),
            latency: Hist::default(),
            boards: (0, 0),
            not_live: 0,
            published: 0,
            dropped: 0,
            left: Ok(0),
            key_ttl_s: 0,
            series: Vec::new(),
        };
        let j = none.to_json(short, serde_json::json!([]));
        if let Err(e) = std::fs::write(path, j.to_string()) {
            line(&format!("warning: --json {}: {e}", path.display()));
        }
    }
    line(&format!("rehearse: fail: {}", short.join("; ")));
    ExitCode::from(1)
}

/// The signal that stops the rehearsal, once one arrived (0: none): SIGINT
/// and SIGTERM both close the viewers and clean up.
fn stop_on_signals() -> Arc<AtomicUsize> {
    let stop = Arc::new(AtomicUsize::new(0));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register_usize(signal, Arc::clone(&stop), signal as usize);
    }
    stop
}

/// The name of the signal [`stop_on_signals`] recorded, if one arrived.
fn signal_name(signal: usize) -> Option<&'static str> {
    match i32::try_from(signal) {
        Ok(0) => None,
        Ok(signal_hook::consts::SIGTERM) => Some("SIGTERM"),
        _ => Some("SIGINT"),
    }
}

/// Runs `seatboard rehearse`.
pub fn run(args: RehearseArgs) -> ExitCode {
    let checked = endpoint(&args.target, "--target")
        .and_then(|t| check(&args).map(|()| t))
        .and_then(|t| endpoints(&args).map(|e| (t, e)));
    let (target, endpoints) = match checked {
        Ok(t) => t,
        Err(e) => return usage(&e),
    };
    let redis = match Redis::from_flags(&args.redis.redis) {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    let untrusted = preflight(&target, &args.target, &endpoints);
    if !untrusted.is_empty() {
        return refuse(&args, &untrusted);
    }
    let Url {
        addr,
        host,
        base,
        name,
        tls,
        origin,
    } = target;
    let stop = stop_on_signals();
    let names = course_names(
        &args.rehearsal_prefix,
        args.courses,
        crate::clock::unix_ms(),
    );
    let mut link = Commands::new(&redis, "rehearse");
    let (state, presence) = (&args.redis.state_prefix, &args.presence_prefix);
    if let Err(e) = cleanup::delete(&mut link, &names, state, presence) {
        line(&format!("error: Redis: {e}"));
        return ExitCode::from(1);
    }
    let publisher = match Publisher::start(PublisherConfig {
        redis: args.redis.redis.clone(),
        channel_prefix: args.redis.channel_prefix.clone(),
        state_prefix: state.clone(),
        queue: (args.publish_rate as usize).clamp(1024, 1 << 20),
        state_ttl: Some(key_ttl(args.duration)),
    }) {
        Ok(p) => p,
        Err(e) => return usage(&e),
    };
    let nofile = raise_nofile();
    let per_process = args
        .viewers_per_process
        .map_or_else(|| per_process(nofile), |n| n as usize);
    let cfg = Config {
        port: addr.port(),
        host: addr.ip(),
        host_header: Some(host),
        base_path: base,
        source_addrs: args.source_addrs.clone(),
        auth_none: args.jwt_secret.as_deref().is_none_or(str::is_empty)
            && args.token_file.is_none(),
        max_courses: 3,
        version_ts: true,
        user_prefix: "rehearsal-".into(),
        goodbye: true,
        clients: args.viewers as usize,
        courses: names.clone(),
        skew: args.hot_skew,
        connect_rate: args.connect_rate,
        inflight: 512,
        secret: args.jwt_secret.clone().unwrap_or_default(),
        seed: fastrand::u64(..),
        max_secs: (args.viewers as f64 / args.connect_rate + args.duration) as u64 + 120,
        tokens_file: args.token_file.as_ref().map(|p| p.display().to_string()),
        tls: tls.map(|_| name),
        // The same wire a browser on the board page uses: its courses in the
        // upgrade, the page's origin, compression offered, a fresh key.
        upgrade_courses: true,
        deflate: true,
        origin: Some(origin),
        ..Config::default()
    };
    let sse = (args.viewers as f64 * args.sse_share).round() as usize;
    let watch = Watch::start(endpoints, Instant::now());
    let mut workers = Workers::start(&cfg, sse, per_process);
    let (series, feed) = drive(&args, &mut workers, &publisher, &stop, &names);
    publisher.flush(Duration::from_secs(5));
    // The nodes' tick, as their `hello` named it (the longest one seen).
    let tick = workers.max(|c| c.tick_ms).max(200);
    let settle = Instant::now() + Duration::from_millis(2 * tick);
    while Instant::now() < settle {
        workers.poll();
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = Run {
        workers,
        publisher: &publisher,
        feed: &feed,
        series,
        watch,
        interrupted: signal_name(stop.load(Ordering::Relaxed)),
    };
    finish(&args, run, link, &names)
}

/// What the run left for the verdict.
struct Run<'a> {
    workers: Workers,
    publisher: &'a Publisher,
    feed: &'a Feed,
    series: Vec<Second>,
    watch: Watch,
    /// The signal (SIGINT or SIGTERM) that stopped it before the end of `--duration`.
    interrupted: Option<&'static str>,
}

/// The per-second series as it is taken, and the status line it feeds.
struct Meter {
    series: Vec<Second>,
    last: (u64, u64, u64),
    progress: Progress,
    asked: u64,
}

impl Meter {
    /// One second ended: its row of the series, and the status line.
    fn second(&mut self, workers: &mut Workers, feed: &Feed, open: u64, publishing: bool) {
        let h: Hist = workers.take_interval();
        let (up, rf, pb) = (
            workers.sum(|c| c.upgrades),
            workers.sum(|c| c.refused),
            feed.sent,
        );
        let (last_up, last_ref, last_pub) = self.last;
        let row = Second {
            t: self.series.len() as u64 + 1,
            viewers: open,
            connects: up - last_up.min(up),
            refused: rf - last_ref.min(rf),
            published: pb - last_pub.min(pb),
            p50_ms: h.quantile(0.5) as f64 / 1e3,
            p99_ms: h.quantile(0.99) as f64 / 1e3,
        };
        self.progress.second(&h);
        self.progress.show(&Status {
            t: row.t,
            phase: if publishing { "publishing" } else { "ramping" },
            viewers: (open, self.asked),
            connects: up,
            refused: workers.refusals(),
            published_per_s: row.published,
            latency_ms: self.progress.recent_ms(),
        });
        self.series.push(row);
        self.last = (up, rf, pb);
    }
}

/// The ramp and the publishing, one second of the series at a time.
fn drive(
    args: &RehearseArgs,
    workers: &mut Workers,
    publisher: &Publisher,
    stop: &AtomicUsize,
    names: &[String],
) -> (Vec<Second>, Feed) {
    let mut feed = Feed::new(names, args.hot_skew);
    let start = Instant::now();
    let ramp_end = Duration::from_secs_f64(args.viewers as f64 / args.connect_rate);
    let mut publishing: Option<Instant> = None;
    let mut meter = Meter {
        series: Vec::new(),
        last: (0, 0, 0),
        progress: Progress::new(),
        asked: u64::from(args.viewers),
    };
    let mut next_second = start + Duration::from_secs(1);
    let interval = Duration::from_secs_f64(1.0 / args.publish_rate);
    let mut next_pub = start;
    while stop.load(Ordering::Relaxed) == 0 {
        workers.poll();
        let now = Instant::now();
        let open = workers.sum(|c| c.open);
        if publishing.is_none()
            && (now - start >= ramp_end && open >= u64::from(args.viewers)
                || now - start >= ramp_end * 2 + Duration::from_secs(10))
        {
            publishing = Some(now);
            next_pub = now;
        }
        if let Some(p0) = publishing {
            if now - p0 >= Duration::from_secs_f64(args.duration) {
                break;
            }
            let mut burst = 0;
            while next_pub <= now && burst < 10_000 {
                feed.publish_one(publisher, clock::unix_ms());
                next_pub += interval;
                burst += 1;
            }
        }
        if now >= next_second {
            next_second += Duration::from_secs(1);
            meter.second(workers, &feed, open, publishing.is_some());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    meter.progress.done();
    (meter.series, feed)
}

/// The viewers' reports merged: latency, connect time, and the boards
/// checked and found correct against the last state `feed` published.
fn merge_reports(reports: &[Report], feed: &Feed, names: &[String]) -> (Hist, Hist, (u64, u64)) {
    loadgen::report::merge(reports, |c| {
        let c = c as usize;
        (c < names.len()).then(|| feed.expected(c))
    })
}

/// Deletes the rehearsal's keys, again for up to 3 s while the nodes take
/// their viewers' presence out as the sockets close; the keys left, or why
/// Redis could not be asked.
fn delete_when_presence_left(
    args: &RehearseArgs,
    link: &mut Commands,
    names: &[String],
) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left = Err("no attempt".to_string());
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        left = cleanup::delete(link, names, &args.redis.state_prefix, &args.presence_prefix)
            .map_err(|e| e.to_string());
        if left == Ok(0) {
            break;
        }
    }
    left
}

/// `--json` and `--report`, where asked for; a file that cannot be written
/// is a warning, not a verdict.
fn write_outputs(
    args: &RehearseArgs,
    figures: &Figures,
    short: &[String],
    nodes: &[NodeSeen],
    processes: usize,
) {
    if let Some(path) = &args.json {
        let nodes_json: Vec<serde_json::Value> = nodes.iter().map(|n| n.to_json()).collect();
        let mut j = figures.to_json(short, nodes_json.into());
        j["processes"] = processes.into();
        let text = j.to_string();
        if let Err(e) = std::fs::write(path, text) {
            line(&format!("warning: --json {}: {e}", path.display()));
        }
    }
    if let Some(path) = &args.report {
        let verdict = match short {
            [] => "pass: every target held and every board was correct".to_string(),
            s => format!("fail: {}", s.join("; ")),
        };
        if let Err(e) = std::fs::write(path, super::report::html(&figures.series, nodes, &verdict))
        {
            line(&format!("warning: --report {}: {e}", path.display()));
        }
    }
}

/// Board check, close, cleanup, verdict.
fn finish(args: &RehearseArgs, run: Run, mut link: Commands, names: &[String]) -> ExitCode {
    let Run {
        workers,
        publisher,
        feed,
        series,
        watch,
        interrupted,
    } = run;
    let nodes = watch.finish();
    let refused = workers.refusals();
    let processes = workers.processes();
    let peak = series.iter().map(|s| s.viewers).max().unwrap_or(0);
    let tls_failed = workers.sum(|c| c.tls_failed);
    let reports = workers.reports();
    let (latency, connect, (checked, correct)) = merge_reports(&reports, feed, names);
    // A viewer not connected at the end shows no live board: each of its
    // courses counts as a board checked and not true.
    let not_live: u64 = reports.iter().map(|r| r.boards_not_live).sum();
    let boards = (checked + not_live, correct);
    let left = delete_when_presence_left(args, &mut link, names);
    let figures = Figures {
        viewers: peak,
        asked: u64::from(args.viewers),
        refused,
        connect,
        latency,
        boards,
        not_live,
        published: publisher.published(),
        dropped: publisher.dropped(),
        left,
        key_ttl_s: key_ttl(args.duration).as_secs(),
        series,
    };
    let mut short = figures.short(args.p99_ms, args.max_refused);
    if tls_failed > 0 {
        let why = reports
            .iter()
            .find_map(|r| r.tls_error.as_deref())
            .unwrap_or("unknown");
        short.push(format!(
            "tls: {tls_failed} viewers' TLS sessions with {} failed ({why})",
            args.target
        ));
    }
    short.extend(nodes.iter().filter_map(|n| n.short()));
    if let Some(signal) = interrupted {
        short.push(format!(
            "interrupted: {signal} stopped the rehearsal before the end of --duration"
        ));
    }
    // (Every board of a viewer that never connected counts as checked and
    // not true: the boards of connected viewers say whether any connected.)
    if !short.is_empty() && checked == 0 && peak == 0 {
        short.push("no viewer connected: is --target right?".into());
    }
    write_outputs(args, &figures, &short, &nodes, processes);
    // The figures, and what the distance to Redis costs each node, before
    // the verdict line.
    line(&format!("rehearse: {}", figures.summary()));
    for n in &nodes {
        line(&format!("rehearse: {}", n.distance()));
    }
    if short.is_empty() {
        line(&format!(
            "rehearse: pass: {} viewers, {} published, p99 {:.0} ms, every board correct",
            figures.viewers,
            figures.published,
            figures.latency.quantile(0.99) as f64 / 1e3
        ));
        return ExitCode::SUCCESS;
    }
    line(&format!("rehearse: fail: {}", short.join("; ")));
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn course_names_carry_the_prefix_and_the_start_second_and_fit_the_contract() {
        let a = course_names("REHEARSAL-", 3, 1_764_420_000_123);
        assert_eq!(a.len(), 3);
        assert!(
            a[0].starts_with("REHEARSAL-") && a[0].ends_with("-0000"),
            "{a:?}"
        );
        assert_eq!(a[0].len(), "REHEARSAL-".len() + 5 + 1 + 4);
        let b = course_names("REHEARSAL-", 3, 1_764_420_001_000);
        assert_ne!(
            a[0], b[0],
            "a rehearsal a second later has courses of its own"
        );
        let long = "X".repeat(53);
        let c = course_names(&long, 100_000, 0);
        assert!(c.iter().all(|n| n.len() <= 64), "{}", c[99_999]);
    }

    #[test]
    fn targets_are_http_or_https_with_their_default_ports_and_tls_names() {
        let u = endpoint("http://127.0.0.1/seats/", "--target").expect("http");
        assert_eq!(
            (u.addr.port(), u.host.as_str(), u.base.as_str()),
            (80, "127.0.0.1", "/seats")
        );
        assert!(u.tls.is_none());
        let u = endpoint("https://localhost", "--target").expect("https");
        assert_eq!(
            (u.addr.port(), u.host.as_str(), u.name.as_str()),
            (443, "localhost", "localhost")
        );
        assert!(u.tls.is_some());
        let u = endpoint("https://localhost:8443/x", "--target").expect("port");
        assert_eq!(
            (u.addr.port(), u.host.as_str(), u.name.as_str()),
            (8443, "localhost:8443", "localhost")
        );
        assert_eq!(u.base, "/x");
        assert_eq!(u.origin, "https://localhost:8443");
        let u = endpoint("https://[::1]:9443", "--nodes").expect("v6");
        assert_eq!((u.addr.port(), u.name.as_str()), (9443, "::1"));
        // A scheme in capitals is the same scheme; a default port is left
        // out of the origin, as a browser leaves it.
        let u = endpoint("HTTP://127.0.0.1:80/", "--target").expect("capitals");
        assert!(u.tls.is_none());
        assert_eq!(u.origin, "http://127.0.0.1");
        let u = endpoint("Https://localhost:443", "--target").expect("capitals");
        assert!(u.tls.is_some());
        assert_eq!(u.origin, "https://localhost");
        for bad in [
            "ftp://x",
            "seats.example.edu",
            "https://no-such-host.invalid",
        ] {
            let e = endpoint(bad, "--target")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("'--target'"), "{bad}: {e}");
        }
    }
}
