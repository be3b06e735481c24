//! Getting work back: the cleanser's pass, the fence raised when a shard
//! changes hands, and the release of a replica's claims (store/recovery.rs
//! on PostgreSQL). PostgreSQL updates each set in one statement over a
//! range; here the range is read without locks, then each row found is
//! locked by primary key with its conditions checked again, and written by
//! that key: InnoDB would lock every row the range scan passed.

use chrono::{DateTime, Utc};
use sqlx::MySql;

use super::claims::insert_memo;
use super::{CHUNK, MysqlStore, db, give_up, placeholders};
use crate::db::recovery::shard_token;
use crate::db::{CleanseReport, DbError, Recovery};

type Tx<'a> = sqlx::Transaction<'a, MySql>;

// === impl MysqlStore ===

impl Recovery for MysqlStore {
    async fn cleanse(
        &self,
        stuck_for: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<CleanseReport, DbError> {
        let stuck_us = i64::try_from(stuck_for.as_micros()).unwrap_or(i64::MAX);
        let found = ids(sqlx::query_as(
            "SELECT id FROM auto_approve_state
                  WHERE status = 'IN_PROGRESS'
                    AND modified_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
        )
        .bind(stuck_us)
        .fetch_all(&self.primary)
        .await
        .map_err(db("cleanse: find stuck claims"))?);
        let mut recovered = Vec::new();
        if !found.is_empty() {
            let mut tx = self.begin("cleanse stuck claims").await?;
            let condition = "status = 'IN_PROGRESS' AND modified_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND";
            let locked = lock_by_id(&mut tx, &found, condition, None, &[stuck_us])
                .await
                .map_err(db("cleanse: lock stuck claims"))?;
            recover(
                &mut tx,
                &locked,
                now,
                "recovered: claim was stuck",
                !self.shadow,
                &mut recovered,
            )
            .await
            .map_err(db("cleanse stuck claims"))?;
            tx.commit().await.map_err(db("cleanse: commit"))?;
        }
        let finished = ids(sqlx::query_as(self.sql(FINISHED))
            .fetch_all(&self.primary)
            .await
            .map_err(db("cleanse: find finished rows"))?);
        let mut deleted = 0;
        for chunk in finished.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM auto_approve_state
                  WHERE id IN ({}) AND NOT EXISTS (SELECT 1 FROM autoapproval_request r
                        WHERE r.id = auto_approve_state.request_id AND r.status IN ({{OPEN}}))",
                placeholders(chunk.len())
            );
            let q = bind_all!(sqlx::query(self.render(&sql)), chunk);
            deleted += q
                .execute(&self.primary)
                .await
                .map_err(db("cleanse finished rows"))?
                .rows_affected();
        }
        recovered.sort_unstable();
        Ok(CleanseReport { recovered, deleted })
    }

    // By the unique request_id.
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
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id FROM auto_approve_state
              WHERE status = 'IN_PROGRESS' AND holder = ? AND fencing_token IN ({})",
            placeholders(tokens.len())
        );
        let q = bind_all!(
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(holder),
            tokens
        );
        let found = ids(q
            .fetch_all(&self.primary)
            .await
            .map_err(db("release held claims: find"))?);
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin("release held claims").await?;
        let condition = format!(
            "status = 'IN_PROGRESS' AND holder = ? AND fencing_token IN ({})",
            placeholders(tokens.len())
        );
        let locked = lock_by_id(&mut tx, &found, &condition, Some(holder), tokens)
            .await
            .map_err(db("release held claims: lock"))?;
        // The held claims no chain of ours runs any more: (state id, request id).
        let idle: Vec<(i64, i64)> = locked
            .into_iter()
            .filter(|(_, request_id, _)| !running.contains(request_id))
            .map(|(id, request_id, _)| (id, request_id))
            .collect();
        if idle.is_empty() {
            return give_up(tx, "release held claims", Vec::new()).await;
        }
        for chunk in idle.chunks(CHUNK) {
            let sql = format!(
                "UPDATE auto_approve_state
                    SET status = 'RETRY_WAITING', next_retry_time = ?, modified_at = UTC_TIMESTAMP(6)
                  WHERE id IN ({})",
                placeholders(chunk.len())
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now);
            for (id, _) in chunk {
                q = q.bind(id);
            }
            q.execute(&mut *tx)
                .await
                .map_err(db("release held claims"))?;
        }
        tx.commit()
            .await
            .map_err(db("release held claims: commit"))?;
        Ok(idle.into_iter().map(|(_, request_id)| request_id).collect())
    }

    shard_token!("?", "?");

    async fn fence_shard(
        &self,
        shard_count: u32,
        shard: u32,
        token: i64,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<i64>>, DbError> {
        let mut tx = self.begin("fence shard").await?;
        // The exclusive lock by primary key waits for the claims that
        // share-locked the old token. No upsert: with CLIENT_FOUND_ROWS an
        // ON DUPLICATE KEY UPDATE counts 1 both for an insert and for a row
        // left as it was, so whether the token was raised is read instead.
        for attempt in 0..2 {
            let current: Option<(i64,)> = sqlx::query_as(
                "SELECT token FROM shard_fence WHERE shard_count = ? AND shard = ? FOR UPDATE",
            )
            .bind(shard_count as i32)
            .bind(shard as i32)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("fence shard: lock"))?;
            match current {
                Some((current,)) if current >= token => {
                    return give_up(tx, "fence shard", None).await;
                }
                Some(_) => {
                    sqlx::query(
                        "UPDATE shard_fence SET token = ?, holder = ?, fenced_at = ?
                          WHERE shard_count = ? AND shard = ?",
                    )
                    .bind(token)
                    .bind(holder)
                    .bind(now)
                    .bind(shard_count as i32)
                    .bind(shard as i32)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("fence shard: raise token"))?;
                    break;
                }
                None => {
                    let inserted = sqlx::query(
                        "INSERT IGNORE INTO shard_fence (shard_count, shard, token, holder, fenced_at)
                         VALUES (?, ?, ?, ?, ?)",
                    )
                    .bind(shard_count as i32)
                    .bind(shard as i32)
                    .bind(token)
                    .bind(holder)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("fence shard: first token"))?;
                    if inserted.rows_affected() == 1 {
                        break;
                    }
                    // Another replica inserted it meanwhile: lock and judge it.
                    if attempt == 1 {
                        return give_up(tx, "fence shard", None).await;
                    }
                }
            }
        }
        // A statement of its own after the lock: it sees every claim
        // committed under the old token (READ COMMITTED).
        let found = ids(sqlx::query_as(
            "SELECT id FROM auto_approve_state
                  WHERE status = 'IN_PROGRESS' AND request_id % ? = ?
                    AND fencing_token > 0 AND fencing_token < ?",
        )
        .bind(i64::from(shard_count))
        .bind(i64::from(shard))
        .bind(token)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("fence shard: find orphaned claims"))?);
        let mut recovered = Vec::new();
        if !found.is_empty() {
            let condition = "status = 'IN_PROGRESS' AND fencing_token > 0 AND fencing_token < ?";
            let locked = lock_by_id(&mut tx, &found, condition, None, &[token])
                .await
                .map_err(db("fence shard: lock orphaned claims"))?;
            let reason = format!("recovered: shard {shard} moved to {holder}");
            recover(&mut tx, &locked, now, &reason, !self.shadow, &mut recovered)
                .await
                .map_err(db("fence shard: recover orphaned claims"))?;
        }
        tx.commit().await.map_err(db("fence shard: commit"))?;
        recovered.sort_unstable();
        Ok(Some(recovered))
    }
}

