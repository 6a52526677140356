//! A connection's I/O after its handshake passed: its registration with the
//! core, the reader task, the writes (from the flush step, through the
//! shard's [`Sends`], or a writer task while the socket is full), and its end.
//! Everything here reaches its shard through [`Shell`] (and a writer task
//! through [`Host`]), so this folder does not depend on the shard's context.

mod host;
mod io;
pub mod lifecycle;
mod opening;
pub mod send_ring;
mod sends;
mod shell;
pub mod sockopt;
mod upgrade;
mod writing;

pub use host::Host;
pub use io::ConnTable;
pub use opening::Openings;
pub use sends::Sends;
pub use shell::Shell;
pub use upgrade::{Slot, Upgrade};
