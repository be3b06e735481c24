//! The store: every SQL statement of the project, against a primary pool and
//! a read pool (a replica, or the primary when none is configured).
//!
//! Candidate queries run on the read pool; every re-read, claim and write runs
//! on the primary, because replica lag is exactly what makes a claimed request
//! still look like a candidate.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{FromRow, Postgres, Transaction};

use crate::domain::{
    Candidate, Claim, Fence, Request, RequestStatus, RequestType, State, StateStatus, UnknownValue,
};

pub mod harness;

/// Database settings.
#[derive(clap::Args, Clone, Debug)]
pub struct DatabaseConfig {
    /// PostgreSQL URL of the primary: re-reads, claims and every write [required, no default].
    #[arg(long, env = "AUTOAPPROVAL_DATABASE_URL")]
    pub database_url: String,
    /// PostgreSQL URL of a read replica for the candidate queries [default: the primary].
    #[arg(long, env = "AUTOAPPROVAL_READ_DATABASE_URL")]
    pub read_database_url: Option<String>,
    /// Connections per pool.
    #[arg(long, env = "AUTOAPPROVAL_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,
}

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or could not be reached.
    #[error("database error during {operation}: {source}")]
    Database {
        /// What the store was doing.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row holds a value the controller does not know; it is skipped.
    #[error("request {request_id}: {error}")]
    Malformed {
        /// The request whose row is malformed.
        request_id: i64,
        /// What is wrong with it.
        error: UnknownValue,
    },
    /// A setting is invalid.
    #[error("invalid database setting {setting}: {message}")]
    Config {
        /// The flag.
        setting: &'static str,
        /// Why.
        message: String,
    },
}

fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Database { operation, source }
}

/// The outcome of a claim attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This worker holds the request now.
    Won(Claim),
    /// Another worker got there first, or the retry is no longer due.
    Lost,
}

/// The outcome of a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The request is APPROVED and the state row is gone.
    Approved,
    /// The fence no longer matches: nothing was written.
    Stale,
    /// The claim was ours but a person decided meanwhile: state row deleted,
    /// the request left as the person set it.
    RequestClosed,
}

/// What the candidate query should select.
#[derive(Clone, Debug)]
pub struct CandidateQuery {
    /// The request type (one query per auto-approvable type).
    pub request_type: RequestType,
    /// At most this many rows.
    pub limit: i64,
    /// Only requests whose sort_time is at or after this instant.
    pub window_start: DateTime<Utc>,
    /// The evaluation time for "retry due".
    pub now: DateTime<Utc>,
    /// Retries at or beyond this are no longer selected.
    pub retry_limit: i32,
    /// Only requests with `id % shard_count` in `shards`; all when `None`.
    pub shards: Option<ShardFilter>,
}

/// A subset of the K shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardFilter {
    /// K.
    pub shard_count: i64,
    /// The shards wanted, each in `0..shard_count`.
    pub shards: Vec<i64>,
}

/// A retry to record.
#[derive(Clone, Debug)]
pub struct RetryWrite<'a> {
    /// When it is due.
    pub next_retry_time: DateTime<Utc>,
    /// Whether the failure was transient (grows the backoff streak).
    pub transient: bool,
    /// Why, for the CR status and the memo.
    pub reason: &'a str,
    /// The step that asked for it.
    pub step: &'a str,
}

/// The NOTIFY channel of migration 0004: payload is the request id as text.
pub const REQUEST_CHANGED_CHANNEL: &str = "autoapproval_request_changed";

/// One notification from the request-changed channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestChange {
    /// This request was inserted, or a fact its filters read changed.
    Changed(i64),
    /// A payload that is not a request id; reported and ignored.
    Malformed(String),
    /// The connection dropped and was re-established: notifications may
    /// have been missed, so the caller should run a full turn.
    Reconnected,
}

/// The LISTEN connection for request changes.
pub struct RequestChanges {
    listener: PgListener,
}

