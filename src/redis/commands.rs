//! The command client: one lazily (re)connected connection, to the one Redis
//! in standalone mode (opened by [`Redis::connect_node`]) or to the whole
//! cluster in cluster mode (each key command goes to its slot's primary,
//! `MOVED`/`ASK` followed by the redis crate's cluster connection). Batches go
//! through one method, [`Commands::pipeline`]: grouped per primary in a
//! cluster, a pipeline's redirected commands sent again on their own so they
//! follow it too. Every call is bounded by timeouts (a standalone pipeline
//! fails at its first reply not read in time, not after a timeout per reply);
//! a failure on the way drops the connection and backs off, so the next call
//! starts from a fresh slot map (refresh on connection loss), while a
//! command's own refusal (`WRONGTYPE`) keeps it; the cluster connection is
//! also rebuilt every 30 s (periodic map refresh), and the slot map it read is
//! kept until then.

use super::backoff::Backoff;
use super::error::{ConnectError, Error};
use super::{glob_escape, Mode, Redis, IO_TIMEOUT};
use crate::slots::SlotMap;
use redis::cluster::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, RetryMethod, ServerErrorKind, Value};
use std::any::TypeId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How old a cluster connection's slot map may get before it is rebuilt.
pub const MAP_REFRESH: Duration = Duration::from_secs(30);
/// Keys asked for per SCAN step.
const SCAN_COUNT: usize = 1000;

/// One `SCAN` step from `cursor` over keys matching `pattern` (of `type_` if given).
pub fn scan_step(cursor: u64, pattern: &str, type_: Option<&str>) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    if let Some(t) = type_ {
        cmd.arg("TYPE").arg(t);
    }
    cmd
}

enum Con {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

/// A command connection that never hangs its caller.
pub struct Commands {
    redis: Arc<Redis>,
    con: Option<Con>,
    built: Instant,
    backoff: Backoff,
    what: &'static str,
    /// The slot map read on this connection, until it is rebuilt or a
    /// redirect shows the map moved.
    map: Option<SlotMap>,
}

fn convert<T: FromRedisValue>(v: Value) -> RedisResult<T> {
    T::from_redis_value(v).map_err(Into::into)
}

/// Commands as one pipeline on one connection, their replies read until the
/// first that fails. The redis crate's `Pipeline::query` goes on reading every
/// reply after one timed out, each under its own read timeout, so a frozen
/// Redis held a pipeline of N commands for N timeouts; here a pipeline waits
/// one timeout at most, and the caller drops the connection with the replies
/// left unread. Every reply comes back, Redis's errors as values.
fn single_pipeline(c: &mut redis::Connection, cmds: &[Cmd]) -> RedisResult<Vec<Value>> {
    let mut packed = Vec::new();
    for cmd in cmds {
        cmd.write_packed_command(&mut packed);
    }
    c.send_packed_command(&packed)?;
    let mut replies = Vec::with_capacity(cmds.len());
    for _ in 0..cmds.len() {
        replies.push(c.recv_response()?);
    }
    Ok(replies)
}

/// `cmds` as one cluster pipeline (sent per primary).
fn cluster_pipeline(cmds: &[Cmd]) -> redis::cluster::ClusterPipeline {
    let mut p = redis::cluster::cluster_pipe();
    for cmd in cmds {
        p.add_command(cmd.clone());
    }
    p
}

/// One command's reply on the path that follows redirects, its own failure
/// as a [`Value::ServerError`]; a failed connection is the error.
fn one_reply(cmd: &Cmd, c: &mut ClusterConnection) -> RedisResult<Value> {
    match cmd.query::<Value>(c) {
        Ok(v) => Ok(v),
        Err(e) => match e.clone().into_server_errors().as_deref() {
            Some([(_, own)]) => Ok(Value::ServerError(own.clone())),
            _ => Err(e),
        },
    }
}

/// The positions of a pipeline's commands that the cluster sent elsewhere or
/// asked to retry (`MOVED`, `ASK` while a slot migrates, `TRYAGAIN`), when
/// those are all that failed; `None` for any other error.
fn redirected(e: &RedisError) -> Option<Vec<usize>> {
    let failed = e.clone().into_server_errors()?;
    failed
        .iter()
        .map(|(i, err)| {
            matches!(
                err.kind(),
                Some(ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::TryAgain)
            )
            .then_some(*i)
        })
        .collect::<Option<Vec<usize>>>()
        .filter(|at| !at.is_empty())
}

/// Redis answered with a refusal of the command itself (`WRONGTYPE`, `OOM`,
/// a script's error, `NOSCRIPT`), not of serving it now: every reply was
/// read, so the connection is in step and Redis is up.
fn refused_by_command(e: &RedisError) -> bool {
    matches!(e.retry_method(), RetryMethod::NoRetry) && e.clone().into_server_errors().is_some()
}

impl Commands {
    /// A client for `redis`; nothing is connected yet.
    pub fn new(redis: &Arc<Redis>, what: &'static str) -> Commands {
        Commands {
            redis: Arc::clone(redis),
            con: None,
            built: Instant::now(),
            backoff: Backoff::default(),
            what,
            map: None,
        }
    }

