//! Claims and every write made under one, with PostgreSQL's guarantees
//! (store/claims.rs): the unique request_id decides a new claim, a
//! conditional UPDATE a due retry, the shard fence row is share-locked by
//! every claim, and every later write is conditional on the fence
//! `status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ? AND
//! claim_nonce = ?` (the nonce drawn by each claim).
//!
//! Differences from PostgreSQL, all here:
//! * No RETURNING in MySQL 8: a write is judged by its affected-row count
//!   (sqlx sets CLIENT_FOUND_ROWS, so an UPDATE counts the rows it matched,
//!   changed or not), and what it wrote is re-read in the same transaction.
//! * No data-modifying WITH: PostgreSQL's one-statement writes are a short
//!   transaction of statements, each by primary or unique key.
//! * `INSERT IGNORE` for ON CONFLICT DO NOTHING: 1 row inserted, 0 when the
//!   key exists. Strict mode stays on for our sessions and every value is
//!   bound from a typed field, so IGNORE has no other error to swallow.
//! * `LOCK IN SHARE MODE` for FOR SHARE (MariaDB has no FOR SHARE before
//!   10.10; MySQL 8 accepts both), `FOR UPDATE NOWAIT` for FOR NO KEY
//!   UPDATE NOWAIT (MySQL has no weaker row lock for an update).

use chrono::{DateTime, Utc};
use sqlx::{Connection, MySql, MySqlConnection};

use super::naming::{Named, named_write};
use super::notify::delete_wakes;
use super::{MysqlStore, db, give_up};
use crate::db::claims::{bind_fence, fenced_writes, fresh_nonce, sent_keys, sent_result};
use crate::db::codes::Statements;
use crate::db::{ClaimOutcome, Claims, Completion, DbError, RetryWrite, StepResult};
use crate::domain::{Candidate, Claim, Facts, Fence};

type Tx<'a> = sqlx::Transaction<'a, MySql>;

/// The fleet's pause, read in the claim's transaction to explain a
/// refused claim (a plain read: READ COMMITTED locks nothing here).
async fn fleet_pause_in(tx: &mut Tx<'_>) -> Result<Option<crate::db::FleetPause>, DbError> {
    sqlx::query_as("SELECT paused_by, reason, paused_at FROM auto_approve_fleet_pause")
        .fetch_optional(&mut **tx)
        .await
        .map_err(db("claim: is the fleet paused"))
}

// === impl MysqlStore ===

