//! A connection's bounded send queue: the frames not yet written, their bytes
//! against the connection's bound, and since when it has refused frames
//! without draining (the slow-consumer clock).

use bytes::Bytes;
use std::collections::VecDeque;

/// What offering a frame to a queue came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Queued.
    Queued,
    /// Refused: the queue is full (or the connection is closing); the frame's
    /// viewer is owed a full frame (resync) at the next render.
    Full,
}

/// The frames queued to one connection, within its bound. The head frame
/// sits inline and only the frames behind it take a ring, given back when it
/// empties: most connections hold one frame or none, and an idle one then
/// holds no allocation for its queue.
#[derive(Debug)]
pub(crate) struct SendQueue {
    /// The next frame to write; `None` only when the queue is empty.
    head: Option<Bytes>,
    /// The frames behind `head`, in order.
    rest: VecDeque<Bytes>,
    /// Bytes of `head` and `rest`.
    bytes: u32,
    /// The most bytes queued at once but for a single frame, which an empty
    /// queue always takes (a bound per connection, set when it is made).
    bound: u32,
    /// Since when frames have been refused without the queue ever draining.
    full_since: Option<u64>,
}

impl SendQueue {
    /// An empty queue bounded at `bound` bytes.
    pub fn new(bound: usize) -> Self {
        SendQueue {
            head: None,
            rest: VecDeque::new(),
            bytes: 0,
            bound: u32::try_from(bound).unwrap_or(u32::MAX),
            full_since: None,
        }
    }

    /// Whether `len` more bytes may be queued: an empty queue takes anything.
    pub fn fits(&self, len: usize) -> bool {
        self.head.is_none() || self.within_bound(len)
    }

    /// Whether `len` more bytes stay within the bound, empty queue or not (for
    /// messages that are dropped rather than owed when they do not fit).
    pub fn within_bound(&self, len: usize) -> bool {
        self.bytes as usize + len <= self.bound as usize
    }

    /// Queues a data frame if it [fits](Self::fits); a refusal starts the
    /// slow-consumer clock at `now_ms` (if it is not running yet).
    pub fn push(&mut self, frame: Bytes, now_ms: u64) -> Push {
        if !self.fits(frame.len()) {
            self.refused(now_ms);
            return Push::Full;
        }
        self.push_always(frame);
        Push::Queued
    }

    /// Queues a frame past the bound (close frames, drain hints, answers that
    /// were checked to fit).
    pub fn push_always(&mut self, frame: Bytes) {
        self.bytes = self.bytes.saturating_add(frame.len() as u32);
        if self.head.is_none() {
            self.head = Some(frame);
        } else {
            self.rest.push_back(frame);
        }
    }

    /// Notes a frame refused at `now_ms` without queueing anything.
    pub fn refused(&mut self, now_ms: u64) {
        self.full_since.get_or_insert(now_ms);
    }

    /// The socket took bytes: the buffer had room, so the slow-consumer clock
    /// stops (a client that reads, however slowly, is no slow consumer; its
    /// queue still drops and heals).
    pub fn took(&mut self) {
        self.full_since = None;
    }

    /// Since when the queue has refused frames without draining.
    pub fn full_since(&self) -> Option<u64> {
        self.full_since
    }

    /// Bytes queued.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }

    /// The next frame to write. An emptied queue stops the slow-consumer
    /// clock; an emptied ring is given back (most connections sit idle
    /// between ticks).
    pub fn pop(&mut self) -> Option<Bytes> {
        let f = self.head.take()?;
        self.bytes -= f.len() as u32;
        self.head = self.rest.pop_front();
        if self.rest.is_empty() && self.rest.capacity() > 0 {
            self.rest = VecDeque::new();
        }
        if self.head.is_none() {
            self.full_since = None;
        }
        Some(f)
    }

    /// The next bytes to write: the head frame, joined with the frames behind
    /// it while the whole stays within `max` bytes, so that frames queued
    /// together (a watch answer and its count, a `101`'s `hello`) go out in
    /// one send and one segment. A lone frame, or one larger than `max`, is
    /// handed over as it is, uncopied.
    pub fn pop_joined(&mut self, max: usize) -> Option<Bytes> {
        let first = self.head.as_ref()?.len();
        if self.rest.front().is_none_or(|f| first + f.len() > max) {
            return self.pop();
        }
        let mut joined = Vec::with_capacity(self.bytes().min(max));
        self.pop_joined_into(&mut joined, max);
        Some(joined.into())
    }

