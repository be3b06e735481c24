//! Claims and every write made under one: the claim itself, heartbeats,
//! results, retries, completion and release. Each write after the claim is
//! conditional on the fence `status = 'IN_PROGRESS' AND holder = $2 AND
//! fencing_token = $3 AND claim_nonce = $4`, so a replica that lost its
//! claim writes nothing, nor does a chain of an earlier claim of the same
//! replica and shard generation (the nonce, migration 0017).

use chrono::{DateTime, Utc};

use super::{DbError, FleetPause};
use crate::domain::{Candidate, Claim, Facts, Fence, RequestStatus};

/// The outcome of a claim attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This worker holds the request now.
    Won(Claim),
    /// Another worker got there first, or the retry is no longer due.
    Lost,
    /// A new request's claim refused because the request is no longer open
    /// on the primary: decided (by an earlier attempt or a person), or gone
    /// (`None`). Nothing was written. A lagging read replica's candidates of
    /// requests approved meanwhile end here, without a chain.
    Closed(Option<RequestStatus>),
    /// Refused because the whole fleet is paused (`autoapproval pause
    /// --all`): every claim statement tests the pause, so none is won
    /// once it is committed. Nothing was written.
    FleetPaused(FleetPause),
}

impl ClaimOutcome {
    /// Why a new request's claim wrote nothing, from the request's status
    /// on the primary read after it (`None`: no such request): decided, or
    /// else lost to another worker (or paused). The claim refuses only a
    /// known decision, so a status this controller does not know is claimed
    /// and reported by the chain's re-read (`malformed_rows`), not here.
    pub(super) fn refused(status: Option<&str>) -> ClaimOutcome {
        let Some(status) = status else {
            return ClaimOutcome::Closed(None);
        };
        match status.parse::<RequestStatus>() {
            Ok(status) if !status.is_open() => ClaimOutcome::Closed(Some(status)),
            _ => ClaimOutcome::Lost,
        }
    }

    /// A refused claim (`refused` for a new request, `Lost` for a due
    /// retry) explained by the fleet's pause when one stands: a decided
    /// request stays Closed, whatever the pause.
    pub(super) fn or_fleet_paused(self, fleet: Option<FleetPause>) -> ClaimOutcome {
        match (self, fleet) {
            (ClaimOutcome::Lost, Some(pause)) => ClaimOutcome::FleetPaused(pause),
            (outcome, _) => outcome,
        }
    }
}

/// A claim's nonce: random, never 0 (the manual claims' value).
pub(super) fn fresh_nonce() -> i64 {
    use rand::Rng;
    rand::rng().random_range(1..=i64::MAX)
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
    /// The claim is ours but a fact changed after the claim: a wake is
    /// pending (the claim consumes the wakes before it), or the locked
    /// request row or the ledger no longer says what the gates passed on
    /// (with or without a wake trigger). Nothing was written.
    Woken,
}

/// What a step's external call returned, to be kept on the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepResult<'a> {
    /// The owner service's owner number.
    OwnerNumber(i64),
    /// The store service's store number.
    StoreNumber(i64),
    /// The ad service's campaign id for the creation sent under `key`; it
    /// is also recorded as that key's result ([`Database::sent_result`]), which
    /// a retry of the ad step compares with.
    CampaignId {
        /// The idempotency key the creation was sent under.
        key: &'a str,
        /// What the ad service answered.
        campaign_id: &'a str,
    },
}

/// A retry to record.
#[derive(Clone, Debug)]
pub struct RetryWrite<'a> {
    /// When it is due.
    pub next_retry_time: DateTime<Utc>,
    /// Whether the failure was transient (grows the backoff streak).
    pub transient: bool,
    /// Whether it counts towards the retry limit (a failure, not a wait).
    pub counted: bool,
    /// Why, for the CR status and the memo.
    pub reason: &'a str,
    /// The step that asked for it.
    pub step: &'a str,
}

