//! The shard layout: the one K every replica works under (migration 0012),
//! and the fleet that owns the database (controller migration 0003).

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::{DbError, Layout, ShardLayout};

impl Layout for PgStore {
    async fn agree_layout(
        &self,
        shard_count: u32,
        fleet: &str,
        replica: &str,
    ) -> Result<ShardLayout, DbError> {
        // Three tries: when a replica starting at the same moment inserted
        // first, this statement's snapshot may not see its row yet; when
        // one adopted a layout without a fleet first, the next read sees it.
        for _ in 0..3 {
            let row: Option<(i32, String, DateTime<Utc>, Option<String>)> = sqlx::query_as(
                "WITH recorded AS (
                     INSERT INTO shard_layout (shard_count, set_by, fleet) VALUES ($1, $2, $3)
                     ON CONFLICT (only_row) DO NOTHING
                     RETURNING shard_count, set_by, set_at, fleet
                 )
                 SELECT shard_count, set_by, set_at, fleet FROM recorded
                 UNION ALL
                 SELECT shard_count, set_by, set_at, fleet FROM shard_layout
                  WHERE NOT EXISTS (SELECT 1 FROM recorded)",
            )
            .bind(shard_count as i32)
            .bind(replica)
            .bind(fleet)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("record the shard layout"))?;
            let Some((count, set_by, set_at, recorded)) = row else {
                continue;
            };
            if let Some(owner) = recorded {
                return Ok(ShardLayout {
                    shard_count: count.max(0) as u32,
                    fleet: owner,
                    set_by,
                    set_at,
                    adopted: false,
                });
            }
            // Recorded by a version without fleets: the first replica to
            // see it takes it for its fleet, one statement, so of two
            // fleets starting at once only one does.
            let adopted: Option<(i32, String, DateTime<Utc>)> = sqlx::query_as(
                "UPDATE shard_layout SET fleet = $1, set_by = $2, set_at = now()
                  WHERE fleet IS NULL
                 RETURNING shard_count, set_by, set_at",
            )
            .bind(fleet)
            .bind(replica)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("record the fleet in the shard layout"))?;
            if let Some((count, set_by, set_at)) = adopted {
                return Ok(ShardLayout {
                    shard_count: count.max(0) as u32,
                    fleet: fleet.to_owned(),
                    set_by,
                    set_at,
                    adopted: true,
                });
            }
        }
        Err(DbError::Config {
            setting: "--shards",
            message: "no shard layout recorded and none could be: is shard_layout writable?".into(),
        })
    }
}
