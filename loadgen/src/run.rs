//! A viewer loop run: on this thread ([`run_with`], commands and outputs as
//! values) or as a child process's main ([`run`], JSON lines on stdin and
//! stdout).

use crate::config::Config;
use crate::gen::Gen;
use crate::message::{self, Command, Output};
use crate::report::Report;
use mio::Events;
use std::io::{ErrorKind, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One output as a line on stdout.
fn emit(out: &Output) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", message::line(out));
    let _ = stdout.flush();
}

/// A child process's main: commands as JSON lines on stdin, outputs as JSON
/// lines on stdout; runs until `report`, stdin's end or `max_secs`. A line
/// that is not a command is answered with [`Output::Rejected`].
pub fn run(cfg: Config) {
    let (tx, rx) = mpsc::channel::<Command>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            let cmd = match stdin.read_line(&mut line) {
                // Stdin's end: the parent is gone, report and stop.
                Ok(0) | Err(_) => Command::Report,
                Ok(_) if line.trim().is_empty() => continue,
                Ok(_) => match message::parse::<Command>(&line) {
                    Ok(cmd) => cmd,
                    Err(e) => {
                        emit(&Output::Rejected(e));
                        continue;
                    }
                },
            };
            let last = cmd == Command::Report;
            if tx.send(cmd).is_err() || last {
                return;
            }
        }
    });
    run_with(cfg, rx, |o| emit(&o));
}

/// The load generator on this thread: commands from `rx`, outputs to `out`;
/// returns after the report.
pub fn run_with(cfg: Config, rx: mpsc::Receiver<Command>, mut out: impl FnMut(Output)) {
    let deadline = Instant::now() + Duration::from_secs(cfg.max_secs);
    let mut g = match Gen::new(cfg) {
        Ok(g) => g,
        Err(e) => {
            out(Output::Report(Box::new(Report::failed(e.to_string()))));
            return;
        }
    };
    let mut events = Events::with_capacity(4096);
    let mut next_progress = Instant::now();
    let mut busy_us = 0u128;
    let mut awake = Instant::now();
    loop {
        busy_us += awake.elapsed().as_micros();
        g.c.busy_ms = (busy_us / 1000) as u64;
        if let Err(e) = g.poll.poll(&mut events, Some(Duration::from_millis(10))) {
            if e.kind() != ErrorKind::Interrupted {
                out(Output::Report(Box::new(Report::failed(e.to_string()))));
                return;
            }
        }
        awake = Instant::now();
        let ready: Vec<(usize, bool)> = events
            .iter()
            .map(|e| (e.token().0, e.is_read_closed() || e.is_error()))
            .collect();
        for (idx, closed) in ready {
            g.handle(idx, closed);
        }
        g.start_new();
        let now = Instant::now();
        if now >= next_progress {
            next_progress = now + Duration::from_millis(500);
            out(Output::Progress(g.progress()));
        }
        let mut stop = now >= deadline;
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Command::Mark => out(Output::Mark(g.c.clone())),
                Command::Report => stop = true,
                other => g.command(other),
            }
        }
        if stop {
            out(Output::Report(Box::new(g.report())));
            if g.cfg.goodbye {
                g.goodbye();
            }
            return;
        }
    }
}
