//! The subcommands' wiring: what `serve`, `demo`, `publish`, `publish-script`,
//! `simulate` and `token` start (the `analytics` worker lives in [`crate::analytics`]).

pub mod demo;
pub mod node;
pub mod publish;
pub mod publish_script;
pub mod serve;
pub mod simulate;
pub mod simulator;
pub mod token;