    /// The deployment this client talks to.
    pub fn redis(&self) -> &Arc<Redis> {
        &self.redis
    }

    fn open(&self) -> Result<Con, ConnectError> {
        let mode = self.redis.resolve()?;
        match mode {
            Mode::Standalone => self
                .redis
                .first_node(|addr| self.redis.connect_node(addr))
                .map(|(_, c)| Con::Single(c))
                .map_err(ConnectError::Standalone),
            Mode::Cluster => {
                let con = self
                    .redis
                    .cluster_client()
                    .and_then(|client| client.get_connection())
                    .and_then(|con| {
                        con.set_write_timeout(Some(IO_TIMEOUT))?;
                        Ok(con)
                    })
                    .map_err(ConnectError::Cluster)?;
                Ok(Con::Cluster(Box::new(con)))
            }
        }
    }

    fn connect(&mut self) -> Result<&mut Con, Error> {
        if matches!(self.con, Some(Con::Cluster(_))) && self.built.elapsed() >= MAP_REFRESH {
            self.con = None;
        }
        let con = match self.con.take() {
            Some(con) => con,
            None if !self.backoff.ready() => return Err(Error::Backoff { what: self.what }),
            None => {
                let con = self.open().map_err(|source| {
                    self.backoff.failed();
                    Error::Connect {
                        what: self.what,
                        source,
                    }
                })?;
                tracing::debug!(what = self.what, "Redis connected");
                self.map = None;
                self.built = Instant::now();
                con
            }
        };
        Ok(self.con.insert(con))
    }

    /// Runs `f` on the connection, connecting first if needed. An error on
    /// the way drops the connection (a late reply must never be read as the
    /// next command's) and backs off; so does a reply saying Redis cannot
    /// serve now (`LOADING`, `READONLY`...). A command's own refusal
    /// ([`refused_by_command`]) keeps both: its reply was read whole. A
    /// connection found already dead (Redis restarted since its last use) is
    /// replaced and `f` retried once at once.
    fn run<T>(&mut self, mut f: impl FnMut(&mut Con) -> RedisResult<T>) -> Result<T, Error> {
        let reused = self.con.is_some();
        let con = self.connect()?;
        let mut r = f(con);
        if let Err(e) = &r {
            if reused && (e.is_connection_dropped() || e.is_io_error()) {
                self.con = None;
                self.backoff.reset();
                r = self.connect().map(&mut f)?;
            }
        }
        match r {
            Ok(v) => {
                self.backoff.reset();
                Ok(v)
            }
            Err(e) => {
                if refused_by_command(&e) {
                    self.backoff.reset();
                } else {
                    self.con = None;
                    self.backoff.failed();
                }
                Err(Error::Command {
                    what: self.what,
                    source: e,
                })
            }
        }
    }