impl Claims for MysqlStore {
    // INSERT IGNORE for a new request; under shard coordination the fence
    // row is share-locked first and its token must be the claim's.
    async fn claim(
        &self,
        candidate: &Candidate,
        fence: &Fence,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<ClaimOutcome, DbError> {
        let nonce = fresh_nonce();
        let mut tx = self.begin("claim").await?;
        if !fence_is_current(&mut tx, candidate.request_id, fence).await? {
            return give_up(tx, "claim", ClaimOutcome::Lost).await;
        }
        // (state row, retries, transient streak, a new request's)
        let won: Option<(i64, i32, i32, bool)> = match candidate.state_id {
            None => {
                // Only a known decision refuses the claim: an unknown status
                // is claimed, and the chain's re-read reports it by name.
                let inserted = sqlx::query(self.sql(CLAIM_NEW))
                    .bind(candidate.request_id)
                    .bind(candidate.request_type.as_str())
                    .bind(&fence.holder)
                    .bind(fence.token)
                    .bind(nonce)
                    .bind(candidate.request_id)
                    .bind(candidate.request_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db("claim new request"))?;
                if inserted.rows_affected() == 0 {
                    // Approved meanwhile (a lagging replica's candidate), decided
                    // by a person, or held by another worker: the status tells.
                    // A plain read: READ COMMITTED locks nothing here.
                    let status: Option<(String,)> = sqlx::query_as(self.sql(WHY_REFUSED))
                        .bind(candidate.request_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db("claim new request: why refused"))?;
                    let fleet = fleet_pause_in(&mut tx).await?;
                    let outcome = ClaimOutcome::refused(status.as_ref().map(|(s,)| s.as_str()))
                        .or_fleet_paused(fleet);
                    return give_up(tx, "claim", outcome).await;
                }
                Some((inserted.last_insert_id() as i64, 0, 0, true))
            }
            Some(state_id) => {
                let updated = sqlx::query(
                    "UPDATE auto_approve_state
                        SET status = 'IN_PROGRESS', holder = ?, fencing_token = ?, claim_nonce = ?,
                            modified_at = UTC_TIMESTAMP(6), woken_at = NULL
                      WHERE id = ? AND request_id = ? AND status = 'RETRY_WAITING'
                        AND next_retry_time <= ? AND retry_count < ?
                        AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = ?)
                        AND NOT EXISTS (SELECT 1 FROM auto_approve_fleet_pause)",
                )
                .bind(&fence.holder)
                .bind(fence.token)
                .bind(nonce)
                .bind(state_id)
                .bind(candidate.request_id)
                .bind(now)
                .bind(retry_limit)
                .bind(candidate.request_id)
                .execute(&mut *tx)
                .await
                .map_err(db("claim due retry"))?;
                if updated.rows_affected() == 1 {
                    let (retry_count, transient_streak): (i32, i32) = sqlx::query_as(
                        "SELECT retry_count, transient_streak FROM auto_approve_state WHERE id = ?",
                    )
                    .bind(state_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db("claim due retry: re-read"))?;
                    Some((state_id, retry_count, transient_streak, false))
                } else {
                    None
                }
            }
        };
        let Some((state_id, retry_count, transient_streak, new_request)) = won else {
            let fleet = fleet_pause_in(&mut tx).await?;
            return give_up(tx, "claim", ClaimOutcome::Lost.or_fleet_paused(fleet)).await;
        };
        // The chain reads the facts after this claim: the wakes recorded
        // before it are consumed here (PostgreSQL 0010), the new request's
        // own insert row included, so the retry it schedules is not due at
        // once for them.
        consume_wakes_of(&mut tx, candidate.request_id)
            .await
            .map_err(db("claim: consume wakes"))?;
        tx.commit().await.map_err(db("claim: commit"))?;
        // No RETURNING: what a new request's pickup is measured from, read
        // after the commit so that the claim's locks are held no longer. The
        // claim is ours by now: a failed read costs the pickup sample only,
        // never the claim (an error here would strand it until the cleanser).
        let requested_at = if new_request {
            sqlx::query_as::<_, (DateTime<Utc>,)>(
                "SELECT created_at FROM autoapproval_request WHERE id = ?",
            )
            .bind(candidate.request_id)
            .fetch_optional(&self.primary)
            .await
            .inspect_err(|error| {
                tracing::warn!(request_id = candidate.request_id, %error, "could not read the creation time of a claimed request");
            })
            .ok()
            .flatten()
            .map(|(at,)| at)
        } else {
            None
        };
        Ok(ClaimOutcome::Won(Claim {
            state_id,
            request_id: candidate.request_id,
            retry_count,
            transient_streak,
            fence: fence.clone(),
            nonce,
            requested_at,
        }))
    }

