//! Distance between two processes on loopback: a TCP proxy that holds every
//! chunk it reads for a fixed one-way delay (plus optional jitter) before it
//! writes it on, in each direction, without ever serializing chunks behind
//! one another; that forwards half-closes and resets after the delay; and
//! that can turn into a black hole (a frozen or partitioned peer: bytes read
//! and dropped, nothing closed, new connections accepted and never answered).
//!
//! Each proxied connection has four threads: per direction a reader that
//! stamps each chunk with its due time (arrival + delay) and queues it, and a
//! writer that waits for the head chunk's due time and writes it. A chunk is
//! never due before the one read ahead of it in its direction (jitter never
//! reorders bytes). The TCP handshake itself is not delayed: the proxy
//! accepts at once and connects upstream at once; the first bytes each way
//! pay the delay.
//!
//! [`RedisAtDistance`] is a `redis-server` with a proxy in front (the node
//! under test gets the far URI, publishers the near one); a cluster whose
//! nodes announce proxies is in `cluster_util` (`ProxiedCluster`).

use crate::proc::{free_port, RedisServer};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits for its upstream to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Stack of each proxy thread (their read buffers are on the heap).
const THREAD_STACK: usize = 128 * 1024;
/// Largest chunk one read takes.
const CHUNK: usize = 64 * 1024;

/// A latency proxy on a free 127.0.0.1 port in front of one upstream; its
/// threads stop and its sockets close when it is dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    listener: TcpListener,
    acceptor: Option<JoinHandle<()>>,
}

/// What the proxy's threads share.
struct Shared {
    upstream: SocketAddr,
    delay_ns: AtomicU64,
    jitter_ns: AtomicU64,
    blackhole: AtomicBool,
    stop: AtomicBool,
    registry: Mutex<Registry>,
}

/// The live connections, those held unanswered, and every thread started.
#[derive(Default)]
struct Registry {
    links: Vec<Weak<Link>>,
    /// Each held connection, and whether its client is known to have closed it.
    held: Vec<(TcpStream, bool)>,
    threads: Vec<JoinHandle<()>>,
}

/// Direction 0: client to upstream; direction 1: upstream to client.
struct Link {
    ends: [TcpStream; 2],
    lanes: [Lane; 2],
    closed: AtomicBool,
}

/// The chunks of one direction that are read and not yet written.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    ready: Condvar,
}

#[derive(Default)]
struct LaneState {
    items: VecDeque<Item>,
    last_due: Option<Instant>,
}

/// A chunk (or the end of the stream) and when it may leave.
struct Item {
    due: Instant,
    what: What,
}

enum What {
    Data(Vec<u8>),
    /// The sender half-closed: shut down writing on the other side.
    Eof,
    /// A read failed (a reset): close both sides.
    Reset,
}

impl DelayProxy {
    /// Starts a proxy to `upstream` that delays each direction by `one_way`.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> DelayProxy {
        let (listener, addr) = bind_free();
        let shared = Arc::new(Shared {
            upstream,
            delay_ns: AtomicU64::new(nanos(one_way)),
            jitter_ns: AtomicU64::new(0),
            blackhole: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
        });
        let l = listener.try_clone().expect("clone listener");
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("delay-proxy-accept".into())
            .stack_size(THREAD_STACK)
            .spawn(move || accept_loop(l, s))
            .expect("spawn proxy acceptor");
        DelayProxy {
            addr,
            shared,
            listener,
            acceptor: Some(acceptor),
        }
    }

    /// Adds up to `jitter` (uniform) to each chunk's delay; order within a
    /// direction is kept all the same.
    pub fn with_jitter(self, jitter: Duration) -> DelayProxy {
        self.shared.jitter_ns.store(nanos(jitter), SeqCst);
        self
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The one-way delay now in force.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.shared.delay_ns.load(SeqCst))
    }

    /// Changes the one-way delay of chunks read from now on (a chunk never
    /// leaves before one read earlier, so a shorter delay takes over as the
    /// queue drains).
    pub fn set_delay(&self, one_way: Duration) {
        self.shared.delay_ns.store(nanos(one_way), SeqCst);
    }

    /// While on, bytes are read and dropped both ways (queued ones too), no
    /// half-close or reset is passed on (they wait for the hole to close),
    /// and new connections are accepted and never connected upstream; off
    /// again, new bytes flow (those dropped stay lost).
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, SeqCst);
        for link in self.shared.live_links() {
            link.wake();
        }
    }

    /// Connections accepted while blackholed that their client has closed
    /// since (a connect or handshake that gave up waiting): what they sent is
    /// read and dropped, never answered.
    pub fn held_closed(&self) -> usize {
        let mut reg = lock(&self.shared.registry);
        let mut buf = [0u8; 4096];
        for (s, closed) in reg.held.iter_mut().filter(|(_, c)| !*c) {
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        *closed = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // A reset: closed too.
                    Err(_) => {
                        *closed = true;
                        break;
                    }
                }
            }
        }
        reg.held.iter().filter(|(_, c)| *c).count()
    }

    /// Connections proxied now (accepted, connected upstream, not yet closed).
    pub fn connections(&self) -> usize {
        self.shared.live_links().len()
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // On Linux a shutdown listening socket wakes its blocked accept().
        // SAFETY: shutdown(2) on a descriptor this proxy owns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let reg = std::mem::take(&mut *lock(&self.shared.registry));
        for link in reg.links.iter().filter_map(Weak::upgrade) {
            link.close();
        }
        for (s, _) in &reg.held {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in reg.threads {
            let _ = t.join();
        }
    }
}

