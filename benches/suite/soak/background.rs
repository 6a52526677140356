//! What runs all through the soak (sampler, storm, admin, churner), and the
//! events on their schedule, each followed by the convergence check.

use super::clients::{admin, churner};
use super::events::{run_event, schedule};
use super::sampler::sampler;
use super::storm::{storm_thread, Ask};
use super::{redis_pid, Store, CONVERGE_MAX, STUCK};
use crate::children::Fleet;
use crate::measure::progress;
use crate::node::ServeNode;
use crate::storm_pub::Sink;
use crate::Opts;
use loadgen::Command;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// What runs all through the soak: the sampler, the storm, the admin and
/// the in-process churner.
pub(super) struct Background {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) t0: Instant,
    pub(super) others: Arc<Mutex<Vec<(String, u32)>>>,
    pub(super) samples: std::thread::JoinHandle<Vec<Value>>,
    pub(super) pub_tx: mpsc::Sender<Ask>,
    pub(super) pub_thread: std::thread::JoinHandle<u64>,
    pub(super) admins: std::thread::JoinHandle<u64>,
    pub(super) churned: std::thread::JoinHandle<u64>,
}

/// What the background threads counted, once stopped.
pub(super) struct Finished {
    pub(super) published: u64,
    pub(super) samples: Vec<Value>,
    pub(super) admin_sessions: u64,
    pub(super) churn_in_process: u64,
}

impl Background {
    /// Starts the background threads on `port`; the storm publishes through
    /// `publisher`.
    pub(super) fn start(
        o: &Opts,
        publisher: Box<dyn Sink>,
        hubs: &[ServeNode],
        store: &Store,
        port: u16,
        courses: &[String],
    ) -> Background {
        let total_s = o.minutes * 60.0;
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let others = Arc::new(Mutex::new(redis_pid(store)));
        let samples = sampler(
            hubs.iter().map(|h| (h.port, h.pid_cell())).collect(),
            Arc::clone(&others),
            Arc::clone(&stop),
            t0,
        );
        let cycle = Duration::from_secs_f64((total_s / 4.0).min(120.0));
        let (pub_tx, pub_rx) = mpsc::channel();
        let pub_thread = storm_thread(publisher, o.rate, o.skew, o.sections, cycle, pub_rx);
        let admins = admin(
            port,
            Duration::from_secs_f64((total_s / 8.0).min(60.0)),
            Arc::clone(&stop),
        );
        let churned = churner(
            port,
            courses[..courses.len().min(50)].to_vec(),
            Arc::clone(&stop),
        );
        Background {
            stop,
            t0,
            others,
            samples,
            pub_tx,
            pub_thread,
            admins,
            churned,
        }
    }

    /// Stops the threads and collects their counts.
    pub(super) fn finish(self) -> Finished {
        self.stop.store(true, Relaxed);
        let _ = self.pub_tx.send(Ask::Stop);
        let published = self.pub_thread.join().unwrap_or(0);
        let samples = self.samples.join().unwrap_or_default();
        let admin_sessions = self.admins.join().unwrap_or(0);
        let churn_in_process = self.churned.join().unwrap_or(0);
        Finished {
            published,
            samples,
            admin_sessions,
            churn_in_process,
        }
    }
}

/// Where the steady viewers connect, what they watch and how many are open.
pub(super) struct Viewers<'a> {
    pub(super) port: u16,
    pub(super) courses: &'a [String],
    pub(super) open: u64,
}

/// The events on their schedule, each followed by the check that every
/// steady viewer's board converges; returns each event's JSON.
pub(super) fn run_schedule(
    o: &Opts,
    bg: &Background,
    f: &mut Fleet,
    hubs: &mut [ServeNode],
    store: &mut Store,
    v: &Viewers,
    stuck: &mut Vec<TcpStream>,
) -> Vec<Value> {
    let (t0, courses) = (bg.t0, v.courses);
    let freeze = Duration::from_secs(if o.minutes >= 5.0 { 15 } else { 10 });
    let mut events = Vec::new();
    for (at, kind) in schedule(o.minutes * 60.0, o.cluster) {
        while t0.elapsed().as_secs_f64() < at {
            std::thread::sleep(Duration::from_millis(200));
        }
        progress(
            o,
            format!(
                "[soak] {:.0}s {}: open {}",
                t0.elapsed().as_secs_f64(),
                kind.name(),
                f.sum(|c| c.open)
            ),
        );
        let started = t0.elapsed().as_secs_f64();
        let (over, notes) = run_event(kind, hubs, store, &courses[0], freeze);
        *bg.others.lock().unwrap_or_else(|e| e.into_inner()) = redis_pid(store);
        let (correct, recovered) = converge(f, &bg.pub_tx, over, v.open as usize);
        progress(
            o,
            format!(
                "[soak] {}: final_correct {correct:.4}, recovered_all_ms {recovered:?}",
                kind.name()
            ),
        );
        events.push(
            json!({"kind": kind.name(), "at_s": started.round(), "final_correct": correct,
                           "recovered_all_ms": recovered, "notes": notes}),
        );
        // Slow consumers again (a restarted hub dropped the old ones).
        drop(std::mem::take(stuck));
        *stuck = crate::stuck::open(v.port, STUCK, &courses[..3.min(courses.len())]);
    }
    events
}

/// After an event: pauses the storm, tells the steady viewers the last
/// published state, and waits until every one holds it. (fraction correct,
/// ms from the end of the fault until all held it).
pub(super) fn converge(
    f: &mut Fleet,
    pub_tx: &mpsc::Sender<Ask>,
    over: Instant,
    viewers: usize,
) -> (f64, Option<u64>) {
    let (tx, rx) = mpsc::channel();
    let _ = pub_tx.send(Ask::Pause(tx));
    let versions = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("the publisher paused");
    f.command(Command::Blind);
    f.command(Command::Ref { versions });
    let end = Instant::now() + CONVERGE_MAX;
    let mut recovered = None;
    // The children report every 500 ms: blind 0 twice in a row after the ref.
    let mut clean = 0;
    std::thread::sleep(Duration::from_millis(600));
    let mut next_note = Instant::now();
    while Instant::now() < end {
        let blind = f.sum(|c| c.blind);
        let open = f.sum(|c| c.open);
        if Instant::now() >= next_note {
            next_note += Duration::from_secs(5);
            let c: Vec<String> = [
                "open",
                "connecting",
                "blind",
                "refused",
                "failed",
                "reconnects",
            ]
            .iter()
            .map(|k| format!("{k} {}", f.sum_named(k)))
            .collect();
            eprintln!("  .. [soak] converging: {}", c.join(", "));
        }
        if blind == 0 && open as usize >= viewers {
            clean += 1;
            if clean >= 2 {
                recovered = Some(over.elapsed().as_millis() as u64);
                break;
            }
        } else {
            clean = 0;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let blind = f.sum(|c| c.blind) as f64;
    let correct = if recovered.is_some() {
        1.0
    } else {
        1.0 - blind.min(viewers as f64) / viewers.max(1) as f64
    };
    let _ = pub_tx.send(Ask::Resume);
    (correct, recovered)
}
