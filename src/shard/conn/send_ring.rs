//! A shard's own io_uring for the flush step's sends (shards on monoio's
//! io_uring driver): the frames one flush writes go to the kernel as one
//! submission, so a tick's fan-out to thousands of connections costs a few
//! `io_uring_enter` calls instead of one `send(2)` per frame. Each send is
//! non-blocking (`MSG_DONTWAIT`), so the kernel completes it inside the
//! submission, and [`SendRing::submit`] reports every result before it
//! returns: nothing stays in flight between flushes. Connections' sockets
//! are registered with the ring (a fixed-file table indexed by the core's
//! connection slot), so a send does not look its socket up and take a
//! reference to it each time. The table's changes (a connection arrived, one
//! left) are queued and go to the kernel as operations of the next
//! submission with sends; only a release forces one at the end of its round
//! (the table's hold keeps the socket open), so arrivals cost no system call
//! of their own and a round's departures one.

use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::RawFd;

/// How many sends one submission carries (the ring's size). The kernel runs a
/// submission's loopback sends (and their receivers' side) in one stretch of
/// this thread, which nothing on this core preempts: at 1,024 that stretch
/// was about 12 ms, so the viewers' readers woke in bursts behind it; at 128
/// it is under 2 ms, for about 80 submissions per 10,000 frames.
const BATCH: u32 = 128;

/// The most sockets registered at once (fewer if the open-file limit is lower).
const MAX_FIXED: u32 = 1 << 16;

/// `user_data` of a table change (its index below it); a send's is its index.
const CHANGE: u64 = 1 << 63;

/// The "no socket" entry of the kernel's table.
const EMPTY: RawFd = -1;

/// The ring, and the sends queued into it since the last submission.
pub struct SendRing<T> {
    ring: IoUring,
    /// The frame and tag of each queued send, by its `user_data`.
    queued: Vec<(Bytes, T)>,
    /// What each queued send came to (a completion's result), by `user_data`.
    results: Vec<Option<i32>>,
    /// Slots in the ring's table of registered sockets (0: none).
    fixed: u32,
    /// Table changes not yet submitted, by slot (the shard's own indexes:
    /// foldhash, no SipHash): the socket to put there
    /// (or [`EMPTY`]); the latest change of a slot wins.
    changes: HashMap<u32, RawFd>,
    /// Of `changes`, the releases ([`EMPTY`]): only they force a submission.
    releases: usize,
    /// The slots and entries of the changes in the current submission (the
    /// kernel reads each entry from here: never grown past its capacity).
    submitted: Vec<(u32, RawFd)>,
    /// Slots whose socket the kernel's table holds.
    live: Vec<bool>,
}

impl<T> SendRing<T> {
    /// A ring for one shard thread, or why the kernel would not give one.
    pub fn new() -> io::Result<Self> {
        let ring = IoUring::builder()
            .setup_submit_all()
            .setup_single_issuer()
            .setup_cqsize(2 * BATCH)
            .build(BATCH)?;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid rlimit to fill in.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        let want = if rc == 0 {
            limit.rlim_cur.min(MAX_FIXED as libc::rlim_t) as u32
        } else {
            0
        };
        let fixed = match ring.submitter().register_files_sparse(want) {
            Ok(()) => want,
            Err(e) => {
                tracing::debug!(error = %e, "no registered sockets: each send looks its socket up");
                0
            }
        };
        Ok(SendRing {
            ring,
            queued: Vec::with_capacity(BATCH as usize),
            results: Vec::with_capacity(BATCH as usize),
            fixed,
            changes: HashMap::new(),
            releases: 0,
            submitted: Vec::with_capacity(BATCH as usize),
            live: Vec::new(),
        })
    }

    /// Queues the registration of socket `fd` in table slot `slot` (with the
    /// next submission), so sends to it then skip the lookup; until then, and
    /// where the table has no such slot, its sends name `fd`. The socket must
    /// stay open until it is [`unregister`](Self::unregister)ed.
    pub fn register(&mut self, slot: u32, fd: RawFd) {
        if slot < self.fixed {
            self.set_change(slot, fd);
        }
    }

    /// Empties table slot `slot` (with the next submission: the ring's hold
    /// keeps the socket open until then, so its close follows within the
    /// round); a registration not yet submitted is dropped.
    pub fn unregister(&mut self, slot: u32) {
        if self.is_live(slot) {
            self.set_change(slot, EMPTY);
        } else {
            self.take_change(slot);
        }
    }

    /// The table slot a send to the connection in `slot` names: `Some` once its
    /// registration went in and while no change of the slot waits.
    pub fn fixed_slot(&self, slot: u32) -> Option<u32> {
        let waits = !self.changes.is_empty() && self.changes.contains_key(&slot);
        (self.is_live(slot) && !waits).then_some(slot)
    }

