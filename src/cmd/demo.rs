//! `seatboard demo`: the hub on the embedded bus, fed by the simulator.

use super::simulator::{SelectionWindow, DEMO_COURSES};
use crate::clock;
use crate::hub;
use crate::ingest::bus::{bus, BusPublisher};
use crate::node::Node;
use crate::presence::memory::MemoryPresence;
use crate::supervisor::{self, Policy};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seat events per second in the demo window.
const DEMO_RATE: f64 = 40.0;

/// Starts the demo hub and its simulator; returns once the hub listens.
pub fn start(node: Arc<Node>) -> std::io::Result<hub::Hub> {
    let names: Vec<String> = DEMO_COURSES.iter().map(|s| s.to_string()).collect();
    node.set_courses(&names);
    let (publisher, source) = bus()?;
    // Seed every section of every course, then some seat events, before the
    // port opens, so the board is whole for the very first viewer and
    // `/api/courses` (read from the state table) lists every course (a loaded
    // box could schedule the simulator thread after the first watch had read
    // an empty state table).
    let mut window = SelectionWindow::new(&names, 1.1, clock::unix_ms());
    for s in window.opening(clock::unix_ms()) {
        publisher.publish(&s.course, s.section, s.to_payload().into_bytes());
    }
    for _ in 0..8 * names.len() {
        let s = window.next(clock::unix_ms());
        publisher.publish(&s.course, s.section, s.to_payload().into_bytes());
    }
    let states = source.states();
    let hub = hub::start(Arc::clone(&node), source, states, MemoryPresence::default())?;
    supervisor::spawn("seatboard-simulator", Policy::FailsNode, move || {
        simulate(publisher, window, &node)
    })?;
    Ok(hub)
}

fn simulate(bus: BusPublisher, mut window: SelectionWindow, node: &Node) {
    let interval = Duration::from_secs_f64(1.0 / DEMO_RATE);
    let mut next = Instant::now();
    while !supervisor::stopping() {
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        let s = window.next(clock::unix_ms());
        node.history.record_demo(&s);
        bus.publish(&s.course, s.section, s.to_payload().into_bytes());
    }
}
