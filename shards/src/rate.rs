//! Rate limits fed with time: the per-connection message window, the node's
//! accept bucket, and the per-course frame pacer.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Messages allowed in any one-second window.
pub const MAX_MESSAGES_PER_SEC: usize = 20;

/// Control frames (ping, pong) allowed in any one-second window.
pub const MAX_CONTROL_PER_SEC: usize = 100;

/// The 20-data-messages-per-second window of a connection.
pub type MessageWindow = Window<MAX_MESSAGES_PER_SEC>;

/// The 100-control-frames-per-second window of a connection.
pub type ControlWindow = Window<MAX_CONTROL_PER_SEC>;

/// Exact sliding one-second window over a connection's last `N` events.
#[derive(Debug, Default)]
pub struct Window<const N: usize> {
    /// The first event's time since the window last started over: most
    /// connections send one `watch` (and a pong every ping interval) and
    /// nothing else, so the ring is only allocated for a second event within
    /// a second of the one before, and given back once a second passes quiet.
    first_ms: u64,
    /// Arrival times (ms) of the last `N` events, a ring.
    times: Option<Box<[u64; N]>>,
    next: u16,
    seen: u16,
}

impl<const N: usize> Window<N> {
    /// Records an event at `now_ms`; false when it makes more than `N` in the last second.
    pub fn admit(&mut self, now_ms: u64) -> bool {
        if self.seen == 0 || now_ms >= self.last_ms().saturating_add(1000) {
            // Nothing before a quiet second counts again: start over.
            self.times = None;
            self.first_ms = now_ms;
            self.seen = 1;
            self.next = 1 % N as u16;
            return true;
        }
        let first = self.first_ms;
        let times = self.times.get_or_insert_with(|| {
            let mut ring = Box::new([0; N]);
            ring[0] = first;
            ring
        });
        // The slot being overwritten holds the `N`th event before this one.
        let next = usize::from(self.next);
        let oldest = times[next];
        let full = usize::from(self.seen) >= N;
        times[next] = now_ms;
        self.next = ((next + 1) % N) as u16;
        self.seen = self.seen.saturating_add(1);
        !(full && now_ms < oldest + 1000)
    }

    /// The last event's time (with at least one seen).
    fn last_ms(&self) -> u64 {
        match &self.times {
            None => self.first_ms,
            Some(t) => t[(usize::from(self.next) + N - 1) % N],
        }
    }
}

/// The node's accept bucket: `rate` tokens per second, at most `burst`
/// stored, one for all shards (the contract's rate is per node), kept as one
/// atomic instant (a virtual-scheduling GCRA, as [`FramePacer`]): the moment
/// the bucket is empty, in µs. Taking a token is one compare-and-swap, so
/// shards never lock each other out.
#[derive(Debug)]
pub struct AcceptBucket {
    /// µs one token takes to come back (0: no limit).
    interval_us: u64,
    /// µs of tokens the bucket holds when full: `burst` tokens.
    depth_us: u64,
    /// When the bucket would be empty with no token taken since (µs): the
    /// tokens held at `now` are `(depth - (empty_at - now)) / interval`.
    empty_at_us: AtomicU64,
}

impl AcceptBucket {
    /// A full bucket at `now_us` (a rate of 0 or less refuses nothing).
    pub fn new(rate_per_sec: f64, burst: f64, now_us: u64) -> Self {
        let interval_us = if rate_per_sec > 0.0 {
            (1e6 / rate_per_sec).round().max(1.0) as u64
        } else {
            0
        };
        AcceptBucket {
            interval_us,
            depth_us: interval_us.saturating_mul(burst.max(1.0) as u64),
            empty_at_us: AtomicU64::new(now_us),
        }
    }

    /// Takes one token if there is one at `now_us`; otherwise `Err` with the
    /// µs until the next one is due.
    pub fn take(&self, now_us: u64) -> Result<(), u64> {
        if self.interval_us == 0 {
            return Ok(());
        }
        let mut held = self.empty_at_us.load(Relaxed);
        loop {
            // A bucket idle past full holds `depth` and no more.
            let from = held.max(now_us);
            let next = from + self.interval_us;
            if next > now_us + self.depth_us {
                return Err(next - now_us - self.depth_us);
            }
            match self
                .empty_at_us
                .compare_exchange_weak(held, next, Relaxed, Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now_held) => held = now_held,
            }
        }
    }
}

/// Tokens a course's frame pacer holds at most.
pub const FRAME_BURST: u64 = 2;

/// A course's frame pacing: a token bucket of one token per tick, at most
/// [`FRAME_BURST`] held, kept as one instant (a virtual-scheduling GCRA): the
/// moment the bucket is full again. A frame may go out while a token is held,
/// i.e. from `FRAME_BURST - 1` ticks before that moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FramePacer {
    full_at_ms: u64,
}