    fn is_live(&self, slot: u32) -> bool {
        self.live.get(slot as usize).copied().unwrap_or(false)
    }

    /// True when the next [`push`](Self::push) must wait for a [`submit`](Self::submit).
    pub fn is_full(&self) -> bool {
        self.queued.len() >= BATCH as usize
    }

    /// Submits the table changes queued since the last submission if one of
    /// them releases a socket (once per round: the table's hold keeps a
    /// closed connection's socket open until its release is in; see
    /// [`submit`](Self::submit)).
    pub fn submit_changes(&mut self) {
        if self.queued.is_empty() {
            self.submit(|_, _, _| {});
        }
    }

    /// Queues `fd` (or [`EMPTY`]) for table slot `slot`, replacing a change
    /// of the slot not yet submitted.
    fn set_change(&mut self, slot: u32, fd: RawFd) {
        let old = self.changes.insert(slot, fd);
        self.releases = self.releases + usize::from(fd == EMPTY) - usize::from(old == Some(EMPTY));
    }

    /// Takes slot `slot`'s change not yet submitted, if any.
    fn take_change(&mut self, slot: u32) -> Option<RawFd> {
        let fd = self.changes.remove(&slot)?;
        self.releases -= usize::from(fd == EMPTY);
        Some(fd)
    }

    /// Moves as many queued table changes into the submission queue as it
    /// has room for (the rest wait for the next submission).
    fn push_changes(&mut self) {
        self.submitted.clear();
        let room = (BATCH as usize).saturating_sub(self.queued.len());
        let take: Vec<u32> = self.changes.keys().copied().take(room).collect();
        for slot in take {
            if let Some(fd) = self.take_change(slot) {
                self.submitted.push((slot, fd));
            }
        }
        for (j, (slot, fd)) in self.submitted.iter().enumerate() {
            let update = opcode::FilesUpdate::new(fd, 1)
                .offset(*slot as i32)
                .build()
                .user_data(CHANGE | j as u64);
            // SAFETY: the kernel reads the entry from `submitted`, which is
            // not touched (nor grown: its capacity is the ring's size) until
            // `submit` has reaped every completion of this submission.
            let pushed = unsafe { self.ring.submission().push(&update) };
            debug_assert!(pushed.is_ok(), "room was counted");
        }
    }

    /// Records what a submitted table change came to; a change the kernel
    /// did not make leaves the slot's sends naming their socket.
    fn settle_change(&mut self, j: usize, result: Option<i32>) {
        let Some(&(slot, fd)) = self.submitted.get(j) else {
            return;
        };
        let i = slot as usize;
        if self.live.len() <= i {
            self.live.resize(i + 1, false);
        }
        match result {
            Some(1) => self.live[i] = fd != EMPTY,
            Some(e) if fd == EMPTY => {
                tracing::warn!(error = %io::Error::from_raw_os_error(-e), slot, "a registered socket could not be released")
            }
            Some(_) => self.live[i] = false,
            // Not completed (the submission failed): try again next time.
            None => {
                if !self.changes.contains_key(&slot) {
                    self.set_change(slot, fd);
                }
            }
        }
    }

    /// Queues a non-blocking send of `frame` on socket `fd` (by its table
    /// slot when `slot` is given: see [`register`](Self::register)); `tag` comes
    /// back with its result. The caller submits first when the ring [`is_full`](Self::is_full).
    pub fn push(&mut self, fd: RawFd, slot: Option<u32>, frame: Bytes, tag: T) {
        debug_assert!(!self.is_full());
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        let send = match slot {
            Some(slot) => opcode::Send::new(types::Fixed(slot), frame.as_ptr(), len),
            None => opcode::Send::new(types::Fd(fd), frame.as_ptr(), len),
        };
        let sqe = send
            .flags(flags)
            .build()
            .user_data(self.queued.len() as u64);
        // SAFETY: the buffer is `frame`'s, kept alive in `queued` until its
        // completion is reaped in `submit` (sends never outlive a submission:
        // they are non-blocking and `submit` waits for every completion), and
        // `fd` (or the socket registered in `slot`) is an open socket the
        // caller owns for that long.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        debug_assert!(pushed.is_ok(), "the ring holds BATCH entries");
        self.queued.push((frame, tag));
    }

