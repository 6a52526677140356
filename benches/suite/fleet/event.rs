//! The event of a fleet run (`kill`, `rolling`, `redis_restart`) on its own
//! thread, and what it asks of the publishing thread meanwhile.

use super::{now_ms, refused_503, Rig};
use crate::Opts;
use loadgen::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the event thread asks of the publishing thread.
pub(super) enum Ask {
    /// A load-generator command (answered on the ack channel once sent).
    Cmd(Command),
    /// Stop sending reference boards until `Resume` (Redis is down).
    Pause,
    /// Send a reference board after the next successful write.
    Resume,
    /// The event is over.
    Done,
}

/// The event's moments, Unix ms.
#[derive(Default, Debug, Clone)]
pub(super) struct Moments {
    pub(super) start: u64,
    /// Redis answering again (redis_restart).
    pub(super) redis_up: Option<u64>,
    pub(super) end: u64,
    /// The nodes' 503 refusals (accept rate, draining, full) when it began.
    pub(super) node_refused_start: Vec<u64>,
    pub(super) notes: Vec<String>,
}

/// Runs the event on its own thread while this one publishes.
pub(super) fn event_thread(
    event: String,
    mut rig: Rig,
    o: Opts,
    tx: mpsc::Sender<Ask>,
    ack: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<(Rig, Moments)> {
    std::thread::spawn(move || {
        let mut m = Moments::default();
        let ask = |a: Ask| {
            let wait = matches!(a, Ask::Cmd(_));
            let _ = tx.send(a);
            if wait {
                let _ = ack.recv_timeout(Duration::from_secs(10));
            }
        };
        ask(Ask::Cmd(Command::Arm));
        ask(Ask::Cmd(Command::Lat {
            phase: "during".into(),
        }));
        m.node_refused_start = rig.nodes.iter().map(|n| refused_503(n.port)).collect();
        match event.as_str() {
            "kill" => {
                m.start = now_ms();
                rig.nodes[0].signal(libc::SIGKILL);
                rig.nodes[0].reap(Duration::from_secs(5));
                m.notes.push("SIGKILL node1".to_string());
            }
            "rolling" => {
                m.start = now_ms();
                let t0 = Instant::now();
                for i in 0..rig.nodes.len() {
                    let t = Instant::now();
                    rig.nodes[i].signal(libc::SIGTERM);
                    let exited = rig.nodes[i].reap(Duration::from_millis(o.drain_ms + 30_000));
                    let drained = t.elapsed().as_secs_f64();
                    if !exited {
                        rig.nodes[i].signal(libc::SIGKILL);
                        rig.nodes[i].reap(Duration::from_secs(5));
                    }
                    let up = rig.nodes[i].spawn();
                    // Until every HAProxy process's checks saw it up (rise 2 at 1 s).
                    std::thread::sleep(Duration::from_millis(2500));
                    m.notes.push(format!(
                        "node{}: SIGTERM at +{:.1} s, drained and exited in {drained:.1} s (exited by itself: {exited}), {} after {:.1} s",
                        i + 1,
                        (t.duration_since(t0)).as_secs_f64(),
                        if up { "ready again" } else { "NOT READY (did not start)" },
                        t.elapsed().as_secs_f64()
                    ));
                }
            }
            "redis_restart" => {
                let _ = tx.send(Ask::Pause);
                ask(Ask::Cmd(Command::Blind));
                m.start = now_ms();
                rig.redis.restart_saved();
                m.redis_up = Some(now_ms());
                let _ = tx.send(Ask::Resume);
                m.notes.push(format!(
                    "Redis SHUTDOWN SAVE + start on the same port: answering again after {} ms",
                    m.redis_up.unwrap_or(0) - m.start
                ));
            }
            other => panic!("unknown event {other}"),
        }
        m.end = now_ms();
        let _ = tx.send(Ask::Done);
        (rig, m)
    })
}
