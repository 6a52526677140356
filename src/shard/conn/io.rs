//! The shell's half of each live connection ([`ConnIo`]: who writes its socket
//! now, and how its end goes) and the table of them the flush step looks up.

use super::host::Host;
use super::sockopt;
use super::upgrade::Slot;
use bytes::Bytes;
use shards::phase::Phase;
use shards::ConnId;
use std::cell::Cell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::task::Waker;

/// The write side of a connection, from its upgrade to the release of its
/// socket: who writes the socket now, and whether it may be touched at all.
/// Only one writer at a time: the shard's flush step writes at once while the
/// socket takes whole frames, a writer task takes over only when it does not
/// (and hands back when the queue is empty), so an idle connection holds no
/// writer at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSide {
    /// Just upgraded: the `101` has not been written, so neither is anything
    /// else (see [`super::writing::write_first`]).
    Upgrading,
    /// Nothing in flight: the flush step writes queued frames with `send(2)`.
    Direct,
    /// A writer task waits for the socket to take the rest.
    Task,
    /// The close frame went out (and the write side was shut down), or a
    /// write failed: nothing more is written.
    Done,
    /// Reader and writer ended and the socket is about to be released:
    /// nothing touches its descriptor again (the kernel may reuse it).
    Released,
}

/// A connection's socket as its shell holds it, so the runtime-free flush
/// step can start that runtime's writer task when the socket is full.
pub trait Socket {
    /// Spawns a writer task that writes `rest` (what the socket did not take
    /// at once), then the connection's queue, and ends when the queue is empty.
    fn spawn_writer(self: Rc<Self>, host: Rc<dyn Host>, io: Rc<ConnIo>, id: ConnId, rest: Bytes);
}

/// The shell's half of one WebSocket connection, shared by its reader task,
/// the flush step and (while the socket is full) its writer task.
pub struct ConnIo {
    /// Who writes the socket now, or that it is released.
    pub(super) write_side: Cell<WriteSide>,
    /// The reader task, waiting (after its last read) for the writer task to
    /// end: set only in [`WriteSide::Task`]. (Not a field of that state: the
    /// waker beside the state's tag would make it 24 bytes instead of 1, and
    /// this struct 72 instead of 64.)
    pub(super) reader_waiting: Cell<Option<Waker>>,
    /// The socket, for the shard's sends and a forced shutdown.
    pub(super) fd: RawFd,
    /// The socket as the shell holds it, to start a writer task.
    pub(super) socket: Rc<dyn Socket>,
    /// The connection's place in the node's and its user's caps, given back
    /// when the connection is gone.
    _slot: Slot,
}

impl ConnIo {
    /// The shell's half of a just-upgraded connection on socket `fd`, its
    /// `101` not written yet.
    pub(super) fn upgrading(fd: RawFd, socket: Rc<dyn Socket>, slot: Slot) -> Self {
        ConnIo {
            write_side: Cell::new(WriteSide::Upgrading),
            reader_waiting: Default::default(),
            fd,
            socket,
            _slot: slot,
        }
    }

    /// Called when the queue was written out, with the connection's phase in
    /// the core: once it is closing, the close frame was the last one queued,
    /// so the write side is shut down (FIN after the close frame, RFC 6455
    /// section 7.1.1) and nothing more is written.
    pub(super) fn after_queue_empty(&self, phase: Option<Phase>) {
        let closing = phase.is_some_and(|p| !p.is_open());
        if closing && !self.released() {
            self.write_side.set(WriteSide::Done);
            // Not released, so the socket behind `fd` is still owned by this
            // connection.
            sockopt::shutdown_write(self.fd);
        }
    }

    /// Cuts the socket (the shard's close grace is over), unless it is already
    /// released. If the kernel still holds bytes the peer has not taken (a
    /// slow consumer), the close that follows resets the connection: a FIN
    /// would queue behind them, and the orphaned socket would keep up to its
    /// send buffer for minutes while the peer advertises no window.
    pub fn cut(&self) {
        if self.released() {
            return;
        }
        // Not released, so the socket behind `fd` is still owned by this
        // connection.
        if sockopt::unsent_bytes(self.fd).is_some_and(|n| n > 0) {
            sockopt::reset_on_close(self.fd);
        }
        sockopt::shutdown_both(self.fd);
    }

    /// Marks the socket released (reader and writer ended; it closes with the
    /// last reference to this half): nothing touches its descriptor after.
    pub(super) fn release(&self) {
        self.write_side.set(WriteSide::Released);
    }

    fn released(&self) -> bool {
        self.write_side.get() == WriteSide::Released
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle connection's cost: the write side's states fit one byte, and
    /// the shell's half of a connection stays at 64 bytes (80 with its `Rc`,
    /// one of the allocator's size classes).
    #[test]
    fn the_shell_half_of_a_connection_stays_small() {
        assert_eq!(std::mem::size_of::<WriteSide>(), 1);
        assert_eq!(std::mem::size_of::<ConnIo>(), 64);
    }
}
