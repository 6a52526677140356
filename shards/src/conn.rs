//! One WebSocket connection as a shard sees it: who, what it watches, its read
//! side (frame decoder, message window) and its bounded send queue.

use crate::rate::{ControlWindow, MessageWindow};
use crate::ws_codec::Decoder;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

/// Handle of a connection on one shard; the generation makes stale handles harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
}

impl ConnId {
    /// A number unique among the shard's live connections (for logs).
    pub fn index(self) -> u32 {
        self.idx
    }
}

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sees courses it watches.
    Student,
    /// May also ask for rosters and connect to `/ws/admin`.
    Admin,
}

impl Role {
    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Student => "student",
            Role::Admin => "admin",
        }
    }
}

/// Why a push did not enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    Queued,
    Full,
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub gen: u32,
    pub user: Arc<str>,
    pub role: Role,
    /// Connected on `/ws/admin`: receives admin aggregates.
    pub admin_feed: bool,
    /// Watched courses and this connection's index in each course's viewer list.
    pub watched: Vec<(Arc<str>, u32)>,
    pub queue: VecDeque<Bytes>,
    pub queued_bytes: usize,
    /// Since when pushes have been failing without the queue ever draining.
    pub full_since: Option<u64>,
    pub last_rx_ms: u64,
    pub last_ping_ms: u64,
    /// Set once a close frame is queued: nothing else goes out.
    pub closing: bool,
    /// Sitting in the shard's ready list.
    pub in_ready: bool,
    /// Negotiated permessage-deflate: text frames of 256 B or more go compressed.
    pub deflate: bool,
    /// Client frames not yet decoded, and the message being assembled.
    pub decoder: Decoder,
    /// The 20-messages-per-second window.
    pub window: MessageWindow,
    /// The 100-control-frames-per-second window (pings and pongs).
    pub control: ControlWindow,
}

impl Conn {
    pub fn new(
        gen: u32,
        user: Arc<str>,
        role: Role,
        admin_feed: bool,
        deflate: bool,
        now_ms: u64,
    ) -> Self {
        Conn {
            gen,
            user,
            role,
            admin_feed,
            watched: Vec::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            full_since: None,
            last_rx_ms: now_ms,
            last_ping_ms: now_ms,
            closing: false,
            in_ready: false,
            deflate,
            decoder: if deflate {
                Decoder::with_deflate()
            } else {
                Decoder::new()
            },
            window: MessageWindow::default(),
            control: ControlWindow::default(),
        }
    }

    /// Queues a frame if it fits in `limit` bytes (an empty queue takes anything).
    pub fn push(&mut self, frame: Bytes, limit: usize, now_ms: u64) -> Push {
        if self.closing {
            return Push::Full;
        }
        if !self.queue.is_empty() && self.queued_bytes + frame.len() > limit {
            self.full_since.get_or_insert(now_ms);
            return Push::Full;
        }
        self.push_always(frame);
        Push::Queued
    }

    /// Queues a frame past the bound (close frames, drain hints).
    pub fn push_always(&mut self, frame: Bytes) {
        self.queued_bytes += frame.len();
        self.queue.push_back(frame);
    }

    pub fn pop(&mut self) -> Option<Bytes> {
        let f = self.queue.pop_front()?;
        self.queued_bytes -= f.len();
        if self.queue.is_empty() {
            self.full_since = None;
            // Hand back the ring's memory: most connections sit idle between ticks.
            if self.queue.capacity() > 4 {
                self.queue = VecDeque::new();
            }
        }
        Some(f)
    }

    pub fn watch_pos(&self, course: &str) -> Option<usize> {
        self.watched.iter().position(|(c, _)| &**c == course)
    }
}
