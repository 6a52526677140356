//! The port check: seatboard refuses to share its port with a process that is
//! not seatboard (SO_REUSEPORT would otherwise share it silently), and shares
//! it with another seatboard (rolling restart).

use crate::common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn refuses_a_port_held_by_a_foreign_process() {
    // The test process itself is the foreign holder; it also sets SO_REUSEPORT,
    // the case a plain bind would silently share.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_reuse_port(true).unwrap();
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(16).unwrap();
    let port = sock.local_addr().unwrap().as_socket().unwrap().port();
    let out = seatboard_command()
        .args(["demo", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .output()
        .expect("run");
    assert!(!out.status.success(), "started on a foreign port");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen 127.0.0.1:"), "names the flag: {err}");
    assert!(err.contains("already held by"), "{err}");
    assert!(
        err.contains(&std::process::id().to_string()),
        "names the holder: {err}"
    );
}

#[test]
fn shares_a_port_with_another_seatboard() {
    let first = Seatboard::start(&["demo", "--shards", "1"]);
    let mut second = seatboard_command()
        .args([
            "demo",
            "--shards",
            "1",
            "--listen",
            &format!("127.0.0.1:{}", first.port),
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = second.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let shared = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("sharing it (rolling restart)"));
    assert!(
        shared,
        "the second seatboard did not report sharing the port"
    );
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second seatboard exited"
    );
    let _ = second.kill();
    let _ = second.wait();
}

/// `systemctl restart` on the same port: the old process drained and exited,
/// the new one starts at once. The old listeners can outlive the process for
/// a moment (io_uring tears its rings down after the exit) with no owner the
/// check can name; the new node must wait them out, not refuse the port.
#[test]
fn starts_again_on_its_port_right_after_the_old_one_exits() {
    let mut sb = Seatboard::start(&["demo", "--shards", "2", "--drain-ms", "200"]);
    let port = sb.port;
    for round in 0..4 {
        // Open WebSockets, so the drain has connections to close.
        let held: Vec<_> = (0..20)
            .filter_map(|i| ws_connect(port, &format!("/ws?user=r{round}u{i}")).ok())
            .collect();
        assert!(!held.is_empty(), "no WebSocket opened");
        sb.signal(libc::SIGTERM);
        let exit = sb
            .wait_exit(Duration::from_secs(20))
            .expect("drained and exited");
        assert_eq!(exit.code(), Some(0));
        let args = [
            "demo",
            "--shards",
            "2",
            "--drain-ms",
            "200",
            "--log-level",
            "warn",
        ];
        sb = Seatboard::spawn_on(port, &args, &[], None);
        let up = sb.wait_answer("/healthz", Duration::from_secs(20), |r| r.status == 200);
        if let Ok(Some(st)) = sb.child.try_wait() {
            panic!("round {round}: the restarted node exited: {st}");
        }
        assert!(up, "round {round}: not up again on {port}");
        drop(held);
    }
}
