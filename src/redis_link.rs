//! Redis command connections that never hang their caller: every connect, read
//! and write is bounded by a timeout, a failed connection is dropped and retried
//! after a jittered exponential backoff capped at 2 s.

use std::time::{Duration, Instant};

/// How long a TCP connect (and the connection handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one command or pipeline may wait on a read or a write.
pub const IO_TIMEOUT: Duration = Duration::from_millis(1000);
/// The first retry delay after a failure.
const BACKOFF_START: Duration = Duration::from_millis(50);
/// The longest retry delay (the contract's cap).
pub const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Jittered exponential backoff between reconnect attempts, capped at 2 s.
#[derive(Debug)]
pub struct Backoff {
    delay: Duration,
    not_before: Instant,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            delay: BACKOFF_START,
            not_before: Instant::now(),
        }
    }
}

impl Backoff {
    /// Whether an attempt may be made now.
    pub fn ready(&self) -> bool {
        Instant::now() >= self.not_before
    }

    /// Records a failure: the next attempt waits a jittered, doubled delay.
    pub fn failed(&mut self) {
        // Full delay in [delay/2, delay]: nodes that lost Redis together do not
        // all come back in the same millisecond.
        let half = self.delay / 2;
        let jitter = half.mul_f64(fastrand::f64());
        self.not_before = Instant::now() + half + jitter;
        self.delay = (self.delay * 2).min(BACKOFF_CAP);
    }

    /// Records a success: the next failure starts from the shortest delay.
    pub fn reset(&mut self) {
        self.delay = BACKOFF_START;
        self.not_before = Instant::now();
    }
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

/// A lazily (re)connected command connection with bounded timeouts.
pub struct Link {
    client: redis::Client,
    con: Option<redis::Connection>,
    backoff: Backoff,
    what: &'static str,
}

impl Link {
    /// A link to `uri`; fails only on a malformed URI (nothing is connected yet).
    pub fn new(uri: &str, what: &'static str) -> Result<Link, String> {
        let client = redis::Client::open(uri).map_err(|e| format!("bad Redis URI {uri:?}: {e}"))?;
        Ok(Link {
            client,
            con: None,
            backoff: Backoff::default(),
            what,
        })
    }

    /// The parsed connection details (for the raw pub/sub connection).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    fn connect(&mut self) -> Result<&mut redis::Connection, String> {
        if self.con.is_none() {
            if !self.backoff.ready() {
                return Err(format!("{}: Redis down, waiting to reconnect", self.what));
            }
            let c = self
                .client
                .get_connection_with_timeout(CONNECT_TIMEOUT)
                .and_then(|c| {
                    c.set_read_timeout(Some(IO_TIMEOUT))?;
                    c.set_write_timeout(Some(IO_TIMEOUT))?;
                    Ok(c)
                });
            match c {
                Ok(c) => {
                    tracing::debug!(what = self.what, "Redis connected");
                    self.con = Some(c);
                }
                Err(e) => {
                    self.backoff.failed();
                    return Err(format!("{}: connect: {e}", self.what));
                }
            }
        }
        self.con
            .as_mut()
            .ok_or_else(|| format!("{}: not connected", self.what))
    }

    /// Runs `f` on the connection, connecting first if needed. Any error drops
    /// the connection (a late reply must never be read as the next command's)
    /// and backs off. A connection found already dead (Redis restarted since
    /// its last use) is replaced and `f` retried once at once: the first
    /// command after a restart must not be lost to a stale socket.
    pub fn run<T>(
        &mut self,
        mut f: impl FnMut(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, String> {
        let reused = self.con.is_some();
        let con = self.connect()?;
        let mut r = f(con);
        if let Err(e) = &r {
            if reused && e.is_connection_dropped() {
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
                self.con = None;
                self.backoff.failed();
                Err(format!("{}: {e}", self.what))
            }
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

    #[test]
    fn backoff_is_capped_and_jittered() {
        let mut b = Backoff::default();
        for _ in 0..20 {
            b.failed();
        }
        assert_eq!(b.delay, BACKOFF_CAP);
        let wait = b.not_before.saturating_duration_since(Instant::now());
        assert!(wait <= BACKOFF_CAP, "{wait:?}");
        b.reset();
        assert!(b.ready());
    }

    #[test]
    fn glob_escapes_metacharacters() {
        assert_eq!(glob_escape("seats:"), "seats:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
