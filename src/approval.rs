//! One attempt at one request: claim, run the chain while heartbeating,
//! write the outcome under the fence.

#[cfg(feature = "test-support")]
mod turn;
#[cfg(feature = "test-support")]
pub use turn::{TurnReport, attempt_all, run_turn};

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{Instrument, debug, info, warn};

use crate::clock::SharedClock;
use crate::db::{
    CandidateQuery, ClaimOutcome, Completion, Database, DbError, RetryWrite, ShadowRecord,
    ShardFilter, WouldDecision,
};
use crate::domain::{Candidate, Claim, Facts, Fence, RequestStatus, RequestType};
use crate::external::ExternalSystems;
use crate::processors::{Chain, ChainContext, ChainError, ChainOutcome, RetryReason, Seen, Step};
use crate::retry::{RetryClass, RetryPolicy};
use crate::telemetry::Metrics;

/// How often a running chain checks that its shard is still held: the
/// longest it can run on after the loss, far below the margin between the
/// renew deadline and the Lease's expiry (at least 2 × --retry-period).
const STANDING_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The reason of a completion refused for a pending wake (state row, CR, memo).
pub const WOKEN_BEFORE_COMPLETION: &str =
    "a fact changed while the attempt ran; checked again before approving";

/// The reason a request shadow mode would have approved waits under.
pub const SHADOW_WOULD_APPROVE: &str =
    "shadow mode: every gate passed; would approve (nothing created, the request untouched)";

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Approved by us: the request APPROVED, our state row gone.
    Approved,
    /// Shadow mode: every gate passed, and it would have approved. Nothing
    /// was created or written to the request; the would-decision is
    /// recorded and the state row left waiting until the request changes.
    WouldApprove {
        /// The last step.
        step: Step,
        /// When it would first have approved (recorded once).
        would_approve_at: DateTime<Utc>,
        /// When it is looked at again unless the request changes first.
        next_retry_time: DateTime<Utc>,
    },
    /// Waiting for a retry.
    RetryScheduled {
        /// The step that stopped.
        step: Step,
        /// Why and how long.
        reason: RetryReason,
        /// When it is due.
        next_retry_time: DateTime<Utc>,
        /// Retries so far, this one included.
        retry_count: i32,
    },
    /// Someone else holds the request, or the retry is no longer due.
    NotClaimed,
    /// A person decided meanwhile; our state row is gone, nothing else written.
    Superseded(RequestStatus),
    /// The request row does not exist.
    Vanished,
    /// Our claim was taken over mid-chain; nothing more was written.
    FenceLost,
    /// Not claimed: the whole fleet is paused (`autoapproval pause --all`).
    FleetPaused(crate::db::FleetPause),
}

impl AttemptOutcome {
    /// Stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            AttemptOutcome::Approved => "approved",
            AttemptOutcome::WouldApprove { .. } => "would_approve",
            AttemptOutcome::RetryScheduled { .. } => "retry",
            AttemptOutcome::NotClaimed => "not_claimed",
            AttemptOutcome::Superseded(_) => "superseded",
            AttemptOutcome::Vanished => "vanished",
            AttemptOutcome::FenceLost => "fence_lost",
            AttemptOutcome::FleetPaused(_) => "fleet_paused",
        }
    }
}

/// Whether the controller acts, or only records what it would do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Makes the external creations and writes the outcome to the request.
    #[default]
    Active,
    /// Does everything else (discovery, CRs, claims, every gate against
    /// fresh data) but creates nothing outside and writes nothing to the
    /// business's tables: each request's would-decision is recorded
    /// (`auto_approve_shadow`, the CR status, an Event, metrics).
    Shadow,
}

impl Mode {
    /// The spelling of `--mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Active => "active",
            Mode::Shadow => "shadow",
        }
    }
}

/// How long a request shadow would have approved waits before it is
/// evaluated again: in effect until it changes (a change of its facts makes
/// its row due at once, as for any waiting request) or a start in active
/// mode hands it over. Longer than any window a request is picked up in.
pub const SHADOW_DECIDED_WAIT: Duration = Duration::from_secs(400 * 86_400);

