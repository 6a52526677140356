//! The suite's command line: the options the scenarios share (`--name
//! value`), their defaults, and the usage line.

use crate::fleet;

/// Options shared by the scenarios (`--name value`).
#[derive(Debug, Clone)]
pub struct Opts {
    pub clients: usize,
    pub seconds: f64,
    pub rate: f64,
    pub courses: usize,
    pub sections: u32,
    pub skew: f64,
    pub procs: usize,
    pub driver: Option<String>,
    pub shards: Option<u32>,
    pub tick_ms: u64,
    pub connect_rate: f64,
    pub inflight: usize,
    pub inner: String,
    pub snapshots: usize,
    pub quiet: bool,
    pub no_watch: bool,
    /// Viewers name their courses in the upgrade (`/ws?course=C`) instead of a `watch` message.
    pub upgrade_courses: bool,
    /// `first_board`: the client round trip (ms) of its second half, through a delay proxy.
    pub client_rtt_ms: f64,
    /// Storm: extra clients that never read.
    pub stuck: usize,
    /// Storm: a three-primary Redis Cluster with sharded pub/sub instead of one Redis.
    pub cluster: bool,
    /// Fleet: seatboard nodes behind HAProxy.
    pub nodes: usize,
    /// Fleet: one event (`kill`, `rolling`, `redis_restart`); all when unset.
    pub event: Option<String>,
    /// Fleet: the nodes' `--drain-ms`.
    pub drain_ms: u64,
    /// Fleet: storm seconds before the event, and after recovery.
    pub before_s: f64,
    pub after_s: f64,
    /// Fleet: give up waiting for recovery this long after the event.
    pub max_wait_s: f64,
    /// Fleet: the survivors' "during" window lasts at least this long.
    pub min_during_s: f64,
    /// Fleet: HAProxy processes sharing the port.
    pub haproxy_procs: usize,
    /// The server's `--compression`; `on` also makes the load generator offer
    /// permessage-deflate (as browsers do).
    pub compression: String,
    /// Fanout: `--rate` was given (updates/s); otherwise one update per tick.
    pub rate_set: bool,
    /// Floor: the frame's size on the wire.
    pub frame_bytes: usize,
    /// Storm, fanout, idle: skip the floor run (compare runs one floor for all).
    pub no_floor: bool,
    /// Handshake: the token algorithm (`hs256`, `rs256`, `es256`, `eddsa`, `all`).
    pub alg: Option<String>,
    /// Load generators: pre-minted tokens, one a line (else HS256 minted per connection).
    pub tokens_file: Option<String>,
    /// `connect_cost`: another `seatboard` binary (e.g. main's build) served
    /// beside this one and measured in the same run.
    pub against: Option<String>,
    /// connect_cost: rounds of the alternation (forward, backward, forward, ...).
    pub rounds: usize,
    /// connect_cost: a `perf record --control fifo:` path; `enable` is
    /// written to it as each phase of this build's named-course way starts,
    /// `disable` as it ends, so a profile holds those phases only.
    pub perf_ctl: Option<String>,
    /// Soak: how long it runs.
    pub minutes: f64,
    /// Storm, fanout: viewers on `ws` (WebSocket), `sse` (Server-Sent
    /// Events), or `both` (runs on each, A B A B, and their CPU per frame).
    pub transport: String,
    /// Reconnect: one pass (`default` or `wide` accept bucket); both when unset.
    pub pass: Option<String>,
    /// Storm, idle: the server's Redis this many ms away (round trip; a delay
    /// proxy with half of it each way); publishers stay near. 0: loopback.
    pub redis_rtt_ms: f64,
    /// Storm: the viewers connect (at `--connect-rate`) while the storm is
    /// published, instead of all before it.
    pub connect_during: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            clients: 1000,
            seconds: 10.0,
            rate: 15_000.0,
            courses: 500,
            sections: 8,
            skew: 1.1,
            procs: 0,
            driver: None,
            shards: None,
            tick_ms: 200,
            connect_rate: 8000.0,
            inflight: 256,
            inner: "fanout".into(),
            snapshots: 500_000,
            quiet: false,
            no_watch: false,
            upgrade_courses: false,
            client_rtt_ms: 50.0,
            stuck: 0,
            cluster: false,
            nodes: 3,
            event: None,
            drain_ms: 10_000,
            before_s: 10.0,
            after_s: 3.0,
            max_wait_s: 30.0,
            min_during_s: 5.0,
            haproxy_procs: 2,
            compression: "on".into(),
            rate_set: false,
            frame_bytes: 190,
            no_floor: false,
            alg: None,
            tokens_file: None,
            against: None,
            rounds: 2,
            perf_ctl: None,
            minutes: 20.0,
            transport: "ws".into(),
            pass: None,
            redis_rtt_ms: 0.0,
            connect_during: false,
        }
    }
}

