//! RFC 6455 opcodes and header bits, named once for the codec, the server-frame
//! reader and every client that speaks to the server.

/// Continuation of a fragmented message.
pub const CONT: u8 = 0x0;
/// A text message (the only data the contract speaks).
pub const TEXT: u8 = 0x1;
/// A binary message (refused by the server with 1003).
pub const BINARY: u8 = 0x2;
/// A close frame.
pub const CLOSE: u8 = 0x8;
/// A ping frame.
pub const PING: u8 = 0x9;
/// A pong frame.
pub const PONG: u8 = 0xA;

/// The "per-message compressed" bit (RFC 7692) in a frame's first byte.
pub const RSV1: u8 = 0x40;
/// The FIN bit in a frame's first byte.
pub const FIN: u8 = 0x80;
/// The MASK bit in a frame's second byte.
pub const MASK: u8 = 0x80;
