//! Log lines carry terminal colour codes only when stderr is a terminal, and
//! never with `NO_COLOR` set (contract §3): a log file or journald gets plain text.

use crate::common;
use common::*;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

/// `serve` at log level info (it logs `seatboard serving` once it listens)
/// with `stderr` as its standard error.
fn serve_logging_to(stderr: Stdio, env: &[(&str, &str)]) -> Child {
    let port = free_port();
    seatboard_command()
        .args(["serve", "--auth", "none", "--log-level", "info"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis", &format!("redis://127.0.0.1:{}", free_port())])
        .env_remove("NO_COLOR")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn seatboard")
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_log_file_gets_no_escape_codes() {
    let dir = std::env::temp_dir().join(format!("seatboard-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("seatboard.log");
    let file = File::create(&path).expect("log file");
    let child = serve_logging_to(Stdio::from(file), &[]);
    let text = wait_for(T, || {
        let t = std::fs::read_to_string(&path).ok()?;
        t.contains("seatboard serving").then_some(t)
    });
    stop(child);
    let _ = std::fs::remove_dir_all(&dir);
    let text = text.expect("the start line in the log file");
    assert!(text.contains("INFO"), "{text}");
    // `--auth none` is announced in the log itself, not before logging starts.
    assert!(
        text.contains("AUTH DISABLED"),
        "no --auth none warning: {text}"
    );
    assert!(
        !text.contains('\x1b'),
        "escape codes in a log file: {text:?}"
    );
}

/// Everything `serve` writes to a pseudo-terminal's slave side until `done` holds.
fn on_a_terminal(env: &[(&str, &str)], done: impl Fn(&str) -> bool) -> String {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the two ints; the name,
    // termios and winsize pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened by openpty and are owned here only.
    let (master, slave) = unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let child = serve_logging_to(Stdio::from(slave), env);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut master = master;
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let text = wait_for(T, || {
        let t = String::from_utf8_lossy(&seen.lock().unwrap()).to_string();
        done(&t).then_some(t)
    });
    stop(child);
    text.expect("log output on the terminal")
}

#[test]
fn a_terminal_gets_colour_unless_no_color_is_set() {
    let coloured = on_a_terminal(&[], |t| t.contains("seatboard serving"));
    assert!(coloured.contains("\x1b["), "{coloured:?}");
    let plain = on_a_terminal(&[("NO_COLOR", "1")], |t| t.contains("seatboard serving"));
    assert!(!plain.contains('\x1b'), "NO_COLOR set: {plain:?}");
}