/// How one attempt runs: its retry policy, heartbeat and processing timeout.
#[derive(Clone, Debug)]
pub struct ApproverConfig {
    /// How long each kind of failure waits, and after how many retries it stops.
    pub retry: RetryPolicy,
    /// How often a running chain touches its claim.
    pub heartbeat_interval: Duration,
    /// A chain running longer is stopped and retried as a transient failure.
    pub processing_timeout: Duration,
    /// Acting, or only recording what it would do (`--mode`).
    pub mode: Mode,
}

/// Runs attempts, one per request at a time in this process: for the
/// controller's reconcile (and, with `test-support`, the seed's poll turn).
pub struct Approver {
    store: Database,
    external: ExternalSystems,
    clock: SharedClock,
    metrics: Metrics,
    config: ApproverConfig,
    chain: Chain,
    /// Requests with an attempt in this process, from before its claim
    /// statement until it ends: a claim of ours outside it has no chain.
    /// One attempt per request at a time: a second is refused before its
    /// claim (it would share the first's holder and token, and its end
    /// would take the first's entry away from the sweep).
    running: std::sync::Mutex<HashSet<i64>>,
    /// Taken to join `running`, and by the sweep for its whole statement,
    /// so no claim can start between the sweep's look and its release.
    joining: tokio::sync::Mutex<()>,
}

/// Keeps a request in [`Approver`]'s running set while its attempt lasts;
/// only the attempt that put it there holds one.
struct Running<'a> {
    running: &'a std::sync::Mutex<HashSet<i64>>,
    request_id: i64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.request_id);
    }
}

// === impl Approver ===

impl Approver {
    /// With the chain owner → store for owner contracts, ad campaign for ads.
    pub fn new(
        store: Database,
        external: ExternalSystems,
        clock: SharedClock,
        metrics: Metrics,
        config: ApproverConfig,
    ) -> Self {
        Self {
            store,
            external,
            clock,
            metrics,
            config,
            chain: Chain::default(),
            running: std::sync::Mutex::default(),
            joining: tokio::sync::Mutex::const_new(()),
        }
    }

    /// Gives back the claims `holder` holds under `tokens` that no attempt
    /// of this process is working on: a chain whose outcome could not be
    /// written (the database failed under it, and then the release too)
    /// leaves its claim IN_PROGRESS with nobody on it. Due again at once.
    pub async fn release_idle(&self, holder: &str, tokens: &[i64]) -> Result<Vec<i64>, DbError> {
        let _joining = self.joining.lock().await;
        let running: Vec<i64> = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        let released = self
            .store
            .release_all(holder, tokens, &running, self.clock.now())
            .await?;
        for request_id in &released {
            warn!(
                request_id,
                "released a claim no chain was working on; it is due again"
            );
        }
        Ok(released)
    }

