//! seatboard's sans-IO core: everything a shard thread decides, with no socket,
//! no clock and no thread of its own, so it can be tested deterministically.
//!
//! - [`shard::Shard`]: the per-core renderer (connections, dirty maps, ticks).
//! - [`server_msg`]: every message the server sends, encoded once here.
//! - [`snapshot`]: the Redis payload, parsed and validated; the version rule.
//! - [`ws_codec`]: RFC 6455 frames in and out; [`opcode`] names their opcodes,
//!   [`server_frame`] reads what the server sends (for clients and tests).
//! - [`sse_event`]: the same messages as Server-Sent Events.
//! - [`deflate`]: permessage-deflate, negotiated, compressed once per render
//!   (a whole board by `fixed_deflate`).
//! - [`http_head`]: request heads, upgrade checks, token lookup.
//! - [`json_str`]: JSON string literals, as serde_json writes them.
//! - [`origin`]: which pages may open a WebSocket with which token.
//! - [`client_op`]: what browsers ask for.
//! - [`rate`]: the message window and the accept bucket.
//! - [`gate`]: when a snapshot of a course must wake its shard.

#![forbid(unsafe_code)]

pub mod client_op;
pub mod conn;
mod course;
pub mod deflate;
mod fixed_deflate;
pub mod gate;
pub mod http_head;
pub mod json_str;
pub mod opcode;
pub mod origin;
pub mod phase;
pub mod rate;
mod send_queue;
pub mod server_frame;
pub mod server_msg;
pub mod shard;
pub mod snapshot;
pub mod sse_event;
mod timer;
pub mod ws_codec;

pub use conn::{ConnId, Role, Transport, WsOptions};
pub use course::MAX_SECTIONS;
pub use gate::Gate;
pub use server_frame::{read_server_frame, FrameError, ServerFrame};
pub use shard::{Action, AdminMsg, Counts, Reading, Shard, ShardConfig, ShardStats};
pub use snapshot::{Reject, Snapshot};
