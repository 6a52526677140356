//! The embedded in-process bus of `demo`: the simulator publishes into it the way
//! the selection API publishes into Redis (a state table plus a channel).

use super::source::{Source, SourceEvent};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type StateTable = Arc<Mutex<HashMap<String, BTreeMap<u32, Vec<u8>>>>>;

/// The publishing side, handed to the simulator.
#[derive(Clone)]
pub struct BusPublisher {
    tx: Sender<(String, Vec<u8>)>,
    state: StateTable,
}

impl BusPublisher {
    /// Writes the state table, then publishes: the order `seatboard publish` uses.
    pub fn publish(&self, course: &str, section: u32, payload: Vec<u8>) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(course.to_owned())
            .or_default()
            .insert(section, payload.clone());
        let _ = self.tx.send((course.to_owned(), payload));
    }
}

/// The subscribing side, owned by the ingest thread.
pub struct Bus {
    rx: Receiver<(String, Vec<u8>)>,
    state: StateTable,
    subscribed: HashSet<String>,
    firehose: bool,
}

/// A connected publisher/subscriber pair.
pub fn bus() -> (BusPublisher, Bus) {
    let (tx, rx) = unbounded();
    let state: StateTable = Arc::default();
    (
        BusPublisher {
            tx,
            state: Arc::clone(&state),
        },
        Bus {
            rx,
            state,
            subscribed: HashSet::new(),
            firehose: false,
        },
    )
}

impl Source for Bus {
    fn poll(&mut self, timeout: Duration) -> Option<SourceEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let (course, payload) = self.rx.recv_deadline(deadline).ok()?;
            // Like Redis, only what is subscribed is delivered.
            if self.firehose || self.subscribed.contains(&course) {
                return Some(SourceEvent::Message { course, payload });
            }
        }
    }

    fn subscribe(&mut self, course: &str) {
        self.subscribed.insert(course.to_owned());
    }

    fn unsubscribe(&mut self, course: &str) {
        self.subscribed.remove(course);
    }

    fn set_firehose(&mut self, on: bool) {
        self.firehose = on;
    }

    fn load_state(&mut self, course: &str) -> Option<Vec<Vec<u8>>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            state
                .get(course)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default(),
        )
    }

    fn known_courses(&mut self) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.keys().cloned().collect()
    }

    fn connected(&self) -> bool {
        true
    }
}
