//! Where io_uring is denied (a container runtime's default seccomp profile,
//! `kernel.io_uring_disabled=2`), `--driver auto` serves on epoll, says so once
//! in the log and in `seatboard_driver_shards`; `--driver uring` refuses to
//! start. The denial is a real seccomp filter installed in the child before
//! it runs the binary, failing `io_uring_setup` with the errno a profile gives
//! (Docker's `EPERM`, and `ENOSYS` as from a profile that does not know it).

use crate::common;
use crate::pinning::Logged;
use common::*;
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The audit architecture the filter checks before it reads a call number.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// classic BPF opcodes (linux/filter.h): BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `cmd` runs under a seccomp filter that fails `io_uring_setup` with `errno`
/// and allows every other call.
fn deny_io_uring_setup(cmd: &mut Command, errno: i32) {
    let filter = [
        // seccomp_data.arch
        insn(BPF_LD_W_ABS, 0, 0, 4),
        insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        // seccomp_data.nr
        insn(BPF_LD_W_ABS, 0, 0, 0),
        insn(BPF_JEQ_K, 0, 1, libc::SYS_io_uring_setup as u32),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe calls (two prctl(2)); the program it points at is a
    // Vec moved into the closure, alive until exec.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn auto_serves_on_epoll_where_io_uring_is_denied_and_says_so_once() {
    for errno in [libc::EPERM, libc::ENOSYS] {
        let mut cmd = seatboard_command();
        deny_io_uring_setup(&mut cmd, errno);
        let mut hub = Logged::start(cmd, &["demo", "--driver", "auto"]);
        assert_eq!(
            hub.metric("seatboard_driver_shards{driver=\"epoll\"}"),
            2.0,
            "errno {errno}"
        );
        assert_eq!(
            hub.metric("seatboard_driver_shards{driver=\"io_uring\"}"),
            0.0
        );
        // A board is served on epoll.
        let mut ws = ws_connect(hub.port, "/ws?user=alice").expect("connect");
        send_json(&mut ws, json!({"op":"watch","course":"ART150"}));
        let full = next_of_type(&mut ws, "frame", Duration::from_secs(10)).expect("watch answer");
        assert_eq!(full["full"], true);
        let log = hub.log();
        let fell_back = log
            .iter()
            .filter(|l| l.contains("io_uring unavailable, falling back to epoll"))
            .count();
        assert_eq!(
            fell_back, 1,
            "one line for the node, not one per shard: {log:#?}"
        );
        assert!(
            log.iter().any(|l| l.contains("WARN")
                && l.contains("io_uring unavailable")
                && l.contains(&std::io::Error::from_raw_os_error(errno).to_string())),
            "the line is a warning naming the kernel's answer: {log:#?}"
        );
        assert!(
            log.iter().any(|l| l.contains("shards run on epoll")),
            "{log:#?}"
        );
        // The demo runs without sign-on, and says so as `--auth none` does.
        assert!(
            log.iter()
                .any(|l| l.contains("WARN") && l.contains("AUTH DISABLED")),
            "{log:#?}"
        );
    }
}

#[test]
fn uring_refuses_to_start_where_io_uring_is_denied() {
    let mut cmd = seatboard_command();
    deny_io_uring_setup(&mut cmd, libc::EPERM);
    let mut child = cmd
        .args(["demo", "--driver", "uring", "--shards", "1", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = wait_for(Duration::from_secs(30), || child.try_wait().ok().flatten());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("--driver uring kept running without io_uring");
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("io_uring unavailable"), "{err}");
}
