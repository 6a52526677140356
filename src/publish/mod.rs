//! Publishing helpers shared by `seatboard publish`, `simulate` and the `Publisher`.

pub mod error;
pub mod script;
