//! The `seatboard` binary.

use clap::Parser;
use seatboard::cli::{Cli, Command};
use seatboard::cmd::node::{self, Feed};
use seatboard::logging::{init as logging, usage};
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    seatboard::allocator::purge_promptly();
    let cli = match Cli::try_parse().and_then(|c| c.check().map(|()| c)) {
        Ok(cli) => cli,
        Err(e) => return refused(e),
    };
    let code = run(cli);
    // The last lines (`drained`, a refusal) reach stderr before the exit.
    seatboard::logging::flush(std::time::Duration::from_millis(500));
    code
}

/// A command line clap did not take: the refusal on stderr (exit 2), or the
/// help or version asked for (exit 0).
fn refused(e: clap::Error) -> ExitCode {
    // A missing flag: named on the first line.
    if let Some(text) = seatboard::cli::missing_flags(&e) {
        seatboard::logging::refusal(&text);
        return ExitCode::from(2);
    }
    // A refused flag under a unit: into the journal as an error.
    if e.use_stderr() && seatboard::logging::refusal_to_journal(&e.to_string()) {
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    e.exit()
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => node::run(args, Feed::Redis),
        Command::Demo(args) => node::run(args, Feed::Demo),
        Command::Publish(args) => match logging(&args.log_level) {
            Ok(()) => seatboard::cmd::publish::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
        Command::Simulate(args) => match logging(&args.log_level) {
            Ok(()) => seatboard::cmd::simulate::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
        Command::PublishScript => seatboard::cmd::publish_script::run(),
        Command::Analytics(args) => seatboard::analytics::main(args),
        Command::Token(args) => seatboard::cmd::token::run(args),
        Command::Relay(args) => seatboard::relay::main(args),
        Command::Reconcile(args) => seatboard::reconcile::main(args),
        Command::RehearseViewers => seatboard::rehearse::child_main(),
        Command::Rehearse(args) => match logging(&args.log_level) {
            Ok(()) => seatboard::rehearse::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
    }
}
