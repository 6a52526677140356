//! Writing a connection's queued frames: at once from the flush step with
//! non-blocking sends (batched through io_uring where the shard has a send
//! ring), through a writer task only while the socket is full, and the end of
//! the write side (FIN after the close frame, or a cut when the grace is over).

use super::runtime::Runtime;
use super::send_ring::SendRing;
use super::{handshake, sockopt, ShardCtx};
use bytes::{Buf, Bytes};
use shards::phase::Phase;
use shards::{ConnId, Shard};
use std::cell::Cell;
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Poll, Waker};

/// Who writes a connection's socket now. Only one writer at a time: the
/// shard's flush step writes at once while the socket takes whole frames, a
/// writer task takes over only when it does not (and hands back when the
/// queue is empty), so an idle connection holds no writer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSide {
    /// Just upgraded: the `101` has not been written, so neither is anything
    /// else (see [`write_first`]).
    Upgrading,
    /// Nothing in flight: the flush step writes queued frames with `send(2)`.
    Direct,
    /// A writer task waits for the socket to take the rest.
    Task,
    /// The close frame went out (and the write side was shut down), or a
    /// write failed: nothing more is written.
    Done,
}

/// A connection's socket as its shell holds it, so the runtime-free flush
/// step can start that runtime's writer task when the socket is full.
pub trait Socket {
    /// Spawns a writer task that writes `rest` (what the socket did not take
    /// at once), then the connection's queue, and ends when the queue is empty.
    fn spawn_writer(self: Rc<Self>, ctx: Rc<ShardCtx>, io: Rc<ConnIo>, id: ConnId, rest: Bytes);
}

/// An upgraded connection's socket on runtime `R`.
pub struct ConnSocket<R: Runtime>(pub R::Stream);

impl<R: Runtime> Socket for ConnSocket<R> {
    fn spawn_writer(self: Rc<Self>, ctx: Rc<ShardCtx>, io: Rc<ConnIo>, id: ConnId, rest: Bytes) {
        R::spawn(write_loop::<R>(ctx, io, id, self, rest));
    }
}

/// The shell's half of one WebSocket connection, shared by its reader task,
/// the flush step and (while the socket is full) its writer task.
pub struct ConnIo {
    /// Who writes the socket now.
    pub write_side: Cell<WriteSide>,
    /// The reader task, waiting (after its last read) for the writer task to end.
    pub reader_waiting: Cell<Option<Waker>>,
    /// Set just before the socket is released, so no one touches a reused fd.
    pub finished: Cell<bool>,
    /// The socket, for writes from the flush step and a forced shutdown.
    pub fd: RawFd,
    /// The socket as the shell holds it, to start a writer task.
    pub socket: Rc<dyn Socket>,
    /// The connection's place in the node's and its user's caps, given back
    /// when the connection is gone.
    _slot: handshake::Slot,
}

impl ConnIo {
    /// The shell's half of a just-upgraded connection on socket `fd`, its
    /// `101` not written yet.
    pub fn upgrading(fd: RawFd, socket: Rc<dyn Socket>, slot: handshake::Slot) -> Self {
        ConnIo {
            write_side: Cell::new(WriteSide::Upgrading),
            reader_waiting: Default::default(),
            finished: Default::default(),
            fd,
            socket,
            _slot: slot,
        }
    }

    /// Called when the queue was written out, with the connection's phase in
    /// the core: once it is closing, the close frame was the last one queued,
    /// so the write side is shut down (FIN after the close frame, RFC 6455
    /// section 7.1.1) and nothing more is written.
    fn after_queue_empty(&self, phase: Option<Phase>) {
        let closing = phase.is_some_and(|p| !p.is_open());
        if closing && !self.finished.get() {
            self.write_side.set(WriteSide::Done);
            // SAFETY: `finished` is false, so the socket behind `fd` is still
            // owned by this connection; shutdown does not close the descriptor.
            unsafe { libc::shutdown(self.fd, libc::SHUT_WR) };
        }
    }

    /// Cuts the socket (the shard's close grace is over), unless it is already
    /// released. If the kernel still holds bytes the peer has not taken (a
    /// slow consumer), the close that follows resets the connection: a FIN
    /// would queue behind them, and the orphaned socket would keep up to its
    /// send buffer for minutes while the peer advertises no window.
    pub fn cut(&self) {
        if self.finished.get() {
            return;
        }
        // `finished` is false, so the socket behind `fd` is still owned by
        // this connection.
        if sockopt::unsent_bytes(self.fd).is_some_and(|n| n > 0) {
            sockopt::reset_on_close(self.fd);
        }
        // SAFETY: as above; shutdown does not close the descriptor.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }
}

/// The shell's half of every live connection, by the slot number the core
/// gave it (dense: the core reuses the slots of closed connections), so a
/// lookup is an index and an entry costs 16 bytes.
#[derive(Default)]
pub struct ConnTable(Vec<Option<(ConnId, Rc<ConnIo>)>>);

impl ConnTable {
    /// The connection `id`, if it is live.
    pub fn get(&self, id: &ConnId) -> Option<&Rc<ConnIo>> {
        match self.0.get(id.index() as usize) {
            Some(Some((live, io))) if live == id => Some(io),
            _ => None,
        }
    }

