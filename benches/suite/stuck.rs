//! Stuck clients: WebSocket connections that watch hot courses and then never
//! read, to measure what slow consumers cost the server during a storm.

use socket2::{Domain, Socket, Type};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Opens `n` connections that each watch `courses` and never read again.
pub fn open(port: u16, n: usize, courses: &[String]) -> Vec<TcpStream> {
    let exp = seatboard::clock::unix_ms() / 1000 + 3600;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        // A tiny receive window: the server's sends back up at once.
        let _ = s.set_recv_buffer_size(4096);
        if s.connect(&addr.into()).is_err() {
            continue;
        }
        let mut stream: TcpStream = s.into();
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let token = seatboard::auth::mint(
            crate::server::SECRET.as_bytes(),
            &format!("stuck{i}"),
            shards::Role::Student,
            exp,
        );
        let req = format!(
            "GET /ws HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        );
        if stream.write_all(req.as_bytes()).is_err() {
            continue;
        }
        // Read the 101 head (and whatever follows in the same segment), then never again.
        let mut head = [0u8; 1024];
        match stream.read(&mut head) {
            Ok(n) if head[..n].starts_with(b"HTTP/1.1 101") => {}
            _ => continue,
        }
        for c in courses {
            let op = format!("{{\"op\":\"watch\",\"course\":\"{c}\"}}");
            let frame = shards::ws_codec::client_frame(true, 1, op.as_bytes(), [1, 2, 3, 4]);
            let _ = stream.write_all(&frame);
        }
        out.push(stream);
    }
    out
}