    async fn retry_now(
        &self,
        request_id: i64,
        retry_limit: i32,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DbError> {
        let mut tx = self.begin("retry now").await?;
        let due = sqlx::query(
            "UPDATE auto_approve_state
                SET next_retry_time = ?, retry_count = LEAST(retry_count, ? - 1),
                    modified_at = UTC_TIMESTAMP(6)
              WHERE request_id = ? AND status = 'RETRY_WAITING'",
        )
        .bind(now)
        .bind(retry_limit)
        .bind(request_id)
        .execute(&mut *tx)
        .await
        .map_err(db("retry now"))?;
        if due.rows_affected() == 0 {
            return give_up(tx, "retry now", false).await;
        }
        if !self.shadow {
            insert_memo(&mut tx, request_id, now, "autoapproval", note)
                .await
                .map_err(db("retry now: memo"))?;
        }
        tx.commit().await.map_err(db("retry now: commit"))?;
        Ok(true)
    }

    async fn schedule_retry(
        &self,
        claim: &Claim,
        retry: &RetryWrite<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<(i32, DateTime<Utc>)>, DbError> {
        let mut tx = self.begin("schedule retry").await?;
        let old: Option<(Option<String>, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT last_reason, woken_at FROM auto_approve_state
              WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
                AND claim_nonce = ?
              FOR UPDATE",
        )
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(claim.nonce)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("schedule retry: lock"))?;
        let Some((old_reason, woken_at)) = old else {
            return give_up(tx, "schedule retry", None).await;
        };
        // Woken while the chain ran: it may have read the old fact.
        let woken_rows = consume_wakes_of(&mut tx, claim.request_id)
            .await
            .map_err(db("schedule retry: consume wakes"))?;
        let next_retry_time = if woken_at.is_some() || woken_rows > 0 {
            retry.next_retry_time.min(now)
        } else {
            retry.next_retry_time
        };
        sqlx::query(
            "UPDATE auto_approve_state
                SET status = 'RETRY_WAITING',
                    retry_count = retry_count + IF(?, 1, 0),
                    transient_streak = IF(?, transient_streak + 1, 0),
                    next_retry_time = ?, woken_at = NULL, last_reason = ?, step = ?,
                    modified_at = UTC_TIMESTAMP(6)
              WHERE id = ?",
        )
        .bind(retry.counted)
        .bind(retry.transient)
        .bind(next_retry_time)
        .bind(retry.reason)
        .bind(retry.step)
        .bind(claim.state_id)
        .execute(&mut *tx)
        .await
        .map_err(db("schedule retry"))?;
        let (retry_count, due): (i32, DateTime<Utc>) = sqlx::query_as(
            "SELECT retry_count, next_retry_time FROM auto_approve_state WHERE id = ?",
        )
        .bind(claim.state_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(db("schedule retry: re-read"))?;
        if !self.shadow && old_reason.as_deref() != Some(retry.reason) {
            let memo = format!("auto-approval waits: {}", retry.reason);
            insert_memo(&mut tx, claim.request_id, now, "autoapproval", &memo)
                .await
                .map_err(db("schedule retry: memo"))?;
        }
        tx.commit().await.map_err(db("schedule retry: commit"))?;
        Ok(Some((retry_count, due)))
    }

    // Our own approval wakes nobody: the connection names the request to
    // the trigger's procedure for the whole transaction.
    async fn complete(&self, claim: &Claim, facts: &Facts) -> Result<Completion, DbError> {
        crate::db::business_write(self.shadow, "approve the request")?;
        named_write(
            &self.primary,
            Named::WritingRequest,
            claim.request_id,
            "complete: name the request",
            async |conn| complete_on(conn, &self.statements, claim, facts).await,
        )
        .await
    }

    fenced_writes! {
        heartbeat: "UPDATE auto_approve_state SET modified_at = UTC_TIMESTAMP(6), step = ?
                     WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
                       AND claim_nonce = ?",
        drop: "DELETE FROM auto_approve_state
                WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
                  AND claim_nonce = ?",
        release: "UPDATE auto_approve_state
                     SET status = 'RETRY_WAITING', next_retry_time = ?,
                         modified_at = UTC_TIMESTAMP(6)
                   WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
                     AND claim_nonce = ?",
    }

    // INSERT IGNORE by the primary key, under the share-locked fence.
    async fn record_sent(
        &self,
        claim: &Claim,
        key: &str,
        body: &str,
    ) -> Result<Option<String>, DbError> {
        let mut tx = self.begin("record sent body").await?;
        if !lock_fenced(&mut tx, claim, "LOCK IN SHARE MODE")
            .await
            .map_err(db("record sent body: check fence"))?
        {
            return give_up(tx, "record sent body", None).await;
        }
        sqlx::query(
            "INSERT IGNORE INTO auto_approve_sent (request_id, idempotency_key, body)
             VALUES (?, ?, ?)",
        )
        .bind(claim.request_id)
        .bind(key)
        .bind(body)
        .execute(&mut *tx)
        .await
        .map_err(db("record sent body"))?;
        let (recorded,): (String,) = sqlx::query_as(
            "SELECT body FROM auto_approve_sent WHERE request_id = ? AND idempotency_key = ?",
        )
        .bind(claim.request_id)
        .bind(key)
        .fetch_one(&mut *tx)
        .await
        .map_err(db("record sent body: re-read"))?;
        tx.commit().await.map_err(db("record sent body: commit"))?;
        Ok(Some(recorded))
    }

    sent_result!("?", "?");

    sent_keys!("?");

    // Under the share-locked fence, as record_sent.
    async fn refuse_sent(&self, claim: &Claim, key: &str) -> Result<bool, DbError> {
        let mut tx = self.begin("mark sent body refused").await?;
        if !lock_fenced(&mut tx, claim, "LOCK IN SHARE MODE")
            .await
            .map_err(db("mark sent body refused: check fence"))?
        {
            return give_up(tx, "mark sent body refused", false).await;
        }
        // The fence decides the answer: MySQL counts only changed rows.
        sqlx::query(
            "UPDATE auto_approve_sent SET refused_at = UTC_TIMESTAMP(6)
              WHERE request_id = ? AND idempotency_key = ?",
        )
        .bind(claim.request_id)
        .bind(key)
        .execute(&mut *tx)
        .await
        .map_err(db("mark sent body refused"))?;
        tx.commit()
            .await
            .map_err(db("mark sent body refused: commit"))?;
        Ok(true)
    }

    // A result is our own write too: it wakes nobody.
    async fn save_result(&self, claim: &Claim, result: StepResult<'_>) -> Result<bool, DbError> {
        crate::db::business_write(self.shadow, "save a result on the request")?;
        named_write(
            &self.primary,
            Named::WritingRequest,
            claim.request_id,
            "save result: name the request",
            async |conn| save_result_on(conn, claim, result).await,
        )
        .await
    }
}

const SAVE_OWNER_NUMBER: &str =
    "UPDATE autoapproval_request SET owner_number = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = ?";
const SAVE_STORE_NUMBER: &str =
    "UPDATE autoapproval_request SET store_number = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = ?";
const SAVE_CAMPAIGN_ID: &str =
    "UPDATE autoapproval_request SET campaign_id = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = ?";

/// Approves the claim's request when it is still open and nothing changed
/// since the claim, and ends the claim. Lock order as on PostgreSQL: the
/// request row (NOWAIT: a row the business holds fails at once), the
/// ledger's row of its contract (NOWAIT too), then the state row, each by
/// primary key.
async fn complete_on(
    conn: &mut MySqlConnection,
    statements: &Statements,
    claim: &Claim,
    facts: &Facts,
) -> Result<Completion, DbError> {
    let mut tx = conn.begin().await.map_err(db("complete"))?;
    // A locking read returns the newest committed version, and no change
    // to the row can come in between it and the approval: its gate
    // columns are what the approval stands on, with or without a trigger.
    let row = lock_request_facts(&mut tx, statements, claim.request_id)
        .await
        .map_err(db("complete: lock request"))?;
    let open = row.as_ref().is_some_and(|r| is_open(&r.status));
    let contract = row.as_ref().and_then(|r| r.econtract_ref.clone());
    let mut changed = open && row.as_ref().is_some_and(|r| !r.holds(facts));
    if open && !changed && facts.econtract_status.is_some() {
        // Locked as the request row is, for the same reasons: the gate
        // passed on it. FOR UPDATE, the one NOWAIT lock MySQL 8 and
        // MariaDB spell alike.
        let ledger: Option<(String,)> = sqlx::query_as(statements.get(LOCK_LEDGER))
            .bind(contract.as_deref())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("complete: lock e-contract"))?;
        changed = ledger.map(|(status,)| status).as_deref() != facts.econtract_status.as_deref();
    }
    // A wake row (the claim consumed the earlier ones) or woken_at: a
    // change no column shows (undone since, say). A contract's change is
    // a row naming the contract until a poller expands it into one per
    // request: counted as the request's own (but for the one its own
    // chain's sync wrote). The subqueries read without locks.
    let woken: Option<(bool,)> = sqlx::query_as(
        "SELECT woken_at IS NOT NULL
                OR EXISTS (SELECT 1 FROM auto_approve_wake w WHERE w.request_id = ?)
                OR EXISTS (SELECT 1 FROM auto_approve_wake w
                            WHERE w.request_id IS NULL AND w.contract_ref = ?
                              AND NOT (w.skip_request <=> ?))
           FROM auto_approve_state
          WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
            AND claim_nonce = ?
          FOR UPDATE",
    )
    .bind(claim.request_id)
    .bind(contract.as_deref())
    .bind(claim.request_id)
    .bind(claim.state_id)
    .bind(&claim.fence.holder)
    .bind(claim.fence.token)
    .bind(claim.nonce)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("complete: lock state"))?;
    match woken {
        None => return give_up(tx, "complete", Completion::Stale).await,
        // A decided request's wake (MySQL appends one for every
        // change) changes nothing: the claim goes as before.
        Some((woken,)) if open && (woken || changed) => {
            return give_up(tx, "complete", Completion::Woken).await;
        }
        Some(_) => {}
    }
    if open {
        sqlx::query(statements.get(APPROVE))
            .bind(claim.request_id)
            .execute(&mut *tx)
            .await
            .map_err(db("complete: approve request"))?;
    }
    sqlx::query("DELETE FROM auto_approve_state WHERE id = ?")
        .bind(claim.state_id)
        .execute(&mut *tx)
        .await
        .map_err(db("complete: delete state"))?;
    // The recorded bodies go with the approval; a person's decision keeps
    // them, for a resubmission to replay the same creations.
    if open {
        sqlx::query("DELETE FROM auto_approve_sent WHERE request_id = ?")
            .bind(claim.request_id)
            .execute(&mut *tx)
            .await
            .map_err(db("complete: delete sent bodies"))?;
    }
    tx.commit().await.map_err(db("complete: commit"))?;
    Ok(if open {
        Completion::Approved
    } else {
        Completion::RequestClosed
    })
}

