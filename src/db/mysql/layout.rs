//! The shard layout: the one K every replica works under, and the fleet
//! that owns the database (controller migration 0002).

use chrono::{DateTime, Utc};

use super::{MysqlStore, db};
use crate::db::{DbError, Layout, ShardLayout};

// === impl MysqlStore ===

impl Layout for MysqlStore {
    // INSERT IGNORE for ON CONFLICT DO NOTHING; the read after it is a
    // statement of its own, which under READ COMMITTED sees a row another
    // replica committed meanwhile.
    async fn agree_layout(
        &self,
        shard_count: u32,
        fleet: &str,
        replica: &str,
    ) -> Result<ShardLayout, DbError> {
        sqlx::query(
            "INSERT IGNORE INTO shard_layout (only_row, shard_count, set_by, fleet) \
             VALUES (true, ?, ?, ?)",
        )
        .bind(shard_count as i32)
        .bind(replica)
        .bind(fleet)
        .execute(&self.primary)
        .await
        .map_err(db("record the shard layout"))?;
        // Recorded by a version without fleets: the first replica to see it
        // takes it for its fleet, one statement, so of two fleets starting
        // at once only one does (the other's matches no row).
        let adopted = sqlx::query(
            "UPDATE shard_layout SET fleet = ?, set_by = ?, set_at = UTC_TIMESTAMP(6) \
             WHERE fleet IS NULL",
        )
        .bind(fleet)
        .bind(replica)
        .execute(&self.primary)
        .await
        .map_err(db("record the fleet in the shard layout"))?
        .rows_affected()
            == 1;
        let row: Option<(i32, String, DateTime<Utc>, Option<String>)> =
            sqlx::query_as("SELECT shard_count, set_by, set_at, fleet FROM shard_layout")
                .fetch_optional(&self.primary)
                .await
                .map_err(db("read the shard layout"))?;
        match row {
            Some((count, set_by, set_at, Some(owner))) => Ok(ShardLayout {
                shard_count: count.max(0) as u32,
                fleet: owner,
                set_by,
                set_at,
                adopted,
            }),
            _ => Err(DbError::Config {
                setting: "--shards",
                message: "no shard layout recorded and none could be: is shard_layout writable?"
                    .into(),
            }),
        }
    }
}
