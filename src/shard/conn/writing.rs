//! A connection's writer task, which holds its socket only while the socket is
//! full (the flush step writes through the shard's [`super::Sends`] the rest
//! of the time): it waits for room, writes the rest of the frame the socket
//! did not take, then the queue, and hands the socket back when the queue is
//! empty.

use super::host::Host;
use super::io::{ConnIo, Socket, WriteSide};
use crate::clock;
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

/// Starts the shell's writer task with the part of a frame the socket did not take.
pub(super) fn hand_to_writer<H: Host>(ctx: &Rc<H>, io: &Rc<ConnIo>, id: ConnId, rest: Bytes) {
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
            // The socket holds all it takes: the buffer is full until it takes more.
            core.borrow_mut().socket_stalled(id, clock::now_ms());
            if R::writable(&socket.0).await.is_err() {
                return writer_failed(&io);
            }
            match R::try_send(&socket.0, &frame) {
                Ok(n) => {
                    frame.advance(n);
                    metrics.bytes_out.fetch_add(n as u64, Relaxed);
                    if n > 0 {
                        core.borrow_mut().socket_took(id);
                    }
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
