//! Recovery tracking: after the rehearsal arms it, a viewer that loses its
//! connection is blind until its board holds, for every section, at least
//! the version of the reference that was current when it lost it (after
//! `blind`, until it holds the next reference).

use crate::board::Entry;

/// One simulated browser tab, across its connections.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    /// The courses it watches (indices into the config's courses).
    pub courses: Vec<u32>,
    /// Backoff exponent, as the page's `attempt`.
    pub attempt: u32,
    /// Blind since (Unix ms), after `arm` or `blind`.
    pub blind_since: Option<u64>,
    /// The reference (1-based; 0: none) its board must reach to see again.
    pub need: usize,
    /// Lost a connection since `arm`.
    pub moved: bool,
}

/// Whether `boards` (one per course of `courses`) hold every section of
/// the reference `refs` (per course, per section, the version to reach; 0:
/// nothing to reach) at least at its version.
pub fn holds(refs: &[Vec<u64>], courses: &[u32], boards: &[Vec<Entry>]) -> bool {
    courses.iter().zip(boards).all(|(&c, board)| {
        let want = refs.get(c as usize).map_or(&[][..], Vec::as_slice);
        want.iter().enumerate().all(|(s, &ver)| {
            ver == 0
                || board
                    .binary_search_by_key(&(s as u32), |e| e.0)
                    .is_ok_and(|i| board[i].1 >= ver)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_holds_a_reference_once_every_section_reached_it() {
        // Course 1: section 0 at version 4, section 1 not yet written.
        let refs = vec![vec![9], vec![4, 0]];
        assert!(holds(&refs, &[1], &[vec![(0, 4, 1)]]));
        assert!(holds(&refs, &[1], &[vec![(0, 5, 1), (1, 1, 1)]]));
        assert!(!holds(&refs, &[1], &[vec![(0, 3, 1)]]), "behind");
        assert!(!holds(&refs, &[1], &[vec![(1, 9, 1)]]), "section missing");
        // Two courses: both must hold.
        assert!(!holds(&refs, &[0, 1], &[vec![(0, 8, 0)], vec![(0, 4, 0)]]));
        assert!(holds(&refs, &[0, 1], &[vec![(0, 9, 0)], vec![(0, 4, 0)]]));
        // A course the reference does not know has nothing to reach.
        assert!(holds(&refs, &[7], &[vec![]]));
    }
}
