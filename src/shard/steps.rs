//! Every runtime-free step of a shard's shell, shared by the monoio shell
//! (`monoio_shell.rs`) and the tokio one (`tokio_shell.rs`): parsing and
//! routing a request head, registering and finishing a connection, handing
//! reads to the core, writing queued frames (at once, or through a writer task
//! while the socket is full), and the feed-render step of the shard's clock.
//! The shells only hold their runtime's loops around these.

use super::handshake::{self, Accepted, Upgrade};
use super::http::{self, Route};
use super::response::Response;
use super::{ConnIo, ConnTable, ShardCtx, ShardSends, Socket, WriteSide};
use crate::channels::Control;
use crate::clock;
use crate::metrics::Refusal;
use bytes::Bytes;
use shards::http_head::{self, HeadError, RequestHead, MAX_HEAD};
use shards::ws_codec::close;
use shards::{ConnId, Reading, Shard};
use std::future::Future;
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A head not complete in this long is dropped (slowloris).
pub(super) const HEAD_DEADLINE: Duration = Duration::from_secs(5);

/// What reading a request head came to.
pub(super) enum HeadOutcome {
    /// A complete head, and the bytes read past it.
    Head(Box<RequestHead>, Vec<u8>),
    /// Refused (timeout, too large, malformed), with the answer to send, if any.
    Refused(Refusal, Option<Response>),
    /// The peer went away.
    Gone,
}

/// Parses what has been read so far; `None` means read more.
pub(super) fn parse_head(head: &mut Vec<u8>) -> Option<HeadOutcome> {
    match http_head::parse(head) {
        Ok(Some((h, used))) => Some(HeadOutcome::Head(Box::new(h), head.split_off(used))),
        Ok(None) if head.len() <= MAX_HEAD => None,
        Ok(None) | Err(HeadError::TooLarge) => Some(HeadOutcome::Refused(
            Refusal::HeadTooLarge,
            Some(Response::text(431, "request head too large")),
        )),
        Err(HeadError::Malformed) => Some(HeadOutcome::Refused(
            Refusal::BadRequest,
            Some(Response::text(400, "bad request")),
        )),
    }
}

/// Where a parsed request goes.
pub(super) enum Next {
    /// Answer with this response (`true`: head only) and close.
    Respond(Response, bool),
    /// Upgrade: every check passed.
    Upgrade(Accepted),
}

/// Routes a parsed head: pages, method checks, and the handshake's refusals.
pub(super) fn route_head(ctx: &ShardCtx, head: &RequestHead) -> Next {
    let head_only = head.method == "HEAD";
    match http::route(&head.path) {
        Route::NotFound => Next::Respond(Response::text(404, "not found"), head_only),
        Route::Page(p) if head.method == "GET" || head_only => {
            Next::Respond(http::answer(&ctx.node, p, head), head_only)
        }
        Route::Ws { admin } if head.method == "GET" => match handshake::check(ctx, head, admin) {
            Err(resp) => Next::Respond(resp, false),
            Ok(accepted) => Next::Upgrade(accepted),
        },
        route => {
            let allow = if matches!(route, Route::Ws { .. }) {
                "GET"
            } else {
                "GET, HEAD"
            };
            let resp = Response::text(405, "method not allowed").header(format!("Allow: {allow}"));
            Next::Respond(resp, false)
        }
    }
}

/// The most one read takes from a socket (on the stack of the read step:
/// an idle connection waits for readability and holds no read buffer).
const READ_MAX: usize = 4096;

/// Kernel send buffer of an upgraded connection (the kernel doubles it for its
/// bookkeeping). Pinned rather than autotuned (up to `tcp_wmem`'s 4 MiB), so a
/// client that stops reading costs a bounded amount of kernel memory besides
/// its send queue, and its queue fills — and it is closed 4001 — in seconds.
const SO_SNDBUF_BYTES: libc::c_int = 64 * 1024;

/// Pins the kernel send buffer of socket `fd` (see [`SO_SNDBUF_BYTES`]).
pub(super) fn pin_send_buffer(fd: RawFd) {
    let size = SO_SNDBUF_BYTES;
    // SAFETY: the fd is this connection's open socket for the whole call, and
    // the option value points to a live c_int of the length passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "SO_SNDBUF not set");
    }
}