    /// One command, routed by its key in a cluster.
    pub fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Error> {
        self.run(|c| match c {
            Con::Single(c) => cmd.query(c),
            Con::Cluster(c) => cmd.query(&mut **c),
        })
    }

    /// The one pipeline: `cmds` sent at once (one pipeline per primary in a
    /// cluster), every reply in order, Redis's first error failing it. A
    /// standalone pipeline stops at the first reply that fails or times out
    /// and drops the connection ([`single_pipeline`]). In a cluster, the
    /// commands redirected (`MOVED`, `ASK`, `TRYAGAIN`) are sent again, one at
    /// a time on the path that follows redirects (the redis crate's cluster
    /// pipeline returns such a reply instead of following it, and drops the
    /// other replies with it): with `T = ()` those alone (the others are done
    /// and never run twice, so any write goes here); a caller that takes
    /// replies has the others read again one at a time too, so its batch must
    /// be one that may run twice (reads, idempotent writes). A redirect also
    /// makes the next [`Commands::known_slot_map`] read the map again.
    pub fn pipeline<T: FromRedisValue + 'static>(&mut self, cmds: &[Cmd]) -> Result<T, Error> {
        if cmds.is_empty() {
            // Nothing to send (a cluster pipeline refuses to be empty).
            return convert(Value::Array(Vec::new())).map_err(|source| Error::Command {
                what: self.what,
                source,
            });
        }
        let replies_taken = TypeId::of::<T>() != TypeId::of::<()>();
        let mut cluster: Option<redis::cluster::ClusterPipeline> = None;
        let mut moved = false;
        let r = self.run(|c| match c {
            Con::Single(c) => convert(Value::Array(single_pipeline(c, cmds)?).extract_error()?),
            Con::Cluster(c) => {
                let p = cluster.get_or_insert_with(|| cluster_pipeline(cmds));
                let e = match p.query::<Value>(c) {
                    Ok(replies) => return convert(replies),
                    Err(e) => e,
                };
                let at = redirected(&e).ok_or(e)?;
                moved = true;
                let again: Vec<usize> = if replies_taken {
                    (0..cmds.len()).collect()
                } else {
                    at
                };
                let mut replies = vec![Value::Nil; cmds.len()];
                for i in again {
                    replies[i] = cmds[i].query::<Value>(&mut **c)?;
                }
                convert(Value::Array(replies))
            }
        });
        if moved {
            self.map = None;
        }
        r
    }