    /// What [`pop_joined`](Self::pop_joined) hands over, appended to `out`
    /// instead (a buffer the caller writes anyway, such as the `101`'s):
    /// the frames are copied once, into it. False when the queue is empty.
    pub fn pop_joined_into(&mut self, out: &mut Vec<u8>, max: usize) -> bool {
        let Some(first) = self.pop() else {
            return false;
        };
        let mut total = first.len();
        out.extend_from_slice(&first);
        while let Some(next) = &self.head {
            total += next.len();
            if total > max {
                break;
            }
            if let Some(f) = self.pop() {
                out.extend_from_slice(&f);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_queue_takes_anything_then_the_bound_holds() {
        let mut q = SendQueue::new(100);
        assert_eq!(q.push(Bytes::from(vec![0; 150]), 5), Push::Queued);
        assert_eq!(q.full_since(), None);
        assert_eq!(q.push(Bytes::from(vec![0; 1]), 6), Push::Full);
        assert_eq!(q.full_since(), Some(6));
        assert!(!q.within_bound(1));
        q.pop();
        assert_eq!(q.full_since(), None, "drained: the clock stops");
        assert_eq!(q.push(Bytes::from(vec![0; 60]), 7), Push::Queued);
        assert_eq!(q.push(Bytes::from(vec![0; 40]), 7), Push::Queued);
        assert_eq!(q.push(Bytes::from(vec![0; 1]), 8), Push::Full);
        q.push_always(Bytes::from(vec![0; 2]));
        assert_eq!(q.bytes(), 102);
    }

    #[test]
    fn frames_are_joined_up_to_the_limit_in_order() {
        let mut q = SendQueue::new(1 << 20);
        for (i, len) in [(1u8, 3), (2, 4), (3, 5), (4, 1)] {
            q.push_always(Bytes::from(vec![i; len]));
        }
        let joined = q.pop_joined(10).expect("a write");
        assert_eq!(
            &joined[..],
            &[1, 1, 1, 2, 2, 2, 2][..],
            "3 + 4 fit, + 5 does not"
        );
        assert_eq!(q.bytes(), 6);
        assert_eq!(
            &q.pop_joined(10).expect("a write")[..],
            &[3, 3, 3, 3, 3, 4][..]
        );
        assert_eq!(q.bytes(), 0);
        assert_eq!(q.pop_joined(10), None);
    }

    #[test]
    fn joining_into_a_buffer_takes_what_joining_takes() {
        let lens = [(1u8, 3), (2, 4), (3, 5), (4, 1), (5, 20)];
        let (mut a, mut b) = (SendQueue::new(1 << 20), SendQueue::new(1 << 20));
        for (i, len) in lens {
            a.push_always(Bytes::from(vec![i; len]));
            b.push_always(Bytes::from(vec![i; len]));
        }
        let mut out = b"HEAD".to_vec();
        while let Some(joined) = a.pop_joined(10) {
            out.truncate(4);
            assert!(b.pop_joined_into(&mut out, 10));
            assert_eq!(&out[4..], &joined[..]);
            assert_eq!(b.bytes(), a.bytes());
        }
        assert!(!b.pop_joined_into(&mut out, 10), "empty");
        assert_eq!(out.len(), 4 + 20, "the frame past the limit went alone");
    }

    #[test]
    fn a_frame_past_the_limit_goes_alone_and_uncopied() {
        let mut q = SendQueue::new(1 << 20);
        let big = Bytes::from(vec![7u8; 64]);
        q.push_always(big.clone());
        q.push_always(Bytes::from_static(b"x"));
        let first = q.pop_joined(16).expect("a write");
        assert_eq!(first.as_ptr(), big.as_ptr(), "handed over as queued");
        assert_eq!(&q.pop_joined(16).expect("a write")[..], b"x");
    }

    #[test]
    fn joining_drains_like_popping_one_by_one() {
        let mut q = SendQueue::new(4);
        q.push(Bytes::from(vec![0; 3]), 1);
        assert_eq!(q.push(Bytes::from(vec![0; 3]), 2), Push::Full);
        assert_eq!(q.full_since(), Some(2));
        q.push_always(Bytes::from(vec![0; 1]));
        assert_eq!(q.pop_joined(100).map(|b| b.len()), Some(4));
        assert_eq!(q.full_since(), None, "drained: the clock stops");
    }

    #[test]
    fn one_frame_takes_no_ring_and_a_drained_ring_is_given_back() {
        let mut q = SendQueue::new(1 << 20);
        q.push_always(Bytes::from_static(b"a"));
        assert_eq!(q.rest.capacity(), 0, "the head frame sits inline");
        q.push_always(Bytes::from_static(b"b"));
        q.push_always(Bytes::from_static(b"c"));
        assert!(q.rest.capacity() > 0);
        assert_eq!(q.pop().as_deref(), Some(&b"a"[..]));
        assert_eq!(q.pop().as_deref(), Some(&b"b"[..]));
        assert_eq!(q.rest.capacity(), 0, "the ring emptied: given back");
        assert_eq!(q.pop().as_deref(), Some(&b"c"[..]));
        assert_eq!((q.pop(), q.bytes()), (None, 0));
    }
}
