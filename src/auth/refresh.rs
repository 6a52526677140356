//! The `--jwks-url` source: the keys it holds, and the thread that fetches
//! them at start, every 5 minutes, and at once when a token names a `kid` not
//! held; no two fetches of any kind start less than 10 s apart. Shards only
//! read the held keys and, for an unknown `kid`, nudge the thread without
//! waiting: they never block on a fetch.

use super::fetch::Target;
use super::jwks::{self, HeldKey};
use crate::clock;
use crate::redis::backoff::Backoff;
use crate::supervisor::{self, Policy};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Refetch interval while the provider answers (contract §4b).
pub const REFRESH: Duration = Duration::from_secs(300);

/// Fewest milliseconds between the starts of two fetches, whatever asked for
/// them (contract §4b: at most once per 10 s per node).
pub const FETCH_SPACING_MS: u64 = 10_000;

/// First wait before a retry while the provider does not answer (jittered,
/// doubled each failure; never under [`FETCH_SPACING_MS`] since the last start).
const RETRY_FIRST: Duration = Duration::from_secs(10);

/// Longest wait between retries while the provider does not answer.
const RETRY_CAP: Duration = Duration::from_secs(30);

/// Unknown `kid`s remembered (oldest forgotten first): bounds what forged kids cost.
const MAX_ASKED: usize = 32;

/// At most one warning per this long while fetches keep failing.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What a token whose `kid` is not held gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The node cannot tell yet (no fetch has succeeded, the last one failed,
    /// or the one the `kid` asked for is under way): 503, retry after this many seconds.
    RetryAfter(u64),
    /// The node's last fetch succeeded without it, and either no new fetch may
    /// start yet or that fetch started after the `kid` was first asked for: 401.
    NotPublished,
}

/// What the last successful fetch brought.
#[derive(Debug, Default)]
pub struct Held {
    /// The signing keys.
    pub keys: Vec<HeldKey>,
    /// The `kid`s of published keys that are never used (another `use`, type
    /// or curve; unreadable): a token naming one is refused, no fetch helps.
    pub unusable_kids: Vec<String>,
}

impl Held {
    /// Whether the set names `kid` (a token without one: whether any key is held).
    pub fn names(&self, kid: Option<&str>) -> bool {
        match kid {
            Some(kid) => {
                self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
                    || self.unusable_kids.iter().any(|k| k == kid)
            }
            None => !self.keys.is_empty(),
        }
    }
}

/// The keys of one JWKS and the state of their fetching.
pub struct JwksSource {
    target: Target,
    keys: RwLock<Arc<Held>>,
    /// A fetch succeeded since start (`/healthz` `auth`).
    ever_ok: AtomicBool,
    /// The last fetch that ended succeeded.
    last_ok: AtomicBool,
    /// A fetch is asked for or running.
    pending: AtomicBool,
    /// A fetch is running.
    in_flight: AtomicBool,
    /// When the last fetch started ([`clock::now_ms`], at least 1; 0: never).
    last_fetch_ms: AtomicU64,
    /// When the last fetch that succeeded started (0: none yet).
    ok_fetch_ms: AtomicU64,
    /// `kid`s asked for and not held, with when each was first asked for.
    asked: Mutex<Vec<(String, u64)>>,
    kick: Sender<()>,
    kicked: Mutex<Option<Receiver<()>>>,
    /// Fetches that succeeded.
    pub fetches_ok: AtomicU64,
    /// Fetches that failed (unreachable, not 200, refused document).
    pub fetches_error: AtomicU64,
}

/// What the fetching thread remembers between fetches, for its log lines.
#[derive(Default)]
struct Log {
    /// Fetches failed in a row.
    failures: u32,
    /// When the last failure was warned about.
    warned: Option<Instant>,
    /// The unreadable keys last warned about.
    unreadable: Vec<String>,
}

impl JwksSource {
    /// A source for this URL; nothing is fetched until [`JwksSource::start`].
    pub fn new(target: Target) -> JwksSource {
        let (kick, kicked) = crossbeam_channel::bounded(1);
        JwksSource {
            target,
            keys: RwLock::new(Arc::new(Held::default())),
            ever_ok: AtomicBool::new(false),
            last_ok: AtomicBool::new(false),
            pending: AtomicBool::new(true),
            in_flight: AtomicBool::new(false),
            last_fetch_ms: AtomicU64::new(0),
            ok_fetch_ms: AtomicU64::new(0),
            asked: Mutex::new(Vec::new()),
            kick,
            kicked: Mutex::new(Some(kicked)),
            fetches_ok: AtomicU64::new(0),
            fetches_error: AtomicU64::new(0),
        }
    }

    /// The keys held now.
    pub fn keys(&self) -> Arc<Held> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// True once a fetch has succeeded.
    pub fn ready(&self) -> bool {
        self.ever_ok.load(Relaxed)
    }

