//! One upgraded connection: a reader that hands what it reads to the shard
//! (which decodes and decides), and a writer that sends what the shard queued. Neither holds a frame longer
//! than it takes to write it.

use super::handshake::Accepted;
use super::{ConnIo, ShardCtx};
use crate::auth::Identity;
use crate::clock;
use bytes::Bytes;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use shards::{ConnId, Reading};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;

/// Read buffer of an idle connection: client messages are small, and an idle
/// connection's pending read holds this buffer all the time.
const READ_MIN: usize = 128;
/// Largest read buffer, reached by doubling when reads fill the buffer.
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

/// Sends the `101`, registers the connection with the shard, and hands it to
/// two tasks of its own (reader and writer), so nothing of the handshake stays
/// alive for the connection's life.
pub async fn start(ctx: Rc<ShardCtx>, mut stream: TcpStream, accepted: Accepted, rest: Vec<u8>) {
    pin_send_buffer(stream.as_raw_fd());
    let (res, _) = stream.write_all(accepted.response).await;
    if res.is_err() {
        release(&ctx, &accepted.identity.user);
        return;
    }
    let (id, io) = register(
        &ctx,
        &accepted.identity,
        accepted.admin_feed,
        accepted.deflate,
        stream.as_raw_fd(),
    );
    drop(accepted.identity);
    let (reader, writer) = stream.into_split();
    let writer_task = monoio::spawn(write_loop(Rc::clone(&ctx), Rc::clone(&io), id, writer));
    monoio::spawn(async move {
        read_loop(&ctx, id, reader, rest).await;
        io.reader_done.set(true);
        io.writer.notify();
        let _writer = writer_task.await;
        finish(&ctx, &io, id);
    });
}

/// Registers an upgraded connection (its `101` sent) with the shard.
pub(super) fn register(
    ctx: &Rc<ShardCtx>,
    identity: &Identity,
    admin_feed: bool,
    deflate: bool,
    fd: RawFd,
) -> (ConnId, Rc<ConnIo>) {
    let io = Rc::new(ConnIo::new(fd));
    let id = ctx.shard.borrow_mut().connect(
        &identity.user,
        identity.role,
        admin_feed,
        deflate,
        clock::now_ms(),
    );
    ctx.conns.borrow_mut().insert(id, Rc::clone(&io));
    ctx.flush();
    (id, io)
}

/// Forgets a connection whose reader and writer both ended; its socket is
/// released right after.
pub(super) fn finish(ctx: &Rc<ShardCtx>, io: &ConnIo, id: ConnId) {
    io.finished.set(true);
    ctx.conns.borrow_mut().remove(&id);
    let user = ctx.shard.borrow().user(id).map(str::to_owned);
    ctx.shard.borrow_mut().disconnect(id);
    ctx.flush();
    release(ctx, user.as_deref().unwrap_or(""));
}

pub(super) fn release(ctx: &ShardCtx, user: &str) {
    ctx.node.open.fetch_sub(1, Relaxed);
    ctx.node.users.release(user);
}

/// The reader's buffer: starts at [`READ_MIN`] bytes, doubles while reads fill
/// it, and shrinks back after a burst, so an idle connection's pending read
/// holds little. Everything read goes to [`shards::Shard::handle_read`].
pub(super) struct ReadBuf {
    /// The next read's buffer (capacity [`READ_MIN`]..=[`READ_MAX`]).
    pub(super) buf: Vec<u8>,
}

impl ReadBuf {
    /// An empty buffer of the smallest size.
    pub(super) fn new() -> Self {
        ReadBuf {
            buf: Vec::with_capacity(READ_MIN),
        }
    }

    /// Hands a read of `buf.len()` (> 0) bytes to the shard, runs what it
    /// decided, and sizes the buffer for the next read. False when the shard
    /// wants no more reads (the peer's close, a violation).
    pub(super) fn after_read(&mut self, ctx: &Rc<ShardCtx>, id: ConnId) -> bool {
        let more = feed(ctx, id, &self.buf);
        let n = self.buf.len();
        // A full read means more is coming: grow; a small one after a
        // burst: give the memory back.
        let cap = self.buf.capacity();
        if n == cap && cap < READ_MAX {
            self.buf = Vec::with_capacity(cap * 2);
        } else if n < cap / 4 && cap > READ_MIN {
            self.buf = Vec::with_capacity(READ_MIN);
        }
        more
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

async fn read_loop(
    ctx: &Rc<ShardCtx>,
    id: ConnId,
    mut reader: OwnedReadHalf<TcpStream>,
    rest: Vec<u8>,
) {
    if !feed(ctx, id, &rest) {
        return;
    }
    drop(rest);
    let mut state = ReadBuf::new();
    loop {
        let buf = std::mem::take(&mut state.buf);
        let (res, b) = reader.read(buf).await;
        state.buf = b;
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !state.after_read(ctx, id) {
                    return;
                }
            }
        }
    }
}

/// What a connection's writer does next.
pub(super) enum WriteNext {
    /// Write this frame.
    Frame(Bytes),
    /// Stop: the close frame went out, or the reader ended.
    Done,
    /// Wait for [`ConnIo::writer`].
    Wait,
}

/// The writer's next step.
pub(super) fn write_next(ctx: &ShardCtx, io: &ConnIo, id: ConnId) -> WriteNext {
    match ctx.shard.borrow_mut().poll_transmit(id) {
        Some(f) => WriteNext::Frame(f),
        // The close frame is always the last one queued.
        None if io.close_code.get().is_some() || io.reader_done.get() => WriteNext::Done,
        None => WriteNext::Wait,
    }
}

async fn write_loop(
    ctx: Rc<ShardCtx>,
    io: Rc<ConnIo>,
    id: ConnId,
    mut writer: OwnedWriteHalf<TcpStream>,
) {
    loop {
        match write_next(&ctx, &io, id) {
            WriteNext::Frame(f) => {
                let n = f.len() as u64;
                let (res, _) = writer.write_all(f).await;
                if res.is_err() {
                    return;
                }
                ctx.metrics().bytes_out.fetch_add(n, Relaxed);
            }
            WriteNext::Done => return,
            WriteNext::Wait => io.writer.notified().await,
        }
    }
}
