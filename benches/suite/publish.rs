//! The bench's selection-API stand-in: writes `HSET <state-prefix>C <section>
//! <json>` + `PUBLISH <channel-prefix>C <json>` pipelined over one plain RESP
//! connection, as `seatboard publish` does, and remembers the last state it
//! published so the runner can check what clients ended up with.
//!
//! Every snapshot carries `seat_info.t`, its publish time in µs since the Unix
//! epoch (and the contract's `ts` in ms), for end-to-end latency.

use crate::loadgen::{digest, now_us, zipf_cdf, zipf_pick};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Publishes snapshots and tracks the final state.
pub struct Publisher {
    port: u16,
    out: TcpStream,
    replies: BufReader<TcpStream>,
    /// Course codes.
    pub courses: Vec<String>,
    sections: u32,
    /// Per course, per section: (version, seats_taken).
    state: Vec<Vec<(u64, u32)>>,
    buf: Vec<u8>,
    pending: usize,
    /// Snapshots published.
    pub published: u64,
}

fn bulk(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(format!("${}\r\n", s.len()).as_bytes());
    buf.extend_from_slice(s);
    buf.extend_from_slice(b"\r\n");
}

const TOTAL: u32 = 60;

impl Publisher {
    /// Connects to Redis on `port`, for `courses` of `sections` sections each.
    pub fn connect(port: u16, courses: Vec<String>, sections: u32) -> Publisher {
        let out = TcpStream::connect(("127.0.0.1", port)).expect("connect redis");
        out.set_nodelay(true).expect("nodelay");
        let replies = BufReader::new(out.try_clone().expect("clone"));
        let state = vec![vec![(0, 0); sections as usize]; courses.len()];
        Publisher {
            port,
            out,
            replies,
            courses,
            sections,
            state,
            buf: Vec::new(),
            pending: 0,
            published: 0,
        }
    }

    /// Queues the next version of one section.
    pub fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        let st = &mut self.state[course][section as usize];
        st.0 += 1;
        st.1 = (st.1 + 1 + (st.0 as u32 % 3)) % (TOTAL + 1);
        let (version, taken) = *st;
        let name = &self.courses[course];
        let json = format!(
            "{{\"course\":\"{name}\",\"section\":{section},\"total_seats\":{TOTAL},\"seats_taken\":{taken},\"seat_info\":{{\"room\":\"R{section}\",\"t\":{t_us}}},\"version\":{version},\"ts\":{}}}",
            t_us / 1000
        );
        let key = format!("seatstate:{name}");
        let chan = format!("seats:{name}");
        self.buf.extend_from_slice(b"*4\r\n");
        bulk(&mut self.buf, b"HSET");
        bulk(&mut self.buf, key.as_bytes());
        bulk(&mut self.buf, section.to_string().as_bytes());
        bulk(&mut self.buf, json.as_bytes());
        self.buf.extend_from_slice(b"*3\r\n");
        bulk(&mut self.buf, b"PUBLISH");
        bulk(&mut self.buf, chan.as_bytes());
        bulk(&mut self.buf, json.as_bytes());
        self.pending += 2;
        self.published += 1;
    }

    /// Sends what is queued and reads every reply. When Redis goes away (a
    /// restart), connects again and sends the whole batch again (snapshots
    /// are versioned, so a repeat is harmless), for up to 60 s.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let end = Instant::now() + Duration::from_secs(60);
        while let Err(e) = self.try_flush() {
            assert!(Instant::now() < end, "redis gone for 60 s: {e}");
            std::thread::sleep(Duration::from_millis(20));
            if let Ok(out) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = out.set_nodelay(true);
                if let Ok(r) = out.try_clone() {
                    self.replies = BufReader::new(r);
                    self.out = out;
                }
            }
        }
        self.buf.clear();
        self.pending = 0;
    }

    fn try_flush(&mut self) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        self.out.write_all(&self.buf)?;
        let mut line = String::new();
        for _ in 0..self.pending {
            line.clear();
            if self.replies.read_line(&mut line)? == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "redis closed"));
            }
            if line.starts_with("-LOADING") {
                return Err(Error::other("redis loading"));
            }
            assert!(!line.starts_with('-'), "redis error: {line}");
        }
        Ok(())
    }

    /// Per course, per section: the last version published (what a viewer's
    /// board must reach; see `loadgen`'s `ref`).
    pub fn versions(&self) -> Vec<Vec<u64>> {
        self.state
            .iter()
            .map(|c| c.iter().map(|s| s.0).collect())
            .collect()
    }

    /// Publishes version 1.. of every section of every course once.
    pub fn seed(&mut self) {
        for c in 0..self.courses.len() {
            for s in 0..self.sections {
                self.queue(c, s, now_us());
            }
            if c % 50 == 49 {
                self.flush();
            }
        }
        self.flush();
    }

    /// `rate` snapshots/s for `secs`, courses Zipf(`skew`), sections uniform;
    /// `progress` is called about once a second with the count so far.
    pub fn storm(
        &mut self,
        rate: f64,
        secs: f64,
        skew: f64,
        seed: u64,
        mut progress: impl FnMut(u64),
    ) {
        let cdf = zipf_cdf(self.courses.len(), skew);
        let mut rng = fastrand::Rng::with_seed(seed);
        let start = Instant::now();
        let mut sent = 0u64;
        let mut next_progress = start + Duration::from_secs(1);
        loop {
            let el = start.elapsed().as_secs_f64();
            if el >= secs {
                break;
            }
            let due = (rate * el) as u64;
            let t = now_us();
            while sent < due {
                let c = zipf_pick(&cdf, &mut rng);
                let s = rng.u32(0..self.sections);
                self.queue(c, s, t);
                sent += 1;
            }
            self.flush();
            if Instant::now() >= next_progress {
                next_progress += Duration::from_secs(1);
                progress(sent);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The digest a client's merged board of `course` must have.
    pub fn expected(&self, course: usize) -> u64 {
        let board: Vec<(u32, u64, u32)> = self.state[course]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.0 > 0)
            .map(|(i, s)| (i as u32, s.0, s.1))
            .collect();
        digest(&board)
    }
}
