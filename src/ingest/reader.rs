//! The state reader thread: every Redis round trip the ingest thread would
//! otherwise wait on (state hash reads after a subscription is confirmed, the
//! admin firehose's scan, the round-trip probe) runs here, and so does the
//! `/api/courses` refresh (every course with a state hash). Requests that
//! arrive while a pipeline is in flight are gathered into the next one, so
//! seeding N courses takes a few round trips of batches, not N; answers go
//! back to the ingest thread's mailbox.

use super::states::StateStore;
use crate::channels::wake::IngestTx;
use crate::channels::{Discovery, IngestCmd, ReadRequest};
use crate::node::Node;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// State hashes read per pipeline: large enough that a window's opening is a
/// few round trips, small enough that the first answers come back early.
pub const READ_BATCH: usize = 512;

/// How often the round trip to Redis is measured.
pub const PING_EVERY: Duration = Duration::from_secs(1);

/// How often `/api/courses` is rebuilt from the state hashes (the contract's cache bound).
pub const COURSES_EVERY: Duration = Duration::from_secs(10);

/// The requests gathered in one turn.
#[derive(Default)]
struct Turn {
    /// Courses to read, by epoch (never mixed: an answer's epoch is exact).
    reads: BTreeMap<u64, Vec<Arc<str>>>,
    discover: Option<HashSet<Arc<str>>>,
    retry_now: bool,
    stop: bool,
}

impl Turn {
    fn add(&mut self, r: ReadRequest) {
        match r {
            // The first list of an epoch is kept as it came, not copied.
            ReadRequest::States { courses, epoch } => match self.reads.entry(epoch) {
                Entry::Vacant(e) => {
                    e.insert(courses);
                }
                Entry::Occupied(mut e) => e.get_mut().extend(courses),
            },
            ReadRequest::Discover { have } => self.discover = Some(have),
            ReadRequest::Reconnected => self.retry_now = true,
            ReadRequest::Shutdown => self.stop = true,
        }
    }
}

/// Runs the state reader until `Shutdown` or until the ingest thread is gone.
pub fn run<T: StateStore>(
    mut store: T,
    requests: Receiver<ReadRequest>,
    ingest: IngestTx,
    node: Arc<Node>,
) {
    let mut next_ping = Instant::now();
    let mut next_courses = Instant::now();
    // Requests taken while a read went on in steps, for the next turn.
    let mut deferred: Vec<ReadRequest> = Vec::new();
    loop {
        let wait = next_ping
            .min(next_courses)
            .saturating_duration_since(Instant::now());
        let first = if deferred.is_empty() {
            match requests.recv_timeout(wait) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        // Everything that queued while the last pipeline was in flight.
        let mut turn = Turn::default();
        for r in deferred.drain(..).chain(first).chain(requests.try_iter()) {
            turn.add(r);
        }
        if turn.retry_now {
            store.retry_now();
        }
        let mut queued = Queued {
            requests: &requests,
            deferred: &mut deferred,
        };
        if read_all(&mut store, turn.reads, &ingest, &mut queued).is_err() {
            return;
        }
        if let Some(have) = turn.discover {
            if ingest
                .send(IngestCmd::Discovered(discover(&mut store, &have)))
                .is_err()
            {
                return;
            }
        }
        let over = store.take_over_cap();
        if over > 0 {
            node.metrics.reject_n(shards::Reject::TooManySections, over);
        }
        if turn.stop {
            return;
        }
        // After the reads, so neither holds one up.
        if Instant::now() >= next_ping {
            node.metrics.set_redis_rtt(store.ping());
            if let Some(t) = store.take_topology() {
                if ingest.send(IngestCmd::Topology(t)).is_err() {
                    return;
                }
            }
            // While Redis does not answer, the probe is the reconnect: made
            // when the failed connection's backoff says, not every second.
            next_ping = Instant::now() + store.next_ping(PING_EVERY);
            // The answers sent since are freed on the ingest thread, which
            // hands their pages back to this thread's heap: returned to the
            // OS here, once a second.
            crate::allocator::collect(false);
        }
        if Instant::now() >= next_courses {
            match store.scan() {
                Some(courses) => node.set_courses(&courses),
                None => tracing::debug!("course list not refreshed"),
            }
            next_courses = Instant::now() + COURSES_EVERY;
        }
    }
}

/// The requests that come in while a read goes on in steps: more courses
/// of its epoch join it, the rest wait for the next turn.
struct Queued<'a> {
    requests: &'a Receiver<ReadRequest>,
    deferred: &'a mut Vec<ReadRequest>,
}

