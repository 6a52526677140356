//! The board page's reconnect timing (`src/web/index.html`), which every
//! viewer follows after it loses a connection: the server's `reconnect`
//! hint, a prompt return after a close 1012 or 4001, else a full-jitter
//! exponential backoff (a refused upgrade's `Retry-After` as its floor).

use std::time::{Duration, Instant};

/// First backoff ceiling.
pub const BACKOFF_BASE_MS: u64 = 500;
/// Backoff cap.
pub const BACKOFF_CAP_MS: u64 = 30_000;
/// A connection open this long resets the backoff.
pub const STABLE_MS: u64 = 10_000;
/// Prompt reconnect after close 1012 / 4001.
pub const PROMPT_MS: (u64, u64) = (250, 1500);

/// How a connection went away, as far as the next attempt cares.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loss {
    /// When it was upgraded (`None`: it never opened).
    pub opened: Option<Instant>,
    /// The close frame's code.
    pub code: Option<u16>,
    /// A `reconnect` hint: come back at this moment.
    pub hint_at: Option<Instant>,
    /// A refused upgrade's `Retry-After`, seconds.
    pub retry_after_s: Option<u64>,
}

/// Milliseconds to wait before the next attempt after `loss`; `attempt` is
/// the viewer's backoff exponent (the page's `attempt`), moved on here.
pub fn delay_ms(attempt: &mut u32, loss: &Loss, now: Instant, rng: &mut fastrand::Rng) -> u64 {
    if let Some(at) = loss.opened {
        if now.duration_since(at) >= Duration::from_millis(STABLE_MS) {
            *attempt = 0;
        }
    }
    if let Some(at) = loss.hint_at {
        return at.saturating_duration_since(now).as_millis() as u64;
    }
    if matches!(loss.code, Some(1012 | 4001)) {
        return rng.u64(PROMPT_MS.0..PROMPT_MS.1);
    }
    let ceiling = BACKOFF_CAP_MS.min(BACKOFF_BASE_MS << (*attempt).min(16));
    *attempt = (*attempt + 1).min(20);
    let d = rng.u64(0..ceiling.max(1));
    match loss.retry_after_s {
        Some(s) if loss.opened.is_none() => d.max(s * 1000 + rng.u64(0..1000)),
        _ => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_after_a_stable_connection() {
        let mut rng = fastrand::Rng::with_seed(9);
        let now = Instant::now();
        let mut attempt = 0;
        for n in 0..30u32 {
            let d = delay_ms(&mut attempt, &Loss::default(), now, &mut rng);
            let ceiling = BACKOFF_CAP_MS.min(BACKOFF_BASE_MS << n.min(16));
            assert!(d < ceiling, "attempt {n}: {d} ms");
        }
        assert_eq!(attempt, 20, "the exponent stops growing");
        let stable = Loss {
            opened: now.checked_sub(Duration::from_millis(STABLE_MS)),
            ..Loss::default()
        };
        if stable.opened.is_some() {
            let d = delay_ms(&mut attempt, &stable, now, &mut rng);
            assert!(d < BACKOFF_BASE_MS);
            assert_eq!(attempt, 1);
        }
    }

    #[test]
    fn hints_prompt_codes_and_retry_after_set_the_delay() {
        let mut rng = fastrand::Rng::with_seed(1);
        let now = Instant::now();
        let mut attempt = 5;
        let hint = Loss {
            hint_at: Some(now + Duration::from_millis(700)),
            ..Loss::default()
        };
        assert_eq!(delay_ms(&mut attempt, &hint, now, &mut rng), 700);
        for code in [1012, 4001] {
            let loss = Loss {
                code: Some(code),
                ..Loss::default()
            };
            let d = delay_ms(&mut attempt, &loss, now, &mut rng);
            assert!((PROMPT_MS.0..PROMPT_MS.1).contains(&d), "{d}");
        }
        assert_eq!(attempt, 5, "hints and prompt returns leave the backoff");
        let refused = Loss {
            retry_after_s: Some(3),
            ..Loss::default()
        };
        let d = delay_ms(&mut attempt, &refused, now, &mut rng);
        assert!((3000..30_000).contains(&d), "{d}");
    }
}
