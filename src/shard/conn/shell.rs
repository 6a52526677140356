//! The shard as a connection's registration, reader and end see it: the
//! [`Host`] plus the table of live connections, the sends, and the flush.

use super::host::Host;
use super::io::ConnTable;
use super::opening::Openings;
use super::sends::Sends;
use std::cell::RefCell;
use std::rc::Rc;

/// What registering, feeding and finishing a connection need of its shard.
pub trait Shell: Host {
    /// The shell's half of every live connection.
    fn conns(&self) -> &RefCell<ConnTable>;
    /// How the shard puts frames on the wire.
    fn sends(&self) -> &RefCell<Sends>;
    /// Upgrades whose `101` waits for the board of a course they named.
    fn openings(&self) -> &RefCell<Openings>;
    /// Carries out what the core asked for and writes what it queued.
    fn flush(self: &Rc<Self>);
}