    /// Adds a just-registered connection.
    pub fn insert(&mut self, id: ConnId, io: Rc<ConnIo>) {
        let i = id.index() as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some((id, io));
    }

    /// Forgets a connection (a stale id is ignored).
    pub fn remove(&mut self, id: &ConnId) {
        if let Some(slot) = self.0.get_mut(id.index() as usize) {
            if slot.as_ref().is_some_and(|(live, _)| live == id) {
                *slot = None;
            }
        }
    }
}

/// A shard's batched sends, each tagged with its connection.
pub type ShardSends = SendRing<(ConnId, Rc<ConnIo>)>;

/// The flush step's writes: every connection the shard made ready gets its
/// queued frames written, batched through the send ring where there is one.
pub(super) fn write_ready(ctx: &Rc<ShardCtx>, shard: &mut Shard) {
    let conns = ctx.conns.borrow();
    match ctx.send_ring.borrow_mut().as_mut() {
        Some(ring) => write_batched(ctx, shard, &conns, ring),
        None => {
            while let Some(id) = shard.poll_ready() {
                if let Some(io) = conns.get(&id) {
                    write_queued(ctx, shard, io, id);
                }
            }
        }
    }
}

/// The first write of a just-registered connection: `head` (the `101`, or
/// an SSE stream's response head) and what the shard queued for it since
/// (its `hello`, an SSE stream's boards, up to [`shards::shard::JOIN_MAX`]) in one
/// non-blocking send; the rest of the queue follows as from the flush step,
/// and what the socket does not take goes to a writer task.
pub(super) fn write_first(ctx: &Rc<ShardCtx>, io: &Rc<ConnIo>, id: ConnId, head: Vec<u8>) {
    let mut shard = ctx.shard.borrow_mut();
    let mut first = head;
    let head_len = first.len();
    if let Some(frames) = shard.poll_transmit(id) {
        first.extend_from_slice(&frames);
    }
    io.write_side.set(WriteSide::Direct);
    let res = sockopt::send_now(io.fd, &first);
    let (n, whole) = settle(ctx, io, id, first.into(), res);
    ctx.metrics()
        .bytes_out
        .fetch_add(n.saturating_sub(head_len) as u64, Relaxed);
    if whole {
        write_queued(ctx, &mut shard, io, id);
    }
}

/// Writes `id`'s queued frames at once, with non-blocking `send(2)`, while
/// the socket takes them whole (the common case: the flush step that queued a
/// frame also puts it on the wire, and no task wakes). The first frame the
/// socket does not take whole goes, with what it did not take, to a writer
/// task that waits for room and empties the queue. Nothing happens here while
/// such a task holds the socket, or after a write failed.
fn write_queued(ctx: &Rc<ShardCtx>, shard: &mut Shard, io: &Rc<ConnIo>, id: ConnId) {
    if io.write_side.get() != WriteSide::Direct {
        return;
    }
    let mut written = 0;
    while let Some(frame) = shard.poll_transmit(id) {
        let res = sockopt::send_now(io.fd, &frame);
        let (n, whole) = settle(ctx, io, id, frame, res);
        written += n;
        if !whole {
            break;
        }
    }
    if io.write_side.get() == WriteSide::Direct {
        io.after_queue_empty(shard.phase(id));
    }
    ctx.metrics().bytes_out.fetch_add(written as u64, Relaxed);
}

/// [`write_queued`] for every connection the shard made ready, through the
/// shard's io_uring: the head frame of each goes into one batch of sends
/// (submitted whenever the ring fills, and at the end); a connection whose
/// frame went whole and that has more queued gets its next one in the next
/// batch. What a socket does not take goes to a writer task, as there.
fn write_batched(ctx: &Rc<ShardCtx>, shard: &mut Shard, conns: &ConnTable, ring: &mut ShardSends) {
    let (mut round, mut again): (Vec<ConnId>, Vec<ConnId>) = Default::default();
    let (mut written, mut batches) = (0, 0);
    let mut first = true;
    loop {
        let mut left = round.iter();
        loop {
            let next = if first {
                shard.poll_ready()
            } else {
                left.next().copied()
            };
            let Some(id) = next else { break };
            let Some(io) = conns.get(&id) else { continue };
            if io.write_side.get() != WriteSide::Direct {
                continue;
            }
            let Some(frame) = shard.poll_transmit(id) else {
                io.after_queue_empty(shard.phase(id));
                continue;
            };
            if ring.is_full() {
                batches += 1;
                ring.submit(|tag, frame, res| {
                    written += sent(ctx, shard, tag, frame, res, &mut again);
                });
            }
            let slot = ring.fixed_slot(id.index());
            ring.push(io.fd, slot, frame, (id, Rc::clone(io)));
        }
        let went = ring.submit(|tag, frame, res| {
            written += sent(ctx, shard, tag, frame, res, &mut again);
        });
        batches += u64::from(went > 0);
        if again.is_empty() {
            break;
        }
        std::mem::swap(&mut round, &mut again);
        again.clear();
        first = false;
    }
    let m = ctx.metrics();
    m.bytes_out.fetch_add(written as u64, Relaxed);
    if batches > 0 {
        m.send_batches.fetch_add(batches, Relaxed);
    }
}

/// What one batched send came to, for its connection: the bytes written.
fn sent(
    ctx: &Rc<ShardCtx>,
    shard: &Shard,
    (id, io): (ConnId, Rc<ConnIo>),
    frame: Bytes,
    res: std::io::Result<usize>,
    again: &mut Vec<ConnId>,
) -> usize {
    let (n, whole) = settle(ctx, &io, id, frame, res);
    if whole {
        if shard.queued_bytes(id) == 0 {
            io.after_queue_empty(shard.phase(id));
        } else {
            again.push(id);
        }
    }
    n
}

/// What a non-blocking send of `frame` came to, for either way of writing:
/// the bytes written, and whether the frame went whole. If not, its rest went
/// to a writer task, or (the send failed) nothing more is written.
fn settle(
    ctx: &Rc<ShardCtx>,
    io: &Rc<ConnIo>,
    id: ConnId,
    frame: Bytes,
    res: std::io::Result<usize>,
) -> (usize, bool) {
    match res {
        Ok(n) if n == frame.len() => (n, true),
        Ok(n) => {
            hand_to_writer(ctx, io, id, frame.slice(n..));
            (n, false)
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            hand_to_writer(ctx, io, id, frame);
            (0, false)
        }
        Err(_) => {
            io.write_side.set(WriteSide::Done);
            (0, false)
        }
    }
}

/// Starts the shell's writer task with the part of a frame the socket did not take.
fn hand_to_writer(ctx: &Rc<ShardCtx>, io: &Rc<ConnIo>, id: ConnId, rest: Bytes) {
    io.write_side.set(WriteSide::Task);
    Rc::clone(&io.socket).spawn_writer(Rc::clone(ctx), Rc::clone(io), id, rest);
}

/// A connection's writer while its socket is full: waits for room, writes
/// `frame` (the rest of the frame the socket did not take at once), then the
/// queue, and ends when the queue is empty. The flush step does not write this
/// socket meanwhile, so the task is its only writer.
async fn write_loop<R: Runtime>(
    ctx: Rc<ShardCtx>,
    io: Rc<ConnIo>,
    id: ConnId,
    socket: Rc<ConnSocket<R>>,
    mut frame: Bytes,
) {
    loop {
        while !frame.is_empty() {
            if R::writable(&socket.0).await.is_err() {
                return writer_failed(&io);
            }
            match R::try_send(&socket.0, &frame) {
                Ok(n) => {
                    frame.advance(n);
                    ctx.metrics().bytes_out.fetch_add(n as u64, Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return writer_failed(&io),
            }
        }
        match writer_next(&ctx, &io, id) {
            Some(f) => frame = f,
            None => return,
        }
    }
}

/// The writer task's next frame, after it wrote the previous one: the head of
/// the queue, or `None` when the queue is empty, which hands the socket back
/// to the flush step (and the task ends).
fn writer_next(ctx: &ShardCtx, io: &ConnIo, id: ConnId) -> Option<Bytes> {
    let mut shard = ctx.shard.borrow_mut();
    let next = shard.poll_transmit(id);
    if next.is_none() {
        io.write_side.set(WriteSide::Direct);
        io.after_queue_empty(shard.phase(id));
        wake_reader(io);
    }
    next
}

/// The writer task's write failed: nothing more is written to the socket.
fn writer_failed(io: &ConnIo) {
    io.write_side.set(WriteSide::Done);
    wake_reader(io);
}

/// Wakes the reader task if it waits in [`writer_gone`].
fn wake_reader(io: &ConnIo) {
    if let Some(w) = io.reader_waiting.take() {
        w.wake();
    }
}

/// Waits (after the reader's last read) until no writer task holds the socket.
pub(super) async fn writer_gone(io: &ConnIo) {
    std::future::poll_fn(|cx| {
        if io.write_side.get() == WriteSide::Task {
            io.reader_waiting.set(Some(cx.waker().clone()));
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}
