//! The child's side of viewers in child processes, past what one process's
//! open files allow: this binary re-executed as the hidden
//! `__rehearse-viewers` subcommand by the `loadgen` crate's one parent
//! ([`loadgen::ChildLoop`]), its config on stdin, never on argv.

/// The hidden subcommand a child runs.
pub const SUBCOMMAND: &str = "__rehearse-viewers";

/// The child's main ([`loadgen::child_main`]). SIGINT and SIGTERM are left to
/// the parent (a Ctrl-C, or a service manager's stop, may reach the whole
/// process group): it asks for the report.
pub fn main() -> std::process::ExitCode {
    let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, std::sync::Arc::clone(&ignored));
    }
    match loadgen::child_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            crate::logging::line(&format!("error: {SUBCOMMAND}: bad config: {e}"));
            std::process::ExitCode::from(2)
        }
    }
}
