//! How many shard threads a node runs, within the limit it supports.

/// A `--shards` count outside 1 to [`ShardSet::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("--shards must be between 1 and {}", ShardSet::MAX)]
pub struct OutOfRange;

/// The shard threads of a node. The limit is the ingest's per-course set of
/// watching shards (one bit each in a `u128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSet {
    count: usize,
}

impl ShardSet {
    /// The most shards a node runs.
    pub const MAX: usize = 128;

    /// `--shards N`, or (none given) one shard per usable core, at most [`Self::MAX`].
    pub fn new(requested: Option<usize>) -> Result<Self, OutOfRange> {
        let count = match requested {
            Some(n) => n,
            None => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(Self::MAX),
        };
        if (1..=Self::MAX).contains(&count) {
            Ok(ShardSet { count })
        } else {
            Err(OutOfRange)
        }
    }

    /// The number of shards.
    pub fn len(self) -> usize {
        self.count
    }

    /// Never true: a node runs at least one shard.
    pub fn is_empty(self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::ShardSet;

    #[test]
    fn one_to_128_shards_and_the_default_fits() {
        assert_eq!(ShardSet::new(Some(1)).map(ShardSet::len), Ok(1));
        assert_eq!(ShardSet::new(Some(128)).map(ShardSet::len), Ok(128));
        assert_eq!(ShardSet::new(Some(0)), Err(super::OutOfRange));
        assert_eq!(
            super::OutOfRange.to_string(),
            "--shards must be between 1 and 128"
        );
        assert!(ShardSet::new(Some(129)).is_err());
        let default = ShardSet::new(None).expect("the default is always valid");
        assert!((1..=ShardSet::MAX).contains(&default.len()));
    }
}