impl FramePacer {
    /// The first moment a frame may go out (at or before `now` if a token is held).
    pub fn due_ms(&self, tick_ms: u64) -> u64 {
        self.full_at_ms.saturating_sub((FRAME_BURST - 1) * tick_ms)
    }

    /// Spends a token for a frame sent at `now_ms` (call only when due).
    pub fn spend(&mut self, tick_ms: u64, now_ms: u64) {
        self.full_at_ms = self.full_at_ms.max(now_ms) + tick_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_per_second_allowed_twenty_first_refused() {
        let mut w = MessageWindow::default();
        for i in 0..20 {
            assert!(w.admit(1000 + i * 10), "message {i}");
        }
        assert!(!w.admit(1500));
    }

    #[test]
    fn window_slides() {
        let mut w = MessageWindow::default();
        // 19 per second forever is fine.
        for i in 0..200u64 {
            assert!(w.admit(i * 1000 / 19 + 1), "message {i}");
        }
        // 25 evenly over 1.1 s puts 21 inside some one-second window.
        let mut w = MessageWindow::default();
        let ok = (0..25u64).all(|i| w.admit(10_000 + i * 44));
        assert!(!ok);
    }

    #[test]
    fn one_message_allocates_nothing() {
        let mut w = MessageWindow::default();
        assert!(w.admit(5));
        assert!(w.times.is_none());
        // The first message still counts in the window once the ring exists.
        for i in 1..20 {
            assert!(w.admit(5 + i), "message {i}");
        }
        assert!(!w.admit(100), "21 within a second");
    }

    #[test]
    fn events_a_second_apart_allocate_nothing_and_a_quiet_second_frees_the_ring() {
        let mut w = ControlWindow::default();
        // A pong every ping interval.
        assert!((0..10u64).all(|i| w.admit(1_000 + i * 30_000)));
        assert!(w.times.is_none());
        // A burst takes the ring and is still counted exactly...
        assert!((0..100u64).all(|i| w.admit(400_000 + i)));
        assert!(!w.admit(400_500), "the 101st within a second");
        assert!(w.times.is_some());
        // ...until a second passes with nothing: the window starts over.
        assert!(w.admit(401_500));
        assert!(w.times.is_none());
        assert!((1..100u64).all(|i| w.admit(401_500 + i)));
        assert!(
            !w.admit(401_600),
            "the count started over with the quiet second"
        );
    }

    #[test]
    fn a_hundred_control_frames_per_second_allowed_the_hundred_and_first_refused() {
        let mut w = ControlWindow::default();
        for i in 0..100 {
            assert!(w.admit(1000 + i * 9), "frame {i}");
        }
        assert!(!w.admit(1999));
        // 99 per second forever is fine.
        let mut w = ControlWindow::default();
        assert!((0..1000u64).all(|i| w.admit(i * 1000 / 99 + 1)));
    }

    #[test]
    fn the_accept_bucket_refills_at_rate_and_holds_its_burst() {
        let b = AcceptBucket::new(10.0, 5.0, 0);
        assert!((0..5).all(|_| b.take(0).is_ok()));
        assert_eq!(b.take(0), Err(100_000), "the next token in 100 ms");
        assert!(b.take(100_000).is_ok());
        assert_eq!(b.take(150_000), Err(50_000));
        // Idle for ten seconds: full again, no more than the burst.
        assert!((0..5).all(|_| b.take(10_000_000).is_ok()));
        assert!(b.take(10_000_000).is_err());
        // No rate: nothing refused.
        let open = AcceptBucket::new(0.0, 1.0, 0);
        assert!((0..1000).all(|_| open.take(0).is_ok()));
    }

    #[test]
    fn one_accept_bucket_shared_by_threads_gives_out_its_burst_once() {
        let b = std::sync::Arc::new(AcceptBucket::new(1.0, 64.0, 1_000_000));
        let taken: usize = std::thread::scope(|s| {
            let hands: Vec<_> = (0..4)
                .map(|_| {
                    let b = &b;
                    s.spawn(move || (0..100).filter(|_| b.take(1_000_000).is_ok()).count())
                })
                .collect();
            hands.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        assert_eq!(taken, 64, "the burst, once, whatever thread asks");
    }

    #[test]
    fn pacer_holds_two_tokens_and_refills_one_per_tick() {
        let mut p = FramePacer::default();
        // Full at start: two frames at once, the third one tick later.
        assert!(p.due_ms(200) <= 1_000);
        p.spend(200, 1_000);
        assert!(p.due_ms(200) <= 1_000);
        p.spend(200, 1_000);
        assert_eq!(p.due_ms(200), 1_200);
        p.spend(200, 1_200);
        assert_eq!(p.due_ms(200), 1_400);
        // Quiet for two ticks: full again, two at once.
        p.spend(200, 5_000);
        p.spend(200, 5_000);
        assert_eq!(p.due_ms(200), 5_200);
        // Half a tick of rest buys one frame at once, not two.
        p.spend(200, 5_300);
        assert_eq!(p.due_ms(200), 5_400);
    }
}
