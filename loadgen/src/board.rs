//! A viewer's board of one course (merged from the watch answer and later
//! frames), its digest, and the Zipf draw of the courses viewers watch.

/// One section as a viewer holds it: (section, version, seats_taken).
pub type Entry = (u32, u64, u32);

/// Unix time in µs.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// FNV-1a over a board, the same digest the runner computes from what it published.
pub fn digest(board: &[Entry]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &(s, v, t) in board {
        for x in [s as u64, v, t as u64] {
            for b in x.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

/// Merges one section into `board` (sorted by section): true when it was
/// new to the board or newer than what it held (a version-less section
/// replaces a version-less one).
pub fn merge(board: &mut Vec<Entry>, section: u32, version: u64, taken: u32) -> bool {
    match board.binary_search_by_key(&section, |e| e.0) {
        Ok(i) => {
            let newer = version > board[i].1 || (version == 0 && board[i].1 == 0);
            if newer {
                board[i] = (section, version, taken);
            }
            newer
        }
        Err(i) => {
            board.insert(i, (section, version, taken));
            true
        }
    }
}

/// A cumulative Zipf table over `n` ranks.
pub fn zipf_cdf(n: usize, skew: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(skew);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// A rank drawn from `cdf`.
pub fn zipf_pick(cdf: &[f64], rng: &mut fastrand::Rng) -> usize {
    let x = rng.f64();
    cdf.partition_point(|&c| c < x).min(cdf.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_the_newest_version_of_each_section_in_order() {
        let mut b = Vec::new();
        assert!(merge(&mut b, 3, 5, 1));
        assert!(merge(&mut b, 1, 2, 1));
        assert!(!merge(&mut b, 3, 4, 9), "older");
        assert!(merge(&mut b, 3, 6, 2));
        assert_eq!(b, vec![(1, 2, 1), (3, 6, 2)]);
        let mut unversioned = vec![(0, 0, 1)];
        assert!(merge(&mut unversioned, 0, 0, 7));
        assert_eq!(unversioned, vec![(0, 0, 7)]);
    }

    #[test]
    fn digest_tells_boards_apart_and_zipf_favours_the_first_ranks() {
        assert_eq!(digest(&[(1, 2, 3)]), digest(&[(1, 2, 3)]));
        assert_ne!(digest(&[(1, 2, 3)]), digest(&[(1, 2, 4)]));
        let cdf = zipf_cdf(10, 1.1);
        assert!((cdf[9] - 1.0).abs() < 1e-12);
        let mut rng = fastrand::Rng::with_seed(3);
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            counts[zipf_pick(&cdf, &mut rng)] += 1;
        }
        assert!(counts[0] > counts[9] * 5, "{counts:?}");
        assert!(zipf_cdf(4, 0.0).windows(2).all(|w| w[1] > w[0]));
    }
}
