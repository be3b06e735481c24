//! Claims and every write made under one: the claim itself, heartbeats,
//! results, retries, completion and release. Each write after the claim is
//! conditional on the fence `status = 'IN_PROGRESS' AND holder = $2 AND
//! fencing_token = $3 AND claim_nonce = $4`, so a replica that lost its
//! claim writes nothing, nor a chain of one of its earlier claims.

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::claims::{bind_fence, fenced_writes, fresh_nonce, sent_keys, sent_result};
use crate::db::pause::FleetPauses;
use crate::db::{ClaimOutcome, Claims, Completion, DbError, RetryWrite, StepResult};
use crate::domain::{Candidate, Claim, Facts, Fence};

impl Claims for PgStore {
    async fn claim(
        &self,
        candidate: &Candidate,
        fence: &Fence,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<ClaimOutcome, DbError> {
        let shard_count = fence.shard_count.map(|k| k as i32);
        let nonce = fresh_nonce();
        let row: Option<(i64, i32, i32, Option<DateTime<Utc>>)> = match candidate.state_id {
            // The chain reads the facts after this claim: the wakes
            // recorded before it are consumed here (migration 0020 records
            // them whether or not a state row exists, and an earlier life of
            // the request may have left some), as a due retry's are.
            None => sqlx::query_as(
                self.sql(CLAIM_NEW),
            )
            .bind(candidate.request_id)
            .bind(candidate.request_type.as_str())
            .bind(&fence.holder)
            .bind(fence.token)
            .bind(now)
            .bind(shard_count)
            .bind(nonce)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("claim new request"))?,
            // The chain reads the facts after this claim: a wake recorded
            // before it is consumed here (migration 0010), not left to make
            // the retry it schedules due at once.
            Some(state_id) => sqlx::query_as(
                "WITH claimed AS (
                     UPDATE auto_approve_state
                        SET status = 'IN_PROGRESS', holder = $3, fencing_token = $4, claim_nonce = $8,
                            modified_at = now(), woken_at = NULL
                      WHERE id = $1 AND request_id = $2 AND status = 'RETRY_WAITING'
                        AND next_retry_time <= $5 AND retry_count < $6
                        AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = $2)
                        AND NOT EXISTS (SELECT 1 FROM auto_approve_fleet_pause)
                        AND ($7::int IS NULL OR EXISTS (
                            SELECT 1 FROM shard_fence f
                             WHERE f.shard_count = $7 AND f.shard = $2 % $7 AND f.token = $4
                               FOR SHARE))
                     RETURNING id, request_id, retry_count, transient_streak
                 ), consumed AS (
                     DELETE FROM auto_approve_wake w USING claimed c WHERE w.request_id = c.request_id
                 )
                 SELECT id, retry_count, transient_streak, NULL::timestamptz FROM claimed",
            )
            .bind(state_id)
            .bind(candidate.request_id)
            .bind(&fence.holder)
            .bind(fence.token)
            .bind(now)
            .bind(retry_limit)
            .bind(shard_count)
            .bind(nonce)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("claim due retry"))?,
        };
        Ok(match row {
            Some((state_id, retry_count, transient_streak, requested_at)) => {
                ClaimOutcome::Won(Claim {
                    state_id,
                    request_id: candidate.request_id,
                    retry_count,
                    transient_streak,
                    fence: fence.clone(),
                    nonce,
                    requested_at,
                })
            }
            // Approved meanwhile (a lagging replica's candidate), decided by
            // a person, or held by another worker: the status tells.
            None if candidate.state_id.is_none() => {
                let status: Option<(String,)> = sqlx::query_as(self.sql(WHY_REFUSED))
                    .bind(candidate.request_id)
                    .fetch_optional(&self.primary)
                    .await
                    .map_err(db("claim new request: why refused"))?;
                ClaimOutcome::refused(status.as_ref().map(|(s,)| s.as_str()))
                    .or_fleet_paused(FleetPauses::fleet_pause(self).await?)
            }
            None => ClaimOutcome::Lost.or_fleet_paused(FleetPauses::fleet_pause(self).await?),
        })
    }

    async fn retry_now(
        &self,
        request_id: i64,
        retry_limit: i32,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DbError> {
        let row: Option<(i64,)> = sqlx::query_as(
            "WITH due AS (
                 UPDATE auto_approve_state
                    SET next_retry_time = $3, retry_count = LEAST(retry_count, $2 - 1),
                        modified_at = now()
                  WHERE request_id = $1 AND status = 'RETRY_WAITING'
                 RETURNING request_id
             ), memo AS (
                 INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $3, 'autoapproval', $4 FROM due WHERE $5
             )
             SELECT request_id FROM due",
        )
        .bind(request_id)
        .bind(retry_limit)
        .bind(now)
        .bind(note)
        .bind(!self.shadow)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("retry now"))?;
        Ok(row.is_some())
    }

    async fn schedule_retry(
        &self,
        claim: &Claim,
        retry: &RetryWrite<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<(i32, DateTime<Utc>)>, DbError> {
        let row: Option<(i32, DateTime<Utc>)> = sqlx::query_as(
            "WITH old AS (
                 SELECT id, request_id, last_reason FROM auto_approve_state
                  WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3
                    AND claim_nonce = $10
                    FOR UPDATE
             ), woken AS (
                 -- Woken while the chain ran (migration 0010): it may have
                 -- read the old fact, so the retry is due at once.
                 DELETE FROM auto_approve_wake w USING old
                  WHERE w.request_id = old.request_id
                 RETURNING w.request_id
             ), upd AS (
                 UPDATE auto_approve_state s
                    SET status = 'RETRY_WAITING',
                        retry_count = s.retry_count + CASE WHEN $9 THEN 1 ELSE 0 END,
                        transient_streak = CASE WHEN $5 THEN s.transient_streak + 1 ELSE 0 END,
                        next_retry_time = CASE
                            WHEN s.woken_at IS NULL
                                 AND NOT EXISTS (SELECT 1 FROM auto_approve_wake w WHERE w.request_id = s.request_id)
                            THEN $4 ELSE LEAST($4, $8) END,
                        woken_at = NULL, last_reason = $6, step = $7, modified_at = now()
                   FROM old WHERE s.id = old.id
                 RETURNING s.request_id, s.retry_count, s.next_retry_time, old.last_reason AS old_reason
             ), memo AS (
                 INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $8, 'autoapproval', 'auto-approval waits: ' || $6
                   FROM upd WHERE old_reason IS DISTINCT FROM $6 AND $11
             )
             SELECT retry_count, next_retry_time FROM upd",
        )
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(retry.next_retry_time)
        .bind(retry.transient)
        .bind(retry.reason)
        .bind(retry.step)
        .bind(now)
        .bind(retry.counted)
        .bind(claim.nonce)
        .bind(!self.shadow)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("schedule retry"))?;
        Ok(row)
    }

    async fn complete(&self, claim: &Claim, facts: &Facts) -> Result<Completion, DbError> {
        crate::db::business_write(self.shadow, "approve the request")?;
        // One statement, no transaction (BEGIN, two writes and COMMIT were
        // four round trips per approval). Row locks in the order every
        // transaction takes them (migration 0010), so none deadlocks with
        // the business system's: the request row first, NOWAIT (a row the
        // business holds fails at once, see SAVE_OWNER_NUMBER; the scalar
        // subquery makes the delete wait for that lock), then the state row
        // by the fenced delete. The approval depends on the delete's
        // returned row, so a fence moved meanwhile (the delete re-checks
        // the row's newest version) approves nothing, as the rolled-back
        // transaction did. The request's recorded bodies go with its
        // approval only (a person's decision keeps them for a resubmission
        // to replay). The lock names the request as ours to write
        // (autoapproval.writing_request): our approval wakes nobody.
        //
        // A fact changed after the claim refuses the delete, and with it
        // the approval, on an open request (`woken`): the chain may have
        // read it before the change. Seen three ways. The locked row's gate
        // columns differ from those the gates passed on: READ COMMITTED
        // returns the newest committed version of a row it locks, so a
        // business commit after this statement's snapshot is seen too, and
        // none can come after the lock. The ledger's status of the
        // contract differs from what the gate saw or wrote: its row is
        // share-locked NOWAIT for the same reasons (the gate passed on it;
        // a held row fails at once). These two need no trigger. And a wake
        // row, or woken_at (the claim consumed the earlier ones): a change
        // no column shows (undone since, or outside the request row). Wake
        // rows are read under the snapshot; one committed after it belongs
        // to a change of the locked row or the ledger, compared above.
        let (fenced, approved, woken): (bool, bool, bool) = sqlx::query_as(self.sql(COMPLETE))
            .bind(claim.request_id)
            .bind(claim.state_id)
            .bind(&claim.fence.holder)
            .bind(claim.fence.token)
            .bind(claim.nonce)
            .bind(facts.status.as_str())
            .bind(facts.request_type.as_str())
            .bind(facts.documents_released)
            .bind(facts.operational_hold)
            .bind(facts.menu_registered)
            .bind(facts.logo_registered)
            .bind(facts.previous_step_approved)
            .bind(facts.econtract_ref.as_deref())
            .bind(facts.target_store_number)
            .bind(facts.econtract_status.as_deref())
            .fetch_one(&self.primary)
            .await
            .map_err(db("complete"))?;
        Ok(match (fenced, approved, woken) {
            (false, _, true) => Completion::Woken,
            (false, _, false) => Completion::Stale,
            (true, true, _) => Completion::Approved,
            (true, false, _) => Completion::RequestClosed,
        })
    }

    fenced_writes! {
        heartbeat: "UPDATE auto_approve_state SET modified_at = now(), step = $1
                     WHERE id = $2 AND status = 'IN_PROGRESS' AND holder = $3
                       AND fencing_token = $4 AND claim_nonce = $5",
        drop: DELETE_FENCED,
        release: "UPDATE auto_approve_state
                     SET status = 'RETRY_WAITING', next_retry_time = $1, modified_at = now()
                   WHERE id = $2 AND status = 'IN_PROGRESS' AND holder = $3
                     AND fencing_token = $4 AND claim_nonce = $5",
    }

    async fn record_sent(
        &self,
        claim: &Claim,
        key: &str,
        body: &str,
    ) -> Result<Option<String>, DbError> {
        // The insert and the read of an earlier row share one snapshot: the
        // row there, or else the one inserted now, is the body of the key.
        let row: Option<(String,)> = sqlx::query_as(
            "WITH fenced AS (
                 SELECT id FROM auto_approve_state
                  WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3
                    AND claim_nonce = $4
                    FOR SHARE
             ), recorded AS (
                 INSERT INTO auto_approve_sent (request_id, idempotency_key, body)
                 SELECT $5, $6, $7 FROM fenced
                 ON CONFLICT (request_id, idempotency_key) DO NOTHING
                 RETURNING body
             )
             SELECT body FROM recorded
             UNION ALL
             SELECT s.body FROM auto_approve_sent s
              WHERE s.request_id = $5 AND s.idempotency_key = $6 AND EXISTS (SELECT 1 FROM fenced)",
        )
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(claim.nonce)
        .bind(claim.request_id)
        .bind(key)
        .bind(body)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("record sent body"))?;
        Ok(row.map(|(body,)| body))
    }

    sent_result!("$1", "$2");

    sent_keys!("$1");

    async fn refuse_sent(&self, claim: &Claim, key: &str) -> Result<bool, DbError> {
        let done = bind_fence!(
            sqlx::query(
                "UPDATE auto_approve_sent SET refused_at = now()
                  WHERE request_id = $5 AND idempotency_key = $6
                    AND EXISTS (SELECT 1 FROM auto_approve_state
                         WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2
                           AND fencing_token = $3 AND claim_nonce = $4 FOR SHARE)",
            ),
            claim
        )
        .bind(claim.request_id)
        .bind(key)
        .execute(&self.primary)
        .await
        .map_err(db("mark sent body refused"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn save_result(&self, claim: &Claim, result: StepResult<'_>) -> Result<bool, DbError> {
        crate::db::business_write(self.shadow, "save a result on the request")?;
        let sql = match result {
            StepResult::OwnerNumber(_) => SAVE_OWNER_NUMBER,
            StepResult::StoreNumber(_) => SAVE_STORE_NUMBER,
            StepResult::CampaignId { .. } => SAVE_CAMPAIGN_ID,
        };
        let query = sqlx::query(sql)
            .bind(claim.state_id)
            .bind(&claim.fence.holder)
            .bind(claim.fence.token);
        let query = match result {
            StepResult::OwnerNumber(number) | StepResult::StoreNumber(number) => query.bind(number),
            StepResult::CampaignId { campaign_id, .. } => query.bind(campaign_id),
        };
        let query = query.bind(claim.request_id).bind(claim.nonce);
        // Only the campaign's statement records its answer as the key's result.
        let query = match result {
            StepResult::CampaignId { key, .. } => query.bind(key),
            _ => query,
        };
        let done = query
            .execute(&self.primary)
            .await
            .map_err(db("save result"))?;
        Ok(done.rows_affected() == 1)
    }
}

const DELETE_FENCED: &str = "\
DELETE FROM auto_approve_state
 WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3
   AND claim_nonce = $4";

// A result is saved only while the claim is still ours, and never waits
// for the request row: a business transaction holding it fails the
// statement at once (55P03, `DbError::RowLocked`) and the attempt is
// retried with backoff, instead of a connection of the chains' pool waiting
// out the lock timeout (16 such waits starve the whole pool). FOR SHARE on
// the state row: a fence recovering it meanwhile makes the check see the
// recovered row (not ours any more), so nothing is written after a takeover.
// The lock also names the request as ours to write for the rest of the
// transaction (autoapproval.writing_request): its wake trigger skips it.
// $6: the claim's nonce.
macro_rules! fenced_result {
    () => {
        "
  FROM (SELECT id, set_config('autoapproval.writing_request', id::text, true)
          FROM autoapproval_request WHERE id = $5 FOR NO KEY UPDATE NOWAIT) AS free
 WHERE r.id = free.id AND EXISTS (SELECT 1 FROM auto_approve_state
     WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3
       AND claim_nonce = $6 FOR SHARE)"
    };
}
const SAVE_OWNER_NUMBER: &str = concat!(
    "UPDATE autoapproval_request r SET owner_number = $4, updated_at = now()",
    fenced_result!()
);
const SAVE_STORE_NUMBER: &str = concat!(
    "UPDATE autoapproval_request r SET store_number = $4, updated_at = now()",
    fenced_result!()
);
// $7: the key the campaign was approved under; its recorded body's result
// becomes the campaign id, which the ad step compares (migration 0018).
const SAVE_CAMPAIGN_ID: &str = concat!(
    "WITH saved AS (UPDATE autoapproval_request r SET campaign_id = $4, updated_at = now()",
    fenced_result!(),
    " RETURNING r.id), answered AS (
 UPDATE auto_approve_sent s SET result = $4
   FROM saved WHERE s.request_id = saved.id AND s.idempotency_key = $7)
SELECT id FROM saved"
);

// The claim of a new request (no state row), consuming its wakes.
const CLAIM_NEW: &str = "WITH claimed AS (
                 INSERT INTO auto_approve_state
                        (request_id, request_type, status, holder, fencing_token, claim_nonce,
                         created_at, modified_at)
                 SELECT $1, $2, 'IN_PROGRESS', $3, $4, $7, $5, now()
                  WHERE ($6::int IS NULL OR EXISTS (
                        SELECT 1 FROM shard_fence f
                         WHERE f.shard_count = $6 AND f.shard = $1 % $6 AND f.token = $4
                           FOR SHARE))
                    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = $1)
                    -- The fleet's brake (migration 0005), in the statement
                    -- itself: no claim is won once a pause is committed.
                    AND NOT EXISTS (SELECT 1 FROM auto_approve_fleet_pause)
                    -- Only a known decision refuses: an unknown status is
                    -- claimed, and the chain's re-read reports it by name.
                    AND EXISTS (SELECT 1 FROM autoapproval_request r
                                 WHERE r.id = $1 AND r.status NOT IN ({DECIDED}))
                 ON CONFLICT (request_id) DO NOTHING
                 RETURNING id, request_id, retry_count, transient_streak
                 ), consumed AS (
                     DELETE FROM auto_approve_wake w USING claimed c WHERE w.request_id = c.request_id
                 )
                 SELECT id, retry_count, transient_streak,
                        (SELECT created_at FROM autoapproval_request WHERE id = $1)
                   FROM claimed";

