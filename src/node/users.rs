//! Connections per user on a node (the `max-conns-per-user` cap).

use foldhash::{HashMap, HashMapExt};
use std::sync::{Arc, Mutex};

/// Stripes of the per-user connection count.
const USER_STRIPES: usize = 64;

/// Connections per user on this node, striped so handshakes rarely contend.
/// User ids are the client's choice: the maps hash with foldhash under a
/// random seed per process, so no one can pick ids that collide.
pub struct UserCounts {
    stripes: Vec<Mutex<HashMap<Arc<str>, u32>>>,
}

impl UserCounts {
    pub(super) fn new() -> Self {
        UserCounts {
            stripes: (0..USER_STRIPES)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn stripe(&self, user: &str) -> &Mutex<HashMap<Arc<str>, u32>> {
        let h = user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        &self.stripes[(h as usize) % USER_STRIPES]
    }

    /// Takes a slot for `user` unless it already holds `cap` (the map keeps
    /// a reference to the connection's own id, never a copy).
    pub fn acquire(&self, user: &Arc<str>, cap: u32) -> bool {
        let mut m = self.stripe(user).lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(&**user) {
            Some(n) if *n >= cap => false,
            Some(n) => {
                *n += 1;
                true
            }
            None if cap == 0 => false,
            None => {
                m.insert(Arc::clone(user), 1);
                true
            }
        }
    }

    /// Gives a slot back.
    pub fn release(&self, user: &str) {
        let mut m = self.stripe(user).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                m.remove(user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_per_user_and_slots_come_back() {
        let users = UserCounts::new();
        let [a, b, c]: [Arc<str>; 3] = ["a".into(), "b".into(), "c".into()];
        assert!(users.acquire(&a, 2));
        assert!(users.acquire(&a, 2));
        assert!(!users.acquire(&a, 2), "a third over a cap of 2");
        assert!(users.acquire(&b, 2), "another user has its own count");
        users.release("a");
        assert!(users.acquire(&a, 2), "a slot given back is taken again");
        assert!(!users.acquire(&c, 0), "a cap of 0 takes none");
        for u in ["a", "a", "b"] {
            users.release(u);
        }
        let held: usize = users
            .stripes
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum();
        assert_eq!(held, 0, "a user with no connection is forgotten");
    }
}