/// The request row's status and gate columns, as the completion locked it.
#[derive(sqlx::FromRow)]
struct LockedRequest {
    status: String,
    request_type: String,
    documents_released: bool,
    operational_hold: bool,
    menu_registered: bool,
    logo_registered: bool,
    previous_step_approved: bool,
    econtract_ref: Option<String>,
    target_store_number: Option<i64>,
}

impl LockedRequest {
    /// Whether the row still says what the gates passed on.
    fn holds(&self, facts: &Facts) -> bool {
        self.status == facts.status.as_str()
            && self.request_type == facts.request_type.as_str()
            && self.documents_released == facts.documents_released
            && self.operational_hold == facts.operational_hold
            && self.menu_registered == facts.menu_registered
            && self.logo_registered == facts.logo_registered
            && self.previous_step_approved == facts.previous_step_approved
            && self.econtract_ref == facts.econtract_ref
            && self.target_store_number == facts.target_store_number
    }
}

/// Locks the request row by primary key without waiting; its status and
/// gate columns, or `None` when it is gone.
async fn lock_request_facts(
    tx: &mut Tx<'_>,
    statements: &Statements,
    request_id: i64,
) -> Result<Option<LockedRequest>, sqlx::Error> {
    sqlx::query_as(statements.get(LOCK_FACTS))
        .bind(request_id)
        .fetch_optional(&mut **tx)
        .await
}

