//! Which shards watch a course and where its state read stands ([`Watch`]),
//! changed only through the node's [`Tally`], which so keeps the counts the
//! metrics and the loop's timer need (courses watched, those of them not read
//! yet) as boards change, never by a pass over every board.

use super::Load;

/// A course's watchers and its state read: read anywhere, changed only by
/// [`Tally::set_shards`] and [`Tally::set_load`].
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// Shards watching, one bit each.
    shards: u128,
    /// Where its state read stands.
    load: Load,
}

impl Watch {
    /// Shards watching, one bit each.
    pub(super) fn shards(&self) -> u128 {
        self.shards
    }

    /// Where its state read stands.
    pub(super) fn load(&self) -> Load {
        self.load
    }

    /// What this course adds to the tally.
    fn counts(&self) -> Tally {
        let watched = self.shards != 0;
        Tally {
            watched: watched as usize,
            unread: (watched && self.load == Load::Unread) as usize,
        }
    }
}

/// The counts over every board, kept as each one changes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    /// Courses some shard watches (a subscription each while no admin is connected).
    watched: usize,
    /// Of those, courses whose state read is [`Load::Unread`] (failed, or
    /// waiting for its subscription to be confirmed).
    unread: usize,
}

impl Tally {
    /// Courses some shard watches.
    pub(super) fn watched(&self) -> usize {
        self.watched
    }

    /// Whether a watched course's state read is [`Load::Unread`].
    pub(super) fn any_unread(&self) -> bool {
        self.unread != 0
    }

    /// Sets which shards watch `w`'s course.
    pub(super) fn set_shards(&mut self, w: &mut Watch, shards: u128) {
        self.change(w, |w| w.shards = shards);
    }

    /// Sets where `w`'s course's state read stands.
    pub(super) fn set_load(&mut self, w: &mut Watch, load: Load) {
        self.change(w, |w| w.load = load);
    }

    /// `edit` applied to `w`, its course counted as it was taken out and
    /// as it is put back. (A board no shard watches counts nothing, so
    /// dropping one leaves the tally as it is.)
    fn change(&mut self, w: &mut Watch, edit: impl FnOnce(&mut Watch)) {
        let was = w.counts();
        edit(w);
        let now = w.counts();
        self.watched = self.watched - was.watched + now.watched;
        self.unread = self.unread - was.unread + now.unread;
    }

    /// The counts recomputed over `watches` (what the kept tally must equal).
    pub(super) fn recount<'a>(watches: impl Iterator<Item = &'a Watch>) -> Tally {
        watches.fold(Tally::default(), |mut t, w| {
            let c = w.counts();
            t.watched += c.watched;
            t.unread += c.unread;
            t
        })
    }
}