// A refused claim's request status, read as our word.
const WHY_REFUSED: &str = "SELECT {STATUS_AS:status} FROM autoapproval_request WHERE id = $1";

// The completion: see `complete`.
const COMPLETE: &str = "WITH free AS (
                 SELECT id, econtract_ref, status IN ({OPEN}) AS open,
                        ({STATUS_WORD:status}, {TYPE_WORD:request_type}, {FLAG:documents_released},
                         {FLAG:operational_hold}, {FLAG:menu_registered}, {FLAG:logo_registered},
                         {FLAG:previous_step_approved}, econtract_ref, target_store_number)
                            IS NOT DISTINCT FROM ($6, $7, $8, $9, $10, $11, $12, $13, $14) AS held,
                        set_config('autoapproval.writing_request', id::text, true)
                   FROM autoapproval_request WHERE id = $1 FOR NO KEY UPDATE NOWAIT
             ), ledger AS (
                 SELECT {ECONTRACT_AS:e.status} FROM autoapproval_econtract e
                  WHERE $15::text IS NOT NULL AND e.contract_ref = (SELECT econtract_ref FROM free)
                    FOR SHARE NOWAIT
             ), woken AS (
                 SELECT id FROM auto_approve_state
                  WHERE id = $2 AND status = 'IN_PROGRESS' AND holder = $3 AND fencing_token = $4
                    AND claim_nonce = $5
                    AND (woken_at IS NOT NULL
                         OR EXISTS (SELECT 1 FROM auto_approve_wake w WHERE w.request_id = $1)
                         OR NOT (SELECT held FROM free)
                         OR ($15::text IS NOT NULL
                             AND (SELECT status FROM ledger) IS DISTINCT FROM $15))
                    AND EXISTS (SELECT 1 FROM free WHERE open)
             ), fenced AS (
                 DELETE FROM auto_approve_state
                  WHERE id = $2 AND status = 'IN_PROGRESS' AND holder = $3 AND fencing_token = $4
                    AND claim_nonce = $5 AND NOT EXISTS (SELECT 1 FROM woken)
                    AND (SELECT count(*) FROM free) >= 0
                 RETURNING id
             ), sent AS (
                 DELETE FROM auto_approve_sent s
                  WHERE s.request_id = $1 AND EXISTS (SELECT 1 FROM fenced)
                    AND EXISTS (SELECT 1 FROM free WHERE open)
             ), approved AS (
                 UPDATE autoapproval_request r
                    SET status = {STATUS:APPROVED}, decided_at = now(), decided_by = 'autoapproval', updated_at = now()
                   FROM free
                  WHERE r.id = free.id AND r.status IN ({OPEN})
                    AND EXISTS (SELECT 1 FROM fenced)
                 RETURNING r.id
             )
             SELECT EXISTS (SELECT 1 FROM fenced), EXISTS (SELECT 1 FROM approved),
                    EXISTS (SELECT 1 FROM woken)";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[CLAIM_NEW, WHY_REFUSED, COMPLETE];