fn ids(rows: Vec<(i64,)>) -> Vec<i64> {
    rows.into_iter().map(|(id,)| id).collect()
}

/// Locks the state rows `ids` by primary key that still meet `condition`
/// (its `?` bound from `holder`, when given, then `values`); their id,
/// request and holder.
async fn lock_by_id(
    tx: &mut Tx<'_>,
    ids: &[i64],
    condition: &str,
    holder: Option<&str>,
    values: &[i64],
) -> Result<Vec<(i64, i64, String)>, sqlx::Error> {
    let mut locked = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            "SELECT id, request_id, holder FROM auto_approve_state
              WHERE id IN ({}) AND {condition} FOR UPDATE",
            placeholders(chunk.len())
        );
        let mut q = bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), chunk);
        if let Some(holder) = holder {
            q = q.bind(holder);
        }
        let q = bind_all!(q, values);
        locked.extend(q.fetch_all(&mut **tx).await?);
    }
    Ok(locked)
}

/// Puts the locked claims back to RETRY_WAITING, due at `now`, one more
/// retry counted, with a memo naming the replica they were interrupted on
/// when `memos` (none in shadow mode).
async fn recover(
    tx: &mut Tx<'_>,
    locked: &[(i64, i64, String)],
    now: DateTime<Utc>,
    reason: &str,
    memos: bool,
    recovered: &mut Vec<i64>,
) -> Result<(), sqlx::Error> {
    if locked.is_empty() {
        return Ok(());
    }
    for chunk in locked.chunks(CHUNK) {
        let sql = format!(
            "UPDATE auto_approve_state
                SET status = 'RETRY_WAITING', next_retry_time = ?, modified_at = UTC_TIMESTAMP(6),
                    retry_count = retry_count + 1, last_reason = ?
              WHERE id IN ({})",
            placeholders(chunk.len())
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(reason);
        for (id, _, _) in chunk {
            q = q.bind(id);
        }
        q.execute(&mut **tx).await?;
    }
    for (_, request_id, holder) in locked {
        if memos {
            let memo = format!("auto-approval was interrupted on {holder}; retrying");
            insert_memo(tx, *request_id, now, "autoapproval-cleanser", &memo).await?;
        }
        recovered.push(*request_id);
    }
    Ok(())
}

/// The state rows whose request is no longer open.
pub(super) const FINISHED: &str = "SELECT s.id FROM auto_approve_state s
                  WHERE NOT EXISTS (SELECT 1 FROM autoapproval_request r
                                     WHERE r.id = s.request_id AND r.status IN ({OPEN}))";

/// A waiting request's row, once the request is no longer open.
pub(super) const FORGET_CLOSED: &str = "DELETE FROM auto_approve_state
              WHERE request_id = ? AND status = 'RETRY_WAITING'
                AND NOT EXISTS (SELECT 1 FROM autoapproval_request r
                                 WHERE r.id = auto_approve_state.request_id
                                   AND r.status IN ({OPEN}))";