    /// [`Commands::pipeline`] for reads where one command's own failure (a
    /// key of the wrong type: `WRONGTYPE`) must not fail the others: each
    /// reply in order, such a failure a [`Value::ServerError`] in its place.
    /// Only a connection that fails fails it all. In a cluster, a pipeline
    /// with a failure is read again one command at a time (reads may run
    /// twice), redirects followed.
    pub fn pipeline_each(&mut self, cmds: &[Cmd]) -> Result<Vec<Value>, Error> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut moved = false;
        let r = self.run(|c| match c {
            Con::Single(c) => single_pipeline(c, cmds),
            Con::Cluster(c) => match cluster_pipeline(cmds).query::<Vec<Value>>(c) {
                Ok(replies) => Ok(replies),
                Err(e) if e.clone().into_server_errors().is_some() => {
                    moved |= redirected(&e).is_some();
                    cmds.iter().map(|cmd| one_reply(cmd, c)).collect()
                }
                Err(e) => Err(e),
            },
        });
        if moved {
            self.map = None;
        }
        r
    }

    /// The mode in use, connecting first (which resolves `auto`).
    pub fn mode(&mut self) -> Result<Mode, Error> {
        Ok(match self.connect()? {
            Con::Single(_) => Mode::Standalone,
            Con::Cluster(_) => Mode::Cluster,
        })
    }

    /// The cluster's slot map as last read on this connection; `None` in
    /// standalone mode. `CLUSTER SLOTS` is read only when needed: on a new
    /// connection (after a failure, and every [`MAP_REFRESH`]) or after a
    /// redirect; the map read is kept till then.
    pub fn known_slot_map(&mut self) -> Result<Option<SlotMap>, Error> {
        if self.mode()? == Mode::Standalone {
            return Ok(None);
        }
        match &self.map {
            Some(map) => Ok(Some(map.clone())),
            None => self.slot_map(),
        }
    }

    /// The cluster's slot map read now (`CLUSTER SLOTS`); `None` in
    /// standalone mode.
    pub fn slot_map(&mut self) -> Result<Option<SlotMap>, Error> {
        if self.mode()? == Mode::Standalone {
            return Ok(None);
        }
        let reply: Value = self.query(&redis::cmd("CLUSTER").arg("SLOTS").clone())?;
        let seed = self
            .redis
            .candidates()
            .first()
            .map(|a| a.0.clone())
            .unwrap_or_default();
        let map = SlotMap::parse(&reply, &seed).ok_or(Error::NoSlotMap)?;
        self.redis.learn(&map);
        self.map = Some(map.clone());
        Ok(Some(map))
    }

    /// Every key matching `<prefix>*` (of `type_` if given), over every
    /// primary in a cluster (`SCAN` is per node), the one node otherwise.
    pub fn scan(&mut self, prefix: &str, type_: Option<&str>) -> Result<Vec<Vec<u8>>, Error> {
        let pattern = format!("{}*", glob_escape(prefix));
        let mut keys = Vec::new();
        let nodes = match self.known_slot_map()? {
            Some(m) => m.primaries(),
            None => vec![("".into(), 0)],
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let cmd = scan_step(cursor, &pattern, type_);
                let (next, page): (u64, Vec<Vec<u8>>) = self.run(|c| match c {
                    Con::Single(c) => cmd.query(c),
                    Con::Cluster(c) => c
                        .route_command(
                            &cmd,
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                host: node.0.clone(),
                                port: node.1,
                            }),
                        )
                        .and_then(convert),
                })?;
                keys.extend(page);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys)
    }

    /// Drops the connection and the slot map read on it: the cluster's slots
    /// are known to have moved, so the next call connects and routes afresh
    /// instead of finding out through a silent old primary's timeout.
    pub fn reroute(&mut self) {
        self.con = None;
        self.map = None;
    }

    /// Lets the next call try at once instead of waiting out the backoff:
    /// Redis was just found answering again (a pub/sub connection came back),
    /// and the state rereads that follow must not wait for this client's own
    /// retry time.
    pub fn retry_now(&mut self) {
        self.backoff.reset();
    }

    /// How long until the next call may try to connect (zero while a
    /// connection is held or the backoff is over): callers that wait for
    /// Redis wait on this client's backoff, not one of their own.
    pub fn retry_in(&self) -> Duration {
        if self.con.is_some() {
            Duration::ZERO
        } else {
            self.backoff.wait()
        }
    }

    /// How long a loop that uses this client every `every` waits for its
    /// next turn: after a turn whose call `failed`, until this client's own
    /// next attempt ([`Commands::retry_in`]: its jittered backoff, capped at
    /// 2 s), so its reconnects keep their jitter instead of falling on the
    /// loop's tick (in step with every other client on the same tick, and
    /// with every node that lost Redis at the same moment); else `every`.
    pub fn next_turn(&self, failed: bool, every: Duration) -> Duration {
        if failed {
            self.retry_in()
        } else {
            every
        }
    }

    /// Whether a connection is currently held.
    pub fn is_connected(&self) -> bool {
        self.con.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ConnectionLike;

    /// A connection that answers a pipeline with canned RESP replies, one per command.
    struct Canned(Vec<&'static [u8]>);

    impl ConnectionLike for Canned {
        fn req_packed_command(&mut self, _cmd: &[u8]) -> RedisResult<Value> {
            redis::parse_redis_value(self.0[0])
        }
        fn req_packed_commands(
            &mut self,
            _cmd: &[u8],
            _offset: usize,
            _count: usize,
        ) -> RedisResult<Vec<Value>> {
            self.0.iter().map(|r| redis::parse_redis_value(r)).collect()
        }
        fn get_db(&self) -> i64 {
            0
        }
        fn check_connection(&mut self) -> bool {
            true
        }
        fn is_open(&self) -> bool {
            true
        }
    }

    /// The error a pipeline of three commands fails with when they get these replies.
    fn pipeline_error(replies: Vec<&'static [u8]>) -> RedisError {
        let mut p = redis::pipe();
        for key in ["a", "b", "c"] {
            p.cmd("HSET").arg(key).arg("f").arg("v");
        }
        p.query::<()>(&mut Canned(replies))
            .expect_err("a failed command fails the pipeline")
    }

    #[test]
    fn redirected_commands_are_found_by_position() {
        let e = pipeline_error(vec![
            b":1\r\n",
            b"-ASK 4643 127.0.0.1:7001\r\n",
            b"-MOVED 4643 127.0.0.1:7002\r\n",
        ]);
        assert_eq!(redirected(&e), Some(vec![1, 2]));
        let e = pipeline_error(vec![b"-TRYAGAIN later\r\n", b":1\r\n", b":1\r\n"]);
        assert_eq!(redirected(&e), Some(vec![0]));
    }

    #[test]
    fn a_failed_connect_never_shows_the_password() {
        use crate::redis::{PubSubMode, RedisFlags, RedisMode};
        for mode in [RedisMode::Standalone, RedisMode::Auto] {
            // Port 1 refuses at once.
            let flags = RedisFlags {
                redis_mode: mode,
                pubsub: PubSubMode::Sharded,
                ..RedisFlags::new("redis://svc:Pw%40S3cret@127.0.0.1:1/3")
            };
            let redis = Redis::from_flags(&flags).expect("valid flags");
            let mut link = Commands::new(&redis, "unit");
            let e = link
                .query::<String>(&redis::cmd("PING"))
                .expect_err("nothing listens");
            assert!(matches!(e, Error::Connect { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.starts_with("unit: connect: "), "{text}");
            assert!(text.contains("127.0.0.1:1"), "{text}");
            assert!(!text.contains("S3cret"), "{text}");
            assert!(!format!("{e:?}").contains("S3cret"), "{e:?}");
            // The next call waits out the backoff, and says so.
            let e = link.query::<String>(&redis::cmd("PING")).expect_err("down");
            assert!(e.is_unreachable(), "{e}");
        }
    }

    #[test]
    fn only_a_commands_own_refusal_keeps_the_connection() {
        let reply = |line: &str| {
            let wire = format!("-{line}\r\n");
            redis::parse_redis_value(wire.as_bytes())
                .and_then(|v| v.extract_error())
                .expect_err(line)
        };
        for line in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR Error running script: payload refused",
            "NOSCRIPT No matching script.",
        ] {
            assert!(refused_by_command(&reply(line)), "{line}");
        }
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "MASTERDOWN Link with MASTER is down",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "MOVED 4643 127.0.0.1:7002",
        ] {
            assert!(!refused_by_command(&reply(line)), "{line}");
        }
        let wrongtype = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
        assert!(refused_by_command(&pipeline_error(vec![
            b":1\r\n", wrongtype, b":1\r\n"
        ])));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!refused_by_command(&io));
    }

    #[test]
    fn other_failures_are_not_redirects() {
        // A real error beside a redirect: the batch fails as a whole.
        let e = pipeline_error(vec![
            b"-ASK 4643 127.0.0.1:7001\r\n",
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            b":1\r\n",
        ]);
        assert_eq!(redirected(&e), None);
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(redirected(&io), None);
    }
}