/// Registers an upgraded connection (its `101` sent) with the shard.
pub(super) fn register(
    ctx: &Rc<ShardCtx>,
    upgrade: Upgrade,
    fd: RawFd,
    socket: Rc<dyn Socket>,
) -> (ConnId, Rc<ConnIo>) {
    let id = ctx.shard.borrow_mut().connect(
        Arc::clone(upgrade.slot.user()),
        upgrade.role,
        upgrade.admin_feed,
        upgrade.deflate,
        clock::now_ms(),
    );
    let io = Rc::new(ConnIo::new(fd, socket, upgrade.slot));
    if let Some(ring) = ctx.send_ring.borrow_mut().as_mut() {
        io.registered.set(ring.register(id.index(), fd));
    }
    ctx.conns.borrow_mut().insert(id, Rc::clone(&io));
    ctx.flush();
    (id, io)
}

/// Forgets a connection whose reader and writer both ended; its socket and
/// its [`super::handshake::Slot`] go with the last [`ConnIo`] right after.
pub(super) fn finish(ctx: &Rc<ShardCtx>, io: &ConnIo, id: ConnId) {
    io.finished.set(true);
    if io.registered.replace(false) {
        if let Some(ring) = ctx.send_ring.borrow_mut().as_mut() {
            ring.unregister(id.index());
        }
    }
    ctx.conns.borrow_mut().remove(&id);
    ctx.shard.borrow_mut().disconnect(id);
    ctx.flush();
}

/// What one read step came to.
pub(super) enum ReadStep {
    /// Wait until the socket is readable again, then read on.
    Again,
    /// Stop reading: the peer closed, the read failed, or the shard wants no more.
    Stop,
}

/// Reads what the socket holds (up to [`READ_MAX`] bytes, with `read`: the
/// shell's non-blocking read) into a buffer on the stack and hands it to the
/// shard. The shells call it each time their runtime reports the socket
/// readable, so no buffer lives between reads.
pub(super) fn read_step(
    ctx: &Rc<ShardCtx>,
    id: ConnId,
    read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
) -> ReadStep {
    let mut buf = [0u8; READ_MAX];
    match read(&mut buf) {
        Ok(0) => ReadStep::Stop,
        Ok(n) if feed(ctx, id, &buf[..n]) => ReadStep::Again,
        Ok(_) => ReadStep::Stop,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
            ReadStep::Again
        }
        Err(_) => ReadStep::Stop,
    }
}

