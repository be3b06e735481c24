//! Wakes without LISTEN/NOTIFY: the poller that reads the rows the business
//! tables' triggers append (through the procedures autoapproval_request_changed
//! and autoapproval_econtract_changed, migrations/mysql/controller) and turns
//! them into the `RequestChange`s discovery already understands, and the
//! consumption of those rows by the shard's owner (`apply_wakes`).

//! Where the poller stands is the [`WakeCursor`] (wake_cursor.rs).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::MySqlPool;
use tokio::time::Instant;

use super::{CHUNK, MysqlStore, db, give_up, placeholders};
use crate::db::connect;
use crate::db::{ChangeSource, DbError, RequestChange, RequestChanges, ShardFilter, Wakes};

/// Rows read per statement, by the poller and by `apply_wakes`.
const BATCH: i64 = 1000;
/// A wake row as the poll reads it: id, request, contract, request not to wake.
type PolledRow = (i64, Option<i64>, Option<String>, Option<i64>);

/// The wake poller: yields a `RequestChange::Changed` for each request a
/// trigger appended a row for, every request on a changed e-contract
/// included. It reads every new row, whatever its shard: discovery keeps
/// those of its shards, as it does with PostgreSQL's NOTIFY.
pub(crate) struct MysqlRequestChanges {
    pool: MySqlPool,
    store: MysqlStore,
    interval: Duration,
    next_poll: Instant,
    buffer: VecDeque<RequestChange>,
}

impl MysqlRequestChanges {
    /// Waits for the next change: polls every interval until one comes.
    pub(crate) async fn next(&mut self) -> Result<RequestChange, DbError> {
        loop {
            if let Some(change) = self.buffer.pop_front() {
                return Ok(change);
            }
            tokio::time::sleep_until(self.next_poll).await;
            self.next_poll = Instant::now() + self.interval;
            self.poll().await?;
        }
    }

    /// A change already read, without waiting.
    pub(crate) fn next_buffered(&mut self) -> Option<RequestChange> {
        self.buffer.pop_front()
    }

    /// One read of the rows past the cursor (PRIMARY range, no lock), and
    /// a second at once when e-contract rows were expanded into new ones.
    async fn poll(&mut self) -> Result<(), DbError> {
        for _ in 0..2 {
            let wakes = &self.store.wakes;
            if wakes.state().cursor.is_none() {
                // A fresh poller starts at the oldest row still there:
                // those not consumed yet survive a restart.
                let (oldest,): (Option<i64>,) =
                    sqlx::query_as("SELECT MIN(id) FROM auto_approve_wake")
                        .fetch_one(&self.pool)
                        .await
                        .map_err(db("wake poll: oldest row"))?;
                wakes.state().start(oldest, Instant::now());
            }
            let from = wakes.state().read_from();
            let rows: Vec<PolledRow> = sqlx::query_as(
                "SELECT id, request_id, contract_ref, skip_request FROM auto_approve_wake
                  WHERE id > ? ORDER BY id LIMIT ?",
            )
            .bind(from)
            .bind(BATCH)
            .fetch_all(&self.pool)
            .await
            .map_err(db("wake poll"))?;
            let rows = rows.into_iter().map(|row| (row.0, row)).collect();
            let fresh = wakes.state().take(rows, &wakes.seen_upto, Instant::now());
            let mut changed = BTreeSet::new();
            let mut expanded = false;
            for (id, request_id, contract_ref, skip) in fresh {
                match (request_id, contract_ref) {
                    (Some(request_id), _) => {
                        changed.insert(request_id);
                    }
                    (None, Some(contract_ref)) => {
                        expanded |= self.store.expand_contract(id, &contract_ref, skip).await?;
                    }
                    (None, None) => {}
                }
            }
            self.buffer
                .extend(changed.into_iter().map(RequestChange::Changed));
            if !expanded {
                break;
            }
        }
        Ok(())
    }
}

// === impl MysqlStore ===

