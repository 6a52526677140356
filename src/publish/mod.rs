//! Publishing helpers shared by `seatboard publish`, `simulate` and the `Publisher`.

pub mod script;
