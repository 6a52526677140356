//! Writing a connection's queued frames: at once from the flush step with
//! non-blocking sends (batched through io_uring where the shard has a send
//! ring), through a writer task only while the socket is full, and the end of
//! the write side (FIN after the close frame, or a cut when the grace is over).

use super::host::Host;
use super::io::{ConnIo, ConnTable, Socket, WriteSide};
use super::sends::{Sends, ShardSends};
use super::shell::Shell;
use crate::shard::runtime::sys;
use crate::shard::runtime::Runtime;
use bytes::{Buf, Bytes};
use shards::{ConnId, Shard};
use std::cell::RefCell;
use std::io::ErrorKind;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

/// An upgraded connection's socket on runtime `R`.
pub struct ConnSocket<R: Runtime>(pub R::Stream);

impl<R: Runtime> Socket for ConnSocket<R> {
    fn spawn_writer(self: Rc<Self>, host: Rc<dyn Host>, io: Rc<ConnIo>, id: ConnId, rest: Bytes) {
        R::spawn(write_loop::<R>(host, io, id, self, rest));
    }
}

/// The flush step's writes: every connection the shard made ready gets its
/// queued frames written, batched through the send ring where there is one.
pub fn write_ready<H: Shell>(ctx: &Rc<H>, shard: &mut Shard) {
    let conns = ctx.conns().borrow();
    match &mut *ctx.sends().borrow_mut() {
        Sends::Ring(ring) => write_batched(ctx, shard, &conns, ring),
        Sends::Direct => {
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
pub(super) fn write_first<H: Shell>(ctx: &Rc<H>, io: &Rc<ConnIo>, id: ConnId, head: Vec<u8>) {
    let mut shard = ctx.core().borrow_mut();
    let mut first = head;
    let head_len = first.len();
    if let Some(frames) = shard.poll_write(id) {
        first.extend_from_slice(&frames);
    }
    io.write_side.set(WriteSide::Direct);
    let res = sys::send_now(io.fd, &first);
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
fn write_queued<H: Shell>(ctx: &Rc<H>, shard: &mut Shard, io: &Rc<ConnIo>, id: ConnId) {
    if io.write_side.get() != WriteSide::Direct {
        return;
    }
    let mut written = 0;
    while let Some(frame) = shard.poll_write(id) {
        let res = sys::send_now(io.fd, &frame);
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
fn write_batched<H: Shell>(
    ctx: &Rc<H>,
    shard: &mut Shard,
    conns: &ConnTable,
    ring: &mut ShardSends,
) {
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
            let Some(frame) = shard.poll_write(id) else {
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
fn sent<H: Shell>(
    ctx: &Rc<H>,
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
fn settle<H: Shell>(
    ctx: &Rc<H>,
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
fn hand_to_writer<H: Shell>(ctx: &Rc<H>, io: &Rc<ConnIo>, id: ConnId, rest: Bytes) {
    io.write_side.set(WriteSide::Task);
    let host: Rc<dyn Host> = Rc::clone(ctx) as Rc<dyn Host>;
    Rc::clone(&io.socket).spawn_writer(host, Rc::clone(io), id, rest);
}

/// A connection's writer while its socket is full: waits for room, writes
/// `frame` (the rest of the frame the socket did not take at once), then the
/// queue, and ends when the queue is empty. The flush step does not write this
/// socket meanwhile, so the task is its only writer.
async fn write_loop<R: Runtime>(
    host: Rc<dyn Host>,
    io: Rc<ConnIo>,
    id: ConnId,
    socket: Rc<ConnSocket<R>>,
    mut frame: Bytes,
) {
    let (core, metrics) = (host.core(), host.metrics());
    loop {
        while !frame.is_empty() {
            if R::writable(&socket.0).await.is_err() {
                return writer_failed(&io);
            }
            match R::try_send(&socket.0, &frame) {
                Ok(n) => {
                    frame.advance(n);
                    metrics.bytes_out.fetch_add(n as u64, Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return writer_failed(&io),
            }
        }
        match writer_next(core, &io, id) {
            Some(f) => frame = f,
            None => return,
        }
    }
}

/// The writer task's next frame, after it wrote the previous one: the head of
/// the queue, or `None` when the queue is empty, which hands the socket back
/// to the flush step (and the task ends).
fn writer_next(core: &RefCell<Shard>, io: &ConnIo, id: ConnId) -> Option<Bytes> {
    let mut shard = core.borrow_mut();
    let next = shard.poll_write(id);
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
