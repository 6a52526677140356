//! One connection (WebSocket or Server-Sent Events) as a shard sees it: who, what it watches, its read
//! side (frame decoder, message windows) and its bounded send queue.

use crate::phase::Phase;
use crate::rate::{ControlWindow, MessageWindow};
use crate::send_queue::{Push, SendQueue};
use crate::ws_codec::Decoder;
use bytes::Bytes;
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

/// How a connection's messages go on the wire: decides the form every frame
/// is queued in, and whether it is pinged and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A WebSocket; `deflate`: it negotiated permessage-deflate (section 4a),
    /// so its text frames of 256 B or more go compressed.
    WebSocket { deflate: bool },
    /// A Server-Sent Events stream (`/sse`): gets events instead of frames,
    /// keepalive comments instead of pings, and reads nothing.
    Sse,
}

impl Transport {
    /// A Server-Sent Events stream.
    pub fn is_sse(self) -> bool {
        self == Transport::Sse
    }

    /// A WebSocket that negotiated permessage-deflate.
    pub fn deflates(self) -> bool {
        self == Transport::WebSocket { deflate: true }
    }
}

/// What a WebSocket's upgrade settled, for [`crate::Shard::connect`]: call
/// sites name the endpoint and the extension instead of passing bare flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WsOptions {
    /// Opened on `/ws/admin`: it receives the admin aggregates.
    pub admin_feed: bool,
    /// Negotiated permessage-deflate.
    pub deflate: bool,
}

impl WsOptions {
    /// A connection on `/ws` (a viewer, whatever its role), uncompressed.
    pub const VIEWER: WsOptions = WsOptions {
        admin_feed: false,
        deflate: false,
    };

    /// An admin feed on `/ws/admin`, uncompressed.
    pub const ADMIN_FEED: WsOptions = WsOptions {
        admin_feed: true,
        deflate: false,
    };

    /// The same, with permessage-deflate negotiated (`true`) or not.
    pub const fn with_deflate(self, deflate: bool) -> WsOptions {
        WsOptions { deflate, ..self }
    }
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub gen: u32,
    pub user: Arc<str>,
    pub role: Role,
    /// Connected on `/ws/admin`: receives admin aggregates (which endpoint it
    /// opened, whatever its transport).
    pub admin_feed: bool,
    /// Watched courses and this connection's index in each course's viewer list.
    pub watched: Vec<(Arc<str>, u32)>,
    /// Frames not yet written, within the connection's bound.
    pub queue: SendQueue,
    pub last_rx_ms: u64,
    pub last_ping_ms: u64,
    /// Open, closing (our close frame queued: nothing else goes out) or cut.
    pub phase: Phase,
    /// Sitting in the shard's ready list (state, kept here so a connection
    /// is listed once).
    pub in_ready: bool,
    /// WebSocket (with or without permessage-deflate) or SSE stream.
    pub transport: Transport,
    /// Client frames not yet decoded, and the message being assembled: only
    /// while there are any (see [`Conn::decoder`]).
    decoder: Option<Box<Decoder>>,
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
        transport: Transport,
        queue_bound: usize,
        now_ms: u64,
    ) -> Self {
        Conn {
            gen,
            user,
            role,
            admin_feed,
            watched: Vec::new(),
            queue: SendQueue::new(queue_bound),
            last_rx_ms: now_ms,
            last_ping_ms: now_ms,
            phase: Phase::Open,
            in_ready: false,
            transport,
            decoder: None,
            window: MessageWindow::default(),
            control: ControlWindow::default(),
        }
    }

    /// Queues a data frame if it fits (nothing goes out after the close frame).
    pub fn push(&mut self, frame: Bytes, now_ms: u64) -> Push {
        if !self.phase.is_open() {
            return Push::Full;
        }
        self.queue.push(frame, now_ms)
    }

    /// The connection's frame decoder, made on its first read since it was
    /// last idle.
    pub fn decoder(&mut self) -> &mut Decoder {
        let deflate = self.transport.deflates();
        self.decoder.get_or_insert_with(|| {
            Box::new(if deflate {
                Decoder::with_deflate()
            } else {
                Decoder::new()
            })
        })
    }

    /// Drops the decoder once it holds nothing: an idle connection (most of
    /// them, between a `watch` and the next pong) keeps no decoder at all.
    pub fn release_idle_decoder(&mut self) {
        if self.decoder.as_ref().is_some_and(|d| d.is_idle()) {
            self.decoder = None;
        }
    }

    pub fn watch_pos(&self, course: &str) -> Option<usize> {
        self.watched.iter().position(|(c, _)| &**c == course)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws_codec::{client_frame, WsEvent};

    /// A student's WebSocket connection, with or without permessage-deflate.
    fn ws_conn(deflate: bool) -> Conn {
        let transport = Transport::WebSocket { deflate };
        Conn::new(1, "u".into(), Role::Student, false, transport, 1024, 0)
    }

    #[test]
    fn the_decoder_lives_only_while_it_holds_something() {
        let mut c = ws_conn(false);
        assert!(c.decoder.is_none(), "a new connection holds no decoder");
        let first = client_frame(false, 0x1, b"{\"op\":", [1, 2, 3, 4]);
        let last = client_frame(true, 0x0, b"1}", [5, 6, 7, 8]);
        // Half a frame, then a whole frame that does not end its message.
        c.decoder().feed(&first[..3]);
        assert_eq!(c.decoder().next_event(), Ok(None));
        c.release_idle_decoder();
        assert!(c.decoder.is_some(), "kept: half a frame is buffered");
        c.decoder().feed(&first[3..]);
        assert_eq!(c.decoder().next_event(), Ok(None));
        c.release_idle_decoder();
        assert!(c.decoder.is_some(), "kept: a message is being assembled");
        c.decoder().feed(&last);
        assert_eq!(
            c.decoder().next_event(),
            Ok(Some(WsEvent::Text("{\"op\":1}".into())))
        );
        assert_eq!(c.decoder().next_event(), Ok(None));
        c.release_idle_decoder();
        assert!(c.decoder.is_none(), "dropped once it holds nothing");
    }

    #[test]
    fn a_decoder_made_again_keeps_the_connection_s_deflate() {
        let mut c = ws_conn(true);
        // RSV1 is allowed only on a connection that negotiated deflate.
        let mut frame = client_frame(true, 0x1, b"x", [0; 4]);
        frame[0] |= 0x40;
        c.decoder().feed(&frame);
        assert_ne!(
            c.decoder().next_event(),
            Err(crate::ws_codec::Violation(crate::ws_codec::close::PROTOCOL))
        );
    }
}
