//! The soak's in-process clients: an admin coming and going, viewers
//! churning in and out.

use crate::server::SECRET;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A raw WebSocket upgrade with a token; the stream after the 101 head.
pub(super) fn upgrade(port: u16, path: &str, user: &str, role: shards::Role) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    let exp = seatboard::clock::unix_ms() / 1000 + 3600;
    let token = seatboard::auth::mint(SECRET.as_bytes(), user, role, exp);
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {token}\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 512];
    match s.read(&mut head) {
        Ok(n) if head[..n].starts_with(b"HTTP/1.1 101") => Some(s),
        _ => None,
    }
}

/// An admin that comes and goes: connected (reading the firehose) for half of
/// every `period`, away the other half.
pub(super) fn admin(
    port: u16,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut sessions = 0u64;
        let t0 = Instant::now();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Relaxed) {
            let on =
                (t0.elapsed().as_secs_f64() % period.as_secs_f64()) < period.as_secs_f64() / 2.0;
            if !on {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let Some(mut s) = upgrade(port, "/ws/admin", "soak-admin", shards::Role::Admin) else {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            };
            sessions += 1;
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            while !stop.load(Relaxed)
                && (t0.elapsed().as_secs_f64() % period.as_secs_f64()) < period.as_secs_f64() / 2.0
            {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        }
        sessions
    })
}

/// Viewers that connect, watch one course and leave again: two of three
/// with a close frame, the third by dropping the socket (loadgen's churn
/// children leave the same way without watching, at 100/s).
pub(super) fn churner(
    port: u16,
    courses: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Relaxed) {
            n += 1;
            let course = &courses[(n as usize * 7) % courses.len()];
            let Some(mut s) = upgrade(port, "/ws", &format!("churn{n}"), shards::Role::Student)
            else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let op = format!("{{\"op\":\"watch\",\"course\":\"{course}\"}}");
            let _ = s.write_all(&shards::ws_codec::client_frame(
                true,
                1,
                op.as_bytes(),
                [9, 8, 7, 6],
            ));
            if n % 3 != 0 {
                let _ = s.write_all(&shards::ws_codec::client_frame(
                    true,
                    8,
                    &1000u16.to_be_bytes(),
                    [1, 2, 3, 4],
                ));
            }
            // A few hundred a second: pacing of the load.
            std::thread::sleep(Duration::from_millis(3));
        }
        n
    })
}