impl Wakes for MysqlStore {
    // The rows are found and locked by the unique request_id, then written
    // by the same key (no RETURNING in MySQL 8).
    async fn wake(&self, request_ids: &[i64], now: DateTime<Utc>) -> Result<Vec<i64>, DbError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin("wake waiting requests").await?;
        let mut woken = Vec::new();
        for chunk in request_ids.chunks(CHUNK) {
            let select = format!(
                "SELECT request_id FROM auto_approve_state
                  WHERE request_id IN ({})
                    AND ((status = 'RETRY_WAITING' AND next_retry_time > ?) OR status = 'IN_PROGRESS')
                  FOR UPDATE",
                placeholders(chunk.len())
            );
            let query = bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(select)), chunk);
            let rows: Vec<(i64,)> = query
                .bind(now)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("wake waiting requests"))?;
            let found: Vec<i64> = rows.into_iter().map(|(id,)| id).collect();
            if found.is_empty() {
                continue;
            }
            let update = format!(
                "UPDATE auto_approve_state
                    SET next_retry_time = IF(status = 'RETRY_WAITING', ?, next_retry_time),
                        woken_at = IF(status = 'IN_PROGRESS', ?, woken_at)
                  WHERE request_id IN ({})",
                placeholders(found.len())
            );
            let query = bind_all!(
                sqlx::query(sqlx::AssertSqlSafe(update)).bind(now).bind(now),
                &found
            );
            query
                .execute(&mut *tx)
                .await
                .map_err(db("wake waiting requests"))?;
            woken.extend(found);
        }
        if woken.is_empty() {
            return give_up(tx, "wake waiting requests", woken).await;
        }
        tx.commit().await.map_err(db("wake waiting requests"))?;
        Ok(woken)
    }

    // Only rows this process's poller has seen are deleted (module doc).
    async fn apply_wakes(
        &self,
        shards: Option<&ShardFilter>,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<Vec<i64>, DbError> {
        let upto = self.wakes.seen_upto();
        self.expand_contracts(upto).await?;
        let shard_sql = match shards {
            Some(f) => format!(
                " AND w.request_id % ? IN ({})",
                placeholders(f.shards.len().max(1))
            ),
            None => String::new(),
        };
        // A range of the primary key, read without locks; what it found is
        // then locked and written by key. FORCE INDEX: MariaDB otherwise
        // reads the (request_id, id) index and sorts (EXPLAIN, issue 19).
        let select = format!(
            "SELECT w.id, w.request_id, s.status, w.new_request
               FROM auto_approve_wake w FORCE INDEX (PRIMARY)
               LEFT JOIN auto_approve_state s ON s.request_id = w.request_id
              WHERE w.id > ? AND w.request_id IS NOT NULL{shard_sql}
              ORDER BY w.id LIMIT ?"
        );
        let mut made_due = Vec::new();
        let mut after = 0;
        loop {
            let mut query = sqlx::query_as(sqlx::AssertSqlSafe(select.clone())).bind(after);
            if let Some(f) = shards {
                query = query.bind(f.shard_count.max(1));
                if f.shards.is_empty() {
                    query = query.bind(-1_i64);
                }
                for shard in &f.shards {
                    query = query.bind(shard);
                }
            }
            let rows: Vec<(i64, i64, Option<String>, bool)> = query
                .bind(BATCH)
                .fetch_all(&self.primary)
                .await
                .map_err(db("apply wakes: read"))?;
            let Some(&(last, ..)) = rows.last() else {
                break;
            };
            after = last;
            let full = rows.len() as i64 >= BATCH;
            // A new request's INSERT row is consumed without effect: it
            // neither makes a retry due nor revives an exhausted request.
            // Every other row counts, however old: the claim consumed the
            // rows committed before it, so a row here was committed after
            // the claim, and its change may have been made before the
            // claim yet read by no attempt (an older woken_at is when the
            // business statement ran, not when it committed).
            // Made due whether seen or not; deleted only once seen.
            let consumed: Vec<i64> = rows
                .iter()
                .filter(|(id, _, status, new_request)| {
                    *id <= upto && (status.as_deref() != Some("IN_PROGRESS") || *new_request)
                })
                .map(|(id, ..)| *id)
                .collect();
            let waiting: BTreeSet<i64> = rows
                .iter()
                .filter(|(_, _, status, new_request)| {
                    status.as_deref() == Some("RETRY_WAITING") && !*new_request
                })
                .map(|(_, request_id, ..)| *request_id)
                .collect();
            made_due.extend(
                self.consume_wakes(&consumed, &waiting, now, retry_limit)
                    .await?,
            );
            if !full {
                break;
            }
        }
        Ok(made_due)
    }

    // Polls the wake table every interval, on a connection of its own.
    async fn request_changes(&self) -> Result<RequestChanges, DbError> {
        let own = self.dedicated(1);
        let pool = own.primary.clone();
        // Reached once, so a database that is down is an error here, as
        // PostgreSQL's LISTEN is.
        connect::ping(&pool)
            .await
            .map_err(db("connect wake poller"))?;
        // From now on, apply_wakes consumes only what this poller saw.
        let state = self.wakes.state();
        let upto = state.cursor.map_or(0, |_| state.read_from());
        self.wakes.seen_upto.store(upto, Ordering::Release);
        drop(state);
        Ok(RequestChanges::new(ChangeSource::Mysql(
            MysqlRequestChanges {
                pool,
                store: self.clone(),
                interval: self.poll_interval,
                next_poll: Instant::now(),
                buffer: VecDeque::new(),
            },
        )))
    }
}