impl Queued<'_> {
    /// The courses of `epoch` asked since, without waiting (the other
    /// requests are kept for the next turn).
    fn courses_of(&mut self, epoch: u64) -> Vec<Arc<str>> {
        let mut more = Vec::new();
        for r in self.requests.try_iter() {
            match r {
                ReadRequest::States { courses, epoch: e } if e == epoch => more.extend(courses),
                other => self.deferred.push(other),
            }
        }
        more
    }
}

/// Reads the turn's courses, epoch by epoch, at most [`READ_BATCH`] to a
/// pipeline, each course answered as soon as it is read; `Err` once the
/// ingest thread is gone.
fn read_all<T: StateStore>(
    store: &mut T,
    reads: BTreeMap<u64, Vec<Arc<str>>>,
    ingest: &IngestTx,
    queued: &mut Queued<'_>,
) -> Result<(), ()> {
    for (epoch, courses) in reads {
        if courses.len() <= READ_BATCH {
            // The usual turn: its list goes back in the answers, moved.
            answer(store, courses, epoch, ingest, queued)?;
            continue;
        }
        // A longer list is taken from the front, each course moved once.
        let mut rest = courses.into_iter();
        while rest.len() > 0 {
            let batch = rest.by_ref().take(READ_BATCH).collect();
            answer(store, batch, epoch, ingest, queued)?;
        }
    }
    Ok(())
}

/// Reads one batch (one pipeline a step; courses of the same epoch asked
/// meanwhile join the next step) and sends each course back as the ingest
/// thread's `States` command as soon as it is read, those read in the same
/// step together; `Err` once the ingest thread is gone.
fn answer<T: StateStore>(
    store: &mut T,
    batch: Vec<Arc<str>>,
    epoch: u64,
    ingest: &IngestTx,
    queued: &mut Queued<'_>,
) -> Result<(), ()> {
    let mut sent = Ok(());
    store.read_each(
        batch,
        &mut || queued.courses_of(epoch),
        &mut |courses, hashes| {
            let done = IngestCmd::States {
                courses,
                hashes,
                epoch,
            };
            if ingest.send(done).is_err() {
                sent = Err(());
            }
        },
    );
    sent
}

