//! The shard layout: the one K every replica works under (migration 0012).

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::{DbError, Layout, ShardLayout};

impl Layout for PgStore {
    async fn agree_shard_count(
        &self,
        shard_count: u32,
        replica: &str,
    ) -> Result<ShardLayout, DbError> {
        // Two tries: when a replica starting at the same moment inserted
        // first, this statement's snapshot may not see its row yet.
        for _ in 0..2 {
            let row: Option<(i32, String, DateTime<Utc>)> = sqlx::query_as(
                "WITH recorded AS (
                     INSERT INTO shard_layout (shard_count, set_by) VALUES ($1, $2)
                     ON CONFLICT (only_row) DO NOTHING
                     RETURNING shard_count, set_by, set_at
                 )
                 SELECT shard_count, set_by, set_at FROM recorded
                 UNION ALL
                 SELECT shard_count, set_by, set_at FROM shard_layout
                  WHERE NOT EXISTS (SELECT 1 FROM recorded)",
            )
            .bind(shard_count as i32)
            .bind(replica)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("record the shard count"))?;
            if let Some((count, set_by, set_at)) = row {
                return Ok(ShardLayout {
                    shard_count: count.max(0) as u32,
                    set_by,
                    set_at,
                });
            }
        }
        Err(DbError::Config {
            setting: "--shards",
            message: "no shard count recorded and none could be: is shard_layout writable?".into(),
        })
    }
}