/// A listener on a free 127.0.0.1 port (see [`free_port`]).
fn bind_free() -> (TcpListener, SocketAddr) {
    for _ in 0..20 {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", free_port())) {
            let addr = l.local_addr().expect("proxy address");
            return (l, addr);
        }
    }
    panic!("no free port for a delay proxy")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn live_links(&self) -> Vec<Arc<Link>> {
        lock(&self.registry)
            .links
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !l.closed.load(SeqCst))
            .collect()
    }

    /// This chunk's delay: the one-way delay plus its share of jitter.
    fn delay_now(&self) -> Duration {
        let jitter = self.jitter_ns.load(SeqCst);
        let extra = if jitter == 0 {
            0
        } else {
            fastrand::u64(0..=jitter)
        };
        Duration::from_nanos(self.delay_ns.load(SeqCst).saturating_add(extra))
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(SeqCst) {
            return;
        }
        let client = match accepted {
            Ok((c, _)) => c,
            // Out of descriptors, or a connection reset before it was
            // accepted: back off a little rather than spin.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        if shared.blackhole.load(SeqCst) {
            // Never answered; read only to see whether the client gave up.
            let _ = client.set_nonblocking(true);
            lock(&shared.registry).held.push((client, false));
            continue;
        }
        match TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) {
            Ok(up) => {
                let _ = up.set_nodelay(true);
                start_link(&shared, client, up);
            }
            // The upstream refuses: so does the proxy (a reset, not a FIN).
            Err(_) => set_linger_zero(&client),
        }
    }
}

/// Starts the four threads of one connection and registers them.
fn start_link(shared: &Arc<Shared>, client: TcpStream, upstream: TcpStream) {
    let link = Arc::new(Link {
        ends: [client, upstream],
        lanes: [Lane::default(), Lane::default()],
        closed: AtomicBool::new(false),
    });
    let mut handles = Vec::with_capacity(4);
    for dir in 0..2 {
        for writer in [false, true] {
            let (l, s) = (link.clone(), shared.clone());
            let h = std::thread::Builder::new()
                .name(format!("delay-proxy-{}", if writer { 'w' } else { 'r' }))
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    if writer {
                        write_loop(&l, dir, &s)
                    } else {
                        read_loop(&l, dir, &s)
                    }
                });
            match h {
                Ok(h) => handles.push(h),
                Err(_) => link.close(),
            }
        }
    }
    let mut reg = lock(&shared.registry);
    reg.links.retain(|w| w.strong_count() > 0);
    reg.threads.retain(|t| !t.is_finished());
    reg.links.push(Arc::downgrade(&link));
    reg.threads.extend(handles);
}

