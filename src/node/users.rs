//! Connections per user on a node (the `max-conns-per-user` cap).

use std::collections::HashMap;
use std::sync::Mutex;

/// Stripes of the per-user connection count.
const USER_STRIPES: usize = 64;

/// Connections per user on this node, striped so handshakes rarely contend.
pub struct UserCounts {
    stripes: Vec<Mutex<HashMap<String, u32>>>,
}

impl UserCounts {
    pub(super) fn new() -> Self {
        UserCounts {
            stripes: (0..USER_STRIPES)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn stripe(&self, user: &str) -> &Mutex<HashMap<String, u32>> {
        let h = user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        &self.stripes[(h as usize) % USER_STRIPES]
    }

    /// Takes a slot for `user` unless it already holds `cap`.
    pub fn acquire(&self, user: &str, cap: u32) -> bool {
        let mut m = self.stripe(user).lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(user.to_owned()).or_insert(0);
        if *n >= cap {
            return false;
        }
        *n += 1;
        true
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
