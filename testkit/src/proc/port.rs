//! Ports for the processes a test starts: the one free-port helper, and who
//! listens where (`/proc/net/tcp`).

use std::net::TcpListener;

/// Where [`free_port`] hands out ports: below Linux's ephemeral range
/// (32768-60999), so no test's outgoing connection takes a port as its
/// source while a node restarting on that port is between two binds.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port nobody listens on right now, and one no other caller in this
/// process was given (ports go round [`TEST_PORTS`], from a start that
/// differs between processes).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    if NEXT.load(Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(7919) % span;
        let _ = NEXT.compare_exchange(u32::MAX, seed, Relaxed, Relaxed);
    }
    for _ in 0..span {
        let p = TEST_PORTS.start + (NEXT.fetch_add(1, Relaxed) % span) as u16;
        if !CLUSTER_PORTS.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in {TEST_PORTS:?}")
}

/// Where [`cluster_port`] hands out ports (and [`free_port`] never does): a
/// Redis Cluster node also listens on its port + 10000 for the cluster bus,
/// and 32000-32767 is neither a port [`free_port`] hands out nor one Linux
/// gives an outgoing connection, so nothing takes a bus port between the
/// check and the node's bind.
const CLUSTER_PORTS: std::ops::Range<u16> = 22_000..22_768;

/// A port for a Redis Cluster node: free, and its cluster bus port (+10000)
/// free too, both outside every other caller's range.
pub fn cluster_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(CLUSTER_PORTS.end - CLUSTER_PORTS.start);
    if NEXT.load(Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(7919) % span;
        let _ = NEXT.compare_exchange(u32::MAX, seed, Relaxed, Relaxed);
    }
    for _ in 0..span {
        let p = CLUSTER_PORTS.start + (NEXT.fetch_add(1, Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", p)).is_ok()
            && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        {
            return p;
        }
    }
    panic!("no free cluster port in {CLUSTER_PORTS:?}")
}

/// Whether process `pid` holds the listening TCP socket on 127.0.0.1:`port`
/// (its inode in `/proc/net/tcp` is one of the process's descriptors).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: Vec<String> = loopback_tcp()
        .into_iter()
        .filter(|s| s.local_port == port && s.state == 0x0A) // LISTEN
        .map(|s| format!("socket:[{}]", s.inode))
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|t| inodes.iter().any(|i| t.to_string_lossy() == *i))
    })
}

/// One IPv4 TCP socket on 127.0.0.1, as `/proc/net/tcp` lists it.
pub struct TcpRow {
    /// Its local port.
    pub local_port: u16,
    /// Its peer's port (0 for a listener).
    pub remote_port: u16,
    /// `st`: 0x01 established, 0x0A listen, ...
    pub state: u8,
    /// Bytes the kernel holds to send (`tx_queue`).
    pub tx_queue: u64,
    /// Its inode (what `/proc/<pid>/fd` links name).
    pub inode: String,
}

/// The machine's TCP sockets whose local address is 127.0.0.1 (`/proc/net/tcp`).
pub fn loopback_tcp() -> Vec<TcpRow> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = |addr: &str| {
        let (_, p) = addr.split_once(':')?;
        u16::from_str_radix(p, 16).ok()
    };
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f.get(1)?.starts_with("0100007F:") {
                return None;
            }
            let (tx, _) = f.get(4)?.split_once(':')?;
            Some(TcpRow {
                local_port: port(f.get(1)?)?,
                remote_port: port(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                tx_queue: u64::from_str_radix(tx, 16).ok()?,
                inode: f.get(9)?.to_string(),
            })
        })
        .collect()
}
