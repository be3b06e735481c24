//! The shard layout: the one K every replica works under (migration 0012).

use chrono::{DateTime, Utc};

use super::DbError;

/// The number of shards in force, and who recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// K: requests are split into shards by `id % shard_count`.
    pub shard_count: u32,
    /// The replica that recorded it.
    pub set_by: String,
    /// When, in the database's clock.
    pub set_at: DateTime<Utc>,
}

interface! {
    /// Layout: see the methods on [`Database`].
    trait Layout {
        /// Records `shard_count` as K when none is recorded yet (the first
        /// replica to start), and returns the K in force, which the caller
        /// compares with its own.
        fn agree_shard_count(
            &self,
            shard_count: u32,
            replica: &str,
        ) -> Result<ShardLayout, DbError>;
    }
}