impl MysqlStore {
    /// One transaction: the waiting requests among `waiting` made due (by
    /// unique key) and the wake rows `consumed` deleted (by primary key).
    async fn consume_wakes(
        &self,
        consumed: &[i64],
        waiting: &BTreeSet<i64>,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<Vec<i64>, DbError> {
        let mut tx = self.begin("apply wakes").await?;
        let mut due = Vec::new();
        if !waiting.is_empty() {
            let select = format!(
                "SELECT request_id FROM auto_approve_state
                  WHERE request_id IN ({}) AND status = 'RETRY_WAITING'
                    AND (next_retry_time > ? OR retry_count >= ?)
                  FOR UPDATE",
                placeholders(waiting.len())
            );
            let query = bind_all!(sqlx::query_as(sqlx::AssertSqlSafe(select)), waiting);
            let rows: Vec<(i64,)> = query
                .bind(now)
                .bind(retry_limit)
                .fetch_all(&mut *tx)
                .await
                .map_err(db("apply wakes: lock waiting"))?;
            due = rows.into_iter().map(|(id,)| id).collect();
        }
        if !due.is_empty() {
            // MySQL assigns left to right, each seeing the ones before it
            // (PostgreSQL: all see the old row): transient_streak first,
            // while retry_count is still the old one. LEAST is NULL when
            // any argument is (PostgreSQL's ignores NULLs).
            let update = format!(
                "UPDATE auto_approve_state
                    SET transient_streak = IF(retry_count >= ?, 0, transient_streak),
                        retry_count = IF(retry_count >= ?, 0, retry_count),
                        next_retry_time = COALESCE(LEAST(next_retry_time, ?), ?)
                  WHERE request_id IN ({})",
                placeholders(due.len())
            );
            let query = bind_all!(
                sqlx::query(sqlx::AssertSqlSafe(update))
                    .bind(retry_limit)
                    .bind(retry_limit)
                    .bind(now)
                    .bind(now),
                &due
            );
            query
                .execute(&mut *tx)
                .await
                .map_err(db("apply wakes: make due"))?;
        }
        if !consumed.is_empty() {
            delete_wakes(&mut tx, consumed)
                .await
                .map_err(db("apply wakes: delete"))?;
        }
        tx.commit().await.map_err(db("apply wakes: commit"))?;
        Ok(due)
    }

    /// Expands the e-contract rows at or below `upto` (module doc of the
    /// migration: the poller usually has already).
    async fn expand_contracts(&self, upto: i64) -> Result<(), DbError> {
        let rows: Vec<(i64, Option<String>, Option<i64>)> = sqlx::query_as(
            "SELECT id, contract_ref, skip_request FROM auto_approve_wake
              WHERE request_id IS NULL AND id <= ? ORDER BY id LIMIT ?",
        )
        .bind(upto)
        .bind(BATCH)
        .fetch_all(&self.primary)
        .await
        .map_err(db("apply wakes: e-contract rows"))?;
        for (id, contract_ref, skip) in rows {
            match contract_ref {
                Some(contract_ref) => {
                    self.expand_contract(id, &contract_ref, skip).await?;
                }
                None => {
                    let mut tx = self.begin("apply wakes: empty row").await?;
                    delete_wakes(&mut tx, &[id])
                        .await
                        .map_err(db("apply wakes: empty row"))?;
                    tx.commit().await.map_err(db("apply wakes: empty row"))?;
                }
            }
        }
        Ok(())
    }

    /// Replaces the e-contract wake row `id` by one row per request on the
    /// contract (but `skip`, whose own chain synced it), in one
    /// transaction; false when another replica did first. The requests are
    /// read first (READ COMMITTED: without locks), then inserted as values:
    /// an `INSERT ... SELECT` is a bulk insert, for which InnoDB (under
    /// MariaDB's default innodb_autoinc_lock_mode 1) holds the table's
    /// AUTO-INC lock to the statement's end, and every business trigger's
    /// insert into this table would wait for it; an insert of values
    /// takes the counter for the allocation only.
    async fn expand_contract(
        &self,
        id: i64,
        contract_ref: &str,
        skip: Option<i64>,
    ) -> Result<bool, DbError> {
        let mut tx = self.begin("expand e-contract wake").await?;
        let taken = delete_wakes(&mut tx, &[id])
            .await
            .map_err(db("expand e-contract wake"))?;
        if taken == 0 {
            return give_up(tx, "expand e-contract wake", false).await;
        }
        let requests: Vec<(i64,)> = sqlx::query_as(
            "SELECT r.id FROM autoapproval_request r
              WHERE r.econtract_ref = ? AND (? IS NULL OR r.id <> ?)",
        )
        .bind(contract_ref)
        .bind(skip)
        .bind(skip)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("expand e-contract wake: requests"))?;
        for chunk in requests.chunks(CHUNK) {
            let sql = format!(
                "INSERT INTO auto_approve_wake (request_id) VALUES {}",
                vec!["(?)"; chunk.len()].join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (request_id,) in chunk {
                query = query.bind(request_id);
            }
            query
                .execute(&mut *tx)
                .await
                .map_err(db("expand e-contract wake"))?;
        }
        tx.commit().await.map_err(db("expand e-contract wake"))?;
        Ok(true)
    }
}

/// Deletes wake rows by primary key only: a range delete would take
/// next-key locks up to the table's end, where the business inserts.
pub(super) async fn delete_wakes(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    ids: &[i64],
) -> Result<u64, sqlx::Error> {
    let mut deleted = 0;
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            "DELETE FROM auto_approve_wake WHERE id IN ({})",
            placeholders(chunk.len())
        );
        let query = bind_all!(sqlx::query(sqlx::AssertSqlSafe(sql)), chunk);
        deleted += query.execute(&mut **tx).await?.rows_affected();
    }
    Ok(deleted)
}
