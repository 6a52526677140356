//! One SO_REUSEPORT listener per shard on the same port, and the check that
//! refuses to share that port with a process that is not seatboard.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::SocketAddr;

/// Pending connections the kernel may queue per listener.
const BACKLOG: i32 = 4096;

/// Kernel send buffer of every accepted connection (the kernel doubles it for
/// its bookkeeping). Pinned rather than autotuned (up to `tcp_wmem`'s 4 MiB),
/// so a client that stops reading costs a bounded amount of kernel memory
/// besides its send queue, and its queue fills — and it is closed 4001 — in
/// seconds.
pub const SEND_BUFFER_BYTES: usize = 64 * 1024;

/// A listening socket. Accepted sockets inherit its `TCP_NODELAY` (every
/// frame is written whole, at once) and its pinned send buffer
/// ([`SEND_BUFFER_BYTES`]), so a new connection costs no `setsockopt` of its own.
fn socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_tcp_nodelay(true)?;
    s.set_send_buffer_size(SEND_BUFFER_BYTES)?;
    defer_accept(&s)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// A connection is handed to a shard once its first bytes (the request head)
/// have arrived, so accepting it and reading its head take one wake-up of the
/// shard rather than two.
fn defer_accept(s: &Socket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let secs = crate::shard::DEFER_ACCEPT.as_secs() as libc::c_int;
    // SAFETY: `s` is an open socket; the option value points to a live c_int
    // of the length passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How long a port held by no process that can be found is tried again (an
/// exited seatboard's listeners, torn down after its exit) before it is refused.
const PORT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);

/// Binds `n` listeners sharing `addr`; fails if a foreign process holds the port.
pub fn bind(addr: SocketAddr, n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    // A plain bind succeeds only if nobody listens there at all. A seatboard
    // that just exited can leave its listeners behind for a moment with no
    // process owning them (io_uring tears its rings down after the exit), and
    // /proc/net/tcp, read in chunks while connections churn, can skip a line:
    // a port whose holder cannot be found is tried again every few tens of
    // milliseconds for up to PORT_PATIENCE before the holder is called unknown.
    let probe = socket(addr, false)?;
    let patience = std::time::Instant::now() + PORT_PATIENCE;
    let mut attempt = 0u64;
    while let Err(e) = probe.bind(&addr.into()) {
        if e.kind() != io::ErrorKind::AddrInUse {
            return Err(e);
        }
        let holders = self::holders(addr.port());
        if holders.is_empty() && std::time::Instant::now() < patience {
            std::thread::sleep(std::time::Duration::from_millis(20 + 4 * attempt.min(20)));
            attempt += 1;
            continue;
        }
        let foreign: Vec<String> = holders
            .iter()
            .filter(|(_, comm)| comm != "seatboard")
            .map(|(pid, comm)| format!("pid {pid} ({comm})"))
            .collect();
        if holders.is_empty() || !foreign.is_empty() {
            let who = if foreign.is_empty() {
                "a process this user cannot identify".to_string()
            } else {
                foreign.join(", ")
            };
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("--listen {addr} is already held by {who}; refusing to share the port"),
            ));
        }
        tracing::warn!(%addr, "another seatboard holds the port: sharing it (rolling restart)");
        break;
    }
    drop(probe);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let s = socket(addr, true)?;
        s.bind(&addr.into())?;
        s.listen(BACKLOG)?;
        out.push(s.into());
    }
    Ok(out)
}

/// Socket inodes listening on `port`, as `/proc/<pid>/fd` links name them.
fn listening(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // One large read per chunk: the fewer chunks, the fewer lines skipped.
        let Ok(text) = read_whole(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    inodes
}

/// Reads a proc table with a large buffer, so the kernel hands it over in few chunks.
fn read_whole(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut out = Vec::with_capacity(1 << 20);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Processes listening on `port`: (pid, command name).
fn holders(port: u16) -> Vec<(u32, String)> {
    let inodes = listening(port);
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|t| t.to_str().map(|t| inodes.iter().any(|i| i == t)))
                .unwrap_or(false)
        });
        if holds {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            out.push((pid, comm.trim().to_owned()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_sockets_inherit_nodelay_and_the_pinned_send_buffer() {
        let listeners = bind("127.0.0.1:0".parse().expect("addr"), 1).expect("bind");
        let listener = &listeners[0];
        listener.set_nonblocking(false).expect("blocking");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        // The accept waits for the first bytes (the deferred accept).
        std::io::Write::write_all(&mut client, b"G").expect("send");
        let (accepted, _) = listener.accept().expect("accept");
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.tcp_nodelay().expect("TCP_NODELAY"));
        // The kernel reports twice what was set (its bookkeeping share).
        assert_eq!(
            sock.send_buffer_size().expect("SO_SNDBUF"),
            2 * SEND_BUFFER_BYTES
        );
    }

    #[test]
    fn a_connection_is_handed_over_once_it_has_sent_something() {
        let listeners = bind("127.0.0.1:0".parse().expect("addr"), 1).expect("bind");
        let listener = &listeners[0];
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        // Connected on the client's side, but the kernel holds it: nothing sent.
        let held = listener.accept().map(drop).map_err(|e| e.kind());
        assert_eq!(held, Err(io::ErrorKind::WouldBlock));
        std::io::Write::write_all(&mut client, b"GET").expect("send");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let accepted = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "never handed over");
                    std::thread::yield_now();
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        let mut buf = [0u8; 3];
        std::io::Read::read_exact(&mut &accepted, &mut buf).expect("read");
        assert_eq!(&buf, b"GET");
    }
}