/// One non-blocking `recv(2)` on socket `fd` (for a runtime without a
/// non-blocking read of its own).
pub(super) fn recv_now(fd: RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `fd` is the open socket of a connection whose reader is running
    // (the socket is released only after the reader ends), and `buf` is valid
    // for writes of `buf.len()` bytes.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Gives bytes read from the socket to the shard and runs what it decided;
/// false when the shard wants no more reads.
pub(super) fn feed(ctx: &Rc<ShardCtx>, id: ConnId, data: &[u8]) -> bool {
    let reading = ctx
        .shard
        .borrow_mut()
        .handle_read(id, data, clock::now_ms());
    ctx.flush();
    reading == Reading::More
}

/// Writes `id`'s queued frames at once, with non-blocking `send(2)`, while
/// the socket takes them whole (the common case: the flush step that queued a
/// frame also puts it on the wire, and no task wakes). The first frame the
/// socket does not take whole goes, with what it did not take, to a writer
/// task that waits for room and empties the queue. Nothing happens here while
/// such a task holds the socket, or after a write failed.
pub(super) fn write_queued(ctx: &Rc<ShardCtx>, shard: &mut Shard, io: &Rc<ConnIo>, id: ConnId) {
    if io.write_side.get() != WriteSide::Direct {
        return;
    }
    let mut written = 0;
    while let Some(frame) = shard.poll_transmit(id) {
        let res = send_now(io.fd, &frame);
        let (n, whole) = settle(ctx, io, id, frame, res);
        written += n;
        if !whole {
            break;
        }
    }
    if io.write_side.get() == WriteSide::Direct {
        io.after_queue_empty();
    }
    ctx.metrics().bytes_out.fetch_add(written as u64, Relaxed);
}

/// [`write_queued`] for every connection the shard made ready, through the
/// shard's io_uring: the head frame of each goes into one batch of sends
/// (submitted whenever the ring fills, and at the end); a connection whose
/// frame went whole and that has more queued gets its next one in the next
/// batch. What a socket does not take goes to a writer task, as there.
pub(super) fn write_batched(
    ctx: &Rc<ShardCtx>,
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
                io.after_queue_empty();
                continue;
            };
            if ring.is_full() {
                batches += 1;
                ring.submit(|tag, frame, res| {
                    written += sent(ctx, shard, tag, frame, res, &mut again);
                });
            }
            let slot = io.registered.get().then(|| id.index());
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
            io.after_queue_empty();
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

/// One non-blocking `send(2)` of `buf` on socket `fd`: the bytes taken, or
/// `WouldBlock` when the send buffer is full.
pub(super) fn send_now(fd: RawFd, buf: &[u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: `fd` is an open socket of a live connection (the caller
        // found it in the shard's map, which `finish` leaves before the
        // socket is released), and `buf` is valid for `buf.len()` bytes.
        let n = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The writer task's next frame, after it wrote the previous one: the head of
/// the queue, or `None` when the queue is empty, which hands the socket back
/// to the flush step (and the task ends).
pub(super) fn writer_next(ctx: &ShardCtx, io: &ConnIo, id: ConnId) -> Option<Bytes> {
    let next = ctx.shard.borrow_mut().poll_transmit(id);
    if next.is_none() {
        io.write_side.set(WriteSide::Direct);
        io.after_queue_empty();
        wake_reader(io);
    }
    next
}

/// The writer task's write failed: nothing more is written to the socket.
pub(super) fn writer_failed(io: &ConnIo) {
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

/// One turn of the loop, without the sleep: feeds the inbox and the time into
/// the renderer, flushes, publishes metrics, and returns the next deadline (ms).
pub(super) fn step(ctx: &Rc<ShardCtx>) -> Option<u64> {
    let drain_ms = ctx.node.args.drain_ms;
    let now = clock::now_ms();
    {
        let mut shard = ctx.shard.borrow_mut();
        while let Some(batch) = ctx.inbox.try_snapshots() {
            for s in &batch {
                shard.handle_snapshot(s);
            }
        }
        while let Some(msg) = ctx.inbox.try_control() {
            match msg {
                Control::Seed { course, sections } => shard.handle_seed(&course, &sections, now),
                Control::Presence(counts) => {
                    for (course, n) in counts.iter() {
                        shard.handle_presence(course, *n);
                    }
                }
                Control::Roster { conn, frame } => shard.deliver(conn, frame),
                Control::Admin(msg) => shard.handle_admin(&msg),
                Control::Drain => shard.start_drain(now, drain_ms),
                Control::CloseAll => shard.close_all(close::GOING_AWAY),
                Control::Probe => {}
            }
        }
        let rendered = shard.stats().frames_rendered;
        let started = Instant::now();
        shard.handle_timeout(now);
        if shard.stats().frames_rendered != rendered {
            ctx.metrics()
                .tick
                .observe_us(started.elapsed().as_micros() as u64);
        }
    }
    ctx.flush();
    ctx.publish_metrics();
    purge_freed_memory(ctx, now);
    ctx.metrics()
        .heartbeat_ms
        .store(now, std::sync::atomic::Ordering::Relaxed);
    let deadline = ctx.shard.borrow().poll_timeout().map(clock::on_round_grid);
    ctx.inbox.set_wakes_at(deadline);
    ctx.kick.take();
    deadline
}

/// How often a shard asks the allocator to return freed pages.
const PURGE_EVERY_MS: u64 = 1_000;

/// Returns pages freed on this shard thread to the OS, at most every
/// [`PURGE_EVERY_MS`]. mimalloc purges only when it is called, so after a
/// burst (thousands of handshakes, each a few KiB freed at its upgrade) a
/// quiet shard would keep that memory resident for good. All free pages go
/// when no frame was rendered since the last call (a quiet shard); while
/// frames flow, only those past the delay (pages about to be reused stay).
fn purge_freed_memory(ctx: &ShardCtx, now: u64) {
    if now < ctx.next_purge_ms.get() {
        return;
    }
    ctx.next_purge_ms.set(now + PURGE_EVERY_MS);
    let rendered = ctx.shard.borrow().stats().frames_rendered;
    let quiet = ctx.rendered_at_purge.replace(rendered) == rendered;
    super::allocator::collect(quiet);
}

/// Ready when the inbox has mail, the shard was kicked, or the deadline passed
/// (`S`: the runtime's sleep future).
pub(super) struct Wait<'a, S> {
    pub(super) ctx: &'a Rc<ShardCtx>,
    pub(super) sleep: Option<Pin<Box<S>>>,
}

impl<S: Future<Output = ()>> Future for Wait<'_, S> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.ctx.inbox.register(cx.waker()) || self.ctx.kick.poll_take(cx) {
            return Poll::Ready(());
        }
        match self.sleep.as_mut() {
            Some(s) => s.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}
