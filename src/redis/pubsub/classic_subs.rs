//! The classic source's subscription bookkeeping, without its socket: the
//! courses wanted, whether the pattern (the admin firehose) is, what one turn
//! writes to the connection, and what Redis confirmed on it. Pure, so the
//! simulator (`sim/`) runs the very rules `serve` does.

use super::source::SourceEvent;
use std::collections::{BTreeSet, HashMap, HashSet};

/// What the live connection asked for and Redis confirmed.
#[derive(Debug, Default)]
struct OnConn {
    /// The connection asked for the pattern subscription.
    pattern: bool,
    /// Redis confirmed it.
    pattern_confirmed: bool,
    /// SUBSCRIBE confirmations still to come, per course: a course counts as
    /// subscribed only once the last one it was sent is confirmed.
    unconfirmed: HashMap<String, u32>,
    /// Courses whose channel is confirmed subscribed.
    confirmed: HashSet<String>,
}

/// One turn's writes, in the order they go out: the pattern first when it
/// is wanted, the per-course channels, and the pattern's removal last (so
/// no publish falls between the two kinds of subscription).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Writes {
    /// PSUBSCRIBE the pattern.
    pub psubscribe: bool,
    /// SUBSCRIBE these courses.
    pub subscribe: Vec<String>,
    /// UNSUBSCRIBE these courses.
    pub unsubscribe: Vec<String>,
    /// PUNSUBSCRIBE the pattern.
    pub punsubscribe: bool,
}

/// The subscriptions a classic source wants and holds.
#[derive(Debug, Default)]
pub struct ClassicSubs {
    /// Per-course subscriptions wanted; always empty while the firehose is on.
    courses: BTreeSet<String>,
    firehose: bool,
    /// Channels to (un)subscribe at the end of this turn.
    to_sub: Vec<String>,
    to_unsub: Vec<String>,
    /// The live connection's side, while there is one.
    conn: Option<OnConn>,
}

impl ClassicSubs {
    /// Whether the pattern is wanted.
    pub fn firehose(&self) -> bool {
        self.firehose
    }

    /// The per-course subscriptions wanted.
    pub fn courses(&self) -> usize {
        self.courses.len()
    }

    /// Whether `course`'s own channel is wanted.
    pub fn wants(&self, course: &str) -> bool {
        self.courses.contains(course)
    }

    /// A fresh connection: every current subscription is written again at
    /// the next [`ClassicSubs::take_writes`].
    pub fn connected(&mut self) {
        self.conn = Some(OnConn::default());
        if self.firehose {
            self.to_unsub.clear();
        } else {
            self.to_sub = self.courses.iter().cloned().collect();
        }
    }

    /// The connection is gone: nothing is confirmed, nothing waits to be written.
    pub fn dropped(&mut self) {
        self.conn = None;
        self.to_sub.clear();
        self.to_unsub.clear();
    }

    /// `course` is wanted (nothing to do while the pattern covers it).
    pub fn subscribe(&mut self, course: &str) {
        if self.firehose || !self.courses.insert(course.to_owned()) {
            return;
        }
        self.to_unsub.retain(|c| c != course);
        self.to_sub.push(course.to_owned());
    }

    /// `course` is no longer wanted.
    pub fn unsubscribe(&mut self, course: &str) {
        if self.courses.remove(course) {
            if let Some(s) = &mut self.conn {
                s.confirmed.remove(course);
            }
            let before = self.to_sub.len();
            self.to_sub.retain(|c| c != course);
            if self.to_sub.len() == before {
                self.to_unsub.push(course.to_owned());
            }
        }
    }

    /// The pattern is wanted (an admin is connected) or no longer.
    pub fn set_firehose(&mut self, on: bool) {
        if on == self.firehose {
            return;
        }
        self.firehose = on;
        if on && !crate::planted::active(crate::planted::Bug::FirehoseKeepsNarrow) {
            // The pattern covers every course: the per-course subscriptions
            // go after the PSUBSCRIBE on the same connection, so nothing falls
            // between. (Confirmed ones stay counted until the pattern is.)
            self.to_sub.clear();
            let courses = std::mem::take(&mut self.courses);
            self.to_unsub.extend(courses);
        }
        // Off: the router subscribes the watched courses again in this turn,
        // and the pattern goes after them (see `take_writes`).
    }

    /// Whether this turn has something to write.
    pub fn due(&self) -> bool {
        let pattern_change = self
            .conn
            .as_ref()
            .is_some_and(|s| s.pattern != self.firehose);
        !self.to_sub.is_empty() || !self.to_unsub.is_empty() || pattern_change
    }

    /// Takes this turn's writes, counted as sent on the live connection
    /// (without one, they are dropped: a new connection writes everything).
    pub fn take_writes(&mut self) -> Writes {
        let to_sub = std::mem::take(&mut self.to_sub);
        let to_unsub = std::mem::take(&mut self.to_unsub);
        let firehose = self.firehose;
        let Some(sub) = &mut self.conn else {
            return Writes::default();
        };
        let mut w = Writes::default();
        if firehose && !sub.pattern {
            w.psubscribe = true;
            sub.pattern = true;
        }
        for c in &to_sub {
            *sub.unconfirmed.entry(c.clone()).or_default() += 1;
        }
        w.subscribe = to_sub;
        w.unsubscribe = to_unsub;
        if !firehose && sub.pattern {
            w.punsubscribe = true;
            sub.pattern = false;
            sub.pattern_confirmed = false;
            // A channel confirmed before the pattern came, and unsubscribed
            // under it, counted only while the pattern covered it: with the
            // pattern gone it is covered no more, even if it is wanted again
            // (its new SUBSCRIBE comes after its UNSUBSCRIBE, and a publish
            // may fall between). Those wanted in this very turn go out before
            // the pattern's removal and stay covered.
            let wanted = &self.courses;
            sub.confirmed.retain(|c| wanted.contains(c));
        }
        w
    }

