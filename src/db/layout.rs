//! The shard layout: the one K every replica works under (migration 0012),
//! and the one fleet that owns the database (controller migration 0003 on
//! PostgreSQL, 0002 on MySQL).

use chrono::{DateTime, Utc};

use super::DbError;

/// The number of shards in force, the fleet that owns the database, and who
/// recorded them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// K: requests are split into shards by `id % shard_count`.
    pub shard_count: u32,
    /// The fleet whose replicas work on this database (`--fleet`).
    pub fleet: String,
    /// The replica that recorded it (or adopted a layout without a fleet).
    pub set_by: String,
    /// When, in the database's clock.
    pub set_at: DateTime<Utc>,
    /// This call gave a layout an older version recorded (no fleet) to the
    /// caller's fleet.
    pub adopted: bool,
}

interface! {
    /// Layout: see the methods on [`Database`].
    trait Layout {
        /// Records `shard_count` as K and `fleet` as the owner when no
        /// layout is recorded yet (the first replica to start), gives a
        /// layout recorded without a fleet (by 0.2.0) to `fleet`, and
        /// returns the layout in force, which the caller compares with its
        /// own.
        fn agree_layout(
            &self,
            shard_count: u32,
            fleet: &str,
            replica: &str,
        ) -> Result<ShardLayout, DbError>;
    }
}