impl RequestChanges {
    /// Waits for the next notification.
    pub async fn next(&mut self) -> Result<RequestChange, StoreError> {
        let received = self
            .listener
            .try_recv()
            .await
            .map_err(db("receive notification"))?;
        Ok(received.map_or(RequestChange::Reconnected, |n| {
            RequestChange::parse(n.payload())
        }))
    }

    /// A notification already received, without waiting.
    pub fn next_buffered(&mut self) -> Option<RequestChange> {
        self.listener
            .next_buffered()
            .map(|n| RequestChange::parse(n.payload()))
    }
}

impl RequestChange {
    fn parse(payload: &str) -> Self {
        match payload.trim().parse() {
            Ok(id) => RequestChange::Changed(id),
            Err(_) => RequestChange::Malformed(payload.to_owned()),
        }
    }
}

/// A request's status as the CR garbage collector needs it.
#[derive(Debug)]
pub struct RequestStatusRow {
    /// The request.
    pub request_id: i64,
    /// Its status, or why it cannot be read.
    pub status: Result<RequestStatus, StoreError>,
    /// When it was decided, else last updated.
    pub changed_at: DateTime<Utc>,
}

/// What the cleanser did in one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanseReport {
    /// Requests whose stuck claim went back to RETRY_WAITING.
    pub recovered: Vec<i64>,
    /// State rows deleted because their request is terminal or gone.
    pub deleted: u64,
}

#[derive(FromRow)]
struct RequestRow {
    id: i64,
    request_type: String,
    status: String,
    sort_time: DateTime<Utc>,
    created_at: DateTime<Utc>,
    business_name: String,
    documents_released: bool,
    operational_hold: bool,
    menu_registered: bool,
    logo_registered: bool,
    previous_step_approved: bool,
    econtract_ref: Option<String>,
    target_store_number: Option<i64>,
    owner_number: Option<i64>,
    store_number: Option<i64>,
    campaign_id: Option<String>,
    decided_by: Option<String>,
}

impl RequestRow {
    fn into_request(self) -> Result<Request, StoreError> {
        let malformed = |error| StoreError::Malformed {
            request_id: self.id,
            error,
        };
        Ok(Request {
            id: self.id,
            request_type: self.request_type.parse().map_err(malformed)?,
            status: self.status.parse().map_err(malformed)?,
            sort_time: self.sort_time,
            created_at: self.created_at,
            business_name: self.business_name,
            documents_released: self.documents_released,
            operational_hold: self.operational_hold,
            menu_registered: self.menu_registered,
            logo_registered: self.logo_registered,
            previous_step_approved: self.previous_step_approved,
            econtract_ref: self.econtract_ref,
            target_store_number: self.target_store_number,
            owner_number: self.owner_number,
            store_number: self.store_number,
            campaign_id: self.campaign_id,
            decided_by: self.decided_by,
        })
    }
}

#[derive(FromRow)]
struct StateRow {
    id: i64,
    request_id: i64,
    status: String,
    next_retry_time: Option<DateTime<Utc>>,
    retry_count: i32,
    holder: String,
    fencing_token: i64,
    step: Option<String>,
    last_reason: Option<String>,
    modified_at: DateTime<Utc>,
}

impl StateRow {
    fn into_state(self) -> Result<State, StoreError> {
        Ok(State {
            status: self
                .status
                .parse::<StateStatus>()
                .map_err(|error| StoreError::Malformed {
                    request_id: self.request_id,
                    error,
                })?,
            id: self.id,
            request_id: self.request_id,
            next_retry_time: self.next_retry_time,
            retry_count: self.retry_count,
            holder: self.holder,
            fencing_token: self.fencing_token,
            step: self.step,
            last_reason: self.last_reason,
            modified_at: self.modified_at,
        })
    }
}

