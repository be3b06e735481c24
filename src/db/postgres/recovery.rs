//! Getting work back: the cleanser's pass over stuck and finished state
//! rows, the fence raised when a shard changes hands (recovering the old
//! holder's claims), and the release of a replica's claims at shutdown.

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::recovery::shard_token;
use crate::db::{CleanseReport, DbError, Recovery};

impl Recovery for PgStore {
    async fn cleanse(
        &self,
        stuck_for: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<CleanseReport, DbError> {
        let recovered: Vec<(i64,)> = sqlx::query_as(
            "WITH stuck AS (
                 UPDATE auto_approve_state
                    SET status = 'RETRY_WAITING', next_retry_time = $2, modified_at = now(),
                        retry_count = retry_count + 1, last_reason = 'recovered: claim was stuck'
                  WHERE status = 'IN_PROGRESS' AND modified_at < now() - make_interval(secs => $1)
                 RETURNING request_id, holder
             ), memo AS (
                 INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $2, 'autoapproval-cleanser',
                        'auto-approval was interrupted on ' || holder || '; retrying'
                   FROM stuck WHERE $3
             )
             SELECT request_id FROM stuck ORDER BY request_id",
        )
        .bind(stuck_for.as_secs_f64())
        .bind(now)
        .bind(!self.shadow)
        .fetch_all(&self.primary)
        .await
        .map_err(db("cleanse stuck claims"))?;
        let deleted = sqlx::query(self.sql(FINISHED))
            .execute(&self.primary)
            .await
            .map_err(db("cleanse finished rows"))?;
        Ok(CleanseReport {
            recovered: recovered.into_iter().map(|(id,)| id).collect(),
            deleted: deleted.rows_affected(),
        })
    }

    async fn forget_closed(&self, request_id: i64) -> Result<bool, DbError> {
        let done = sqlx::query(self.sql(FORGET_CLOSED))
            .bind(request_id)
            .execute(&self.primary)
            .await
            .map_err(db("forget closed request"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_all(
        &self,
        holder: &str,
        tokens: &[i64],
        running: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<i64>, DbError> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "UPDATE auto_approve_state
                SET status = 'RETRY_WAITING', next_retry_time = $3, modified_at = now()
              WHERE status = 'IN_PROGRESS' AND holder = $1 AND fencing_token = ANY($2)
                AND request_id <> ALL($4)
             RETURNING request_id",
        )
        .bind(holder)
        .bind(tokens)
        .bind(now)
        .bind(running)
        .fetch_all(&self.primary)
        .await
        .map_err(db("release held claims"))?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    shard_token!("$1", "$2");

    async fn fence_shard(
        &self,
        shard_count: u32,
        shard: u32,
        token: i64,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<i64>>, DbError> {
        let mut tx = self.begin("fence shard").await?;
        // The row lock waits for claims that share-locked the old token;
        // the recovery below is a new statement, so it sees their rows.
        let raised: Option<(i64,)> = sqlx::query_as(
            "INSERT INTO shard_fence (shard_count, shard, token, holder, fenced_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (shard_count, shard) DO UPDATE
                SET token = EXCLUDED.token, holder = EXCLUDED.holder, fenced_at = EXCLUDED.fenced_at
              WHERE shard_fence.token < EXCLUDED.token
             RETURNING token",
        )
        .bind(shard_count as i32)
        .bind(shard as i32)
        .bind(token)
        .bind(holder)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("fence shard: raise token"))?;
        if raised.is_none() {
            return Ok(None);
        }
        let recovered: Vec<(i64,)> = sqlx::query_as(
            "WITH orphaned AS (
                 UPDATE auto_approve_state
                    SET status = 'RETRY_WAITING', next_retry_time = $5, modified_at = now(),
                        retry_count = retry_count + 1,
                        last_reason = 'recovered: shard ' || $2 || ' moved to ' || $4
                  WHERE status = 'IN_PROGRESS' AND request_id % $1 = $2
                    AND fencing_token > 0 AND fencing_token < $3
                 RETURNING request_id, holder
             ), memo AS (
                 INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $5, 'autoapproval-cleanser',
                        'auto-approval was interrupted on ' || holder || '; retrying'
                   FROM orphaned WHERE $6
             )
             SELECT request_id FROM orphaned ORDER BY request_id",
        )
        .bind(i64::from(shard_count))
        .bind(i64::from(shard))
        .bind(token)
        .bind(holder)
        .bind(now)
        .bind(!self.shadow)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("fence shard: recover orphaned claims"))?;
        tx.commit().await.map_err(db("fence shard: commit"))?;
        Ok(Some(recovered.into_iter().map(|(id,)| id).collect()))
    }
}

// The state rows whose request is no longer open.
const FINISHED: &str = "DELETE FROM auto_approve_state s
              WHERE NOT EXISTS (SELECT 1 FROM autoapproval_request r
                                 WHERE r.id = s.request_id AND r.status IN ({OPEN}))";

// A waiting request's row, once the request is no longer open.
const FORGET_CLOSED: &str = "DELETE FROM auto_approve_state s
              WHERE s.request_id = $1 AND s.status = 'RETRY_WAITING'
                AND NOT EXISTS (SELECT 1 FROM autoapproval_request r
                                 WHERE r.id = s.request_id AND r.status IN ({OPEN}))";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[FINISHED, FORGET_CLOSED];