/// Saves a result only while the claim is still ours: the request row
/// locked NOWAIT (a business transaction holding it fails the attempt at
/// once, `DbError::RowLocked`), then the state row share-locked under the
/// fence (a recovery meanwhile makes it not ours), then the update by
/// primary key.
async fn save_result_on(
    conn: &mut MySqlConnection,
    claim: &Claim,
    result: StepResult<'_>,
) -> Result<bool, DbError> {
    let mut tx = conn.begin().await.map_err(db("save result"))?;
    if lock_request_nowait(&mut tx, claim.request_id)
        .await
        .map_err(db("save result: lock request"))?
        .is_none()
    {
        return give_up(tx, "save result", false).await;
    }
    if !lock_fenced(&mut tx, claim, "LOCK IN SHARE MODE")
        .await
        .map_err(db("save result: check fence"))?
    {
        return give_up(tx, "save result", false).await;
    }
    let query = match result {
        StepResult::OwnerNumber(number) => sqlx::query(SAVE_OWNER_NUMBER).bind(number),
        StepResult::StoreNumber(number) => sqlx::query(SAVE_STORE_NUMBER).bind(number),
        StepResult::CampaignId { campaign_id, .. } => {
            sqlx::query(SAVE_CAMPAIGN_ID).bind(campaign_id)
        }
    };
    query
        .bind(claim.request_id)
        .execute(&mut *tx)
        .await
        .map_err(db("save result"))?;
    if let StepResult::CampaignId { key, campaign_id } = result {
        sqlx::query(
            "UPDATE auto_approve_sent SET result = ? WHERE request_id = ? AND idempotency_key = ?",
        )
        .bind(campaign_id)
        .bind(claim.request_id)
        .bind(key)
        .execute(&mut *tx)
        .await
        .map_err(db("save result: answer of the key"))?;
    }
    tx.commit().await.map_err(db("save result: commit"))?;
    Ok(true)
}

pub(super) fn is_open(status: &str) -> bool {
    matches!(status, "ING" | "PENDING" | "RETRY")
}

/// Under shard coordination, share-locks the shard's fence row by primary
/// key and tells whether its token is the fence's (PostgreSQL 0008); true
/// outside coordination.
async fn fence_is_current(
    tx: &mut Tx<'_>,
    request_id: i64,
    fence: &Fence,
) -> Result<bool, DbError> {
    let Some(shard_count) = fence.shard_count else {
        return Ok(true);
    };
    let shard_count = i64::from(shard_count.max(1));
    let token: Option<(i64,)> = sqlx::query_as(
        "SELECT token FROM shard_fence WHERE shard_count = ? AND shard = ? LOCK IN SHARE MODE",
    )
    .bind(shard_count)
    .bind(request_id.rem_euclid(shard_count))
    .fetch_optional(&mut **tx)
    .await
    .map_err(db("claim: lock shard fence"))?;
    Ok(token.is_some_and(|(t,)| t == fence.token))
}

