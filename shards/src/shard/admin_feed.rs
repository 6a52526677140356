//! Admin delivery on one shard (contract §5, Admin): a new admin feed gets the
//! latest full aggregate, the others each tick's delta; an admin whose queue
//! had no room for a message is owed a full one, sent as soon as its queue has
//! room again. An admin message is never dropped for its size alone: an empty
//! queue takes it whatever its size.

use super::Shard;
use crate::conn::ConnId;
use crate::ws_codec::deflated_frame;
use bytes::Bytes;

/// Bytes an admin feed may have queued before a message is refused (viewers
/// get [`super::ShardConfig::send_queue_bytes`]).
pub const ADMIN_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// One admin tick's output, built once per node by the ingest thread.
#[derive(Debug, Clone)]
pub struct AdminMsg {
    /// `full:true`: every course the node knows, as of this message.
    pub full: Bytes,
    /// For the feeds that had the previous message: `full:false` with the
    /// courses whose entry changed since, or the full aggregate when a course
    /// left the view (a delta cannot take an entry away); `None` when nothing
    /// changed (a full sent for a newcomer only).
    pub delta: Option<Bytes>,
}

/// The admin feeds of a shard and the aggregate they are at.
#[derive(Debug, Default)]
pub(super) struct AdminFeeds {
    /// Every admin feed here, and whether it is owed a full message.
    feeds: Vec<(ConnId, bool)>,
    /// The latest full aggregate, and its compressed twin once one was needed.
    full: Option<(Bytes, Option<Bytes>)>,
}

impl AdminFeeds {
    /// Admin feeds open on this shard.
    pub(super) fn len(&self) -> usize {
        self.feeds.len()
    }
}

impl Shard {
    /// A feed opened on `/ws/admin`: it gets the latest full aggregate now, or
    /// the next one the ingest thread sends.
    pub(super) fn admin_feed_opened(&mut self, id: ConnId) {
        self.admin.feeds.push((id, true));
        self.admin_send_owed(id);
    }

    /// A feed's connection is gone; true if it was the last one here (the
    /// aggregate is forgotten with it: the next feed is sent a fresh one).
    pub(super) fn admin_feed_closed(&mut self, id: ConnId) -> bool {
        self.admin.feeds.retain(|(f, _)| *f != id);
        if self.admin.feeds.is_empty() {
            self.admin.full = None;
            return true;
        }
        false
    }

    /// An admin aggregate built once per node: feeds owed a full message get
    /// the full one, the others the delta (each compressed at most once here,
    /// for the feeds that negotiated permessage-deflate).
    pub fn handle_admin(&mut self, msg: &AdminMsg) {
        self.admin.full = Some((msg.full.clone(), None));
        let mut delta_deflated: Option<Bytes> = None;
        let feeds = self.admin.feeds.clone();
        for (id, owed) in feeds {
            if owed {
                self.admin_send_owed(id);
                continue;
            }
            let Some(delta) = &msg.delta else { continue };
            let deflate = self.conn(id).is_some_and(|c| c.transport.deflates());
            let frame = if deflate {
                delta_deflated
                    .get_or_insert_with(|| deflated_frame(&mut self.deflater, delta))
                    .clone()
            } else {
                delta.clone()
            };
            if !self.admin_push(id, delta, frame) {
                self.admin_owe_full(id);
            }
        }
    }

    /// Sends the latest full aggregate to a feed owed one, if its queue has
    /// room (an empty queue always has).
    pub(super) fn admin_send_owed(&mut self, id: ConnId) {
        let Some((plain, deflated)) = self.admin.full.clone() else {
            return;
        };
        let Some(conn) = self.conn(id) else { return };
        let frame = if conn.transport.deflates() {
            let d = deflated.unwrap_or_else(|| deflated_frame(&mut self.deflater, &plain));
            self.admin.full = Some((plain.clone(), Some(d.clone())));
            d
        } else {
            plain.clone()
        };
        if self.admin_push(id, &plain, frame) {
            if let Some(f) = self.admin.feeds.iter_mut().find(|(f, _)| *f == id) {
                f.1 = false;
            }
        }
    }

    /// Heals every feed owed a full message whose queue has room again (runs
    /// with the shard's sweep).
    pub(super) fn admin_heal(&mut self) {
        let owed: Vec<ConnId> = self
            .admin
            .feeds
            .iter()
            .filter(|(_, owed)| *owed)
            .map(|(id, _)| *id)
            .collect();
        for id in owed {
            self.admin_send_owed(id);
        }
    }

    fn admin_owe_full(&mut self, id: ConnId) {
        if let Some(f) = self.admin.feeds.iter_mut().find(|(f, _)| *f == id) {
            f.1 = true;
        }
    }

    /// Queues `frame` (the wire form of `plain`) to an admin feed if it fits
    /// its 4 MiB bound or the queue is empty; false (and the queue counts as
    /// full) if not.
    fn admin_push(&mut self, id: ConnId, plain: &Bytes, frame: Bytes) -> bool {
        let now_ms = self.now_ms;
        let Some(conn) = self.conn_mut(id) else {
            return false;
        };
        if !conn.phase.is_open() {
            return false;
        }
        if !conn.queue.fits(frame.len()) {
            conn.queue.refused(now_ms);
            return false;
        }
        self.send_always_as(id, plain, &frame, None);
        true
    }
}