/// The usage line printed with no scenario or a bad flag.
pub const USAGE: &str =
    "usage: cargo bench --bench suite -- <idle|first_board|connect_cost|storm|fanout|floor|ingest|publish_cost|handshake|compare|fleet|soak|reconnect|relay|reconcile> \
[--clients C] [--seconds D] [--rate R (storm: snapshots/s; fanout: updates/s, default one per tick)] \
[--compression on|off] [--frame-bytes B (floor)] [--courses N] [--sections S] [--skew Z] [--procs P] \
[--driver uring|epoll|auto|tokio] [--shards N] [--tick-ms T] [--connect-rate R] [--inflight K] \
[--inner fanout|storm] [--snapshots N] [--no-watch (idle: connect only)] \
[--upgrade-courses (idle, reconnect: courses named in the upgrade, no watch message)] \
[--client-rtt-ms N (first_board: the client round trip of its second half, default 50)] \
[--no-floor (storm, fanout, idle: skip the floor run)] \
[--against BIN (connect_cost: another seatboard build measured beside this one in the same run)] \
[--rounds N (connect_cost: rounds of the alternation, forward then backward, default 2)] \
[--perf-ctl FIFO (connect_cost: enable/disable written to a perf control fifo around this build's named-course phases)] \
[--alg hs256|rs256|es256|eddsa|all (handshake: token algorithm, default all side by side)] \
[--transport ws|sse|both (storm, fanout: viewers on WebSocket, Server-Sent Events, or each in turn)] \
[--stuck N (storm: N more clients watch the 3 hottest courses and never read)] \
[--redis-mode standalone|cluster (storm, idle: cluster = 3 primaries, SPUBLISH/SSUBSCRIBE)] \
[--redis-rtt-ms N (storm, idle: the server's Redis N ms round trip away through a delay proxy; publishers near)] \
[--connect-during (storm: viewers connect at --connect-rate while the storm is published)] \
[fleet: --event kill|rolling|redis_restart --nodes N --drain-ms D --before S --haproxy-procs P] \
[soak: --minutes M --cluster (3 primaries with a replica each; a primary killed)] [reconnect: --pass default|wide (one accept bucket; both when unset)] \
[relay: --rate R --seconds D per case] \
[reconcile: --courses C --sections S (C x S rows) --rate R changes/s --seconds D]";

/// The scenario and its options from the arguments after `--bench`.
pub fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts::default();
    let mut scenario = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with("--") {
            scenario = Some(a.clone());
            continue;
        }
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        let num = |s: String| {
            s.parse::<f64>()
                .map_err(|_| format!("bad number for {a}: {s}"))
        };
        match a.as_str() {
            "--clients" => o.clients = num(val()?)? as usize,
            "--seconds" => o.seconds = num(val()?)?,
            "--rate" => {
                o.rate = num(val()?)?;
                o.rate_set = true;
            }
            "--compression" => o.compression = val()?,
            "--frame-bytes" => o.frame_bytes = num(val()?)? as usize,
            "--courses" => o.courses = num(val()?)? as usize,
            "--sections" => o.sections = num(val()?)? as u32,
            "--skew" => o.skew = num(val()?)?,
            "--procs" => o.procs = num(val()?)? as usize,
            "--driver" => o.driver = Some(val()?),
            "--shards" => o.shards = Some(num(val()?)? as u32),
            "--tick-ms" => o.tick_ms = num(val()?)? as u64,
            "--connect-rate" => o.connect_rate = num(val()?)?,
            "--inflight" => o.inflight = num(val()?)? as usize,
            "--inner" => o.inner = val()?,
            "--snapshots" => o.snapshots = num(val()?)? as usize,
            "--no-watch" => o.no_watch = true,
            "--upgrade-courses" => o.upgrade_courses = true,
            "--client-rtt-ms" => o.client_rtt_ms = num(val()?)?,
            "--no-floor" => o.no_floor = true,
            "--against" => o.against = Some(val()?),
            "--rounds" => o.rounds = (num(val()?)? as usize).max(1),
            "--perf-ctl" => o.perf_ctl = Some(val()?),
            "--alg" => o.alg = Some(val()?),
            "--transport" => {
                o.transport = val()?;
                if !matches!(o.transport.as_str(), "ws" | "sse" | "both") {
                    return Err(format!("unknown --transport {}", o.transport));
                }
            }
            "--stuck" => o.stuck = num(val()?)? as usize,
            "--redis-mode" => {
                o.cluster = match val()?.as_str() {
                    "standalone" => false,
                    "cluster" => true,
                    m => return Err(format!("unknown --redis-mode {m}")),
                }
            }
            "--cluster" => o.cluster = true,
            "--nodes" => o.nodes = num(val()?)? as usize,
            "--minutes" => o.minutes = num(val()?)?,
            "--event" => o.event = Some(val()?),
            "--drain-ms" => o.drain_ms = num(val()?)? as u64,
            "--before" => o.before_s = num(val()?)?,
            "--haproxy-procs" => o.haproxy_procs = num(val()?)? as usize,
            "--pass" => o.pass = Some(val()?),
            "--redis-rtt-ms" => o.redis_rtt_ms = num(val()?)?,
            "--connect-during" => o.connect_during = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if scenario.as_deref() == Some("fleet") {
        if !args.iter().any(|a| a == "--clients") {
            o.clients = 15_000;
        }
        // Under the three nodes' default accept buckets (2,000/s each).
        if !args.iter().any(|a| a == "--connect-rate") {
            o.connect_rate = 3000.0;
        }
        // Three nodes on the box's 2 cores: one shard each (two each only
        // add threads that take turns: nodes +15 points of a core, the
        // survivors' p99 up, at 15,000 viewers).
        if o.shards.is_none() {
            o.shards = Some(1);
        }
        if let Some(e) = &o.event {
            if !fleet::EVENTS.contains(&e.as_str()) {
                return Err(format!("unknown event {e}"));
            }
        }
    }
    scenario
        .map(|s| (s, o))
        .ok_or_else(|| "no scenario given".into())
}
