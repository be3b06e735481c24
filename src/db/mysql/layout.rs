//! The shard layout: the one K every replica works under.

use chrono::{DateTime, Utc};

use super::{MysqlStore, db};
use crate::db::{DbError, Layout, ShardLayout};

// === impl MysqlStore ===

impl Layout for MysqlStore {
    // INSERT IGNORE for ON CONFLICT DO NOTHING; the read after it is a
    // statement of its own, which under READ COMMITTED sees a row another
    // replica committed meanwhile.
    async fn agree_shard_count(
        &self,
        shard_count: u32,
        replica: &str,
    ) -> Result<ShardLayout, DbError> {
        sqlx::query(
            "INSERT IGNORE INTO shard_layout (only_row, shard_count, set_by) VALUES (true, ?, ?)",
        )
        .bind(shard_count as i32)
        .bind(replica)
        .execute(&self.primary)
        .await
        .map_err(db("record the shard count"))?;
        let row: Option<(i32, String, DateTime<Utc>)> =
            sqlx::query_as("SELECT shard_count, set_by, set_at FROM shard_layout")
                .fetch_optional(&self.primary)
                .await
                .map_err(db("read the shard count"))?;
        match row {
            Some((count, set_by, set_at)) => Ok(ShardLayout {
                shard_count: count.max(0) as u32,
                set_by,
                set_at,
            }),
            None => Err(DbError::Config {
                setting: "--shards",
                message: "no shard count recorded and none could be: is shard_layout writable?"
                    .into(),
            }),
        }
    }
}
