//! The `seatboard` binary.

use clap::Parser;
use seatboard::auth::Auth;
use seatboard::cli::{AuthMode, Cli, Command, HubArgs};
use seatboard::cmd::demo;
use seatboard::hub as runtime;
use seatboard::logging::{init as logging, usage};
use seatboard::node::Node;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn auth_for(args: &HubArgs, demo: bool) -> Result<Auth, String> {
    let secret = args.jwt_secret.as_deref().filter(|s| !s.is_empty());
    match args.auth {
        AuthMode::None => {
            if !demo {
                tracing::warn!("AUTH DISABLED (--auth none): anyone can connect as any user and role; never run this in production");
            }
            Ok(Auth::None)
        }
        AuthMode::Jwt if demo && secret.is_none() && !args.idp.any_key() => Ok(Auth::None),
        AuthMode::Jwt => Auth::from_flags(secret.map(str::as_bytes), &args.idp),
    }
}

fn hub(args: HubArgs, demo_mode: bool) -> ExitCode {
    let shards = match runtime::ShardSet::new(args.shards.map(usize::from)) {
        Ok(set) => set,
        Err(e) => return usage(&e),
    };
    if !demo_mode {
        if let Err(e) = seatboard::redis::Redis::from_flags(&args.redis) {
            return usage(&e);
        }
    }
    // Logging before the auth mode is chosen (`--auth none` warns), after
    // every check whose refusal must be the first line on stderr.
    if let Err(e) = logging(&args.log_level) {
        return usage(&format!(
            "invalid value '{}' for '--log-level': {e}",
            args.log_level
        ));
    }
    let auth = match auth_for(&args, demo_mode) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    if let Err(e) = auth.start() {
        seatboard::logging::line(&format!("error: cannot start: {e}"));
        return ExitCode::from(1);
    }
    let node = Arc::new(Node::new(args, shards.len(), auth));
    let started = if demo_mode {
        demo::start(Arc::clone(&node))
    } else {
        seatboard::cmd::serve::start(Arc::clone(&node))
    };
    let hub = match started {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            seatboard::logging::line(&format!("error: cannot start: {e}"));
            return ExitCode::from(1);
        }
    };
    let addr = node.args.listen;
    let shown = if addr.ip().is_unspecified() {
        format!("http://127.0.0.1:{}/", addr.port())
    } else {
        format!("http://{addr}/")
    };
    if demo_mode {
        // Not `println!`: a closed stdout must not stop the node.
        let _ = writeln!(
            std::io::stdout(),
            "seatboard demo running: open {shown}  (admin: {shown}admin)"
        );
    } else {
        tracing::info!(listen = %addr, shards = shards.len(), "seatboard serving");
        let stop = {
            let node = Arc::clone(&node);
            move || node.draining()
        };
        let history = seatboard::history::start(
            Arc::clone(&node.history),
            &node.args.redis,
            node.args.analytics_prefix.clone(),
            stop,
        );
        if let Err(e) = history {
            tracing::warn!(error = %e, "history thread did not start; /api/history stays empty");
        }
    }
    ExitCode::from(hub.wait() as u8)
}

fn main() -> ExitCode {
    seatboard::shard::allocator::purge_promptly();
    let cli = Cli::parse();
    let code = run(cli);
    // The last lines (`drained`, a refusal) reach stderr before the exit.
    seatboard::logging::flush(std::time::Duration::from_millis(500));
    code
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => hub(args, false),
        Command::Demo(mut args) => {
            args.auth = AuthMode::None;
            hub(args, true)
        }
        Command::Publish(args) => match logging(&args.target.log_level) {
            Ok(()) => seatboard::cmd::publish::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
        Command::Simulate(args) => match logging(&args.target.log_level) {
            Ok(()) => seatboard::cmd::simulate::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
        Command::PublishScript => seatboard::cmd::publish_script::run(),
        Command::Analytics(args) => seatboard::analytics::main(args),
        Command::Token(args) => seatboard::cmd::token::run(args),
        Command::Relay(args) => seatboard::relay::main(args),
        Command::RehearseViewers => seatboard::rehearse::child_main(),
        Command::Rehearse(args) => match logging(&args.redis.log_level) {
            Ok(()) => seatboard::rehearse::run(args),
            Err(e) => usage(&format!("invalid value for '--log-level': {e}")),
        },
    }
}
