//! What a connection's tasks need of the shard they run on, so the connection
//! code does not depend on the shard's context (its one implementation).

use crate::metrics::ShardMetrics;
use shards::Shard;
use std::cell::RefCell;

/// The shard as a connection's writes see it (the sends and the writer task).
pub trait Host: 'static {
    /// The core.
    fn core(&self) -> &RefCell<Shard>;
    /// This shard's metrics.
    fn metrics(&self) -> &ShardMetrics;
}
