//! Ports for the processes a test starts: the one free-port helper, and who
//! listens where (`/proc/net/tcp`).

use std::net::TcpListener;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Where [`free_port`] hands out ports: below Linux's ephemeral range
/// (32768-60999), so no test's outgoing connection takes a port as its
/// source while a node restarting on that port is between two binds.
const TEST_PORTS: Range<u16> = 20_000..32_000;

/// Where [`cluster_port`] hands out ports (and [`free_port`] never does): a
/// Redis Cluster node also listens on its port + 10000 for the cluster bus,
/// and 32000-32767 is neither a port [`free_port`] hands out nor one Linux
/// gives an outgoing connection, so nothing takes a bus port between the
/// check and the node's bind.
const CLUSTER_PORTS: Range<u16> = 22_000..22_768;

/// A window of ports handed out round and round, from a start that differs
/// between processes, so no two callers in this process are given the same
/// port and two processes seldom try the same one first.
struct Window {
    ports: Range<u16>,
    /// The next turn's offset into the window (`u32::MAX`: not started).
    next: AtomicU32,
}

impl Window {
    const fn new(ports: Range<u16>) -> Self {
        Window {
            ports,
            next: AtomicU32::new(u32::MAX),
        }
    }

    /// The next port of the window that `fits`, at most one turn round it.
    fn take(&self, fits: impl Fn(u16) -> bool) -> Option<u16> {
        let span = u32::from(self.ports.end - self.ports.start);
        if self.next.load(Relaxed) == u32::MAX {
            let seed = std::process::id().wrapping_mul(7919) % span;
            let _ = self.next.compare_exchange(u32::MAX, seed, Relaxed, Relaxed);
        }
        (0..span)
            .map(|_| self.ports.start + (self.next.fetch_add(1, Relaxed) % span) as u16)
            .find(|&p| fits(p))
    }
}

/// Whether nothing listens on 127.0.0.1:`port` now.
fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A port nobody listens on right now, and one no other caller in this
/// process was given (ports go round [`TEST_PORTS`], from a start that
/// differs between processes).
pub fn free_port() -> u16 {
    static FREE: Window = Window::new(TEST_PORTS);
    FREE.take(|p| !CLUSTER_PORTS.contains(&p) && bindable(p))
        .unwrap_or_else(|| panic!("no free port in {TEST_PORTS:?}"))
}

/// A port for a Redis Cluster node: free, and its cluster bus port (+10000)
/// free too, both outside every other caller's range.
pub fn cluster_port() -> u16 {
    static CLUSTER: Window = Window::new(CLUSTER_PORTS);
    CLUSTER
        .take(|p| bindable(p) && bindable(p + 10_000))
        .unwrap_or_else(|| panic!("no free cluster port in {CLUSTER_PORTS:?}"))
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

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn a_window_goes_round_its_ports_and_passes_over_those_that_do_not_fit() {
        let w = Window::new(100..104);
        let got: Vec<u16> = (0..6).filter_map(|_| w.take(|p| p != 102)).collect();
        let mut turn = got[..3].to_vec();
        turn.sort();
        assert_eq!(turn, [100, 101, 103], "each fitting port once a turn");
        assert_eq!(got[3..], got[..3], "the next turn in the same order");
        assert_eq!(w.take(|_| false), None, "one turn, then none");
    }
}
