//! Deterministic tests of `shards::Shard` through its public API only: the test
//! plays the shell (feeds events and the clock, pops frames) and the browser
//! (decodes server frames, merges course frames).

mod admin_feed;
mod connect;
mod convergence;
mod drain;
mod pacing;
mod presence;
mod requests;
mod rig;
mod send_queue;
mod upgrade_courses;
mod watch;
