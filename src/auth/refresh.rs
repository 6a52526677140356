//! The `--jwks-url` source: the keys it holds, and the thread that fetches
//! them at start, every 5 minutes, and at once (at most once per 10 s) when a
//! token names a `kid` not held. Shards only read the held keys and, for an
//! unknown `kid`, nudge the thread without waiting: they never block on a fetch.

use super::fetch::Target;
use super::jwks::{self, HeldKey};
use crate::clock;
use crate::redis::backoff::Backoff;
use crate::supervisor::{self, Policy};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Refetch interval while the provider answers (contract §4b).
pub const REFRESH: Duration = Duration::from_secs(300);

/// Fewest milliseconds between two fetches asked for by an unknown `kid`.
pub const KICK_SPACING_MS: u64 = 10_000;

/// First wait before a retry while the provider does not answer (jittered,
/// doubled each failure).
const RETRY_FIRST: Duration = Duration::from_secs(2);

/// Longest wait between retries while the provider does not answer.
const RETRY_CAP: Duration = Duration::from_secs(30);

/// Unknown `kid`s remembered (oldest forgotten first): bounds what forged kids cost.
const MAX_ASKED: usize = 32;

/// At most one warning per this long while fetches keep failing.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What a token whose `kid` is not held gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// No fetch since it was first asked for has succeeded: 503, retry after this many seconds.
    RetryAfter(u64),
    /// A fetch since it was first asked for succeeded without it: 401.
    NotPublished,
}

/// The keys of one JWKS and the state of their fetching.
pub struct JwksSource {
    target: Target,
    keys: RwLock<Arc<Vec<HeldKey>>>,
    /// A fetch succeeded since start (`/healthz` `auth`).
    ever_ok: AtomicBool,
    /// A fetch is asked for or running.
    pending: AtomicBool,
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

impl JwksSource {
    /// A source for this URL; nothing is fetched until [`JwksSource::start`].
    pub fn new(target: Target) -> JwksSource {
        let (kick, kicked) = crossbeam_channel::bounded(1);
        JwksSource {
            target,
            keys: RwLock::new(Arc::new(Vec::new())),
            ever_ok: AtomicBool::new(false),
            pending: AtomicBool::new(true),
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
    pub fn keys(&self) -> Arc<Vec<HeldKey>> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// True once a fetch has succeeded.
    pub fn ready(&self) -> bool {
        self.ever_ok.load(Relaxed)
    }

    /// When `kid` was first asked for (now, if it was not in the short list).
    fn first_asked(&self, kid: &str, now: u64) -> u64 {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, at)) = asked.iter().find(|(k, _)| k == kid) {
            return *at;
        }
        if asked.len() >= MAX_ASKED {
            asked.remove(0);
        }
        asked.push((kid.to_owned(), now));
        now
    }

    /// A token named a `kid` that is not held (`""`: it named none while
    /// nothing is held). 401 once a fetch that started after the `kid` was
    /// first asked for succeeded without it; until then 503, and a fetch is
    /// asked for: at once, or as soon as 10 s have passed since the last one.
    /// Never blocks.
    pub fn missing(&self, kid: &str) -> Missing {
        let now = clock::now_ms().max(1);
        let first = self.first_asked(kid, now);
        if self.ok_fetch_ms.load(Relaxed) >= first {
            return Missing::NotPublished;
        }
        // Read before the kick: the fetch it starts moves `last_fetch_ms`.
        let next = self.last_fetch_ms.load(Relaxed) + KICK_SPACING_MS;
        if !self.pending.swap(true, Relaxed)
            && matches!(self.kick.try_send(()), Err(TrySendError::Disconnected(())))
        {
            self.pending.store(false, Relaxed);
        }
        Missing::RetryAfter(next.saturating_sub(now).div_ceil(1000).max(1))
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

    fn run(&self, kicked: Receiver<()>) {
        let mut failures = 0u32;
        let mut warned: Option<Instant> = None;
        let mut retry = Backoff::new(RETRY_FIRST, RETRY_CAP);
        loop {
            self.fetch_once(&mut failures, &mut warned);
            let wait = if failures == 0 {
                retry.reset();
                REFRESH
            } else {
                retry.failed();
                retry.wait()
            };
            let deadline = Instant::now() + wait;
            let kick = kicked.recv_deadline(deadline);
            if supervisor::stopping() {
                return;
            }
            match kick {
                Ok(()) => {
                    // Asked for by an unknown kid: at most one fetch per 10 s.
                    let due = self.last_fetch_ms.load(Relaxed) + KICK_SPACING_MS;
                    let wait = due.saturating_sub(clock::now_ms());
                    std::thread::sleep(Duration::from_millis(wait));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn fetch_once(&self, failures: &mut u32, warned: &mut Option<Instant>) {
        self.pending.store(true, Relaxed);
        let started = clock::now_ms().max(1);
        self.last_fetch_ms.store(started, Relaxed);
        match self.target.get().and_then(|body| jwks::parse(&body)) {
            Ok(parsed) => {
                let kids: Vec<&str> = parsed
                    .keys
                    .iter()
                    .filter_map(|k| k.kid.as_deref())
                    .collect();
                let changed = {
                    let held = self.keys();
                    held.len() != parsed.keys.len()
                        || held.iter().zip(&parsed.keys).any(|(a, b)| a.kid != b.kid)
                };
                if changed || *failures > 0 {
                    tracing::info!(keys = parsed.keys.len(), ?kids, ignored = ?parsed.ignored, "JWKS loaded");
                }
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(parsed.keys);
                self.fetches_ok.fetch_add(1, Relaxed);
                self.ok_fetch_ms.store(started, Relaxed);
                self.ever_ok.store(true, Relaxed);
                *failures = 0;
                *warned = None;
            }
            Err(e) => {
                self.fetches_error.fetch_add(1, Relaxed);
                *failures = failures.saturating_add(1);
                if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    tracing::warn!(error = %e, failures = *failures, "JWKS fetch failed; the keys already held stay in use");
                    *warned = Some(Instant::now());
                } else {
                    tracing::debug!(error = %e, "JWKS fetch failed");
                }
            }
        }
        self.pending.store(false, Relaxed);
    }
}
