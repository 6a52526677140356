//! A single-threaded wake-up flag: one task waits (polling it), any code on
//! the same thread notifies.

use std::cell::{Cell, RefCell};
use std::task::{Context, Waker};

/// Remembers one notification until the waiter takes it.
#[derive(Default)]
pub struct LocalNotify {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl LocalNotify {
    /// Sets the flag and wakes the waiter, if any.
    pub fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Takes the flag without waiting.
    pub fn take(&self) -> bool {
        self.notified.replace(false)
    }

    /// Registers `cx`'s waker; true if a notification is already pending.
    pub fn poll_take(&self, cx: &mut Context<'_>) -> bool {
        if self.take() {
            return true;
        }
        *self.waker.borrow_mut() = Some(cx.waker().clone());
        false
    }
}
