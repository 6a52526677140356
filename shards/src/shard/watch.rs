//! Watching and unwatching courses: the viewer lists, the watch answer, and
//! the full frames owed to viewers whose queue had no room.

use super::{Action, Shard, MAX_COURSES_PER_CONN};
use crate::client_op::OpError;
use crate::conn::{ConnId, Transport};
use crate::course::{Course, Viewer};
use crate::snapshot::valid_course;
use crate::timer::Timer;
use std::cmp::Reverse;
use std::sync::Arc;

impl Shard {
    /// The courses a WebSocket named in its upgrade (`/ws?course=C&course=D`,
    /// section 5), each taken as a `watch` message arriving right after the
    /// `hello`: its watch answer, or the `error` a `watch` of it would get
    /// (a malformed code, one past the cap). Call right after [`Shard::connect`].
    pub fn watch_named(&mut self, id: ConnId, courses: &[String], now_ms: u64) {
        for course in courses {
            let result = if valid_course(course) {
                self.watch(id, course, now_ms)
            } else {
                Err(OpError::BadCourse)
            };
            if let Err(e) = result {
                self.refuse_op(id, e, now_ms);
            }
        }
    }

    /// Whether connection `id` watches a course whose seed has not come yet:
    /// its watch answer is still to be queued (false for a closed connection).
    pub fn awaits_seed(&self, id: ConnId) -> bool {
        self.conn(id).is_some_and(|conn| {
            conn.watched
                .iter()
                .any(|(name, _)| self.courses.get(name).is_some_and(|c| !c.ready()))
        })
    }

    /// A count that moves with each event that can end a connection's wait
    /// for a seed (a seed, an unwatch, a close): a shell holding upgrades
    /// until [`Shard::awaits_seed`] turns false looks again only when it moved.
    pub fn wait_ends(&self) -> u64 {
        self.wait_ends
    }

    /// Adds `id` to a course's viewers (creating the course here, which
    /// declares interest) and answers it once the course is seeded.
    pub(super) fn watch(&mut self, id: ConnId, course: &str, now_ms: u64) -> Result<(), OpError> {
        let conn = self.conn(id).ok_or(OpError::Forbidden)?;
        if conn.watch_pos(course).is_some() {
            // Watching again re-answers with the whole board, nothing else.
            let c = self.courses.get(course).filter(|c| c.ready());
            if let Some(c) = c {
                let name = Arc::clone(&c.name);
                self.answer_watch(id, &name, now_ms);
            }
            return Ok(());
        }
        if conn.watched.len() >= MAX_COURSES_PER_CONN {
            return Err(OpError::TooManyCourses);
        }
        let user = Arc::clone(&conn.user);
        let name: Arc<str> = match self.courses.get_key_value(course) {
            Some((k, _)) => Arc::clone(k),
            None => {
                let name: Arc<str> = course.into();
                let mut c = Course::new(Arc::clone(&name));
                // The node's count of the course, if it has one (its other
                // shards' viewers): this shard's joins from here on are
                // after it. (A leave of this course from here that the count
                // does not include yet is forgotten with the course it left,
                // and is one too many until the next count.)
                c.global = self.kept_count(course);
                self.courses.insert(Arc::clone(&name), c);
                self.actions.push_back(Action::Interest {
                    course: Arc::clone(&name),
                    watching: true,
                });
                name
            }
        };
        let Some(c) = self.courses.get_mut(&name) else {
            return Ok(());
        };
        let pos = c.viewers.len() as u32;
        c.viewers.push(Viewer {
            conn: id,
            owes_full: false,
            shown: Viewer::NO_COUNT,
        });
        let n = c.users.entry(Arc::clone(&user)).or_insert(0);
        *n += 1;
        if *n == 1 {
            c.note_presence(self.presence_batch, 1);
            self.actions.push_back(Action::PresenceJoin {
                course: Arc::clone(&name),
                user,
            });
        }
        let ready = c.ready();
        if !ready {
            c.awaiting_seed.push(id);
        }
        if let Some(conn) = self.conn_mut(id) {
            // Most connections watch one course: room for one, not the
            // default four (an idle connection's bytes).
            conn.watched.reserve_exact(1);
            conn.watched.push((Arc::clone(&name), pos));
        }
        if ready {
            self.answer_watch(id, &name, now_ms);
        }
        Ok(())
    }

