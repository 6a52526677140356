//! The fleet's storm around its event: published through the shared
//! storm publisher, with the event thread's asks answered, reference boards
//! sent and the end of the recovery found.

use super::event::Ask;
use crate::children::Fleet;
use crate::measure::progress;
use crate::publish::SelectionApi;
use crate::storm_pub::StormPub;
use crate::Opts;
use loadgen::Command;
use serde_json::Value;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Publishes the storm until the event is over and every blind viewer sees
/// again (or `max_wait` after the event), sending reference boards each
/// `ref_every`. Returns (published snapshots, seconds, the load generators'
/// counters when the event began).
#[allow(clippy::too_many_arguments)]
pub(super) fn storm_through(
    o: &Opts,
    p: &mut SelectionApi,
    f: &mut Fleet,
    rx: &mpsc::Receiver<Ask>,
    ack: &mpsc::Sender<()>,
    before_s: f64,
    after_s: f64,
    max_wait: Duration,
    mut start_event: impl FnMut(),
) -> (u64, f64, Value) {
    let mut st = StormLoop::new(StormPub::new(p.courses.len(), o.skew, o.sections, 7));
    f.command(Command::Lat {
        phase: "before".into(),
    });
    loop {
        st.storm.publish(p, o.rate);
        let el = st.t0.elapsed().as_secs_f64();
        let now = Instant::now();
        if !st.started && el >= before_s {
            st.started = true;
            st.mark_at_event = Some(f.mark());
            st.event_at = Some(now);
            start_event();
        }
        st.answer(f, rx, ack, now);
        st.reference(f, p, now);
        st.show_progress(o, f, p, el, now);
        st.check_over(o, f, now, max_wait);
        if let Some(e) = st.end_at {
            if now.duration_since(e).as_secs_f64() >= after_s {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (
        p.published,
        st.t0.elapsed().as_secs_f64(),
        st.mark_at_event.unwrap_or(Value::Null),
    )
}

/// The storm loop's state from one pass to the next.
pub(super) struct StormLoop {
    pub(super) t0: Instant,
    pub(super) storm: StormPub,
    pub(super) started: bool,
    pub(super) done_at: Option<Instant>,
    pub(super) event_at: Option<Instant>,
    pub(super) end_at: Option<Instant>,
    pub(super) paused: bool,
    pub(super) last_closed: (u64, Instant),
    pub(super) send_ref: bool,
    pub(super) next_ref: Instant,
    pub(super) next_progress: Instant,
    pub(super) mark_at_event: Option<Value>,
}

impl StormLoop {
    /// The state as the storm starts.
    fn new(storm: StormPub) -> StormLoop {
        StormLoop {
            t0: Instant::now(),
            storm,
            started: false,
            done_at: None,
            event_at: None,
            end_at: None,
            paused: false,
            last_closed: (0, Instant::now()),
            send_ref: false,
            next_ref: Instant::now(),
            next_progress: Instant::now() + Duration::from_secs(1),
            mark_at_event: None,
        }
    }

    /// Does what the event thread asked.
    fn answer(
        &mut self,
        f: &mut Fleet,
        rx: &mpsc::Receiver<Ask>,
        ack: &mpsc::Sender<()>,
        now: Instant,
    ) {
        while let Ok(a) = rx.try_recv() {
            match a {
                Ask::Cmd(c) => {
                    f.command(c);
                    let _ = ack.send(());
                }
                Ask::Pause => self.paused = true,
                Ask::Resume => {
                    self.paused = false;
                    self.send_ref = true;
                }
                Ask::Done => self.done_at = Some(now),
            }
        }
    }

    /// Sends the load generators the reference board every 500 ms (not
    /// while paused) and right after a resume.
    fn reference(&mut self, f: &mut Fleet, p: &SelectionApi, now: Instant) {
        if (!self.paused && now >= self.next_ref) || self.send_ref {
            self.send_ref = false;
            self.next_ref = now + Duration::from_millis(500);
            f.command(Command::Ref {
                versions: p.versions(),
            });
        }
    }

    /// A progress line each second.
    fn show_progress(&mut self, o: &Opts, f: &mut Fleet, p: &SelectionApi, el: f64, now: Instant) {
        if now >= self.next_progress {
            self.next_progress += Duration::from_secs(1);
            progress(
                o,
                format!(
                    "[fleet] {el:.0}s published {}  open {}  blind {}  recovered {}  refused {} ({} with Retry-After)  closed {}",
                    p.published,
                    f.sum(|c| c.open),
                    f.sum(|c| c.blind),
                    f.sum(|c| c.recovered),
                    f.sum(|c| c.refused),
                    f.sum(|c| c.refused_retry_after),
                    f.sum(|c| c.closed_by_server),
                ),
            );
        }
    }

    /// Once the event is done: the end of the recovery, when it comes.
    fn check_over(&mut self, o: &Opts, f: &mut Fleet, now: Instant, max_wait: Duration) {
        let (Some(d), None) = (self.done_at, self.end_at) else {
            return;
        };
        let ev = self.event_at.unwrap_or(d);
        // Over when every child reports no blind viewer, some recovered,
        // and no connection closed for 2 s (children may report late on a
        // busy machine); and a few seconds of "during" at least, for the
        // survivors' latency.
        let closed = f.sum(|c| c.closed_by_server);
        let quiet = f.progress.iter().all(|p| p.blind == 0) && f.sum(|c| c.recovered) > 0;
        if closed != self.last_closed.0 || !quiet {
            self.last_closed = (closed, now);
        }
        let recovered = quiet
            && now.duration_since(self.last_closed.1) >= Duration::from_secs(2)
            && now.duration_since(ev).as_secs_f64() >= o.min_during_s;
        if recovered || now.duration_since(ev.max(d)) >= max_wait {
            self.end_at = Some(now);
            f.command(Command::Lat {
                phase: "after".into(),
            });
        }
    }
}
