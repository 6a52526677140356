//! A shard's HTTP front door: accepting connections, reading and routing
//! request heads, the pages and JSON answers, and the checks before a
//! WebSocket upgrade or an SSE stream, which go on to the connection code
//! (`conn/`).

mod csp;
pub mod front_door;
mod handshake;
mod pages;
mod response;
mod routes;
mod sse;