interface! {
    /// Claims: see the methods on [`Database`].
    trait Claims {
        /// Claims a candidate on the primary: an INSERT for a new request (the
        /// UNIQUE(request_id) lets exactly one racer win; only while the request
        /// is open there, else [`ClaimOutcome::Closed`]), a conditional UPDATE
        /// for a due retry. Check and write are one statement, so nothing is held
        /// while the chain runs. A sharded fence also needs its token to be the
        /// shard's current one (migration 0008), a paused request is never
        /// claimed (migration 0014), nor anything while the fleet is paused
        /// ([`ClaimOutcome::FleetPaused`]).
        #[tracing::instrument(name = "store.claim", skip_all)]
        fn claim(
            &self,
            candidate: &Candidate,
            fence: &Fence,
            now: DateTime<Utc>,
            retry_limit: i32,
        ) -> Result<ClaimOutcome, DbError>;
        /// A person asked for a retry now: a waiting request becomes due at
        /// `now`, an exhausted one gets one more attempt, and `note` goes to its
        /// memo. False when nothing waits (no state row, or a claim running).
        #[tracing::instrument(name = "store.retry_now", skip_all)]
        fn retry_now(
            &self,
            request_id: i64,
            retry_limit: i32,
            note: &str,
            now: DateTime<Utc>,
        ) -> Result<bool, DbError>;
        /// Touches the claim so the cleanser sees it is alive (in the database's
        /// clock, which the cleanser compares with); false when the fence no
        /// longer matches (the claim is lost: stop writing).
        #[tracing::instrument(name = "store.heartbeat", skip_all)]
        fn heartbeat(&self, claim: &Claim, step: &str) -> Result<bool, DbError>;
        /// Moves a claimed request to RETRY_WAITING, with retry_count + 1 when
        /// the retry is `counted` (a failure; a wait for a condition is not), and
        /// appends a memo when the reason changed. Returns the new retry count,
        /// `None` when the fence no longer matches.
        #[tracing::instrument(name = "store.schedule_retry", skip_all)]
        fn schedule_retry(
            &self,
            claim: &Claim,
            retry: &RetryWrite<'_>,
            now: DateTime<Utc>,
        ) -> Result<Option<(i32, DateTime<Utc>)>, DbError>;
        /// Approves the request and deletes the state row (and, when it
        /// approves, the bodies recorded for it), in one transaction, only
        /// while the fence matches, no wake is pending, and the request row
        /// (locked, its newest version) and the ledger still hold the
        /// `facts` the gates passed on ([`Completion::Woken`] otherwise).
        #[tracing::instrument(name = "store.complete", skip_all)]
        fn complete(&self, claim: &Claim, facts: &Facts) -> Result<Completion, DbError>;
        /// Deletes our own state row without touching the request (a person
        /// decided, or the request vanished). False when the fence no longer matches.
        #[tracing::instrument(name = "store.drop_claim", skip_all)]
        fn drop_claim(&self, claim: &Claim) -> Result<bool, DbError>;
        /// Gives a claim back (shutdown, lost shard): due again at once, no retry
        /// counted. False when the fence no longer matches.
        #[tracing::instrument(name = "store.release", skip_all)]
        fn release(&self, claim: &Claim, now: DateTime<Utc>) -> Result<bool, DbError>;
        /// Saves what a step's external call returned on the request, under
        /// the fence; false when the fence no longer matches.
        #[tracing::instrument(name = "store.save_result", skip_all)]
        fn save_result(&self, claim: &Claim, result: StepResult<'_>) -> Result<bool, DbError>;
        /// Records `body` as what is sent under idempotency key `key`, under
        /// the fence, unless a body is recorded for that key already; the
        /// recorded body (the earlier one when there is one), `None` when the
        /// fence no longer matches. Called before the creation is sent, so a
        /// retry resends the same body under the same key (migration 0018).
        #[tracing::instrument(name = "store.record_sent", skip_all)]
        fn record_sent(
            &self,
            claim: &Claim,
            key: &str,
            body: &str,
        ) -> Result<Option<String>, DbError>;
        /// The result saved from the creation sent under `key`, if any.
        #[tracing::instrument(name = "store.sent_result", skip_all)]
        fn sent_result(
            &self,
            request_id: i64,
            key: &str,
        ) -> Result<Option<String>, DbError>;
        /// The keys bodies were recorded under for `request_id`, each with
        /// whether the downstream refused its body ([`Database::refuse_sent`]).
        #[tracing::instrument(name = "store.sent_keys", skip_all)]
        fn sent_keys(&self, request_id: i64) -> Result<Vec<SentKey>, DbError>;
        /// Marks the body recorded under `key` as refused by the downstream
        /// (400 or 422: nothing was created), under the fence: the key is
        /// ended, and the next attempt records a new body under the next
        /// key. False when the fence no longer matches (migration 0003 on
        /// PostgreSQL, 0002 on MySQL).
        #[tracing::instrument(name = "store.refuse_sent", skip_all)]
        fn refuse_sent(&self, claim: &Claim, key: &str) -> Result<bool, DbError>;
    }
}

/// A key a body was recorded under, as [`Database::sent_keys`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentKey {
    /// The `Idempotency-Key` the body was (or is about to be) sent under.
    pub key: String,
    /// Whether the downstream refused that body (the key is ended).
    pub refused: bool,
}