const SELECT_REQUEST: &str = "\
SELECT id, request_type, status, sort_time, created_at, business_name, documents_released,
       operational_hold, menu_registered, logo_registered, previous_step_approved, econtract_ref,
       target_store_number, owner_number, store_number, campaign_id, decided_by
  FROM approval_request WHERE id = $1";

// The two candidate queries. Conditions and ORDER BY follow the partial
// index `approval_request_open_candidates` (request_type, status, sort_time)
// INCLUDE (id, target_store_number), so the request side is one index-only
// range read in order and LIMIT stops it; each row costs one unique-index
// probe of the state table. Open statuses sort ING < PENDING < RETRY. A
// union of a new-request and a due-retry branch was measured and rejected:
// docs/BENCHMARKS.md.
const OWNER_CANDIDATES: &str = "\
SELECT r.id AS request_id, s.id AS state_id
  FROM approval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ('ING', 'PENDING', 'RETRY')
   AND r.request_type = 'OWNER_CONTRACT'
   AND r.sort_time >= $1
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
 ORDER BY r.status, r.sort_time
 LIMIT $4";

// Ad contracts also need the store they advertise.
const AD_CANDIDATES: &str = "\
SELECT r.id AS request_id, s.id AS state_id
  FROM approval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ('ING', 'PENDING', 'RETRY')
   AND r.request_type = 'AD_CONTRACT'
   AND r.sort_time >= $1
   AND r.target_store_number IS NOT NULL
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
 ORDER BY r.status, r.sort_time
 LIMIT $4";

/// The candidate SQL for a type; `None` for types that are not auto-approvable.
pub fn candidate_sql(request_type: RequestType) -> Option<&'static str> {
    match request_type {
        RequestType::OwnerContract => Some(OWNER_CANDIDATES),
        RequestType::AdContract => Some(AD_CANDIDATES),
        _ => None,
    }
}

// Every write after a claim carries the fence condition
// `status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3`.

/// Access to the request, ledger, memo and state tables.
#[derive(Clone, Debug)]
pub struct Store {
    primary: PgPool,
    read: PgPool,
}

// === impl Store ===

impl Store {
    /// Connects both pools; the read pool is the primary when no replica is set.
    pub async fn connect(config: &DatabaseConfig) -> Result<Self, StoreError> {
        if config.db_max_connections == 0 {
            return Err(StoreError::Config {
                setting: "--db-max-connections",
                message: "must be at least 1".into(),
            });
        }
        let options = || {
            PgPoolOptions::new()
                .max_connections(config.db_max_connections)
                .acquire_timeout(Duration::from_secs(10))
        };
        let primary = options()
            .connect(&config.database_url)
            .await
            .map_err(db("connect to the primary"))?;
        let read = match &config.read_database_url {
            Some(url) => options()
                .connect(url)
                .await
                .map_err(db("connect to the read replica"))?,
            None => primary.clone(),
        };
        Ok(Self { primary, read })
    }

    /// A store over existing pools.
    pub fn new(primary: PgPool, read: PgPool) -> Self {
        Self { primary, read }
    }

    /// The primary pool (for LISTEN and for tests' fixtures).
    pub fn primary(&self) -> &PgPool {
        &self.primary
    }