/// Reads direction `dir`'s source and queues each chunk with its due time;
/// never waits for anything but the read itself.
fn read_loop(link: &Link, dir: usize, shared: &Shared) {
    let mut src = &link.ends[dir];
    let mut buf = vec![0u8; CHUNK];
    loop {
        let what = match src.read(&mut buf) {
            Ok(0) => What::Eof,
            Ok(n) => What::Data(buf[..n].to_vec()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => What::Reset,
        };
        let arrived = Instant::now();
        if shared.stop.load(SeqCst) || link.closed.load(SeqCst) {
            return;
        }
        let end = !matches!(what, What::Data(_));
        if end || !shared.blackhole.load(SeqCst) {
            link.lanes[dir].push(arrived + shared.delay_now(), what);
        }
        if end {
            return;
        }
    }
}

/// Writes direction `dir`'s chunks to the other side as each falls due.
fn write_loop(link: &Link, dir: usize, shared: &Shared) {
    let mut dst = &link.ends[1 - dir];
    while let Some(what) = link.next_due(dir, shared) {
        match what {
            What::Data(bytes) => {
                if dst.write_all(&bytes).is_err() {
                    set_linger_zero(&link.ends[dir]);
                    link.close();
                    return;
                }
            }
            What::Eof => {
                let _ = dst.shutdown(Shutdown::Write);
                return;
            }
            What::Reset => {
                set_linger_zero(dst);
                link.close();
                return;
            }
        }
    }
}

impl Lane {
    /// Queues `what` to leave at `due`, or after the last queued item if later.
    fn push(&self, due: Instant, what: What) {
        let mut st = lock(&self.state);
        let due = st.last_due.map_or(due, |last| due.max(last));
        st.last_due = Some(due);
        st.items.push_back(Item { due, what });
        self.ready.notify_one();
    }
}

impl Link {
    /// Waits until direction `dir`'s head item is due and returns it (data
    /// is dropped while the proxy is a black hole); `None` once the proxy
    /// stops or the connection closed.
    fn next_due(&self, dir: usize, shared: &Shared) -> Option<What> {
        let lane = &self.lanes[dir];
        let mut st = lock(&lane.state);
        loop {
            if shared.stop.load(SeqCst) || self.closed.load(SeqCst) {
                return None;
            }
            let black = shared.blackhole.load(SeqCst);
            let now = Instant::now();
            match st.items.front() {
                None => st = lane.ready.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(i) if black && matches!(i.what, What::Data(_)) => {
                    st.items.pop_front();
                }
                Some(_) if black => st = lane.ready.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(i) if i.due > now => {
                    let wait = i.due - now;
                    st = lane
                        .ready
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                Some(_) => return st.items.pop_front().map(|i| i.what),
            }
        }
    }

    /// Wakes both writers (to look at the flags again).
    fn wake(&self) {
        for lane in &self.lanes {
            let _st = lock(&lane.state);
            lane.ready.notify_all();
        }
    }

    /// Closes both sides and stops the connection's threads.
    fn close(&self) {
        self.closed.store(true, SeqCst);
        for s in &self.ends {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.wake();
    }
}

/// Makes the socket's close send a reset rather than a FIN.
pub fn set_linger_zero(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt(2) on a live descriptor with a properly sized linger.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// A `redis-server` on loopback with a [`DelayProxy`] in front: the node
/// under test gets [`RedisAtDistance::far_uri`], publishers and checks the
/// direct [`RedisAtDistance::near_uri`].
pub struct RedisAtDistance {
    /// The server itself (its `port` is the direct one).
    pub redis: RedisServer,
    /// The proxy in front of it.
    pub proxy: DelayProxy,
}

impl RedisAtDistance {
    /// Starts a `redis-server` and a proxy to it with `one_way` delay each way.
    pub fn start(one_way: Duration) -> RedisAtDistance {
        let redis = RedisServer::start();
        let up = SocketAddr::from(([127, 0, 0, 1], redis.port));
        RedisAtDistance {
            proxy: DelayProxy::start(up, one_way),
            redis,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`: Redis at a distance.
    pub fn far_uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.proxy.port())
    }

    /// `redis://127.0.0.1:<redis port>`: Redis on loopback, no delay.
    pub fn near_uri(&self) -> String {
        self.redis.uri()
    }
}

#[cfg(test)]
#[path = "delay_proxy_tests.rs"]
mod tests;