/// Scans for courses with a state hash and reads those not in `have`. A
/// failed read ends the pass with what was read so far: the courses it left
/// are read by the next rescan, so a large keyspace on a slow Redis is taken
/// in pieces rather than all or nothing.
fn discover<T: StateStore>(store: &mut T, have: &HashSet<Arc<str>>) -> Option<Discovery> {
    let courses = store.scan()?;
    let new: Vec<Arc<str>> = courses
        .iter()
        .filter(|c| !have.contains(c.as_str()))
        .map(|c| Arc::from(c.as_str()))
        .collect();
    let mut states = Vec::with_capacity(new.len());
    for batch in new.chunks(READ_BATCH) {
        let Some(hashes) = store.read(batch) else {
            tracing::debug!(
                read = states.len(),
                left = new.len() - states.len(),
                "discovery cut short by a failed read; the rest at the next rescan"
            );
            break;
        };
        states.extend(batch.iter().cloned().zip(hashes));
    }
    Some(Discovery { courses, states })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of `n` courses whose `fail_at`-th read (counted from 0) fails.
    struct Flaky {
        n: usize,
        reads: usize,
        fail_at: usize,
    }

    impl StateStore for Flaky {
        fn read(&mut self, courses: &[Arc<str>]) -> Option<Vec<Vec<Vec<u8>>>> {
            let i = self.reads;
            self.reads += 1;
            (i != self.fail_at).then(|| {
                courses
                    .iter()
                    .map(|c| vec![c.as_bytes().to_vec()])
                    .collect()
            })
        }
        fn scan(&mut self) -> Option<Vec<String>> {
            Some((0..self.n).map(|i| format!("C{i:05}")).collect())
        }
        fn ping(&mut self) -> Vec<super::super::states::RoundTrip> {
            Vec::new()
        }
    }

    #[test]
    fn a_turns_reads_are_answered_in_batches_in_order_each_epoch_apart() {
        let mut store = Flaky {
            n: 0,
            reads: 0,
            fail_at: usize::MAX,
        };
        let names = |from: usize, n: usize| -> Vec<Arc<str>> {
            (from..from + n)
                .map(|i| Arc::from(format!("C{i:05}")))
                .collect()
        };
        // Two requests of epoch 1 (gathered into one list) and one of epoch 0.
        let mut turn = Turn::default();
        turn.add(ReadRequest::States {
            courses: names(0, READ_BATCH + 3),
            epoch: 1,
        });
        turn.add(ReadRequest::States {
            courses: names(READ_BATCH + 3, 2),
            epoch: 1,
        });
        turn.add(ReadRequest::States {
            courses: names(9_000, 1),
            epoch: 0,
        });
        let (tx, rx) = crate::channels::wake::channel().expect("eventfd");
        let (_req_tx, req_rx) = crossbeam_channel::unbounded();
        let mut deferred = Vec::new();
        let mut queued = Queued {
            requests: &req_rx,
            deferred: &mut deferred,
        };
        assert!(read_all(&mut store, turn.reads, &tx, &mut queued).is_ok());
        let answers: Vec<_> = std::iter::from_fn(|| rx.try_recv())
            .map(|cmd| match cmd {
                IngestCmd::States {
                    courses,
                    hashes,
                    epoch,
                } => (epoch, courses, hashes.expect("read")),
                other => panic!("not an answer: {other:?}"),
            })
            .collect();
        let shape: Vec<(u64, usize)> = answers.iter().map(|(e, c, _)| (*e, c.len())).collect();
        assert_eq!(shape, [(0, 1), (1, READ_BATCH), (1, 5)]);
        // Every course once, in the order asked, each with its own hash.
        let read: Vec<Arc<str>> = answers.iter().flat_map(|(_, c, _)| c.clone()).collect();
        let mut want = names(9_000, 1);
        want.extend(names(0, READ_BATCH + 5));
        assert_eq!(read, want);
        for (_, courses, hashes) in &answers {
            for (c, h) in courses.iter().zip(hashes) {
                assert_eq!(h, &[c.as_bytes().to_vec()]);
            }
        }
        assert_eq!(store.reads, 3, "one pipeline per batch");
        // The ingest thread gone: the reader stops.
        drop(rx);
        let mut again = BTreeMap::new();
        again.insert(0, names(0, 1));
        assert!(read_all(&mut store, again, &tx, &mut queued).is_err());
    }

    #[test]
    fn a_failed_read_ends_a_discovery_with_what_was_read() {
        let mut store = Flaky {
            n: 3 * READ_BATCH,
            reads: 0,
            fail_at: 1,
        };
        let d = discover(&mut store, &HashSet::new()).expect("the scan answered");
        assert_eq!(d.courses.len(), 3 * READ_BATCH);
        // The first batch, and nothing past the failed second one.
        assert_eq!(d.states.len(), READ_BATCH);
        assert_eq!(store.reads, 2);
        assert_eq!(&*d.states[0].0, "C00000");
        // The next pass reads only what is not held.
        let have: HashSet<Arc<str>> = d.states.iter().map(|(c, _)| Arc::clone(c)).collect();
        store.fail_at = usize::MAX;
        let d = discover(&mut store, &have).expect("the scan answered");
        assert_eq!(d.states.len(), 2 * READ_BATCH);
        assert_eq!(&*d.states[0].0, &format!("C{READ_BATCH:05}"));
    }
}