    /// Applies the migrations in `migrations/`; a no-op when they are applied.
    pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations").run(pool).await?;
        Ok(())
    }

    /// Runs the thin candidate query on the read pool.
    pub async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, StoreError> {
        let Some(sql) = candidate_sql(query.request_type) else {
            return Ok(Vec::new());
        };
        let (shards, shard_count) = match &query.shards {
            Some(f) => (Some(f.shards.clone()), f.shard_count.max(1)),
            None => (None, 1),
        };
        let rows: Vec<(i64, Option<i64>)> = sqlx::query_as(sql)
            .bind(query.window_start)
            .bind(query.now)
            .bind(query.retry_limit)
            .bind(query.limit)
            .bind(shards)
            .bind(shard_count)
            .fetch_all(&self.read)
            .await
            .map_err(db("candidate query"))?;
        Ok(rows
            .into_iter()
            .map(|(request_id, state_id)| Candidate {
                request_id,
                request_type: query.request_type,
                state_id,
            })
            .collect())
    }

    /// Re-reads a request from the primary.
    pub async fn request(&self, request_id: i64) -> Result<Option<Request>, StoreError> {
        let row: Option<RequestRow> = sqlx::query_as(SELECT_REQUEST)
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("re-read request"))?;
        row.map(RequestRow::into_request).transpose()
    }

    /// Reads a request's state row from the primary.
    pub async fn state(&self, request_id: i64) -> Result<Option<State>, StoreError> {
        let row: Option<StateRow> = sqlx::query_as(
            "SELECT id, request_id, status, next_retry_time, retry_count, holder, fencing_token, \
                    step, last_reason, modified_at
               FROM auto_approve_state WHERE request_id = $1",
        )
        .bind(request_id)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("read state"))?;
        row.map(StateRow::into_state).transpose()
    }

    /// Claims a candidate on the primary: an INSERT for a new request (the
    /// UNIQUE(request_id) lets exactly one racer win), a conditional UPDATE
    /// for a due retry. Check and write are one statement, so nothing is held
    /// while the chain runs. A sharded fence also needs its token to be the
    /// shard's current one (migration 0008).
    pub async fn claim(
        &self,
        candidate: &Candidate,
        fence: &Fence,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<ClaimOutcome, StoreError> {
        let shard_count = fence.shard_count.map(|k| k as i32);
        let row: Option<(i64, i32, i32)> = match candidate.state_id {
            None => sqlx::query_as(
                "INSERT INTO auto_approve_state
                        (request_id, request_type, status, holder, fencing_token, created_at, modified_at)
                 SELECT $1, $2, 'IN_PROGRESS', $3, $4, $5, $5
                  WHERE $6::int IS NULL OR EXISTS (
                        SELECT 1 FROM shard_fence f
                         WHERE f.shard_count = $6 AND f.shard = $1 % $6 AND f.token = $4
                           FOR SHARE)
                 ON CONFLICT (request_id) DO NOTHING
                 RETURNING id, retry_count, transient_streak",
            )
            .bind(candidate.request_id)
            .bind(candidate.request_type.as_str())
            .bind(&fence.holder)
            .bind(fence.token)
            .bind(now)
            .bind(shard_count)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("claim new request"))?,
            Some(state_id) => sqlx::query_as(
                "UPDATE auto_approve_state
                    SET status = 'IN_PROGRESS', holder = $3, fencing_token = $4, modified_at = $5,
                        woken_at = NULL
                  WHERE id = $1 AND request_id = $2 AND status = 'RETRY_WAITING'
                    AND next_retry_time <= $5 AND retry_count < $6
                    AND ($7::int IS NULL OR EXISTS (
                        SELECT 1 FROM shard_fence f
                         WHERE f.shard_count = $7 AND f.shard = $2 % $7 AND f.token = $4
                           FOR SHARE))
                 RETURNING id, retry_count, transient_streak",
            )
            .bind(state_id)
            .bind(candidate.request_id)
            .bind(&fence.holder)
            .bind(fence.token)
            .bind(now)
            .bind(retry_limit)
            .bind(shard_count)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("claim due retry"))?,
        };
        Ok(match row {
            Some((state_id, retry_count, transient_streak)) => ClaimOutcome::Won(Claim {
                state_id,
                request_id: candidate.request_id,
                retry_count,
                transient_streak,
                fence: fence.clone(),
            }),
            None => ClaimOutcome::Lost,
        })
    }

    /// Touches the claim so the cleanser sees it is alive; false when the
    /// fence no longer matches (the claim is lost: stop writing).
    pub async fn heartbeat(
        &self,
        claim: &Claim,
        step: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE auto_approve_state SET modified_at = $4, step = $5
              WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3",
        )
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(now)
        .bind(step)
        .execute(&self.primary)
        .await
        .map_err(db("heartbeat"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Moves a claimed request to RETRY_WAITING with retry_count + 1 and
    /// appends a memo when the reason changed. Returns the new retry count,
    /// `None` when the fence no longer matches.
    pub async fn schedule_retry(
        &self,
        claim: &Claim,
        retry: &RetryWrite<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<(i32, DateTime<Utc>)>, StoreError> {
        let row: Option<(i32, DateTime<Utc>)> = sqlx::query_as(
            "WITH old AS (
                 SELECT id, last_reason FROM auto_approve_state
                  WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3
                    FOR UPDATE
             ), upd AS (
                 UPDATE auto_approve_state s
                    SET status = 'RETRY_WAITING', retry_count = s.retry_count + 1,
                        transient_streak = CASE WHEN $5 THEN s.transient_streak + 1 ELSE 0 END,
                        next_retry_time = CASE WHEN s.woken_at IS NULL THEN $4 ELSE LEAST($4, $8) END,
                        woken_at = NULL, last_reason = $6, step = $7, modified_at = $8
                   FROM old WHERE s.id = old.id
                 RETURNING s.request_id, s.retry_count, s.next_retry_time, old.last_reason AS old_reason
             ), memo AS (
                 INSERT INTO approval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $8, 'autoapproval', 'auto-approval waits: ' || $6
                   FROM upd WHERE old_reason IS DISTINCT FROM $6
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
        .fetch_optional(&self.primary)
        .await
        .map_err(db("schedule retry"))?;
        Ok(row)
    }

    /// Approves the request and deletes the state row, in one transaction,
    /// only while the fence matches.
    pub async fn complete(
        &self,
        claim: &Claim,
        now: DateTime<Utc>,
    ) -> Result<Completion, StoreError> {
        let mut tx = self.begin("complete").await?;
        let deleted = sqlx::query(DELETE_FENCED)
            .bind(claim.state_id)
            .bind(&claim.fence.holder)
            .bind(claim.fence.token)
            .execute(&mut *tx)
            .await
            .map_err(db("complete: delete state"))?;
        if deleted.rows_affected() == 0 {
            return Ok(Completion::Stale);
        }
        let approved = sqlx::query(
            "UPDATE approval_request
                SET status = 'APPROVED', decided_at = $2, decided_by = 'autoapproval', updated_at = $2
              WHERE id = $1 AND status IN ('ING', 'PENDING', 'RETRY')",
        )
        .bind(claim.request_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db("complete: approve request"))?;
        tx.commit().await.map_err(db("complete: commit"))?;
        Ok(if approved.rows_affected() == 1 {
            Completion::Approved
        } else {
            Completion::RequestClosed
        })
    }

    /// Deletes our own state row without touching the request (a person
    /// decided, or the request vanished). False when the fence no longer matches.
    pub async fn drop_claim(&self, claim: &Claim) -> Result<bool, StoreError> {
        let done = sqlx::query(DELETE_FENCED)
            .bind(claim.state_id)
            .bind(&claim.fence.holder)
            .bind(claim.fence.token)
            .execute(&self.primary)
            .await
            .map_err(db("drop claim"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives a claim back (shutdown, lost shard): due again at once, no retry
    /// counted. False when the fence no longer matches.
    pub async fn release(&self, claim: &Claim, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE auto_approve_state
                SET status = 'RETRY_WAITING', next_retry_time = $4, modified_at = $4
              WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3",
        )
        .bind(claim.state_id)
        .bind(&claim.fence.holder)
        .bind(claim.fence.token)
        .bind(now)
        .execute(&self.primary)
        .await
        .map_err(db("release"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Stores the owner number the owner service returned, under the fence.
    pub async fn save_owner_number(
        &self,
        claim: &Claim,
        owner_number: i64,
    ) -> Result<bool, StoreError> {
        self.save_result(claim, SAVE_OWNER_NUMBER, ResultValue::Int(owner_number))
            .await
    }

    /// Stores the store number the store service returned, under the fence.
    pub async fn save_store_number(
        &self,
        claim: &Claim,
        store_number: i64,
    ) -> Result<bool, StoreError> {
        self.save_result(claim, SAVE_STORE_NUMBER, ResultValue::Int(store_number))
            .await
    }

    /// Stores the campaign id the ad service returned, under the fence.
    pub async fn save_campaign_id(
        &self,
        claim: &Claim,
        campaign_id: &str,
    ) -> Result<bool, StoreError> {
        self.save_result(claim, SAVE_CAMPAIGN_ID, ResultValue::Text(campaign_id))
            .await
    }

    async fn save_result(
        &self,
        claim: &Claim,
        sql: &'static str,
        value: ResultValue<'_>,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(sql)
            .bind(claim.state_id)
            .bind(&claim.fence.holder)
            .bind(claim.fence.token);
        let query = match value {
            ResultValue::Int(v) => query.bind(v),
            ResultValue::Text(v) => query.bind(v),
        };
        let done = query
            .bind(claim.request_id)
            .execute(&self.primary)
            .await
            .map_err(db("save result"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The e-contract status our ledger holds, if any.
    pub async fn econtract_status(&self, contract_ref: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> =
            sqlx::query_as("SELECT status FROM econtract WHERE contract_ref = $1")
                .bind(contract_ref)
                .fetch_optional(&self.primary)
                .await
                .map_err(db("read e-contract"))?;
        Ok(row.map(|(s,)| s))
    }

    /// Records what the e-sign system says about a contract, synced by the
    /// chain of `request_id`.
    pub async fn sync_econtract(
        &self,
        request_id: i64,
        contract_ref: &str,
        status: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // One statement, one round-trip: the transaction-local setting,
        // read by the econtract trigger (migration 0007), lasts until the
        // statement's implicit transaction ends, after the trigger fired.
        sqlx::query(
            "INSERT INTO econtract (contract_ref, status, synced_at)
             SELECT $1, $2, $3 FROM (SELECT set_config('autoapproval.syncing_request', $4, true)) AS origin
             ON CONFLICT (contract_ref) DO UPDATE SET status = EXCLUDED.status, synced_at = EXCLUDED.synced_at",
        )
        .bind(contract_ref)
        .bind(status)
        .bind(now)
        .bind(request_id.to_string())
        .execute(&self.primary)
        .await
        .map_err(db("sync e-contract"))?;
        Ok(())
    }

    /// Appends a memo to a request's history.
    pub async fn add_memo(
        &self,
        request_id: i64,
        message: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO approval_request_memo (request_id, created_at, author, message)
             VALUES ($1, $2, 'autoapproval', $3)",
        )
        .bind(request_id)
        .bind(now)
        .bind(message)
        .execute(&self.primary)
        .await
        .map_err(db("add memo"))?;
        Ok(())
    }

    /// A request's memos, oldest first.
    pub async fn memos(&self, request_id: i64) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT message FROM approval_request_memo WHERE request_id = $1 ORDER BY id",
        )
        .bind(request_id)
        .fetch_all(&self.primary)
        .await
        .map_err(db("read memos"))?;
        Ok(rows.into_iter().map(|(m,)| m).collect())
    }

    /// The cleanser's pass: stuck claims back to RETRY_WAITING (with a memo
    /// and retry_count + 1, so a request that kills its worker every time
    /// still reaches the limit), then rows of terminal or vanished requests
    /// deleted. Rows at the retry limit match neither and stay.
    pub async fn cleanse(
        &self,
        stuck_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<CleanseReport, StoreError> {
        let recovered: Vec<(i64,)> = sqlx::query_as(
            "WITH stuck AS (
                 UPDATE auto_approve_state
                    SET status = 'RETRY_WAITING', next_retry_time = $2, modified_at = $2,
                        retry_count = retry_count + 1, last_reason = 'recovered: claim was stuck'
                  WHERE status = 'IN_PROGRESS' AND modified_at < $1
                 RETURNING request_id, holder
             ), memo AS (
                 INSERT INTO approval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $2, 'autoapproval-cleanser',
                        'auto-approval was interrupted on ' || holder || '; retrying'
                   FROM stuck
             )
             SELECT request_id FROM stuck ORDER BY request_id",
        )
        .bind(stuck_before)
        .bind(now)
        .fetch_all(&self.primary)
        .await
        .map_err(db("cleanse stuck claims"))?;
        let deleted = sqlx::query(
            "DELETE FROM auto_approve_state s
              WHERE NOT EXISTS (SELECT 1 FROM approval_request r
                                 WHERE r.id = s.request_id AND r.status IN ('ING', 'PENDING', 'RETRY'))",
        )
        .execute(&self.primary)
        .await
        .map_err(db("cleanse finished rows"))?;
        Ok(CleanseReport {
            recovered: recovered.into_iter().map(|(id,)| id).collect(),
            deleted: deleted.rows_affected(),
        })
    }

    /// Makes waiting requests due at `now` because a fact their filters read
    /// changed, and marks running ones so the retry they schedule is due at
    /// once; returns the requests touched. Retry counts stay. The triggers
    /// record the same wake with every change (migration 0009); this is for
    /// a caller that knows of a change the database did not see.
    pub async fn wake(
        &self,
        request_ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<i64>, StoreError> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "UPDATE auto_approve_state
                SET next_retry_time = CASE WHEN status = 'RETRY_WAITING' THEN $2 ELSE next_retry_time END,
                    woken_at = CASE WHEN status = 'IN_PROGRESS' THEN $2 ELSE woken_at END
              WHERE request_id = ANY($1)
                AND ((status = 'RETRY_WAITING' AND next_retry_time > $2) OR status = 'IN_PROGRESS')
             RETURNING request_id",
        )
        .bind(request_ids)
        .bind(now)
        .fetch_all(&self.primary)
        .await
        .map_err(db("wake waiting requests"))?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Deletes the waiting state row of a request that is no longer open (a
    /// person decided); an IN_PROGRESS row is left to its holder.
    pub async fn forget_closed(&self, request_id: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM auto_approve_state s
              WHERE s.request_id = $1 AND s.status = 'RETRY_WAITING'
                AND NOT EXISTS (SELECT 1 FROM approval_request r
                                 WHERE r.id = s.request_id AND r.status IN ('ING', 'PENDING', 'RETRY'))",
        )
        .bind(request_id)
        .execute(&self.primary)
        .await
        .map_err(db("forget closed request"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives back every claim `holder` still holds under one of `tokens`
    /// (graceful shutdown): due again at once, no retry counted. Returns the
    /// requests released.
    pub async fn release_all(
        &self,
        holder: &str,
        tokens: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<i64>, StoreError> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "UPDATE auto_approve_state
                SET status = 'RETRY_WAITING', next_retry_time = $3, modified_at = $3
              WHERE status = 'IN_PROGRESS' AND holder = $1 AND fencing_token = ANY($2)
             RETURNING request_id",
        )
        .bind(holder)
        .bind(tokens)
        .bind(now)
        .fetch_all(&self.primary)
        .await
        .map_err(db("release held claims"))?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// For each of `request_ids` that exists: its status and, when decided,
    /// when (the decision time, else the last update).
    pub async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, StoreError> {
        let rows: Vec<(i64, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT id, status, COALESCE(decided_at, updated_at)
               FROM approval_request WHERE id = ANY($1)",
        )
        .bind(request_ids)
        .fetch_all(&self.read)
        .await
        .map_err(db("read request statuses"))?;
        Ok(rows
            .into_iter()
            .map(|(request_id, status, changed_at)| RequestStatusRow {
                request_id,
                status: status
                    .parse()
                    .map_err(|error| StoreError::Malformed { request_id, error }),
                changed_at,
            })
            .collect())
    }

    /// The current fencing token of a shard, if it was ever fenced.
    pub async fn shard_token(
        &self,
        shard_count: u32,
        shard: u32,
    ) -> Result<Option<i64>, StoreError> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT token FROM shard_fence WHERE shard_count = $1 AND shard = $2")
                .bind(shard_count as i32)
                .bind(shard as i32)
                .fetch_optional(&self.primary)
                .await
                .map_err(db("read shard token"))?;
        Ok(row.map(|(t,)| t))
    }

    /// Raises a shard's fencing token to `token` for `holder`, and recovers
    /// every claim of the shard made under an older token (back to
    /// RETRY_WAITING, due now, retry_count + 1, with a memo), in one
    /// transaction. Token 0 marks a claim outside coordination (a manual
    /// path): only the stuck-age cleanser recovers those. `None` when the shard already has a token at or above
    /// `token`: someone acquired it later, nothing was written.
    pub async fn fence_shard(
        &self,
        shard_count: u32,
        shard: u32,
        token: i64,
        holder: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<i64>>, StoreError> {
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
                    SET status = 'RETRY_WAITING', next_retry_time = $5, modified_at = $5,
                        retry_count = retry_count + 1,
                        last_reason = 'recovered: shard ' || $2 || ' moved to ' || $4
                  WHERE status = 'IN_PROGRESS' AND request_id % $1 = $2
                    AND fencing_token > 0 AND fencing_token < $3
                 RETURNING request_id, holder
             ), memo AS (
                 INSERT INTO approval_request_memo (request_id, created_at, author, message)
                 SELECT request_id, $5, 'autoapproval-cleanser',
                        'auto-approval was interrupted on ' || holder || '; retrying'
                   FROM orphaned
             )
             SELECT request_id FROM orphaned ORDER BY request_id",
        )
        .bind(i64::from(shard_count))
        .bind(i64::from(shard))
        .bind(token)
        .bind(holder)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("fence shard: recover orphaned claims"))?;
        tx.commit().await.map_err(db("fence shard: commit"))?;
        Ok(Some(recovered.into_iter().map(|(id,)| id).collect()))
    }

    /// One round-trip to the primary, for the readiness probe.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.primary)
            .await
            .map_err(db("ping"))?;
        Ok(())
    }

    /// Listens on the primary for the request-changed notifications.
    pub async fn request_changes(&self) -> Result<RequestChanges, StoreError> {
        let mut listener = PgListener::connect_with(&self.primary)
            .await
            .map_err(db("connect listener"))?;
        listener
            .listen(REQUEST_CHANGED_CHANNEL)
            .await
            .map_err(db("listen"))?;
        Ok(RequestChanges { listener })
    }

    async fn begin(
        &self,
        operation: &'static str,
    ) -> Result<Transaction<'_, Postgres>, StoreError> {
        self.primary.begin().await.map_err(db(operation))
    }
}

const DELETE_FENCED: &str = "\
DELETE FROM auto_approve_state
 WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3";

// A result is saved only while the claim is still ours.
const SAVE_OWNER_NUMBER: &str = "\
UPDATE approval_request SET owner_number = $4, updated_at = now()
 WHERE id = $5 AND EXISTS (SELECT 1 FROM auto_approve_state
     WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3)";
const SAVE_STORE_NUMBER: &str = "\
UPDATE approval_request SET store_number = $4, updated_at = now()
 WHERE id = $5 AND EXISTS (SELECT 1 FROM auto_approve_state
     WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3)";
const SAVE_CAMPAIGN_ID: &str = "\
UPDATE approval_request SET campaign_id = $4, updated_at = now()
 WHERE id = $5 AND EXISTS (SELECT 1 FROM auto_approve_state
     WHERE id = $1 AND status = 'IN_PROGRESS' AND holder = $2 AND fencing_token = $3)";

enum ResultValue<'a> {
    Int(i64),
    Text(&'a str),
}
