//! A WebSocket connection's life after its handshake passed: the `101`, its
//! registration with the core, the reader task that hands what the socket
//! holds to the core, and the end (once its reader and any writer are done).

use super::io::ConnIo;
use super::opening::Opening;
use super::shell::Shell;
use super::upgrade::Upgrade;
use super::writing::{self, ConnSocket};
use crate::clock;
use crate::shard::runtime::Runtime;
use shards::{ConnId, Reading, WsOptions};
use std::io::ErrorKind;
use std::rc::Rc;
use std::sync::Arc;

/// The most one read takes from a socket (on the stack of the read step:
/// an idle connection waits for readability and holds no read buffer).
const READ_MAX: usize = 4096;

/// Registers the connection with the shard, sends the `101` (or the SSE
/// response head) together with what the shard queued for it (the `hello`,
/// the boards of the courses the request named) in one send, and hands it to a reader task of its
/// own, so nothing of the handshake stays alive for the connection's life but
/// its slot (in its [`ConnIo`]). A named course the shard holds no board of
/// yet holds that send until its seed comes ([`super::Openings`]). Frames are
/// written by the shard's flush step, or by a writer task only while the
/// socket is full.
pub async fn start<R: Runtime, H: Shell>(
    ctx: Rc<H>,
    stream: R::Stream,
    upgrade: Upgrade,
    response: Vec<u8>,
    rest: Vec<u8>,
) {
    let socket = Rc::new(ConnSocket::<R>(stream));
    let sse = upgrade.sse;
    let (id, io) = register(&ctx, upgrade, Rc::clone(&socket));
    if ctx.core().borrow().awaits_seed(id) {
        ctx.openings()
            .borrow_mut()
            .hold(id, Rc::clone(&io), response);
    } else {
        ctx.sends().borrow().write_first(&ctx, &io, id, response);
    }
    // An SSE stream's request is all it sends: what follows is ignored. A
    // head read alone (the usual case) leaves nothing to decode yet.
    let reading = sse || rest.is_empty() || feed(&ctx, id, &rest);
    drop(rest);
    R::spawn(async move {
        if reading {
            read_loop::<R, H>(&ctx, id, &socket.0, sse).await;
        }
        drop(socket);
        writing::writer_gone(&io).await;
        finish(&ctx, &io, id);
    });
}

/// Registers an upgraded connection with the shard; nothing is written to
/// it until [`super::Sends::write_first`] puts the `101` in front.
fn register<R: Runtime, H: Shell>(
    ctx: &Rc<H>,
    upgrade: Upgrade,
    socket: Rc<ConnSocket<R>>,
) -> (ConnId, Rc<ConnIo>) {
    let user = Arc::clone(upgrade.slot.user());
    let now_ms = clock::now_ms();
    let id = if upgrade.sse {
        ctx.core()
            .borrow_mut()
            .connect_sse(user, upgrade.role, &upgrade.courses, now_ms)
    } else {
        let mut core = ctx.core().borrow_mut();
        let ws = WsOptions {
            admin_feed: upgrade.admin_feed,
            deflate: upgrade.deflate,
        };
        let id = core.connect(user, upgrade.role, ws, now_ms);
        // The courses of `/ws?course=`: watched before the `101` is written,
        // so their answers go out with it when the course is held here.
        core.watch_named(id, &upgrade.courses, now_ms);
        id
    };
    let fd = R::fd(&socket.0);
    let io = Rc::new(ConnIo::upgrading(fd, socket, upgrade.slot));
    ctx.sends().borrow_mut().register(id, &io);
    ctx.conns().borrow_mut().insert(id, Rc::clone(&io));
    ctx.flush();
    (id, io)
}

/// Writes the `101` of each upgrade that waited for its boards, now queued
/// behind it, as [`start`] writes it for a course the shard held (the flush
/// step calls it with [`super::Openings::take_ready`]).
pub fn open_held<H: Shell>(ctx: &Rc<H>, ready: Vec<Opening>) {
    for o in ready {
        if ctx.conns().borrow().get(&o.id).is_some() {
            ctx.sends().borrow().write_first(ctx, &o.io, o.id, o.head);
        }
    }
}

/// Forgets a connection whose reader and writer both ended; its socket and
/// its [`super::Slot`] go with the last [`ConnIo`] right after.
fn finish<H: Shell>(ctx: &Rc<H>, io: &ConnIo, id: ConnId) {
    ctx.openings().borrow_mut().forget(id);
    io.release();
    ctx.sends().borrow_mut().release(id);
    ctx.conns().borrow_mut().remove(&id);
    ctx.core().borrow_mut().disconnect(id);
    ctx.flush();
}

/// Waits for the socket to be readable and reads what it holds, until the
/// peer or the shard ends it. The wait holds no buffer. An SSE stream's
/// reads (`discard`) only watch for the peer's close.
async fn read_loop<R: Runtime, H: Shell>(
    ctx: &Rc<H>,
    id: ConnId,
    stream: &R::Stream,
    discard: bool,
) {
    loop {
        if R::readable(stream).await.is_err() {
            return;
        }
        let more = if discard {
            discard_step::<R>(stream)
        } else {
            read_step::<R, H>(ctx, id, stream)
        };
        if !more {
            return;
        }
    }
}

/// Reads and drops what an SSE stream's peer sent; false once it closed.
fn discard_step<R: Runtime>(stream: &R::Stream) -> bool {
    let mut buf = [0u8; READ_MAX];
    match R::try_recv(stream, &mut buf) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    }
}

/// Reads what the socket holds (up to [`READ_MAX`] bytes) into a buffer on
/// the stack and hands it to the shard, so no buffer lives between reads;
/// false when reading stops (the peer closed, the read failed, or the shard
/// wants no more).
fn read_step<R: Runtime, H: Shell>(ctx: &Rc<H>, id: ConnId, stream: &R::Stream) -> bool {
    let mut buf = [0u8; READ_MAX];
    match R::try_recv(stream, &mut buf) {
        Ok(0) => false,
        Ok(n) => feed(ctx, id, &buf[..n]),
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    }
}

/// Gives bytes read from the socket to the shard and runs what it decided;
/// false when the shard wants no more reads.
fn feed<H: Shell>(ctx: &Rc<H>, id: ConnId, data: &[u8]) -> bool {
    let reading = ctx
        .core()
        .borrow_mut()
        .handle_read(id, data, clock::now_ms());
    ctx.flush();
    reading == Reading::More
}
