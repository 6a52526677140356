//! The soak's storm: bursts and quiet stretches through the shared storm
//! publisher, on one Redis or (through seatboard's own cluster-aware layer)
//! on a cluster; paused while a check reads the truth.

use crate::storm_pub::{Sink, StormPub};
use seatboard::redis::commands::Commands;
use seatboard::redis::{Redis as SbRedis, RedisFlags, RedisMode};
use shards::Snapshot;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The same snapshots written through seatboard's own cluster-aware Redis
/// layer (`seatboard::publisher::write`: hashes, then SPUBLISH), which
/// follows a failover (`MOVED`, a dead primary, a new slot map).
pub(super) struct ClusterPub {
    pub(super) link: Commands,
    pub(super) courses: Vec<String>,
    /// Per course, per section: (version, seats_taken).
    pub(super) state: Vec<Vec<(u64, u32)>>,
    pub(super) batch: Vec<Snapshot>,
    pub(super) published: u64,
}

impl ClusterPub {
    pub(super) fn connect(seeds: &str, courses: Vec<String>, sections: u32) -> ClusterPub {
        let mut flags = RedisFlags::new(seeds);
        flags.redis_mode = RedisMode::Cluster;
        let redis = SbRedis::from_flags(&flags).expect("cluster flags");
        ClusterPub {
            link: Commands::new(&redis, "soak"),
            state: vec![vec![(0, 0); sections as usize]; courses.len()],
            courses,
            batch: Vec::new(),
            published: 0,
        }
    }
}

impl Sink for ClusterPub {
    fn queue(&mut self, course: usize, section: u32, t_us: u64) {
        let st = &mut self.state[course][section as usize];
        st.0 += 1;
        st.1 = (st.1 + 1 + (st.0 as u32 % 3)) % 61;
        let (version, taken) = *st;
        let name = &self.courses[course];
        let json = format!(
            "{{\"course\":\"{name}\",\"section\":{section},\"total_seats\":60,\"seats_taken\":{taken},\"seat_info\":{{\"room\":\"R{section}\",\"t\":{t_us}}},\"version\":{version},\"ts\":{}}}",
            t_us / 1000
        );
        let snap = Snapshot::parse(json.as_bytes(), Some(name)).expect("a valid snapshot");
        self.batch.push(snap);
        self.published += 1;
    }

    fn flush(&mut self) {
        let end = Instant::now() + Duration::from_secs(60);
        for chunk in self.batch.chunks(256) {
            // A repeat after a partial write is harmless: snapshots are versioned.
            while let Err(e) =
                seatboard::publisher::write(&mut self.link, "seats:", "seatstate:", chunk)
            {
                assert!(
                    Instant::now() < end,
                    "the cluster refused writes for 60 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.batch.clear();
    }

    fn versions(&self) -> Vec<Vec<u64>> {
        self.state
            .iter()
            .map(|c| c.iter().map(|s| s.0).collect())
            .collect()
    }

    fn courses(&self) -> usize {
        self.courses.len()
    }

    fn published(&self) -> u64 {
        self.published
    }
}

/// What the main thread asks of the publishing thread.
pub(super) enum Ask {
    /// Stop publishing once the batch in hand is written; answer with the
    /// last published versions.
    Pause(mpsc::Sender<Vec<Vec<u64>>>),
    Resume,
    Stop,
}

/// The storm: `rate` snapshots/s for the first sixth of every `cycle`, a
/// trickle of 20/s the rest of it; paused while a check reads the truth.
pub(super) fn storm_thread(
    mut p: Box<dyn Sink>,
    rate: f64,
    skew: f64,
    sections: u32,
    cycle: Duration,
    rx: mpsc::Receiver<Ask>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut storm = StormPub::new(p.courses(), skew, sections, 11);
        let t0 = Instant::now();
        let mut paused = false;
        loop {
            while let Ok(a) = rx.try_recv() {
                match a {
                    Ask::Pause(tx) => {
                        paused = true;
                        let _ = tx.send(p.versions());
                    }
                    Ask::Resume => paused = false,
                    Ask::Stop => return p.published(),
                }
            }
            let phase = t0.elapsed().as_secs_f64() % cycle.as_secs_f64();
            let r = if phase < cycle.as_secs_f64() / 6.0 {
                rate
            } else {
                20.0
            };
            if paused {
                storm.hold();
            } else {
                storm.publish(p.as_mut(), r);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}