    /// Joins the running set; `None` when another attempt of this process
    /// is on `request_id` already (and stays there).
    async fn join_running(&self, request_id: i64) -> Option<Running<'_>> {
        let _joining = self.joining.lock().await;
        let joined = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(request_id);
        // No guard at all when refused: a guard's drop removes the entry,
        // and the entry is the running attempt's.
        if !joined {
            return None;
        }
        Some(Running {
            running: &self.running,
            request_id,
        })
    }

    /// The database the attempts claim in and write to; reconcile reads
    /// the truth through it.
    pub fn database(&self) -> &Database {
        &self.store
    }

    /// The retry policy, heartbeat and timeout every attempt runs under.
    pub fn config(&self) -> &ApproverConfig {
        &self.config
    }

    /// Claims `candidate` under `fence` and, when won, runs it to an outcome.
    /// A store error after the claim tries to release it, so an error path
    /// never leaves the request IN_PROGRESS when it could give it back.
    pub async fn attempt(
        &self,
        candidate: &Candidate,
        fence: &Fence,
    ) -> Result<AttemptOutcome, DbError> {
        self.attempt_since(candidate, fence, None, &|| true).await
    }

    /// Like [`Approver::attempt`]; a won claim also records the pickup
    /// latency from `eligible_at` (when the request became workable), and
    /// the chain stops at its next await point, and calls nothing more,
    /// once `held` says the fence's shard was lost or its renewal is overdue.
    pub async fn attempt_since(
        &self,
        candidate: &Candidate,
        fence: &Fence,
        eligible_at: Option<DateTime<Utc>>,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<AttemptOutcome, DbError> {
        // The claim's fencing token tells apart two holders' lines about one request.
        let span = tracing::info_span!(
            "attempt",
            request_id = candidate.request_id,
            token = fence.token,
            holder = %fence.holder,
        );
        self.claim_and_run(candidate, fence, eligible_at, held)
            .instrument(span)
            .await
    }

    async fn claim_and_run(
        &self,
        candidate: &Candidate,
        fence: &Fence,
        eligible_at: Option<DateTime<Utc>>,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<AttemptOutcome, DbError> {
        let Some(_running) = self.join_running(candidate.request_id).await else {
            // Discovery's attempt before the cache's sync and the
            // Controller's reconcile of the same CR, say: the one running
            // goes on, this one looks again later.
            self.metrics.claim("already_running");
            debug!(
                request_id = candidate.request_id,
                "an attempt of this replica is running on the request; not claimed"
            );
            return Ok(AttemptOutcome::NotClaimed);
        };
        let now = self.clock.now();
        let claim = match self
            .store
            .claim(candidate, fence, now, self.config.retry.limit)
            .await?
        {
            ClaimOutcome::Won(claim) => {
                if let Some(since) = eligible_at.or(claim.requested_at) {
                    let waited = (now - since).to_std().unwrap_or_default();
                    self.metrics.pickup(waited.as_secs_f64());
                }
                claim
            }
            ClaimOutcome::Lost => {
                self.metrics.claim("lost");
                debug!(request_id = candidate.request_id, "claim lost");
                return Ok(AttemptOutcome::NotClaimed);
            }
            // Decided before our claim: a lagging read replica's stale
            // candidate costs this refused claim and nothing more.
            ClaimOutcome::Closed(Some(status)) => {
                self.metrics.claim("already_done");
                debug!(request_id = candidate.request_id, %status, "claim refused: already decided");
                return Ok(AttemptOutcome::Superseded(status));
            }
            // Nothing is claimed while the fleet is paused: the chains
            // already running finish, the rest wait for the resume.
            ClaimOutcome::FleetPaused(pause) => {
                self.metrics.claim("fleet_paused");
                debug!(request_id = candidate.request_id, pause = %pause.describe(), "not claimed: the fleet is paused");
                return Ok(AttemptOutcome::FleetPaused(pause));
            }
            ClaimOutcome::Closed(None) => {
                self.metrics.claim("vanished");
                warn!(request_id = candidate.request_id, "request vanished");
                return Ok(AttemptOutcome::Vanished);
            }
        };
        self.metrics.claim("won");
        debug!(state_id = claim.state_id, "claimed");
        let current = std::sync::Mutex::new(Step::Owner);
        let result = match self.run_claimed(&claim, &current, held).await {
            Ok(outcome) => Ok(outcome),
            Err(error) => {
                let step = *current.lock().unwrap_or_else(|e| e.into_inner());
                match after_chain_error(&error, step) {
                    Settle::ShardLost => {
                        // The claim stays as it is: the shard's next holder
                        // fences and recovers it, or, when only the renewal
                        // was late, the sweep gives it back.
                        self.metrics.chain_cancelled();
                        warn!(
                            request_id = claim.request_id,
                            "shard lost or its renewal overdue mid-chain; stopped before any further call"
                        );
                        return Ok(AttemptOutcome::FenceLost);
                    }
                    Settle::Park {
                        column,
                        value,
                        reason,
                    } => {
                        // Reported and parked, never lost: it waits the long
                        // interval and is visible in the state row and the memo.
                        self.metrics.malformed_row(column);
                        warn!(request_id = claim.request_id, column, %value, "malformed request row skipped");
                        self.schedule_retry_at(&claim, Step::Owner, reason, None)
                            .await
                    }
                    Settle::Retry { step, reason, due } => {
                        warn!(request_id = claim.request_id, %step, %error, "a database call after the claim failed; retrying with backoff");
                        self.schedule_retry_at(&claim, step, reason, due)
                            .await
                            // Unreachable for this too: the claim is given
                            // back below, and the first failure reported.
                            .map_err(|scheduling| match error {
                                ChainError::Database(first) => first,
                                _ => scheduling,
                            })
                    }
                    // Taken over: no other answer follows an error.
                    _ => {
                        warn!(
                            request_id = claim.request_id,
                            "claim taken over mid-chain; stopping"
                        );
                        return Ok(AttemptOutcome::FenceLost);
                    }
                }
            }
        };
        if result.is_err()
            && let Err(release) = self.store.release(&claim, self.clock.now()).await
        {
            warn!(request_id = claim.request_id, error = %release, "could not release claim after error");
        }
        result
    }

    /// Runs the chain under `claim`, keeping `current` at the step it is in.
    async fn run_claimed(
        &self,
        claim: &Claim,
        current: &std::sync::Mutex<Step>,
        held: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<AttemptOutcome, ChainError> {
        let cx = ChainContext {
            store: &self.store,
            external: &self.external,
            claim,
            clock: self.clock.as_ref(),
            metrics: &self.metrics,
            held,
            seen: &Seen::default(),
            shadow: self.config.mode == Mode::Shadow,
        };
        let on_step = |step: Step| *current.lock().unwrap_or_else(|e| e.into_inner()) = step;
        let chain = self.chain.run(&cx, &on_step);
        tokio::pin!(chain);
        let mut ticker = tokio::time::interval(self.config.heartbeat_interval);
        ticker.tick().await;
        let deadline = tokio::time::sleep(self.config.processing_timeout);
        tokio::pin!(deadline);
        let mut standing = tokio::time::interval(STANDING_CHECK_EVERY);
        standing.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            tokio::select! {
                outcome = &mut chain => break outcome?,
                // Dropping the chain cancels its call in flight: a shard
                // lost, or overdue (another replica may take it once its
                // Lease expires), must not keep calling external systems.
                _ = standing.tick() => {
                    if !held() {
                        return Err(ChainError::ShardLost(claim.request_id));
                    }
                }
                // Dropping the chain abandons its call in flight; the
                // idempotency key makes the retry's call safe.
                () = &mut deadline => {
                    let step = *current.lock().unwrap_or_else(|e| e.into_inner());
                    warn!(request_id = claim.request_id, %step, "chain exceeded the processing timeout");
                    let reason = RetryReason::transient(format!(
                        "processing timed out after {}",
                        crate::flags::format_duration(self.config.processing_timeout)
                    ));
                    break ChainOutcome::Retry { step, reason };
                }
                _ = ticker.tick() => {
                    let step = *current.lock().unwrap_or_else(|e| e.into_inner());
                    if !self.store.heartbeat(claim, step.as_str()).await? {
                        return Err(ChainError::FenceLost(claim.request_id));
                    }
                }
            }
        };
        let step = *current.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = after_chain(outcome, self.clock.now());
        let result = loop {
            next = match next {
                Settle::Approve(facts) if self.config.mode == Mode::Shadow => {
                    self.would_complete(claim, &facts, step).await?
                }
                Settle::WouldApprove { step } => {
                    break self.would_approve(claim, step).await?;
                }
                Settle::Approve(facts) => {
                    let completion = self.store.complete(claim, &facts).await?;
                    if completion == Completion::Woken {
                        info!(
                            request_id = claim.request_id,
                            "a fact changed while the attempt ran; not approved, checked again at once"
                        );
                    }
                    after_completion(completion, step, self.clock.now())
                }
                Settle::Retry { step, reason, due } => {
                    break self.schedule_retry_at(claim, step, reason, due).await?;
                }
                Settle::Drop(outcome) => {
                    if !self.store.drop_claim(claim).await? {
                        return Err(ChainError::FenceLost(claim.request_id));
                    }
                    match &outcome {
                        AttemptOutcome::Superseded(status) => {
                            info!(request_id = claim.request_id, %status, "decided by a person; superseded");
                        }
                        _ => warn!(request_id = claim.request_id, "request vanished"),
                    }
                    break outcome;
                }
                Settle::Approved => {
                    info!(request_id = claim.request_id, "approved");
                    break AttemptOutcome::Approved;
                }
                Settle::LookUpClosed => {
                    break AttemptOutcome::Superseded(self.closed_status(claim).await?);
                }
                Settle::TakenOver | Settle::ShardLost | Settle::Park { .. } => {
                    return Err(ChainError::FenceLost(claim.request_id));
                }
            };
        };
        let reason = match &result {
            AttemptOutcome::RetryScheduled { reason, .. } => reason.class.as_str(),
            _ => "",
        };
        self.metrics.outcome(step.as_str(), result.label(), reason);
        Ok(result)
    }

    /// Shadow mode's completion: the request read again, as the real one
    /// locks it, approves nothing but says what would follow: a person
    /// decided or the row went, a gate column changed since the gates read
    /// it (due again at once), or it would approve.
    async fn would_complete(
        &self,
        claim: &Claim,
        facts: &Facts,
        step: Step,
    ) -> Result<Settle, DbError> {
        let now = self.clock.now();
        Ok(match self.store.request(claim.request_id).await? {
            None => Settle::Drop(AttemptOutcome::Vanished),
            Some(request) if !request.status.is_open() => {
                Settle::Drop(AttemptOutcome::Superseded(request.status))
            }
            Some(request) => {
                let read = Facts {
                    econtract_status: facts.econtract_status.clone(),
                    ..Facts::of(&request)
                };
                if read == *facts {
                    Settle::WouldApprove { step }
                } else {
                    after_completion(Completion::Woken, step, now)
                }
            }
        })
    }

    /// Records that shadow mode would have approved, and leaves the request
    /// waiting until it changes (or an active start hands it over).
    async fn would_approve(&self, claim: &Claim, step: Step) -> Result<AttemptOutcome, DbError> {
        let now = self.clock.now();
        let would_approve_at = self
            .record_would(claim, WouldDecision::Approve, step, SHADOW_WOULD_APPROVE)
            .await?
            .unwrap_or(now);
        let write = RetryWrite {
            next_retry_time: crate::clock::after(now, SHADOW_DECIDED_WAIT),
            transient: false,
            counted: false,
            reason: SHADOW_WOULD_APPROVE,
            step: step.as_str(),
        };
        match self.store.schedule_retry(claim, &write, now).await? {
            Some((_, next_retry_time)) => {
                info!(request_id = claim.request_id, %step, %would_approve_at, "shadow mode: would approve");
                Ok(AttemptOutcome::WouldApprove {
                    step,
                    would_approve_at,
                    next_retry_time,
                })
            }
            None => Ok(AttemptOutcome::FenceLost),
        }
    }

    /// Records a would-decision of shadow mode and counts it.
    async fn record_would(
        &self,
        claim: &Claim,
        decision: WouldDecision,
        step: Step,
        reason: &str,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let request_type = match self.store.request(claim.request_id).await? {
            Some(request) => request.request_type,
            None => return Ok(None),
        };
        let record = ShadowRecord {
            request_id: claim.request_id,
            request_type,
            decision,
            step: step.as_str(),
            reason,
        };
        let at = self.store.record_shadow(&record, self.clock.now()).await?;
        self.metrics
            .shadow_decision(decision.label(), step.as_str());
        Ok(at)
    }

    async fn closed_status(&self, claim: &Claim) -> Result<RequestStatus, DbError> {
        Ok(self
            .store
            .request(claim.request_id)
            .await?
            .map_or(RequestStatus::Canceled, |r| r.status))
    }

    /// Records a retry of `claim`, due at `due`, or at the policy's time
    /// for the reason's class.
    async fn schedule_retry_at(
        &self,
        claim: &Claim,
        step: Step,
        reason: RetryReason,
        due: Option<DateTime<Utc>>,
    ) -> Result<AttemptOutcome, DbError> {
        let now = self.clock.now();
        let (transient, next_retry_time) = retry_due(
            &self.config.retry,
            reason.class,
            claim.transient_streak,
            now,
            due,
            &mut rand::rng(),
        );
        let write = RetryWrite {
            next_retry_time,
            transient,
            counted: reason.counted,
            reason: &reason.reason,
            step: step.as_str(),
        };
        // Shadow mode records the hold; a retry due at once (a fact changed
        // mid-attempt) is no decision, and the next attempt makes one.
        if self.config.mode == Mode::Shadow && due.is_none() {
            self.record_would(claim, WouldDecision::Hold, step, &reason.reason)
                .await?;
        }
        match self.store.schedule_retry(claim, &write, now).await? {
            // A change notified mid-chain makes it due at once.
            Some((retry_count, next_retry_time)) => {
                info!(request_id = claim.request_id, %step, reason = %reason.reason, retry_count, "retry scheduled");
                Ok(AttemptOutcome::RetryScheduled {
                    step,
                    reason,
                    next_retry_time,
                    retry_count,
                })
            }
            None => Ok(AttemptOutcome::FenceLost),
        }
    }
}

/// Limits and window of the candidate queries (discovery's catch-up, and
/// the seed's poll turn).
#[derive(Clone, Debug)]
pub struct TurnConfig {
    /// Owner contracts per turn (the seed's 20).
    pub owner_limit: i64,
    /// Ad contracts per turn (the seed's 10).
    pub ad_limit: i64,
    /// Only requests whose sort_time is within this window.
    pub window: Duration,
    /// Attempts run at once.
    pub concurrency: usize,
}

impl TurnConfig {
    /// The candidate query of one type at `now`.
    pub fn query(
        &self,
        request_type: RequestType,
        now: DateTime<Utc>,
        retry_limit: i32,
        shards: Option<ShardFilter>,
    ) -> CandidateQuery {
        let limit = match request_type {
            RequestType::AdContract => self.ad_limit,
            _ => self.owner_limit,
        };
        CandidateQuery {
            request_type,
            limit,
            window_start: crate::clock::before(now, self.window),
            now,
            retry_limit,
            shards,
        }
    }
}

// === Decisions ===
//
// Pure: what an attempt writes once its chain has stopped, and when a
// retry is due. `Approver` only carries them out.

/// What an attempt does once its chain stopped, or a write after it answered.
#[derive(Clone, Debug, PartialEq)]
enum Settle {
    /// Every step passed: approve under the fence while the facts hold.
    Approve(Facts),
    /// Shadow mode: every step passed and the facts still hold; record
    /// that it would approve, `step` being the last.
    WouldApprove { step: Step },
    /// The approval is written.
    Approved,
    /// Record a retry, due at `due`, or at the policy's time for its class.
    Retry {
        step: Step,
        reason: RetryReason,
        due: Option<DateTime<Utc>>,
    },
    /// A malformed row: parked as an unmet condition, never lost.
    Park {
        column: &'static str,
        value: String,
        reason: RetryReason,
    },
    /// A person decided, or the row vanished: drop our claim, end so.
    Drop(AttemptOutcome),
    /// Refused as decided by a person: read how, to show it.
    LookUpClosed,
    /// The claim was taken over: write nothing more.
    TakenOver,
    /// The shard was lost or its renewal is overdue: write nothing more,
    /// call nothing more; the claim stays for the next holder.
    ShardLost,
}

/// What follows the chain's own answer.
fn after_chain(outcome: ChainOutcome, now: DateTime<Utc>) -> Settle {
    match outcome {
        ChainOutcome::Success(facts) => Settle::Approve(facts),
        // An earlier step's gate passed on a fact that a later step read
        // changed: as a completion refused for it, due again at once.
        ChainOutcome::Changed { step } => Settle::Retry {
            step,
            reason: RetryReason::condition(WOKEN_BEFORE_COMPLETION),
            due: Some(now),
        },
        ChainOutcome::Retry { step, reason } => Settle::Retry {
            step,
            reason,
            due: None,
        },
        ChainOutcome::Closed(status) => Settle::Drop(AttemptOutcome::Superseded(status)),
        ChainOutcome::Vanished => Settle::Drop(AttemptOutcome::Vanished),
    }
}

/// What follows the completion's answer; `step` is the chain's last.
fn after_completion(completion: Completion, step: Step, now: DateTime<Utc>) -> Settle {
    match completion {
        Completion::Approved => Settle::Approved,
        Completion::Stale => Settle::TakenOver,
        // A fact changed after the claim, maybe after the gate that reads
        // it (a wake pending, or the request or the ledger no longer what
        // the gates passed on): nothing approved, due again at once, and
        // the next attempt reads the new fact.
        Completion::Woken => Settle::Retry {
            step,
            reason: RetryReason::condition(WOKEN_BEFORE_COMPLETION),
            due: Some(now),
        },
        Completion::RequestClosed => Settle::LookUpClosed,
    }
}

/// What follows a chain that failed at `step`.
fn after_chain_error(error: &ChainError, step: Step) -> Settle {
    match error {
        ChainError::FenceLost(_) => Settle::TakenOver,
        ChainError::ShardLost(_) => Settle::ShardLost,
        ChainError::Database(DbError::Malformed { error, .. }) => Settle::Park {
            column: error.column,
            value: error.value.clone(),
            reason: RetryReason::condition(format!("malformed row: {error}")),
        },
        // A statement the database refuses fails the same way on every
        // attempt: released uncounted, it would be claimed and its external
        // calls repeated every poll, for ever. Counted as a transient retry,
        // it backs off and the limit ends it.
        ChainError::Database(error) => Settle::Retry {
            step,
            reason: RetryReason::transient(format!("store error: {error}")),
            due: None,
        },
    }
}

/// Whether a retry of `class` continues the transient streak, and when it
/// is due: at `due` when given, else transient failures back off with the
/// streak (the one the claim read, plus this one) and unmet conditions wait
/// the long interval and end the streak.
fn retry_due(
    policy: &RetryPolicy,
    class: RetryClass,
    streak_before: i32,
    now: DateTime<Utc>,
    due: Option<DateTime<Utc>>,
    rng: &mut impl rand::Rng,
) -> (bool, DateTime<Utc>) {
    let transient = class == RetryClass::Transient;
    let streak = if transient { streak_before + 1 } else { 0 };
    let at = due.unwrap_or_else(|| policy.next_retry_time(now, class, streak, rng));
    (transient, at)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::domain::UnknownValue;
    use crate::external::{ErrorKind, ExternalError, System};

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 9, minute, 0)
            .single()
            .unwrap()
    }

    fn retry(step: Step, reason: RetryReason, due: Option<DateTime<Utc>>) -> Settle {
        Settle::Retry { step, reason, due }
    }

    #[test]
    fn each_way_a_chain_ends_settles_as_named() {
        let not_signed = RetryReason::condition("e-contract not signed");
        let store_down = DbError::Database {
            operation: "save the owner number",
            source: sqlx::Error::PoolTimedOut,
        };
        let store_down_reason = format!("store error: {store_down}");
        let facts = Facts {
            status: RequestStatus::Pending,
            request_type: RequestType::OwnerContract,
            documents_released: true,
            operational_hold: false,
            menu_registered: true,
            logo_registered: true,
            previous_step_approved: true,
            econtract_ref: Some("EC-7".into()),
            target_store_number: None,
            econtract_status: Some("SIGNED".into()),
        };
        let malformed = DbError::Malformed {
            request_id: 7,
            error: UnknownValue {
                column: "approval_request.status",
                value: "WHATEVER".into(),
            },
        };
        let cases = [
            (
                "every step passed: approve while the facts hold",
                after_chain(ChainOutcome::Success(facts.clone()), at(3)),
                Settle::Approve(facts),
            ),
            (
                "a later step read another fact than an earlier gate: due again at once",
                after_chain(ChainOutcome::Changed { step: Step::Store }, at(3)),
                retry(
                    Step::Store,
                    RetryReason::condition(WOKEN_BEFORE_COMPLETION),
                    Some(at(3)),
                ),
            ),
            (
                "a gate refused: its retry at the policy's time",
                after_chain(
                    ChainOutcome::Retry {
                        step: Step::Store,
                        reason: not_signed.clone(),
                    },
                    at(3),
                ),
                retry(Step::Store, not_signed, None),
            ),
            (
                "a person decided mid-chain: drop the claim",
                after_chain(ChainOutcome::Closed(RequestStatus::Rejected), at(3)),
                Settle::Drop(AttemptOutcome::Superseded(RequestStatus::Rejected)),
            ),
            (
                "the row vanished mid-chain: drop the claim",
                after_chain(ChainOutcome::Vanished, at(3)),
                Settle::Drop(AttemptOutcome::Vanished),
            ),
            (
                "the completion approved",
                after_completion(Completion::Approved, Step::Store, at(3)),
                Settle::Approved,
            ),
            (
                "the completion found our fence gone",
                after_completion(Completion::Stale, Step::Store, at(3)),
                Settle::TakenOver,
            ),
            (
                "a fact changed during the attempt: due again at once",
                after_completion(Completion::Woken, Step::Store, at(3)),
                retry(
                    Step::Store,
                    RetryReason::condition(WOKEN_BEFORE_COMPLETION),
                    Some(at(3)),
                ),
            ),
            (
                "the completion found it decided: read by whom",
                after_completion(Completion::RequestClosed, Step::Store, at(3)),
                Settle::LookUpClosed,
            ),
            (
                "the claim was taken over mid-chain",
                after_chain_error(&ChainError::FenceLost(7), Step::Store),
                Settle::TakenOver,
            ),
            (
                "the shard was lost mid-chain",
                after_chain_error(&ChainError::ShardLost(7), Step::Owner),
                Settle::ShardLost,
            ),
            (
                "a malformed row is parked as an unmet condition",
                after_chain_error(&ChainError::Database(malformed), Step::Store),
                Settle::Park {
                    column: "approval_request.status",
                    value: "WHATEVER".into(),
                    reason: RetryReason::condition(
                        "malformed row: unknown approval_request.status \"WHATEVER\"",
                    ),
                },
            ),
            (
                "a database failure after the claim is a counted transient retry",
                after_chain_error(&ChainError::Database(store_down), Step::Store),
                retry(Step::Store, RetryReason::transient(store_down_reason), None),
            ),
        ];
        let mut failed = Vec::new();
        for (name, got, want) in cases {
            if got != want {
                failed.push(format!("{name}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    #[test]
    fn each_retry_class_is_due_as_its_policy_says() {
        let policy = RetryPolicy {
            condition_interval: Duration::from_secs(600),
            transient_base: Duration::from_secs(2),
            transient_max: Duration::from_secs(600),
            limit: 5,
        };
        let now = at(0);
        let secs = |s: i64| now + chrono::Duration::seconds(s);
        let external = |kind| {
            RetryReason::external(&ExternalError {
                system: System::Owner,
                operation: "create_owner",
                kind,
                message: "timed out".into(),
                refused: false,
            })
        };
        // Name, the reason's class, the streak the claim read, a due time
        // given, and what is recorded: the streak goes on, due between.
        let cases = [
            (
                "an unmet condition waits the long interval and ends the streak",
                RetryReason::condition("documents not released").class,
                3,
                None,
                (false, secs(600), secs(600)),
            ),
            (
                "a refusal waits the long interval and ends the streak",
                external(ErrorKind::Permanent).class,
                3,
                None,
                (false, secs(600), secs(600)),
            ),
            (
                "a first transient failure backs off about the base",
                external(ErrorKind::Transient).class,
                0,
                None,
                (true, secs(1), secs(2)),
            ),
            (
                "a fourth transient failure backs off eight times the base",
                RetryReason::transient("processing timed out").class,
                3,
                None,
                (true, secs(8), secs(16)),
            ),
            (
                "a long streak backs off at most the cap",
                RetryClass::Transient,
                40,
                None,
                (true, secs(300), secs(600)),
            ),
            (
                "a wake during the attempt is due when given",
                RetryClass::ConditionNotMet,
                2,
                Some(now),
                (false, now, now),
            ),
        ];
        let mut rng = StdRng::seed_from_u64(34);
        let mut failed = Vec::new();
        for (name, class, streak, due, (transient, earliest, latest)) in cases {
            let (got_transient, got) = retry_due(&policy, class, streak, now, due, &mut rng);
            if got_transient != transient || got < earliest || got > latest {
                failed.push(format!(
                    "{name}: got ({got_transient}, {got}), want ({transient}, {earliest}..={latest})"
                ));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}