    /// When `kid` was asked for with a fetch still to come: now, if it was
    /// not in the short list or a new fetch may start for it now (`anew`),
    /// else when that was.
    fn asked_at(&self, kid: &str, now: u64, anew: bool) -> u64 {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, at)) = asked.iter_mut().find(|(k, _)| k == kid) {
            if anew {
                *at = now;
            }
            return *at;
        }
        if asked.len() >= MAX_ASKED {
            asked.remove(0);
        }
        asked.push((kid.to_owned(), now));
        now
    }

    /// A token named a `kid` that is not held (`""`: it named none while
    /// nothing is held). A fetch is asked for: at once, or as soon as 10 s
    /// have passed since the last one started. 401 while the node's last fetch
    /// succeeded and none runs, when no new fetch may start yet or a fetch that
    /// started after the `kid` was asked for succeeded without it; 503 while
    /// fetches fail, before the first succeeds, or while a fetch is under way
    /// or about to start for it (a `kid` asked for again once a new fetch may
    /// start waits for that fetch: the provider may have published it since).
    /// Never blocks.
    pub fn missing(&self, kid: &str) -> Missing {
        self.missing_at(kid, clock::now_ms().max(1))
    }

    /// [`JwksSource::missing`] at `now` ([`clock::now_ms`]).
    fn missing_at(&self, kid: &str, now: u64) -> Missing {
        // Read before the kick (the fetch it starts moves them), the start
        // first: a fetch seen started is seen running or ended.
        let next = self.last_fetch_ms.load(SeqCst) + FETCH_SPACING_MS;
        let in_flight = self.in_flight.load(SeqCst);
        let last_ok = self.last_ok.load(SeqCst);
        let asked = self.asked_at(kid, now, !in_flight && now >= next);
        let ok_since_asked = self.ok_fetch_ms.load(SeqCst) >= asked;
        if !self.pending.swap(true, SeqCst)
            && matches!(self.kick.try_send(()), Err(TrySendError::Disconnected(())))
        {
            self.pending.store(false, SeqCst);
        }
        if last_ok && !in_flight && (ok_since_asked || now < next) {
            // The keys are fresh: the token's key is not published.
            return Missing::NotPublished;
        }
        let wait_ms = if in_flight {
            0
        } else {
            next.saturating_sub(now)
        };
        Missing::RetryAfter(wait_ms.div_ceil(1000).max(1))
    }

    /// Starts the fetching thread (once).
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let Some(kicked) = self.kicked.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let me = Arc::clone(self);
        supervisor::spawn("seatboard-jwks", Policy::FailsNode, move || me.run(kicked))
    }

    /// Ends the fetching thread at shutdown (after [`supervisor::stop`]):
    /// a kick wakes its wait, and it sees the stop.
    pub fn stop(&self) {
        let _ = self.kick.try_send(());
    }

    /// When the next fetch may start: [`FETCH_SPACING_MS`] after the last one began.
    fn floor(&self) -> Instant {
        clock::instant_at(self.last_fetch_ms.load(SeqCst) + FETCH_SPACING_MS)
    }

    fn run(&self, kicked: Receiver<()>) {
        let mut log = Log::default();
        let mut retry = Backoff::new(RETRY_FIRST, RETRY_CAP);
        loop {
            self.fetch_once(&mut log);
            let mut due = if log.failures == 0 {
                retry.reset();
                Instant::now() + REFRESH
            } else {
                retry.failed();
                (Instant::now() + retry.wait()).max(self.floor())
            };
            // Wait for the refresh or the retry; a kick (an unknown `kid`)
            // brings the fetch forward to the 10 s floor, not before.
            loop {
                let kick = kicked.recv_deadline(due);
                if supervisor::stopping() {
                    return;
                }
                match kick {
                    Ok(()) => due = due.min(self.floor()),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    }

    fn fetch_once(&self, log: &mut Log) {
        self.pending.store(true, SeqCst);
        self.in_flight.store(true, SeqCst);
        let started = clock::now_ms().max(1);
        self.last_fetch_ms.store(started, SeqCst);
        match self.target.get().and_then(|body| jwks::parse(&body)) {
            Ok(parsed) => {
                let kids: Vec<&str> = parsed
                    .keys
                    .iter()
                    .filter_map(|k| k.kid.as_deref())
                    .collect();
                let changed = {
                    let held = self.keys();
                    held.keys.len() != parsed.keys.len()
                        || held
                            .keys
                            .iter()
                            .zip(&parsed.keys)
                            .any(|(a, b)| a.kid != b.kid)
                };
                if changed || log.failures > 0 {
                    tracing::info!(
                        keys = parsed.keys.len(),
                        ?kids,
                        ignored = %jwks::summary(&parsed.ignored),
                        "JWKS loaded"
                    );
                }
                if parsed.unreadable != log.unreadable {
                    if !parsed.unreadable.is_empty() {
                        tracing::warn!(
                            skipped = parsed.unreadable.len(),
                            keys = %jwks::summary(&parsed.unreadable),
                            "JWKS keys that cannot be read are skipped; the others are used"
                        );
                    }
                    log.unreadable = parsed.unreadable;
                }
                let held = Held {
                    keys: parsed.keys,
                    unusable_kids: parsed.unusable_kids,
                };
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(held);
                self.fetches_ok.fetch_add(1, Relaxed);
                self.ok_fetch_ms.store(started, SeqCst);
                self.last_ok.store(true, SeqCst);
                self.ever_ok.store(true, SeqCst);
                log.failures = 0;
                log.warned = None;
            }
            Err(e) => {
                self.fetches_error.fetch_add(1, Relaxed);
                self.last_ok.store(false, SeqCst);
                log.failures = log.failures.saturating_add(1);
                if log.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    tracing::warn!(error = %e, failures = log.failures, "JWKS fetch failed; the keys already held stay in use");
                    log.warned = Some(Instant::now());
                } else {
                    tracing::debug!(error = %e, "JWKS fetch failed");
                }
            }
        }
        self.in_flight.store(false, SeqCst);
        self.pending.store(false, SeqCst);
    }
}

#[cfg(test)]
impl JwksSource {
    /// Holds `held` as if a fetch had brought it (for the verifier's tests).
    pub(super) fn hold(&self, held: Held) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> JwksSource {
        JwksSource::new(Target::parse("http://127.0.0.1:9/jwks", None).expect("a target"))
    }

    /// A source whose last fetch started now and ended `ok` or failed, and
    /// `kid` first asked for just after that fetch started.
    fn fetched(ok: bool, kid: &str) -> (JwksSource, u64) {
        let s = source();
        let started = clock::now_ms().max(1);
        s.last_fetch_ms.store(started, SeqCst);
        s.pending.store(false, SeqCst);
        if ok {
            s.ok_fetch_ms.store(started, SeqCst);
            s.last_ok.store(true, SeqCst);
            s.ever_ok.store(true, SeqCst);
        }
        s.asked
            .lock()
            .expect("asked")
            .push((kid.to_owned(), started + 1));
        (s, started)
    }

    #[test]
    fn an_unknown_kid_right_after_a_good_fetch_is_a_401() {
        let (s, _) = fetched(true, "new");
        assert_eq!(s.missing("new"), Missing::NotPublished);
        assert_eq!(s.missing("new"), Missing::NotPublished, "asked again");
        // A fetch is still asked for, to start once 10 s have passed.
        assert!(s.pending.load(SeqCst));
    }

    #[test]
    fn an_unknown_kid_is_a_503_while_fetches_fail_or_its_fetch_runs() {
        let (s, _) = fetched(false, "new");
        assert!(
            matches!(s.missing("new"), Missing::RetryAfter(1..=10)),
            "the last fetch failed"
        );
        let never = source();
        assert!(matches!(never.missing("new"), Missing::RetryAfter(_)));
        let (s, started) = fetched(true, "new");
        s.in_flight.store(true, SeqCst);
        assert_eq!(
            s.missing("new"),
            Missing::RetryAfter(1),
            "a fetch is under way"
        );
        // It ends without the kid: 401.
        s.last_fetch_ms.store(started + 2, SeqCst);
        s.ok_fetch_ms.store(started + 2, SeqCst);
        s.in_flight.store(false, SeqCst);
        assert_eq!(s.missing("new"), Missing::NotPublished);
        // The next one fails: 503 again, until one may start (10 s, rounded up).
        s.last_ok.store(false, SeqCst);
        assert!(matches!(s.missing("new"), Missing::RetryAfter(1..=11)));
    }

    #[test]
    fn a_kid_refused_by_a_good_fetch_waits_for_the_next_one_once_it_may_start() {
        // Asked for 30 s ago; a fetch 20 s ago succeeded without it (401
        // then). The provider may have published it since: asked again, it
        // starts a fetch at once and gets 503 until that fetch has answered.
        let s = source();
        let now = 100_000;
        s.asked
            .lock()
            .expect("asked")
            .push(("r2".into(), now - 30_000));
        s.last_fetch_ms.store(now - 20_000, SeqCst);
        s.ok_fetch_ms.store(now - 20_000, SeqCst);
        s.last_ok.store(true, SeqCst);
        s.ever_ok.store(true, SeqCst);
        s.pending.store(false, SeqCst);
        assert_eq!(s.missing_at("r2", now), Missing::RetryAfter(1));
        // The fetch it started runs: still 503.
        s.in_flight.store(true, SeqCst);
        s.last_fetch_ms.store(now + 1, SeqCst);
        assert_eq!(s.missing_at("r2", now + 50), Missing::RetryAfter(1));
        // It succeeded without the kid: 401.
        s.ok_fetch_ms.store(now + 1, SeqCst);
        s.in_flight.store(false, SeqCst);
        assert_eq!(s.missing_at("r2", now + 100), Missing::NotPublished);
    }

    #[test]
    fn the_set_names_its_unusable_kids() {
        let held = Held {
            keys: Vec::new(),
            unusable_kids: vec!["enc".into()],
        };
        assert!(held.names(Some("enc")));
        assert!(!held.names(Some("other")));
        assert!(!held.names(None), "no key held");
    }
}