    /// The answer to a watch: the whole board and the viewer count. While
    /// a join of this shard's (a user new here, who may be new to the
    /// course or watch it on another shard or node already) is in no count
    /// yet, and with a [`crate::ShardConfig::count_hold_ms`], the count goes
    /// later: read after that join was written ([`Shard::release_held`]),
    /// or the shard's estimate once the wait is over.
    pub(super) fn answer_watch(&mut self, id: ConnId, course: &str, now_ms: u64) {
        let patience = self.cfg.count_hold_ms;
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        let hold = c.unsettled_join;
        let plain = c.full_frame();
        let transport = self.conns[id.idx as usize]
            .as_ref()
            .map_or(Transport::WebSocket { deflate: false }, |conn| {
                conn.transport
            });
        let frame = match transport {
            Transport::Sse => c.full_frame_sse(),
            Transport::WebSocket { deflate: true } => {
                c.full_frame_deflated(&mut self.board_deflater)
            }
            Transport::WebSocket { deflate: false } => plain.clone(),
        };
        let (count, presence) = c.count_with_board();
        // The answer replaces what came before; if the queue has no room for it
        // (a client that asks but never reads), a full frame is owed instead, so
        // what a client sends itself never grows its queue past the bound.
        self.clear_owed(id, course);
        if self.fits(id, frame.len()) {
            self.send_always_as(id, &plain, &frame, Some(&frame));
            let held = hold.filter(|_| patience > 0);
            if held.is_some_and(|batch| self.hold_count(id, course, batch, now_ms + patience)) {
                return;
            }
            // The count goes with the board, past the bound as the board does:
            // a count is sent again only when it changes, so one dropped here
            // would leave the viewer without it.
            self.send_always(id, presence);
            self.set_shown(id, course, count);
        } else {
            self.mark_owed(id, course, now_ms);
        }
    }

    /// Whether `len` more bytes may be queued to `id` (an empty queue takes anything).
    pub(super) fn fits(&self, id: ConnId, len: usize) -> bool {
        self.conn(id).is_some_and(|c| c.queue.fits(len))
    }

    /// A frame for `id` did not fit: it is owed a full frame of `course` at the
    /// next render, and its queue counts as full from `now_ms`.
    fn mark_owed(&mut self, id: ConnId, course: &str, now_ms: u64) {
        let Some(conn) = self.conn_mut(id) else {
            return;
        };
        conn.queue.refused(now_ms);
        self.owe_full(id, course);
    }

    /// `id` is owed a full frame of `course` (with its count) at the next
    /// render that finds room in its queue.
    pub(super) fn owe_full(&mut self, id: ConnId, course: &str) {
        let Some(conn) = self.conn(id) else {
            return;
        };
        let Some(pos) = conn.watch_pos(course) else {
            return;
        };
        let vpos = conn.watched[pos].1 as usize;
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if let Some(v) = c.viewers.get_mut(vpos) {
            if !v.owes_full {
                v.owes_full = true;
                c.owed += 1;
            }
            // It may have missed a count: the heal sends the count it owes.
            v.shown = Viewer::NO_COUNT;
        }
        let name = Arc::clone(&c.name);
        self.schedule(&name);
    }

    /// Holds `id`'s watch answer's count for a count that covers presence
    /// batch `batch`, or until `due_ms`; false (nothing held) if `id` is no
    /// viewer of `course`.
    fn hold_count(&mut self, id: ConnId, course: &str, batch: u64, due_ms: u64) -> bool {
        let Some(v) = self.viewer_mut(id, course) else {
            return false;
        };
        v.shown = Viewer::HELD;
        let Some(c) = self.courses.get_mut(course) else {
            return false;
        };
        c.held.push((id, batch, due_ms));
        if c.held.len() == 1 {
            let name = Arc::clone(&c.name);
            self.queue_hold(due_ms, name);
        }
        true
    }

    /// Queues `course`'s next held count to go at `due_ms`, in order.
    fn queue_hold(&mut self, due_ms: u64, course: Arc<str>) {
        let at = self.count_holds.partition_point(|(due, _)| *due <= due_ms);
        self.count_holds.insert(at, (due_ms, course));
        self.timers
            .set_or_stop(Timer::Hold, self.count_holds.front().map(|(d, _)| *d));
    }

    /// Held counts whose wait is over by `now_ms` go with the shard's
    /// estimate; a course still holding later ones is queued again.
    pub(super) fn holds_due(&mut self, now_ms: u64) {
        if !self.timers.is_expired(Timer::Hold, now_ms) {
            return;
        }
        while let Some(course) = super::pop_due(&mut self.count_holds, now_ms) {
            self.release_held(&course, 0, now_ms);
            let next = self.courses.get(&course).and_then(|c| c.held.first());
            if let Some(&(_, _, due)) = next {
                self.queue_hold(due, course);
            }
        }
        self.timers
            .set_or_stop(Timer::Hold, self.count_holds.front().map(|(d, _)| *d));
    }

