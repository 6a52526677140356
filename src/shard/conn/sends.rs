//! How a shard puts frames on the wire ([`Sends`]): one non-blocking
//! `send(2)` per frame, or (a shard on io_uring) its send ring, which batches
//! a flush's sends into a few submissions. Either way a frame the socket does
//! not take whole goes, with what it did not take, to the connection's writer
//! task (`writing.rs`).

use super::host::Host;
use super::io::{ConnIo, ConnTable, WriteSide};
use super::send_ring::SendRing;
use super::writing::hand_to_writer;
use crate::sys;
use bytes::Bytes;
use shards::{ConnId, Shard};
use std::io::ErrorKind;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

/// A shard's batched sends, each tagged with its connection.
pub type ShardSends = SendRing<(ConnId, Rc<ConnIo>)>;

/// How this shard sends. (One per shard, so the ring is held in place: a box
/// would only add a step to every send.)
#[allow(clippy::large_enum_variant)]
pub enum Sends {
    /// One non-blocking `send(2)` per frame (epoll, tokio, or no io_uring
    /// for the ring).
    Direct,
    /// The flush step's sends batched through the shard's own io_uring.
    Ring(ShardSends),
}

impl Sends {
    /// The send ring for shard `shard` on io_uring, or direct sends if the
    /// kernel gives no ring.
    pub fn batched(shard: usize) -> Self {
        match SendRing::new() {
            Ok(ring) => Sends::Ring(ring),
            Err(e) => {
                tracing::warn!(error = %e, shard, "no io_uring for batched sends: one send(2) per frame");
                Sends::Direct
            }
        }
    }

    /// Makes connection `id`'s socket known to the sends (the ring's table of
    /// registered sockets); it stays open until [`release`](Self::release).
    pub fn register(&mut self, id: ConnId, io: &ConnIo) {
        if let Sends::Ring(ring) = self {
            ring.register(id.index(), io.fd);
        }
    }

    /// Forgets connection `id`'s socket (it closes after the round's changes go in).
    pub fn release(&mut self, id: ConnId) {
        if let Sends::Ring(ring) = self {
            ring.unregister(id.index());
        }
    }

    /// Submits the round's changes (a release forces one: the ring's hold
    /// keeps a closed connection's socket open until then).
    pub fn submit_changes(&mut self) {
        if let Sends::Ring(ring) = self {
            ring.submit_changes();
        }
    }

    /// The flush step's writes: every connection the shard made ready gets
    /// its queued frames written, batched through the ring where there is one.
    pub fn flush<H: Host>(&mut self, ctx: &Rc<H>, shard: &mut Shard, conns: &ConnTable) {
        match self {
            Sends::Ring(ring) => write_batched(ctx, shard, conns, ring),
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
    pub fn write_first<H: Host>(&self, ctx: &Rc<H>, io: &Rc<ConnIo>, id: ConnId, head: Vec<u8>) {
        let mut shard = ctx.core().borrow_mut();
        let mut first = head;
        let head_len = first.len();
        shard.transmit_into(id, &mut first);
        io.write_side.set(WriteSide::Direct);
        let res = sys::send_now(io.fd, &first);
        let (n, whole) = settle(ctx, io, id, first, res);
        ctx.metrics()
            .bytes_out
            .fetch_add(n.saturating_sub(head_len) as u64, Relaxed);
        if whole {
            write_queued(ctx, &mut shard, io, id);
        }
    }
}

/// Writes `id`'s queued frames at once, with non-blocking `send(2)`, while
/// the socket takes them whole (the common case: the flush step that queued a
/// frame also puts it on the wire, and no task wakes). The first frame the
/// socket does not take whole goes, with what it did not take, to a writer
/// task that waits for room and empties the queue. Nothing happens here while
/// such a task holds the socket, or after a write failed.
fn write_queued<H: Host>(ctx: &Rc<H>, shard: &mut Shard, io: &Rc<ConnIo>, id: ConnId) {
    if io.write_side.get() != WriteSide::Direct {
        return;
    }
    let mut written = 0;
    while let Some(frame) = shard.poll_transmit(id) {
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
fn write_batched<H: Host>(
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
fn sent<H: Host>(
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
fn settle<H: Host>(
    ctx: &Rc<H>,
    io: &Rc<ConnIo>,
    id: ConnId,
    frame: impl Into<Bytes> + AsRef<[u8]>,
    res: std::io::Result<usize>,
) -> (usize, bool) {
    match res {
        Ok(n) if n == frame.as_ref().len() => (n, true),
        Ok(n) => {
            hand_to_writer(ctx, io, id, frame.into().slice(n..));
            (n, false)
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            hand_to_writer(ctx, io, id, frame.into());
            (0, false)
        }
        Err(_) => {
            io.write_side.set(WriteSide::Done);
            (0, false)
        }
    }
}