    /// Redis confirmed the pattern: every course may be read now.
    pub fn pattern_confirmed(&mut self) -> Option<SourceEvent> {
        let sub = self.conn.as_mut().filter(|s| s.pattern)?;
        sub.pattern_confirmed = true;
        // The pattern covers every course: per-course confirmations no longer matter.
        sub.confirmed.clear();
        Some(SourceEvent::Subscribed(None))
    }

    /// Redis confirmed a SUBSCRIBE of `course`: once its last one is, and it
    /// is still wanted, it may be read now.
    pub fn course_confirmed(&mut self, course: &str) -> Option<SourceEvent> {
        let sub = self.conn.as_mut()?;
        let left = sub.unconfirmed.get_mut(course)?;
        *left = left.saturating_sub(1);
        if *left > 0 {
            return None;
        }
        sub.unconfirmed.remove(course);
        if !self.courses.contains(course) {
            return None;
        }
        sub.confirmed.insert(course.to_owned());
        Some(SourceEvent::Subscribed(Some(course.to_owned())))
    }

    /// Whether `course`'s channel, or the pattern, is confirmed on the live connection.
    pub fn subscribed(&self, course: &str) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|s| s.pattern_confirmed || s.confirmed.contains(course))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn courses(names: &[&str]) -> Vec<String> {
        names.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn the_firehose_subscribes_the_pattern_first_and_drops_the_course_channels() {
        let mut s = ClassicSubs::default();
        s.connected();
        s.subscribe("A");
        s.subscribe("B");
        assert_eq!(s.take_writes().subscribe, courses(&["A", "B"]));
        assert!(s.course_confirmed("A").is_some());
        s.set_firehose(true);
        let w = s.take_writes();
        assert!(w.psubscribe && !w.punsubscribe, "{w:?}");
        assert_eq!(w.unsubscribe, courses(&["A", "B"]));
        assert!(w.subscribe.is_empty());
        // A confirmed channel still counts until the pattern is confirmed.
        assert!(s.subscribed("A") && !s.subscribed("C"));
        assert!(matches!(
            s.pattern_confirmed(),
            Some(SourceEvent::Subscribed(None))
        ));
        assert!(s.subscribed("C"));
        // A course watched under the pattern writes nothing.
        s.subscribe("C");
        assert!(!s.due());
    }

    #[test]
    fn off_again_the_course_channels_go_before_the_pattern_leaves() {
        let mut s = ClassicSubs::default();
        s.connected();
        s.set_firehose(true);
        s.take_writes();
        s.set_firehose(false);
        s.subscribe("A");
        let w = s.take_writes();
        assert_eq!(w.subscribe, courses(&["A"]));
        assert!(w.punsubscribe && !w.psubscribe, "{w:?}");
        assert!(!s.subscribed("A"), "the pattern's confirmation is gone");
        assert!(s.course_confirmed("A").is_some());
        assert!(s.subscribed("A"));
    }

    #[test]
    fn a_channel_dropped_under_an_unconfirmed_pattern_waits_for_its_own_confirmation() {
        // Found by the simulator (seed 2001225): the firehose came and went
        // while Redis was slow, before it confirmed the pattern; the course's
        // old confirmation was still counted when it was watched again, its
        // state was read before the new SUBSCRIBE was confirmed, and a publish
        // that fell between its UNSUBSCRIBE and SUBSCRIBE was lost for good.
        let mut s = ClassicSubs::default();
        s.connected();
        s.subscribe("A");
        s.subscribe("B");
        s.take_writes();
        assert!(s.course_confirmed("A").is_some() && s.course_confirmed("B").is_some());
        s.set_firehose(true);
        assert_eq!(s.take_writes().unsubscribe, courses(&["A", "B"]));
        assert!(s.subscribed("A"), "covered: its channel, then the pattern");
        // Off before the pattern is confirmed; B is wanted again in this turn.
        s.set_firehose(false);
        s.subscribe("B");
        let w = s.take_writes();
        assert!(w.punsubscribe && w.subscribe == courses(&["B"]), "{w:?}");
        assert!(
            s.subscribed("B"),
            "B's SUBSCRIBE goes before the pattern leaves"
        );
        assert!(!s.subscribed("A"), "nothing covers A any more");
        // A watched again: read only once its own SUBSCRIBE is confirmed.
        s.subscribe("A");
        assert_eq!(s.take_writes().subscribe, courses(&["A"]));
        assert!(!s.subscribed("A"));
        assert!(s.course_confirmed("A").is_some());
        assert!(s.subscribed("A"));
    }

    #[test]
    fn a_new_connection_writes_what_is_wanted_and_nothing_is_confirmed() {
        let mut s = ClassicSubs::default();
        s.connected();
        s.subscribe("A");
        s.take_writes();
        s.course_confirmed("A");
        s.dropped();
        assert!(!s.subscribed("A"));
        assert_eq!(
            s.take_writes(),
            Writes::default(),
            "nothing without a connection"
        );
        s.connected();
        assert_eq!(s.take_writes().subscribe, courses(&["A"]));
        s.set_firehose(true);
        s.take_writes();
        s.dropped();
        s.connected();
        let w = s.take_writes();
        assert!(
            w.psubscribe && w.subscribe.is_empty() && w.unsubscribe.is_empty(),
            "{w:?}"
        );
    }
}