    /// Sends the held counts of `course` that are due: those covered by a
    /// count read after this shard's presence batches up to `applied` were
    /// applied, and those whose patience is over by `now_ms`; each gets the
    /// count the shard has now (unless a heal brought it one meanwhile).
    pub(super) fn release_held(&mut self, course: &str, applied: u64, now_ms: u64) {
        let Some(c) = self.courses.get_mut(course) else {
            return;
        };
        if c.held.is_empty() {
            return;
        }
        let mut due = Vec::new();
        c.held.retain(|&(id, batch, at)| {
            let go = batch <= applied || at <= now_ms;
            if go {
                due.push(id);
            }
            !go
        });
        if due.is_empty() {
            return;
        }
        let (count, presence) = c.count_with_board();
        for id in due {
            if self
                .viewer_mut(id, course)
                .is_some_and(|v| v.shown == Viewer::HELD)
            {
                self.send_always(id, presence.clone());
                self.set_shown(id, course, count);
            }
        }
    }

    /// The viewer entry of `id` in `course`, if it watches it.
    fn viewer_mut(&mut self, id: ConnId, course: &str) -> Option<&mut Viewer> {
        let conn = self.conn(id)?;
        let vpos = conn.watched[conn.watch_pos(course)?].1 as usize;
        let v = self.courses.get_mut(course)?.viewers.get_mut(vpos)?;
        (v.conn == id).then_some(v)
    }

    /// Remembers that `id` was sent `count` as `course`'s viewer count.
    fn set_shown(&mut self, id: ConnId, course: &str, count: u64) {
        let Some(vpos) = self
            .conn(id)
            .and_then(|c| c.watch_pos(course).map(|p| c.watched[p].1 as usize))
        else {
            return;
        };
        if let Some(v) = self
            .courses
            .get_mut(course)
            .and_then(|c| c.viewers.get_mut(vpos))
        {
            v.shown = Viewer::count(count);
        }
    }

    /// `id` no longer owes a full frame of `course` (a watch answer replaces it).
    fn clear_owed(&mut self, id: ConnId, course: &str) {
        let Some(pos) = self.conn(id).and_then(|c| c.watch_pos(course)) else {
            return;
        };
        let vpos = self.conn(id).map(|c| c.watched[pos].1 as usize);
        if let (Some(vpos), Some(c)) = (vpos, self.courses.get_mut(course)) {
            if let Some(v) = c.viewers.get_mut(vpos) {
                if v.owes_full {
                    v.owes_full = false;
                    c.owed -= 1;
                }
            }
        }
    }

    /// Removes `id` from a course's viewers; the last one leaving forgets it.
    pub(super) fn unwatch(&mut self, id: ConnId, course: &str) {
        let Some(conn) = self.conn_mut(id) else {
            return;
        };
        let Some(wpos) = conn.watch_pos(course) else {
            return;
        };
        let (name, vpos) = conn.watched.swap_remove(wpos);
        let user = Arc::clone(&conn.user);
        self.wait_ends += 1;
        let Some(c) = self.courses.get_mut(&name) else {
            return;
        };
        let vpos = vpos as usize;
        let removed = c.viewers.swap_remove(vpos);
        if removed.owes_full {
            c.owed -= 1;
        }
        c.awaiting_seed.retain(|w| *w != id);
        // The viewer moved into `vpos` must learn its new index.
        let moved = c.viewers.get(vpos).map(|v| v.conn);
        if let Some(n) = c.users.get_mut(&user) {
            *n -= 1;
            if *n == 0 {
                c.users.remove(&user);
                c.note_presence(self.presence_batch, -1);
                self.actions.push_back(Action::PresenceLeave {
                    course: Arc::clone(&name),
                    user,
                });
            }
        }
        let empty = c.viewers.is_empty();
        if let Some(m) = moved {
            if let Some(mc) = self.conn_mut(m) {
                if let Some(w) = mc.watched.iter_mut().find(|(c, _)| *c == name) {
                    w.1 = vpos as u32;
                }
            }
        }
        if empty {
            if let Some(c) = self.courses.remove(&name) {
                if c.scheduled {
                    // Rare (the last viewer left): keeps one entry per scheduled course.
                    self.scheduled.retain(|Reverse((_, s))| *s != name);
                }
            }
            self.actions.push_back(Action::Interest {
                course: name,
                watching: false,
            });
        }
    }
}
