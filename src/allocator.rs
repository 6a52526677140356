//! The two calls into mimalloc (the global allocator; the crate links the whole
//! library) that keep idle memory low: purge freed pages at once, and collect.
//! The binary sets the purge at start; a shard's clock, the state reader and
//! the presence worker collect.

use std::ffi::{c_int, c_long};
// Links the library these symbols come from into every binary of the crate.
use mimalloc as _;

extern "C" {
    fn mi_collect(force: bool);
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (bundled by
/// libmimalloc-sys 0.1.49): how long freed pages stay resident before a purge.
const PURGE_DELAY: c_int = 15;
/// Its default in that version (ms).
const PURGE_DELAY_DEFAULT: c_long = 1_000;

/// Makes mimalloc return freed pages at the next purge instead of 1 s later
/// (idle memory per connection about a tenth lower, storm CPU within noise). Does nothing if the option at that index does not hold the known
/// default (another mimalloc build), or if `MIMALLOC_PURGE_DELAY` set it.
pub fn purge_promptly() -> bool {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return false;
    }
    // SAFETY: plain calls into the allocator's option table, which is
    // thread-safe and takes no pointers; the index is checked against the
    // version's default first.
    unsafe {
        if mi_option_get(PURGE_DELAY) != PURGE_DELAY_DEFAULT {
            return false;
        }
        mi_option_set(PURGE_DELAY, 0);
        mi_option_get(PURGE_DELAY) == 0
    }
}

/// Frees what this thread's heap can and returns its free pages to the OS
/// (with `force`, every free page at once).
pub fn collect(force: bool) {
    // SAFETY: a plain call into the allocator, which is thread-safe and takes
    // no pointers.
    unsafe { mi_collect(force) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_index_is_the_bundled_mimallocs_and_it_is_set_to_zero() {
        // Fails if libmimalloc-sys bundles a version whose option table moved.
        assert!(
            purge_promptly(),
            "mi_option_purge_delay not found at index 15"
        );
        // SAFETY: as in purge_promptly.
        assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, 0);
        // Once set, a second call leaves it alone.
        assert!(!purge_promptly());
    }
}