/// `sent_keys` of `impl Claims for <backend>`, whose SQL differs between
/// the backends only in its placeholder ("$1" or "?").
macro_rules! sent_keys {
    ($request:literal) => {
        async fn sent_keys(
            &self,
            request_id: i64,
        ) -> Result<Vec<$crate::db::SentKey>, $crate::db::DbError> {
            let rows: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
                sqlx::query_as(concat!(
                    "SELECT idempotency_key, refused_at FROM auto_approve_sent WHERE request_id = ",
                    $request
                ))
                .bind(request_id)
                .fetch_all(&self.primary)
                .await
                .map_err(db("read sent keys"))?;
            Ok(rows
                .into_iter()
                .map(|(key, refused_at)| $crate::db::SentKey {
                    key,
                    refused: refused_at.is_some(),
                })
                .collect())
        }
    };
}
pub(super) use sent_keys;

/// `sent_result` of `impl Claims for <backend>`, whose SQL differs between
/// the backends only in its placeholders ("$1", "$2" or "?", "?").
macro_rules! sent_result {
    ($request:literal, $key:literal) => {
        async fn sent_result(
            &self,
            request_id: i64,
            key: &str,
        ) -> Result<Option<String>, $crate::db::DbError> {
            let row: Option<(Option<String>,)> = sqlx::query_as(concat!(
                "SELECT result FROM auto_approve_sent WHERE request_id = ",
                $request,
                " AND idempotency_key = ",
                $key
            ))
            .bind(request_id)
            .bind(key)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read sent result"))?;
            Ok(row.and_then(|(result,)| result))
        }
    };
}
pub(super) use sent_result;

/// `query` with the claim's fence bound after its own parameters: state
/// id, holder, token, nonce, in that order.
macro_rules! bind_fence {
    ($query:expr, $claim:expr) => {
        $query
            .bind($claim.state_id)
            .bind(&$claim.fence.holder)
            .bind($claim.fence.token)
            .bind($claim.nonce)
    };
}
pub(super) use bind_fence;

/// The one-statement writes under the fence of `impl Claims for
/// <backend>`, each given its SQL: its own parameter first (the step, none,
/// the due time), then the fence ([`bind_fence`]). True when the fence
/// matched and the row was written.
macro_rules! fenced_writes {
    (heartbeat: $heartbeat:expr, drop: $drop:expr, release: $release:expr $(,)?) => {
        async fn heartbeat(
            &self,
            claim: &$crate::domain::Claim,
            step: &str,
        ) -> Result<bool, $crate::db::DbError> {
            let done = bind_fence!(sqlx::query($heartbeat).bind(step), claim)
                .execute(&self.primary)
                .await
                .map_err(db("heartbeat"))?;
            Ok(done.rows_affected() == 1)
        }

        async fn drop_claim(
            &self,
            claim: &$crate::domain::Claim,
        ) -> Result<bool, $crate::db::DbError> {
            let done = bind_fence!(sqlx::query($drop), claim)
                .execute(&self.primary)
                .await
                .map_err(db("drop claim"))?;
            Ok(done.rows_affected() == 1)
        }

        async fn release(
            &self,
            claim: &$crate::domain::Claim,
            now: chrono::DateTime<chrono::Utc>,
        ) -> Result<bool, $crate::db::DbError> {
            let done = bind_fence!(sqlx::query($release).bind(now), claim)
                .execute(&self.primary)
                .await
                .map_err(db("release"))?;
            Ok(done.rows_affected() == 1)
        }
    };
}
pub(super) use fenced_writes;