/// Locks the request row by primary key without waiting; `None` when it
/// is gone. Its key is read, not its status: a code of any type will do.
async fn lock_request_nowait(tx: &mut Tx<'_>, request_id: i64) -> Result<Option<i64>, sqlx::Error> {
    let row: Option<(i64,)> =
        sqlx::query_as("SELECT id FROM autoapproval_request WHERE id = ? FOR UPDATE NOWAIT")
            .bind(request_id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(row.map(|(id,)| id))
}

/// Locks the claim's state row by primary key (`lock`: FOR UPDATE or LOCK
/// IN SHARE MODE) when the fence still matches; false when it does not.
async fn lock_fenced(tx: &mut Tx<'_>, claim: &Claim, lock: &str) -> Result<bool, sqlx::Error> {
    let sql = format!(
        "SELECT id FROM auto_approve_state
          WHERE id = ? AND status = 'IN_PROGRESS' AND holder = ? AND fencing_token = ?
            AND claim_nonce = ? {lock}"
    );
    let row: Option<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(claim.nonce)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.is_some())
}

/// Deletes the wake rows of `request_id`: found without a lock through the
/// (request_id, id) index, deleted by primary key. The count deleted.
async fn consume_wakes_of(tx: &mut Tx<'_>, request_id: i64) -> Result<u64, sqlx::Error> {
    let ids: Vec<(i64,)> = sqlx::query_as("SELECT id FROM auto_approve_wake WHERE request_id = ?")
        .bind(request_id)
        .fetch_all(&mut **tx)
        .await?;
    let ids: Vec<i64> = ids.into_iter().map(|(id,)| id).collect();
    delete_wakes(tx, &ids).await
}

pub(super) async fn insert_memo(
    tx: &mut Tx<'_>,
    request_id: i64,
    at: DateTime<Utc>,
    author: &str,
    message: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
         VALUES (?, ?, ?, ?)",
    )
    .bind(request_id)
    .bind(at)
    .bind(author)
    .bind(message)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The claim of a new request (no state row): only a known decision
/// refuses it; an unknown status is claimed, and the chain's re-read
/// reports it by name. A template of `db::codes`.
pub(super) const CLAIM_NEW: &str = "INSERT IGNORE INTO auto_approve_state
                            (request_id, request_type, status, holder, fencing_token, claim_nonce,
                             created_at, modified_at)
                     SELECT ?, ?, 'IN_PROGRESS', ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM DUAL
                      WHERE NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = ?)
                        AND NOT EXISTS (SELECT 1 FROM auto_approve_fleet_pause)
                        AND EXISTS (SELECT 1 FROM autoapproval_request r
                                     WHERE r.id = ? AND r.status NOT IN ({DECIDED}))";

/// A refused claim's request status, as our word.
pub(super) const WHY_REFUSED: &str =
    "SELECT {STATUS_AS:status} FROM autoapproval_request WHERE id = ?";

/// The completion's lock of the request row, its status, type and flags as
/// our words.
pub(super) const LOCK_FACTS: &str =
    "SELECT {STATUS_AS:status}, {TYPE_AS:request_type}, {FLAG_AS:documents_released},
            {FLAG_AS:operational_hold}, {FLAG_AS:menu_registered}, {FLAG_AS:logo_registered},
            {FLAG_AS:previous_step_approved}, econtract_ref, target_store_number
       FROM autoapproval_request WHERE id = ? FOR UPDATE NOWAIT";

/// The completion's lock of the ledger row, its status as our word.
pub(super) const LOCK_LEDGER: &str = "SELECT {ECONTRACT_AS:status} FROM autoapproval_econtract WHERE contract_ref = ? FOR UPDATE NOWAIT";

/// The approval, in the business's code.
pub(super) const APPROVE: &str = "UPDATE autoapproval_request
                SET status = {STATUS:APPROVED}, decided_at = UTC_TIMESTAMP(6), decided_by = 'autoapproval',
                    updated_at = UTC_TIMESTAMP(6)
              WHERE id = ?";