    /// Submits the queued sends, waits until each has completed, and hands
    /// each frame and tag back with the bytes the socket took (`WouldBlock`
    /// when its send buffer was full), in the order they were queued; returns
    /// how many sends went in (0: nothing was queued). The queued table
    /// changes go in with them. Without sends, only a release makes a
    /// submission: registrations alone wait for the next sends, which carry
    /// them at no cost of their own (a connection's sends name its socket
    /// until then).
    pub fn submit(&mut self, mut done: impl FnMut(T, Bytes, io::Result<usize>)) -> usize {
        let n = self.queued.len();
        if n == 0 && self.releases == 0 {
            return 0;
        }
        self.push_changes();
        let mut change_results = vec![None; self.submitted.len()];
        let all = n + self.submitted.len();
        self.results.clear();
        self.results.resize_with(n, || None);
        let mut reaped = 0;
        let mut failed = None;
        while reaped < all {
            match self.ring.submit_and_wait(all - reaped) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            for cqe in self.ring.completion() {
                let data = cqe.user_data();
                let slot = if data & CHANGE != 0 {
                    change_results.get_mut((data & !CHANGE) as usize)
                } else {
                    self.results.get_mut(data as usize)
                };
                if let Some(slot) = slot {
                    *slot = Some(cqe.result());
                    reaped += 1;
                }
            }
        }
        for (j, r) in change_results.into_iter().enumerate() {
            self.settle_change(j, r);
        }
        if let Some(e) = failed {
            // The kernel refused the submission itself (not a send): sends
            // it did not complete are reported failed, and their frames are
            // kept for good, since the kernel might still read them.
            tracing::error!(error = %e, "io_uring send submission failed");
            for (i, r) in self.results.iter().enumerate() {
                if r.is_none() {
                    std::mem::forget(self.queued[i].0.clone());
                }
            }
        }
        for ((frame, tag), r) in self.queued.drain(..).zip(self.results.iter()) {
            let r = match *r {
                Some(n) if n >= 0 => Ok(n as usize),
                Some(e) => Err(io::Error::from_raw_os_error(-e)),
                None => Err(io::Error::other("send not completed")),
            };
            done(tag, frame, r);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// The ring under test: the kernels this project runs on have io_uring
    /// (the uring driver's tests need it too), so its absence is a failure.
    fn ring<T>() -> SendRing<T> {
        SendRing::new().expect("io_uring for the send ring")
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    #[test]
    fn batched_sends_arrive_in_order_and_a_full_socket_reports_would_block() {
        let mut ring = ring::<usize>();
        let (mut rx1, tx1) = pair();
        let (_rx2, tx2) = pair();
        let (rx3, tx3) = pair();
        drop(rx3);
        ring.push(tx1.as_raw_fd(), None, Bytes::from_static(b"hello "), 1);
        let big = Bytes::from(vec![7u8; 64 << 20]);
        ring.push(tx2.as_raw_fd(), None, big.clone(), 2);
        ring.push(tx3.as_raw_fd(), None, Bytes::from_static(b"x"), 3);
        let mut seen = Vec::new();
        ring.submit(|tag, frame, r| seen.push((tag, frame.len(), r)));
        assert_eq!(seen.len(), 3);
        assert_eq!((seen[0].0, seen[0].1), (1, 6));
        assert_eq!(seen[0].2.as_ref().ok(), Some(&6));
        // 64 MiB does not fit a loopback socket's buffers: a short send.
        let took = *seen[1].2.as_ref().expect("partial send");
        assert!(took > 0 && took < big.len(), "took {took}");
        // A peer that closed: whether this first send is taken depends on
        // when its RST comes back, so only the tag and frame are checked.
        assert_eq!((seen[2].0, seen[2].1), (3, 1));

        // The full socket now refuses at once instead of waiting for room.
        ring.push(tx2.as_raw_fd(), None, Bytes::from_static(b"more"), 4);
        ring.push(tx1.as_raw_fd(), None, Bytes::from_static(b"world"), 5);
        let mut second = Vec::new();
        ring.submit(|tag, _, r| second.push((tag, r.map_err(|e| e.kind()))));
        assert_eq!(
            second,
            vec![(4, Err(io::ErrorKind::WouldBlock)), (5, Ok(5))]
        );
        let mut got = [0u8; 11];
        rx1.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"hello world");
    }

    #[test]
    fn a_batch_larger_than_the_ring_goes_in_several_submissions() {
        let mut ring = ring::<u32>();
        let (mut rx, tx) = pair();
        let mut count = 0u32;
        for i in 0..(BATCH * 2 + 5) {
            if ring.is_full() {
                ring.submit(|_, _, r| {
                    assert_eq!(r.ok(), Some(1));
                    count += 1;
                });
            }
            ring.push(tx.as_raw_fd(), None, Bytes::from(vec![(i % 251) as u8]), i);
        }
        ring.submit(|_, _, r| {
            assert_eq!(r.ok(), Some(1));
            count += 1;
        });
        assert_eq!(count, BATCH * 2 + 5);
        let mut got = vec![0u8; (BATCH * 2 + 5) as usize];
        rx.read_exact(&mut got).expect("read");
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    #[test]
    fn a_registered_socket_is_sent_to_by_slot_and_closes_once_released() {
        let mut ring = ring::<()>();
        assert!(ring.fixed > 0, "a table of registered sockets");
        let (mut rx, tx) = pair();
        ring.register(7, tx.as_raw_fd());
        ring.register(ring.fixed, tx.as_raw_fd());
        assert_eq!(ring.fixed_slot(7), None, "not in before a submission");
        // The registration goes in with the next submission's sends.
        let mut res = None;
        ring.push(tx.as_raw_fd(), None, Bytes::from_static(b"fd "), ());
        ring.submit(|_, _, r| res = Some(r.map_err(|e| e.kind())));
        assert_eq!(res, Some(Ok(3)));
        assert_eq!(ring.fixed_slot(7), Some(7));
        assert_eq!(ring.fixed_slot(ring.fixed), None, "past the table");
        // By slot: the fd passed alongside is not used (-1 would fail).
        ring.push(-1, Some(7), Bytes::from_static(b"fixed"), ());
        ring.submit(|_, _, r| res = Some(r.map_err(|e| e.kind())));
        assert_eq!(res, Some(Ok(5)));
        let mut got = [0u8; 8];
        rx.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"fd fixed");
        // Released and closed: the ring's hold keeps the socket open (no
        // end of stream) until the release is submitted.
        ring.unregister(7);
        assert_eq!(ring.fixed_slot(7), None);
        drop(tx);
        rx.set_nonblocking(true).expect("nonblocking");
        let held = rx.read(&mut got).map_err(|e| e.kind());
        assert_eq!(held, Err(io::ErrorKind::WouldBlock));
        ring.submit_changes();
        rx.set_nonblocking(false).expect("blocking");
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(rx.read(&mut got).expect("eof"), 0);
    }

    #[test]
    fn registrations_wait_for_sends_and_a_release_goes_in_with_the_round() {
        let mut ring = ring::<()>();
        let (mut rx, tx) = pair();
        let (_rx2, tx2) = pair();
        ring.register(1, tx.as_raw_fd());
        ring.submit_changes();
        assert_eq!(
            ring.fixed_slot(1),
            None,
            "no submission for a registration alone"
        );
        ring.submit(|_, _, _| {});
        assert_eq!(ring.fixed_slot(1), None, "nor for a flush without sends");
        assert_eq!(ring.changes.len(), 1);
        ring.push(tx2.as_raw_fd(), None, Bytes::from_static(b"x"), ());
        ring.submit(|_, _, _| {});
        assert_eq!(ring.fixed_slot(1), Some(1), "carried by the next sends");
        ring.register(2, tx2.as_raw_fd());
        ring.unregister(1);
        drop(tx);
        ring.submit_changes();
        assert!(
            ring.changes.is_empty(),
            "the release took the registration along"
        );
        assert_eq!(ring.fixed_slot(2), Some(2));
        let mut got = [0u8; 1];
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(rx.read(&mut got).expect("eof"), 0, "released: closed");
    }

    #[test]
    fn a_registration_released_before_its_submission_never_reaches_the_kernel() {
        let mut ring = ring::<()>();
        let (mut rx, tx) = pair();
        ring.register(3, tx.as_raw_fd());
        ring.unregister(3);
        assert!(ring.changes.is_empty());
        assert_eq!(ring.submit(|_, _, _| {}), 0, "nothing to submit");
        drop(tx);
        let mut got = [0u8; 1];
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(rx.read(&mut got).expect("eof"), 0, "closed at once");
        assert_eq!(ring.fixed_slot(3), None);
    }

    #[test]
    fn more_table_changes_than_the_ring_holds_go_in_over_several_submissions() {
        let mut ring = ring::<()>();
        let (_rx, tx) = pair();
        let slots = BATCH + 10;
        for slot in 0..slots {
            ring.register(slot, tx.as_raw_fd());
        }
        // Registrations go in with sends, as many as the ring has room for.
        let (_rx2, other) = pair();
        let send = |ring: &mut SendRing<()>| {
            ring.push(other.as_raw_fd(), None, Bytes::from_static(b"x"), ());
            ring.submit(|_, _, _| {});
        };
        send(&mut ring);
        let live = (0..slots).filter(|s| ring.fixed_slot(*s).is_some()).count();
        assert_eq!(live, BATCH as usize - 1, "one entry is the send");
        send(&mut ring);
        assert!((0..slots).all(|s| ring.fixed_slot(s) == Some(s)));
        for slot in 0..slots {
            ring.unregister(slot);
        }
        ring.submit_changes();
        ring.submit_changes();
        assert!(ring.changes.is_empty());
        assert!((0..slots).all(|s| ring.fixed_slot(s).is_none()));
    }
}
