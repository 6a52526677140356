//! The embedded in-process bus of `demo`: the simulator publishes into it the way
//! the selection API publishes into Redis (a state table plus a channel).

use super::states::{RoundTrip, StateStore};
use crate::channels::wake::Wake;
use crate::redis::pubsub::{Source, SourceEvent};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type StateTable = Arc<Mutex<HashMap<String, BTreeMap<u32, Vec<u8>>>>>;

/// The publishing side, handed to the simulator.
#[derive(Clone)]
pub struct BusPublisher {
    tx: Sender<(String, Vec<u8>)>,
    state: StateTable,
    /// Bumped after each publish: the ingest thread sleeps on it.
    wake: Arc<Wake>,
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
        self.wake.wake();
    }
}

/// The bus's state table as the state reader sees it.
pub struct BusStates {
    state: StateTable,
}

impl StateStore for BusStates {
    fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            courses
                .iter()
                .map(|c| {
                    state
                        .get(&**c)
                        .map(|m| m.values().cloned().collect())
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    fn scan(&mut self) -> Option<Vec<String>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut courses: Vec<String> = state.keys().cloned().collect();
        courses.sort();
        Some(courses)
    }

    fn ping(&mut self) -> Vec<RoundTrip> {
        // In-process: no distance to measure.
        vec![(None, Some(0.0))]
    }
}

/// The subscribing side, owned by the ingest thread.
pub struct Bus {
    rx: Receiver<(String, Vec<u8>)>,
    state: StateTable,
    subscribed: HashSet<String>,
    firehose: bool,
    wake: Arc<Wake>,
}

impl Bus {
    /// The state table, for the state reader.
    pub fn states(&self) -> BusStates {
        BusStates {
            state: Arc::clone(&self.state),
        }
    }
}

/// A connected publisher/subscriber pair.
pub fn bus() -> std::io::Result<(BusPublisher, Bus)> {
    let (tx, rx) = unbounded();
    let state: StateTable = Arc::default();
    let wake = Arc::new(Wake::new()?);
    Ok((
        BusPublisher {
            tx,
            state: Arc::clone(&state),
            wake: Arc::clone(&wake),
        },
        Bus {
            rx,
            state,
            subscribed: HashSet::new(),
            firehose: false,
            wake,
        },
    ))
}

impl Source for Bus {
    fn poll(&mut self) -> Option<SourceEvent> {
        loop {
            let (course, payload) = self.rx.try_recv().ok()?;
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

    /// One process, no cluster: nothing moves.
    fn topology(&mut self, _moved: Option<&crate::slots::SlotMap>, _down: &[crate::slots::Addr]) {}

    fn subscribed(&self, _course: &str) -> bool {
        true
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        // Reset before looking: a publish after the look bumps it again.
        self.wake.drain();
        (!self.rx.is_empty()).then_some(Duration::ZERO)
    }

    fn wait_fds(&self, fds: &mut Vec<RawFd>) {
        fds.push(self.wake.fd());
    }

    fn connected(&self) -> bool {
        true
    }
}
