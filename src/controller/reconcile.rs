//! One level-triggered reconcile of an AutoApproval: read the truth from the
//! primary, then clean up, wait, or claim and run the chain; project the
//! outcome onto the CR status and publish an Event.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use super::cached::{CachedAutoApproval, CachedStatus};
use super::crd::{
    ApprovalType, AutoApproval, AutoApprovalStatus, FIELD_MANAGER, Phase, RETRY_ANNOTATION, cr_name,
};
use super::status::{Observed, Would, project, same_outcome};
use crate::approval::{Approver, AttemptOutcome, Mode, SHADOW_WOULD_APPROVE};
use crate::clock::SharedClock;
use crate::coordination::{ShardGuard, Shards};
use crate::db::{DbError, Pause};
use crate::domain::{
    Candidate, DECIDED_BY_US, Request, RequestStatus, State, StateStatus, UnknownValue,
};
use crate::events::Publisher;
use crate::processors::Step;
use crate::telemetry::Metrics;

/// Errors of one reconcile; the error policy requeues with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The database failed.
    #[error("request {request_id}: {source}")]
    Database {
        /// Whose CR is backed off.
        request_id: i64,
        /// The database's error.
        #[source]
        source: DbError,
    },
    /// The API server refused to delete a CR being replaced.
    #[error("request {request_id}: replacing the AutoApproval: {source}")]
    Replace {
        /// Whose CR is backed off.
        request_id: i64,
        /// The API server's refusal.
        #[source]
        source: kube::Error,
    },
    /// The API server refused a status write.
    #[error("request {request_id}: writing the status: {source}")]
    Status {
        /// Whose CR is backed off.
        request_id: i64,
        /// The API server's refusal.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer a status write in time.
    #[error(
        "request {request_id}: writing the status: no answer from the API server within {after:?}"
    )]
    StatusUnanswered {
        /// Whose CR is backed off.
        request_id: i64,
        /// The API timeout.
        after: Duration,
    },
}

/// How soon reconcile looks again, and when a slow chain shows InProgress.
#[derive(Clone, Debug)]
pub struct ReconcileConfig {
    /// A chain still running after this shows InProgress on the CR (one
    /// status write that fast chains do without).
    pub in_progress_after: Duration,
    /// How soon to look again at a request claimed elsewhere.
    pub held_recheck: Duration,
    /// How soon to look again at a request whose row is malformed.
    pub malformed_recheck: Duration,
    /// First backoff after an error.
    pub error_backoff_base: Duration,
    /// Longest backoff after errors.
    pub error_backoff_max: Duration,
    /// A status write or Event the API server has not answered after this
    /// long is given up: the kube client waits without limit, and a
    /// reconcile waiting holds one of the Controller's `--concurrency` slots.
    pub api_timeout: Duration,
}

impl ReconcileConfig {
    /// `--in-progress-after` as given; the rest are fixed, not flags.
    pub fn new(in_progress_after: Duration) -> Self {
        Self {
            in_progress_after,
            held_recheck: Duration::from_secs(30),
            malformed_recheck: Duration::from_secs(600),
            error_backoff_base: Duration::from_millis(500),
            error_backoff_max: Duration::from_secs(300),
            api_timeout: Duration::from_secs(60),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// Runs attempts.
    pub approver: Arc<Approver>,
    /// The CRs' namespace.
    pub api: Api<AutoApproval>,
    /// Publishes Events.
    pub events: Publisher,
    /// The shards this replica holds: it reconciles no other.
    pub shards: Arc<Shards>,
    /// The clock.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Metrics,
    /// Timings.
    pub settings: ReconcileConfig,
    /// True once shutdown began: no new claims.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Told of every claim the fleet's pause refused.
    pub brake: Arc<super::fleet::FleetBrake>,
    /// Consecutive errors per CR, for the backoff: at most
    /// [`FAILURES_TRACKED`] CRs.
    pub failures: Mutex<HashMap<String, u32>>,
    /// This replica's last status write per CR (name and uid) until the
    /// cache shows it: at most [`FAILURES_TRACKED`] CRs.
    pub written: Mutex<HashMap<String, Written>>,
}

/// A status this replica wrote that the cache may not show yet: a
/// reconcile queued during the one that wrote it can start before the
/// watch delivers the write, and, judging by the cache, would act on the
/// status before it (write an approved request's status again, act on a
/// retry request already acted on).
#[derive(Clone, Debug)]
pub struct Written {
    /// The digests the cache may still show instead: the statuses this
    /// write replaced, newest last (a few).
    stale: Vec<Option<u64>>,
    /// The status written.
    status: Arc<CachedStatus>,
}

/// Stale digests kept per CR: successive writes before the watch shows
/// the first are rare, more than this many is beyond any real lag.
const STALE_KEPT: usize = 4;

/// The key of a CR in the per-CR maps: name and uid, as a CR deleted and
/// created again starts without status.
fn written_key(cr: &CachedAutoApproval) -> String {
    format!("{}/{}", cr.name_any(), cr.uid().unwrap_or_default())
}

/// `cr` as this replica knows it: with the status it wrote last when the
/// cache still shows a status that write replaced. A cache that caught up,
/// or shows a status written by someone else, is taken as it is and the
/// entry goes.
fn freshest<'a>(ctx: &Context, cr: &'a CachedAutoApproval) -> Cow<'a, CachedAutoApproval> {
    let key = written_key(cr);
    let mut written = ctx.written.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ours) = written.get(&key) else {
        return Cow::Borrowed(cr);
    };
    let cached = cr.status.as_ref().map(|s| s.digest);
    if !ours.stale.contains(&cached) {
        written.remove(&key);
        return Cow::Borrowed(cr);
    }
    let mut fresh = cr.clone();
    fresh.status = Some(Box::new((*ours.status).clone()));
    Cow::Owned(fresh)
}

/// CRs whose consecutive errors are counted. When that many fail at once,
/// one count is dropped: one more CR starts its backoff from the
/// base again, and the map stays bounded whatever the API server does.
pub(crate) const FAILURES_TRACKED: usize = 1024;

/// Keeps a per-CR map within [`FAILURES_TRACKED`] entries: when it is full
/// and `key` is not in it, any one entry goes (the map has no order).
fn make_room<V>(map: &mut HashMap<String, V>, key: &str) {
    if map.len() >= FAILURES_TRACKED
        && !map.contains_key(key)
        && let Some(evicted) = map.keys().next().cloned()
    {
        map.remove(&evicted);
    }
}

/// The reconcile function given to kube-runtime's Controller.
pub async fn reconcile(
    cr: Arc<CachedAutoApproval>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let shard = ctx.shards.shard_of(cr.spec.request_id);
    // Not ours now: the holder reconciles it, and acquiring the shard
    // triggers a reconcile of every CR in it.
    let Some(guard) = ctx.shards.guard(shard) else {
        return Ok(Action::await_change());
    };
    // A root span: one trace per reconcile, so per attempt, whatever span
    // the runtime's stream runs in. Every line logged under it carries the
    // request and its shard.
    let span = info_span!(parent: None, "reconcile", request_id = cr.spec.request_id, shard);
    let seen = freshest(&ctx, &cr);
    let result = Reconcile {
        cr: &seen,
        ctx: &ctx,
        guard: &guard,
        retry_ack: Mutex::new(None),
    }
    .run()
    .instrument(span.clone())
    .await;
    let label = if result.is_ok() { "ok" } else { "error" };
    // Inside the span: the exemplar names this reconcile's trace.
    span.in_scope(|| {
        ctx.metrics
            .reconcile(label, started.elapsed().as_secs_f64())
    });
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cr.name_any());
    }
    result
}

/// The error policy: exponential backoff per CR, capped.
pub fn error_policy(
    cr: Arc<CachedAutoApproval>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let failures = {
        let mut map = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let name = cr.name_any();
        // Any one evicted loses only its count.
        make_room(&mut map, &name);
        let n = map.entry(name).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let s = &ctx.settings;
    let delay = s
        .error_backoff_base
        .saturating_mul(1u32 << failures.clamp(1, 20).saturating_sub(1))
        .min(s.error_backoff_max);
    warn!(request_id = cr.spec.request_id, %error, failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

struct Reconcile<'a> {
    cr: &'a CachedAutoApproval,
    ctx: &'a Context,
    guard: &'a ShardGuard,
    /// A retry request acted on in this reconcile, echoed by the status write.
    retry_ack: Mutex<Option<String>>,
}

impl Reconcile<'_> {
    fn request_id(&self) -> i64 {
        self.cr.spec.request_id
    }

    fn store_err(&self) -> impl FnOnce(DbError) -> ReconcileError {
        let request_id = self.request_id();
        move |source| ReconcileError::Database { request_id, source }
    }

    /// Decides, carries the decision out, and decides again with what that
    /// taught (a read, an attempt's outcome) until a decision ends it.
    async fn run(&self) -> Result<Action, ReconcileError> {
        let mut facts = Facts {
            cr: self.cr,
            now: self.ctx.clock.now(),
            stopping: self.ctx.stopping.is_cancelled(),
            retry_limit: self.ctx.approver.config().retry.limit,
            lookup: None,
            retry_acted: false,
        };
        let mut decision = decide(&facts);
        loop {
            match self.carry_out(decision, &mut facts).await? {
                Flow::Next(next) => decision = next,
                Flow::Done(action) => return Ok(action),
            }
        }
    }

    /// [`decide`] with the clock and the shutdown flag as they are now.
    fn decide_again(&self, facts: &mut Facts<'_>) -> Decision {
        facts.now = self.ctx.clock.now();
        facts.stopping = self.ctx.stopping.is_cancelled();
        decide(facts)
    }

    /// Reads the request and its state row in one statement, ending the
    /// pause this CR set first when `resume`.
    async fn read(&self, resume: bool) -> Result<Lookup, ReconcileError> {
        let id = self.request_id();
        let store = self.ctx.approver.database();
        if resume {
            store
                .resume(id, self.cr.uid().as_deref())
                .await
                .map_err(self.store_err())?;
        }
        match store.request_with_state(id).await {
            Ok(Some((request, state))) => Ok(Lookup::Found(Box::new(request), state)),
            Ok(None) => Ok(Lookup::Missing),
            Err(DbError::Malformed { error, .. }) => Ok(Lookup::Malformed(error)),
            Err(e) => Err(self.store_err()(e)),
        }
    }

    /// Carries out a decision: what it taught and the next decision, or the
    /// reconcile's end.
    async fn carry_out(
        &self,
        decision: Decision,
        facts: &mut Facts<'_>,
    ) -> Result<Flow, ReconcileError> {
        let id = self.request_id();
        let settings = &self.ctx.settings;
        let soon = Action::requeue(Duration::from_secs(1));
        let done = match decision {
            Decision::ClaimAtOnce(candidate) => {
                let outcome = self.attempt(&candidate, None).await?;
                return Ok(Flow::Next(after_attempt(
                    outcome,
                    None,
                    facts.retry_limit,
                    true,
                )));
            }
            Decision::Read { resume } => {
                facts.lookup = Some(self.read(resume).await?);
                return Ok(Flow::Next(self.decide_again(facts)));
            }
            Decision::ActOnRetryRequest => {
                // A retry that made the row due changed it: read it again.
                if self.act_on_retry_request().await?
                    && let Some(Lookup::Found(_, state)) = &mut facts.lookup
                {
                    *state = self
                        .ctx
                        .approver
                        .database()
                        .state(id)
                        .await
                        .map_err(self.store_err())?;
                }
                facts.retry_acted = true;
                return Ok(Flow::Next(self.decide_again(facts)));
            }
            Decision::Claim {
                candidate,
                eligible_at,
                recovered,
            } => {
                if let Some(note) = recovered {
                    self.event(EventType::Normal, "Recovered", "Recover", note)
                        .await;
                }
                let outcome = self.attempt(&candidate, Some(eligible_at)).await?;
                return Ok(Flow::Next(after_attempt(
                    outcome,
                    facts.state(),
                    facts.retry_limit,
                    false,
                )));
            }
            Decision::LookForPause => {
                let pause = self
                    .ctx
                    .approver
                    .database()
                    .pause_of(id)
                    .await
                    .map_err(self.store_err())?;
                return Ok(Flow::Next(after_pause_lookup(pause.as_ref())));
            }
            Decision::NameMismatch { reason } => self.invalid("NameMismatch", reason).await,
            Decision::Pause => {
                // Recorded in the database: no replica claims it, and a
                // deleted CR comes back paused.
                let by = format!("AutoApproval {}", self.cr.name_any());
                self.ctx
                    .approver
                    .database()
                    .pause(id, &by, self.cr.uid().as_deref())
                    .await
                    .map_err(self.store_err())?;
                self.write(Observed::phase(
                    Phase::Paused,
                    Some("spec.paused is set".into()),
                ))
                .await?;
                Ok(Action::await_change())
            }
            Decision::RequestNotFound => {
                let reason = format!("request {id} does not exist");
                self.invalid("RequestNotFound", reason).await
            }
            Decision::MalformedRow { column, reason } => {
                self.ctx.metrics.malformed_row(column);
                self.invalid("MalformedRow", reason).await?;
                // It may be repaired; the DB is the truth, so look again.
                Ok(Action::requeue(settings.malformed_recheck))
            }
            Decision::TypeChanged { reason } => self.replace(reason).await,
            Decision::TypeMismatch { reason } => {
                self.invalid("TypeMismatch", reason).await?;
                // It may be corrected again; look again, as for a malformed row.
                Ok(Action::requeue(settings.malformed_recheck))
            }
            Decision::Closed(closed) => self.closed(closed).await,
            // Shutting down: left for the next holder.
            Decision::Stopping => Ok(soon),
            Decision::Held(state) => {
                self.write(waiting_view(Phase::InProgress, &state)).await?;
                Ok(Action::requeue(settings.held_recheck))
            }
            Decision::Exhausted(state) => self.exhausted(&state).await,
            Decision::Waiting { state, requeue } => {
                self.write(waiting_view(Phase::RetryWaiting, &state))
                    .await?;
                Ok(Action::requeue(requeue))
            }
            Decision::Approved { retry_count } => {
                let view = Observed {
                    retry_count,
                    holder: Some(self.ctx.shards.identity().to_owned()),
                    ..Observed::phase(Phase::Approved, Some("approved by autoapproval".into()))
                };
                self.write(view).await?;
                self.event(
                    EventType::Normal,
                    "Approved",
                    "Approve",
                    "approved by autoapproval".into(),
                )
                .await;
                Ok(Action::await_change())
            }
            Decision::RetryScheduled {
                step,
                reason,
                next_retry_time,
                retry_count,
            } => {
                let shadow = self.ctx.approver.config().mode == Mode::Shadow;
                let view = Observed {
                    phase: Phase::RetryWaiting,
                    step: Some(step.as_str().to_owned()),
                    retry_count,
                    next_retry_time: Some(next_retry_time),
                    reason: Some(reason.clone()),
                    holder: Some(self.ctx.shards.identity().to_owned()),
                    would: shadow.then_some(Would {
                        decision: "Hold",
                        approve_at: None,
                    }),
                };
                // A retry with the outcome the CR shows writes nothing and
                // publishes nothing: the write budget at rest.
                let reason_name = if shadow {
                    "WouldHold"
                } else {
                    "RetryScheduled"
                };
                if self.write(view).await? {
                    let note = format!(
                        "{step}: {reason} (retry {retry_count} at {})",
                        next_retry_time.to_rfc3339()
                    );
                    if shadow {
                        let note = format!("shadow mode: would hold at {note}");
                        self.event(EventType::Normal, reason_name, "Shadow", note)
                            .await;
                    } else {
                        self.event(EventType::Normal, reason_name, "Retry", note)
                            .await;
                    }
                } else {
                    self.ctx.metrics.event_skipped(reason_name);
                }
                Ok(Action::requeue(until(
                    next_retry_time,
                    self.ctx.clock.now(),
                )))
            }
            Decision::WouldApprove {
                step,
                would_approve_at,
                next_retry_time,
                retry_count,
            } => {
                let view = Observed {
                    phase: Phase::RetryWaiting,
                    step: Some(step.as_str().to_owned()),
                    retry_count,
                    next_retry_time: Some(next_retry_time),
                    reason: Some(SHADOW_WOULD_APPROVE.to_owned()),
                    holder: Some(self.ctx.shards.identity().to_owned()),
                    would: Some(Would {
                        decision: "Approve",
                        approve_at: Some(would_approve_at),
                    }),
                };
                if self.write(view).await? {
                    let note = format!(
                        "shadow mode: every gate passed at {}; would approve (first at {})",
                        self.ctx.clock.now().to_rfc3339(),
                        would_approve_at.to_rfc3339()
                    );
                    self.event(EventType::Normal, "WouldApprove", "Shadow", note)
                        .await;
                } else {
                    self.ctx.metrics.event_skipped("WouldApprove");
                }
                // Left alone until the request changes (its wake makes the
                // row due, and the CR is reconciled again).
                Ok(Action::requeue(until(
                    next_retry_time,
                    self.ctx.clock.now(),
                )))
            }
            Decision::GaveUp {
                step,
                reason,
                retry_count,
            } => {
                let view = Observed {
                    phase: Phase::Exhausted,
                    step: Some(step.as_str().to_owned()),
                    retry_count,
                    next_retry_time: None,
                    reason: Some(reason.clone()),
                    holder: Some(self.ctx.shards.identity().to_owned()),
                    would: None,
                };
                self.write(view).await?;
                let limit = self.ctx.approver.config().retry.limit;
                let note = format!("retry limit {limit} reached: {reason}");
                self.event(EventType::Warning, "Exhausted", "Retry", note)
                    .await;
                Ok(Action::await_change())
            }
            Decision::Superseded(status) => self.superseded(status, None).await,
            Decision::FleetPaused { reason } => {
                self.ctx.brake.held_back();
                self.write(Observed::phase(Phase::Paused, Some(reason)))
                    .await?;
                Ok(Action::await_change())
            }
            Decision::PausedElsewhere { reason } => {
                self.write(Observed::phase(Phase::Paused, Some(reason)))
                    .await?;
                Ok(Action::await_change())
            }
            // Someone else has it, the retry moved, or our claim was taken
            // over: look at the truth again shortly.
            Decision::NotClaimed | Decision::FenceLost => Ok(soon),
        };
        done.map(Flow::Done)
    }

    /// Runs the attempt; a chain slower than `in_progress_after` shows
    /// InProgress meanwhile. The attempt is polled while that status is
    /// written, so its heartbeats and its shard check go on however slow
    /// the API server is; the outcome waits for the write, so the final
    /// status is never overwritten by a late InProgress.
    async fn attempt(
        &self,
        candidate: &Candidate,
        eligible_at: Option<DateTime<Utc>>,
    ) -> Result<AttemptOutcome, ReconcileError> {
        let held = || self.guard.holds();
        let attempt =
            self.ctx
                .approver
                .attempt_since(candidate, self.guard.fence(), eligible_at, &held);
        tokio::pin!(attempt);
        let outcome = tokio::select! {
            outcome = &mut attempt => outcome,
            // A retry of a waiting request is not shown InProgress: that
            // would be two writes per retry at rest (InProgress, then the
            // same RetryWaiting again). The CR keeps its last outcome.
            () = tokio::time::sleep(self.ctx.settings.in_progress_after),
                if self.cr.phase() != Some(Phase::RetryWaiting) => {
                let view = Observed {
                    holder: Some(self.ctx.shards.identity().to_owned()),
                    ..Observed::phase(Phase::InProgress, None)
                };
                let (written, outcome) = tokio::join!(self.write(view), &mut attempt);
                if let Err(error) = written {
                    debug!(request_id = self.request_id(), %error, "could not show InProgress");
                }
                outcome
            }
        };
        outcome.map_err(self.store_err())
    }

    /// A decided request: its waiting row goes, nothing is called.
    async fn closed(&self, closed: Closed) -> Result<Action, ReconcileError> {
        self.ctx
            .approver
            .database()
            .forget_closed(self.request_id())
            .await
            .map_err(self.store_err())?;
        match closed {
            Closed::ApprovedShown => Ok(Action::await_change()),
            Closed::ApprovedUnshown => {
                self.write(Observed::phase(
                    Phase::Approved,
                    Some("approved by autoapproval".into()),
                ))
                .await?;
                Ok(Action::await_change())
            }
            Closed::ByPerson { status, by } => self.superseded(status, by.as_deref()).await,
        }
    }

    async fn superseded(
        &self,
        status: RequestStatus,
        by: Option<&str>,
    ) -> Result<Action, ReconcileError> {
        let reason = format!("{status} by {}", by.unwrap_or("a person"));
        let changed = self
            .write(Observed::phase(Phase::Superseded, Some(reason.clone())))
            .await?;
        if changed {
            info!(request_id = self.request_id(), %status, "superseded by a person's decision");
            self.event(EventType::Normal, "Superseded", "Observe", reason)
                .await;
        }
        Ok(Action::await_change())
    }

    async fn exhausted(&self, state: &State) -> Result<Action, ReconcileError> {
        let changed = self.write(waiting_view(Phase::Exhausted, state)).await?;
        if changed {
            let note = format!(
                "{} retries: {}",
                state.retry_count,
                state.last_reason.as_deref().unwrap_or("no reason recorded")
            );
            self.event(EventType::Warning, "Exhausted", "Retry", note)
                .await;
        }
        Ok(Action::await_change())
    }

    async fn invalid(&self, why: &str, reason: String) -> Result<Action, ReconcileError> {
        let changed = self
            .write(Observed::phase(Phase::Invalid, Some(reason.clone())))
            .await?;
        if changed {
            warn!(request_id = self.request_id(), why, %reason, "invalid AutoApproval");
            self.event(EventType::Warning, "Invalid", why, reason).await;
        }
        Ok(Action::await_change())
    }

    /// The `autoapproval.io/retry-requested-at` annotation, once per value:
    /// a waiting or exhausted request is made due now (one more attempt for
    /// an exhausted one), with who asked in the memo and an Event; the value
    /// is echoed in `status.lastRetryRequest` by this reconcile's status write.
    /// True when it made the request's state row due (the caller's copy of
    /// the row is then stale).
    async fn act_on_retry_request(&self) -> Result<bool, ReconcileError> {
        let Some(ask) = self.cr.retry_pending() else {
            return Ok(false);
        };
        let asked = &ask.value;
        let who = ask.manager.as_deref().unwrap_or("someone");
        let note = format!("retry requested by {who} at {asked} ({RETRY_ANNOTATION})");
        let limit = self.ctx.approver.config().retry.limit;
        let made_due = self
            .ctx
            .approver
            .database()
            .retry_now(self.request_id(), limit, &note, self.ctx.clock.now())
            .await
            .map_err(self.store_err())?;
        info!(request_id = self.request_id(), %who, %asked, made_due, "retry requested");
        let note = if made_due {
            note
        } else {
            format!("{note}: nothing was waiting")
        };
        self.event(EventType::Normal, "RetryRequested", "Retry", note)
            .await;
        *self.retry_ack.lock().unwrap_or_else(|e| e.into_inner()) = Some(asked.clone());
        Ok(made_due)
    }

    /// Deletes this CR (exactly this one, by uid) so discovery recreates it
    /// from the database; its request's state in the database is untouched.
    async fn replace(&self, reason: String) -> Result<Action, ReconcileError> {
        info!(request_id = self.request_id(), %reason, "request type changed; replacing its AutoApproval");
        self.event(EventType::Normal, "TypeChanged", "Replace", reason)
            .await;
        match super::crd::delete_seen(&self.ctx.api, &self.cr.name_any(), self.cr.uid()).await {
            // Deleted, gone already, or replaced by someone else meanwhile.
            Ok(_) => Ok(Action::await_change()),
            Err(source) => Err(ReconcileError::Replace {
                request_id: self.request_id(),
                source,
            }),
        }
    }

    /// Writes the status when its outcome differs from what the CR shows
    /// ([`same_outcome`]); true when it wrote. A CR deleted meanwhile is not an error: the DB has the
    /// outcome and discovery recreates the CR if there is work left.
    async fn write(&self, observed: Observed) -> Result<bool, ReconcileError> {
        let previous = self.cr.status.as_deref();
        let mut status = project(
            previous,
            &observed,
            self.cr.meta().generation,
            self.ctx.clock.now(),
        );
        if let Some(ack) = self
            .retry_ack
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            status.last_retry_request = Some(ack);
        }
        let phase = observed.phase.as_str();
        if same_outcome(previous, &status) {
            self.ctx.metrics.status_write(phase, "skipped");
            return Ok(false);
        }
        let before = previous.map(|p| p.digest);
        let name = self.cr.name_any();
        let patch = serde_json::json!({
            "apiVersion": AutoApproval::api_version(&()),
            "kind": AutoApproval::kind(&()),
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let limit = self.ctx.settings.api_timeout;
        let apply = Patch::Apply(&patch);
        let written = self.ctx.api.patch_status(&name, &params, &apply);
        let Ok(written) = tokio::time::timeout(limit, written).await else {
            return Err(ReconcileError::StatusUnanswered {
                request_id: self.request_id(),
                after: limit,
            });
        };
        match written {
            Ok(_) => {
                self.ctx.metrics.status_write(phase, "written");
                self.remember(before, &status);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!(
                    request_id = self.request_id(),
                    "CR deleted before its status was written"
                );
                Ok(false)
            }
            Err(source) => Err(ReconcileError::Status {
                request_id: self.request_id(),
                source,
            }),
        }
    }

    /// Keeps the status just written, which replaced `before`, for the
    /// reconciles that run before the cache shows it.
    fn remember(&self, before: Option<u64>, status: &AutoApprovalStatus) {
        let key = written_key(self.cr);
        let mut written = self.ctx.written.lock().unwrap_or_else(|e| e.into_inner());
        // Replacing our own earlier write the cache does not show yet: the
        // cache may show either.
        let mut stale = written.remove(&key).map(|w| w.stale).unwrap_or_default();
        stale.push(before);
        if stale.len() > STALE_KEPT {
            stale.remove(0);
        }
        // Any one evicted costs at most one more identical write.
        make_room(&mut written, &key);
        let status = Arc::new(CachedStatus::of(status));
        written.insert(key, Written { stale, status });
    }

    /// Publishes an Event; a failure is logged, never fatal.
    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        let reference = self.cr.object_ref(&());
        let limit = self.ctx.settings.api_timeout;
        let published = self.ctx.events.publish(&event, &reference);
        match tokio::time::timeout(limit, published).await {
            Ok(Ok(())) => self.ctx.metrics.event(reason),
            Ok(Err(error)) => {
                warn!(request_id = self.request_id(), reason, %error, "could not publish Event");
            }
            Err(_) => {
                warn!(request_id = self.request_id(), reason, after = ?limit, "could not publish Event: no answer from the API server");
            }
        }
    }
}

fn waiting_view(phase: Phase, state: &State) -> Observed {
    Observed {
        phase,
        step: state.step.clone(),
        retry_count: state.retry_count,
        next_retry_time: state
            .next_retry_time
            .filter(|_| phase == Phase::RetryWaiting),
        reason: state.last_reason.clone(),
        holder: Some(state.holder.clone()),
        would: None,
    }
}

/// The requeue delay until `due`, a little late rather than early.
fn until(due: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (due - now).to_std().unwrap_or_default() + Duration::from_millis(20)
}

// === Decisions ===
//
// Pure: what reconcile does with what it has read, tested without a
// database or an API server. `Reconcile::run` only carries them out.

/// What reconcile knows when it decides.
#[derive(Clone, Debug)]
pub(crate) struct Facts<'a> {
    pub(crate) cr: &'a CachedAutoApproval,
    pub(crate) now: DateTime<Utc>,
    /// Shutdown began: nothing new is claimed.
    pub(crate) stopping: bool,
    pub(crate) retry_limit: i32,
    /// The request and its state row; `None` until read.
    pub(crate) lookup: Option<Lookup>,
    /// The retry asked for on the CR was acted on in this reconcile.
    pub(crate) retry_acted: bool,
}

impl Facts<'_> {
    fn state(&self) -> Option<&State> {
        match &self.lookup {
            Some(Lookup::Found(_, state)) => state.as_ref(),
            _ => None,
        }
    }
}

/// The request and its state row, as read from the primary.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Lookup {
    Found(Box<Request>, Option<State>),
    Missing,
    Malformed(UnknownValue),
}

/// What to do next. The first five find something out, and the reconcile
/// decides again with it; every other one ends the reconcile.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decision {
    /// A CR no status was written to (discovery just made it): claimed
    /// without reading the request first, one statement per approval. The
    /// claim refuses a decided, paused or held request; then it is read.
    ClaimAtOnce(Candidate),
    /// Read the request and its state row, ending this CR's pause first.
    Read {
        resume: bool,
    },
    /// Act on `autoapproval.io/retry-requested-at`, once per value.
    ActOnRetryRequest,
    /// Claim and run the chain; `recovered` is the Event announcing a claim
    /// the cleanser brought back, once.
    Claim {
        candidate: Candidate,
        eligible_at: DateTime<Utc>,
        recovered: Option<String>,
    },
    /// Not claimed: is it paused in the database by someone else?
    LookForPause,
    /// Only the CR named after its request drives it: another one (made by
    /// hand, or its name copied) would be a second door to the same request.
    NameMismatch {
        reason: String,
    },
    /// spec.paused: recorded in the database and shown.
    Pause,
    RequestNotFound,
    /// Shown, and looked at again later: the row may be repaired.
    MalformedRow {
        column: &'static str,
        reason: String,
    },
    /// The database's type changed to another auto-approvable one:
    /// spec.requestType is immutable, so the CR is replaced.
    TypeChanged {
        reason: String,
    },
    /// The database's type is not auto-approvable: shown, looked at again.
    TypeMismatch {
        reason: String,
    },
    /// The request is decided: its waiting row goes.
    Closed(Closed),
    /// Shutting down: left for the next holder.
    Stopping,
    /// Claimed and running elsewhere.
    Held(State),
    /// Out of retries.
    Exhausted(State),
    /// A retry not due yet; looked at again when it is.
    Waiting {
        state: State,
        requeue: Duration,
    },
    /// The attempt approved it.
    Approved {
        retry_count: i32,
    },
    RetryScheduled {
        step: Step,
        reason: String,
        next_retry_time: DateTime<Utc>,
        retry_count: i32,
    },
    /// Shadow mode: the attempt would have approved; nothing was created.
    WouldApprove {
        step: Step,
        would_approve_at: DateTime<Utc>,
        next_retry_time: DateTime<Utc>,
        retry_count: i32,
    },
    /// The attempt's retry was the last one.
    GaveUp {
        step: Step,
        reason: String,
        retry_count: i32,
    },
    /// A person decided while the attempt ran.
    Superseded(RequestStatus),
    /// Paused in the database through another CR or by hand: shown, and
    /// left until this CR is paused and unpaused.
    PausedElsewhere {
        reason: String,
    },
    /// The whole fleet is paused: shown, and left for the whole discovery
    /// turn that follows the resume (no timer per CR while it lasts).
    FleetPaused {
        reason: String,
    },
    /// Someone else has it or the retry moved: looked at again shortly.
    NotClaimed,
    /// Our claim was taken over mid-chain: looked at again shortly.
    FenceLost,
}

/// What carrying out a decision leads to.
enum Flow {
    /// Decide again: this is the next step.
    Next(Decision),
    /// The reconcile ends so.
    Done(Action),
}

/// How a decided request is shown.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Closed {
    /// Shown by the attempt that approved it, with its holder and retries:
    /// a second write would only blank those.
    ApprovedShown,
    /// Approved by us, the status write lost (a crash right after, say).
    ApprovedUnshown,
    /// Decided by a person (or by nobody we know).
    ByPerson {
        status: RequestStatus,
        by: Option<String>,
    },
}

/// The next step of a reconcile, from what it knows so far.
pub(crate) fn decide(facts: &Facts<'_>) -> Decision {
    let cr = facts.cr;
    let id = cr.spec.request_id;
    let expected = cr_name(id);
    if cr.name_any() != expected {
        let reason = format!(
            "spec.requestId {id} belongs to the AutoApproval named {expected}, not {}",
            cr.name_any()
        );
        return Decision::NameMismatch { reason };
    }
    if cr.spec.paused {
        return Decision::Pause;
    }
    let was_paused = cr.phase() == Some(Phase::Paused);
    let wanted = cr.spec.request_type.request_type();
    let Some(lookup) = &facts.lookup else {
        if cr.status.is_none() && !was_paused && cr.retry_pending().is_none() && !facts.stopping {
            return Decision::ClaimAtOnce(Candidate {
                request_id: id,
                request_type: wanted,
                state_id: None,
            });
        }
        return Decision::Read { resume: was_paused };
    };
    let (request, state) = match lookup {
        Lookup::Found(request, state) => (request, state.as_ref()),
        Lookup::Missing => return Decision::RequestNotFound,
        Lookup::Malformed(error) => {
            return Decision::MalformedRow {
                column: error.column,
                reason: format!("malformed request row: {error}"),
            };
        }
    };
    if request.request_type != wanted {
        let reason = format!(
            "spec.requestType is {wanted} but request {id} is {}",
            request.request_type
        );
        // Discovery puts a replaced CR back with the database's type.
        if ApprovalType::from_request_type(request.request_type).is_some() {
            return Decision::TypeChanged { reason };
        }
        return Decision::TypeMismatch { reason };
    }
    if !request.status.is_open() {
        let ours = request.status == RequestStatus::Approved
            && request.decided_by.as_deref() == Some(DECIDED_BY_US);
        return Decision::Closed(match ours {
            true if cr.phase() == Some(Phase::Approved) => Closed::ApprovedShown,
            true => Closed::ApprovedUnshown,
            false => Closed::ByPerson {
                status: request.status,
                by: request.decided_by.clone(),
            },
        });
    }
    if !facts.retry_acted && cr.retry_pending().is_some() {
        return Decision::ActOnRetryRequest;
    }
    if facts.stopping {
        return Decision::Stopping;
    }
    let now = facts.now;
    let Some(s) = state else {
        return Decision::Claim {
            candidate: Candidate {
                request_id: id,
                request_type: request.request_type,
                state_id: None,
            },
            eligible_at: request.created_at,
            recovered: None,
        };
    };
    if s.status == StateStatus::InProgress {
        return Decision::Held(s.clone());
    }
    if s.retry_count >= facts.retry_limit {
        return Decision::Exhausted(s.clone());
    }
    if let Some(due) = s.next_retry_time.filter(|t| *t > now) {
        return Decision::Waiting {
            state: s.clone(),
            requeue: until(due, now),
        };
    }
    Decision::Claim {
        candidate: Candidate {
            request_id: id,
            request_type: request.request_type,
            state_id: Some(s.id),
        },
        eligible_at: s.next_retry_time.unwrap_or(now),
        recovered: recovered_note(cr, s),
    }
}

/// The Event announcing a claim the cleanser brought back, unless the CR
/// shows its reason already.
fn recovered_note(cr: &CachedAutoApproval, state: &State) -> Option<String> {
    let reason = state.last_reason.as_deref()?;
    let shown = cr.status.as_ref().is_some_and(|s| s.shows_reason(reason));
    (reason.starts_with("recovered:") && !shown)
        .then(|| format!("{reason}; last held by {}", state.holder))
}

/// What follows an attempt; `before` is the state row it started from, and
/// `at_once` marks the claim made before any read, whose refusal is
/// explained by reading.
pub(crate) fn after_attempt(
    outcome: AttemptOutcome,
    before: Option<&State>,
    retry_limit: i32,
    at_once: bool,
) -> Decision {
    match outcome {
        AttemptOutcome::NotClaimed | AttemptOutcome::Superseded(_) | AttemptOutcome::Vanished
            if at_once =>
        {
            Decision::Read { resume: false }
        }
        AttemptOutcome::Approved => Decision::Approved {
            retry_count: before.map_or(0, |s| s.retry_count),
        },
        AttemptOutcome::RetryScheduled {
            step,
            reason,
            retry_count,
            ..
        } if retry_count >= retry_limit => Decision::GaveUp {
            step,
            reason: reason.reason,
            retry_count,
        },
        AttemptOutcome::RetryScheduled {
            step,
            reason,
            next_retry_time,
            retry_count,
        } => Decision::RetryScheduled {
            step,
            reason: reason.reason,
            next_retry_time,
            retry_count,
        },
        AttemptOutcome::WouldApprove {
            step,
            would_approve_at,
            next_retry_time,
        } => Decision::WouldApprove {
            step,
            would_approve_at,
            next_retry_time,
            retry_count: before.map_or(0, |s| s.retry_count),
        },
        AttemptOutcome::Superseded(status) => Decision::Superseded(status),
        AttemptOutcome::Vanished => Decision::RequestNotFound,
        AttemptOutcome::NotClaimed => Decision::LookForPause,
        AttemptOutcome::FenceLost => Decision::FenceLost,
        AttemptOutcome::FleetPaused(pause) => Decision::FleetPaused {
            reason: format!("{}; `autoapproval resume --all` resumes", pause.describe()),
        },
    }
}

/// A request not claimed is shown paused when the database says so.
pub(crate) fn after_pause_lookup(pause: Option<&Pause>) -> Decision {
    match pause {
        Some(pause) => Decision::PausedElsewhere {
            reason: format!(
                "paused in the database by {} at {}; set spec.paused to true, then false, to resume",
                pause.paused_by, pause.paused_at
            ),
        },
        None => Decision::NotClaimed,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::TimeZone;

    use super::*;
    use crate::controller::crd::AutoApprovalSpec;
    use crate::domain::RequestType;
    use crate::processors::RetryReason;

    const ID: i64 = 7;
    const LIMIT: i32 = 5;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 9, minute, 0)
            .single()
            .unwrap()
    }

    /// What the CR shows, as the cases vary it.
    #[derive(Default)]
    struct Shown {
        name: Option<&'static str>,
        paused: bool,
        ad: bool,
        phase: Option<Phase>,
        reason: Option<&'static str>,
        retry_asked: Option<&'static str>,
        retry_done: Option<&'static str>,
    }

    fn cr(shown: Shown) -> CachedAutoApproval {
        let spec = AutoApprovalSpec {
            request_id: ID,
            request_type: if shown.ad {
                ApprovalType::AdContract
            } else {
                ApprovalType::OwnerContract
            },
            paused: shown.paused,
        };
        let mut cr = AutoApproval::new(shown.name.unwrap_or("request-7"), spec);
        cr.metadata.uid = Some("uid-7".into());
        if let Some(asked) = shown.retry_asked {
            cr.metadata.annotations = Some(BTreeMap::from([(
                RETRY_ANNOTATION.to_owned(),
                asked.to_owned(),
            )]));
        }
        if shown.phase.is_some() || shown.retry_done.is_some() {
            cr.status = Some(AutoApprovalStatus {
                phase: shown.phase,
                last_reason: shown.reason.map(Into::into),
                last_retry_request: shown.retry_done.map(Into::into),
                ..AutoApprovalStatus::default()
            });
        }
        CachedAutoApproval::of(&cr)
    }

    fn request(status: RequestStatus, decided_by: Option<&str>) -> Request {
        Request {
            id: ID,
            request_type: RequestType::OwnerContract,
            status,
            sort_time: at(0),
            created_at: at(1),
            business_name: "Cafe".into(),
            documents_released: true,
            operational_hold: false,
            menu_registered: true,
            logo_registered: true,
            previous_step_approved: true,
            econtract_ref: None,
            target_store_number: None,
            owner_number: None,
            store_number: None,
            campaign_id: None,
            decided_by: decided_by.map(Into::into),
        }
    }

    fn open() -> Request {
        request(RequestStatus::Pending, None)
    }

    fn of_type(request_type: RequestType) -> Request {
        Request {
            request_type,
            ..open()
        }
    }

    fn state(status: StateStatus, retry_count: i32, due: Option<u32>) -> State {
        State {
            id: 70,
            request_id: ID,
            status,
            next_retry_time: due.map(at),
            retry_count,
            holder: "replica-b".into(),
            fencing_token: 3,
            step: Some("owner".into()),
            last_reason: Some("documents not released".into()),
            modified_at: at(2),
        }
    }

    fn waiting(retry_count: i32, due: Option<u32>) -> State {
        state(StateStatus::RetryWaiting, retry_count, due)
    }

    fn recovered() -> State {
        State {
            last_reason: Some("recovered: claim of a dead replica".into()),
            ..waiting(1, Some(5))
        }
    }

    fn found(request: Request, state: Option<State>) -> Option<Lookup> {
        Some(Lookup::Found(Box::new(request), state))
    }

    fn candidate(request_type: RequestType, state_id: Option<i64>) -> Candidate {
        Candidate {
            request_id: ID,
            request_type,
            state_id,
        }
    }

    fn claim(state_id: Option<i64>, eligible_at: DateTime<Utc>) -> Decision {
        Decision::Claim {
            candidate: candidate(RequestType::OwnerContract, state_id),
            eligible_at,
            recovered: None,
        }
    }

    fn shown_phase(phase: Phase) -> Shown {
        Shown {
            phase: Some(phase),
            ..Shown::default()
        }
    }

    /// One row: what the CR shows, what was read (`None`: nothing yet),
    /// whether shutdown began, whether the CR's retry was acted on.
    struct Case {
        name: &'static str,
        cr: Shown,
        lookup: Option<Lookup>,
        stopping: bool,
        retry_acted: bool,
        want: Decision,
    }

    fn case(name: &'static str, cr: Shown, lookup: Option<Lookup>, want: Decision) -> Case {
        Case {
            name,
            cr,
            lookup,
            stopping: false,
            retry_acted: false,
            want,
        }
    }

    #[test]
    fn decide_names_the_next_step_of_every_reconcile() {
        let now = at(10);
        let asked = || Shown {
            retry_asked: Some("2026-12-07T09:09:00Z"),
            ..shown_phase(Phase::Exhausted)
        };
        let cases = [
            case(
                "a CR named after another request is refused",
                Shown {
                    name: Some("copy-of-request-7"),
                    ..Shown::default()
                },
                found(open(), None),
                Decision::NameMismatch {
                    reason: "spec.requestId 7 belongs to the AutoApproval named request-7, not copy-of-request-7".into(),
                },
            ),
            case(
                "spec.paused pauses, whatever the database says",
                Shown {
                    paused: true,
                    ..shown_phase(Phase::RetryWaiting)
                },
                found(open(), Some(waiting(1, Some(5)))),
                Decision::Pause,
            ),
            case(
                "a new CR is claimed before any read",
                Shown::default(),
                None,
                Decision::ClaimAtOnce(candidate(RequestType::OwnerContract, None)),
            ),
            case(
                "a new ad CR is claimed at once as an ad",
                Shown {
                    ad: true,
                    ..Shown::default()
                },
                None,
                Decision::ClaimAtOnce(candidate(RequestType::AdContract, None)),
            ),
            Case {
                stopping: true,
                ..case(
                    "a new CR seen while stopping is read, not claimed",
                    Shown::default(),
                    None,
                    Decision::Read { resume: false },
                )
            },
            case(
                "a new CR with a retry asked for is read first",
                Shown {
                    retry_asked: Some("now"),
                    ..Shown::default()
                },
                None,
                Decision::Read { resume: false },
            ),
            case(
                "a CR with a status is read",
                shown_phase(Phase::RetryWaiting),
                None,
                Decision::Read { resume: false },
            ),
            case(
                "an unpaused CR ends its pause as it reads",
                shown_phase(Phase::Paused),
                None,
                Decision::Read { resume: true },
            ),
            case(
                "a request that does not exist",
                shown_phase(Phase::RetryWaiting),
                Some(Lookup::Missing),
                Decision::RequestNotFound,
            ),
            case(
                "a malformed row is shown and looked at again",
                shown_phase(Phase::RetryWaiting),
                Some(Lookup::Malformed(UnknownValue {
                    column: "approval_request.status",
                    value: "WHATEVER".into(),
                })),
                Decision::MalformedRow {
                    column: "approval_request.status",
                    reason: "malformed request row: unknown approval_request.status \"WHATEVER\""
                        .into(),
                },
            ),
            case(
                "a type changed to another auto-approvable one replaces the CR",
                shown_phase(Phase::RetryWaiting),
                found(of_type(RequestType::AdContract), None),
                Decision::TypeChanged {
                    reason: "spec.requestType is OWNER_CONTRACT but request 7 is AD_CONTRACT"
                        .into(),
                },
            ),
            case(
                "a type changed to one not auto-approvable is refused",
                shown_phase(Phase::RetryWaiting),
                found(of_type(RequestType::MenuChange), None),
                Decision::TypeMismatch {
                    reason: "spec.requestType is OWNER_CONTRACT but request 7 is MENU_CHANGE"
                        .into(),
                },
            ),
            case(
                "approved by us and shown: nothing more to write",
                shown_phase(Phase::Approved),
                found(request(RequestStatus::Approved, Some(DECIDED_BY_US)), None),
                Decision::Closed(Closed::ApprovedShown),
            ),
            case(
                "approved by us, the status lost: shown now",
                shown_phase(Phase::InProgress),
                found(request(RequestStatus::Approved, Some(DECIDED_BY_US)), None),
                Decision::Closed(Closed::ApprovedUnshown),
            ),
            case(
                "approved by a person: superseded",
                shown_phase(Phase::RetryWaiting),
                found(request(RequestStatus::Approved, Some("alice")), None),
                Decision::Closed(Closed::ByPerson {
                    status: RequestStatus::Approved,
                    by: Some("alice".into()),
                }),
            ),
            case(
                "rejected by nobody named: superseded",
                shown_phase(Phase::RetryWaiting),
                found(request(RequestStatus::Rejected, None), Some(waiting(1, Some(5)))),
                Decision::Closed(Closed::ByPerson {
                    status: RequestStatus::Rejected,
                    by: None,
                }),
            ),
            case(
                "a retry asked for on the CR is acted on",
                asked(),
                found(open(), Some(waiting(LIMIT, Some(5)))),
                Decision::ActOnRetryRequest,
            ),
            Case {
                retry_acted: true,
                ..case(
                    "once acted on, the retry made due is claimed",
                    asked(),
                    found(open(), Some(waiting(LIMIT - 1, Some(10)))),
                    claim(Some(70), at(10)),
                )
            },
            case(
                "a retry asked for and acknowledged already is not acted on again",
                Shown {
                    retry_done: Some("2026-12-07T09:09:00Z"),
                    ..asked()
                },
                found(open(), Some(waiting(LIMIT, Some(5)))),
                Decision::Exhausted(waiting(LIMIT, Some(5))),
            ),
            Case {
                stopping: true,
                ..case(
                    "an open request seen while stopping is left for the next holder",
                    shown_phase(Phase::RetryWaiting),
                    found(open(), Some(waiting(1, Some(5)))),
                    Decision::Stopping,
                )
            },
            case(
                "a request with no state row is claimed, eligible since its creation",
                shown_phase(Phase::InProgress),
                found(open(), None),
                claim(None, at(1)),
            ),
            case(
                "a request claimed elsewhere is shown held",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(state(StateStatus::InProgress, 1, None))),
                Decision::Held(state(StateStatus::InProgress, 1, None)),
            ),
            case(
                "held wins over the limit: the holder's outcome is shown",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(state(StateStatus::InProgress, LIMIT, None))),
                Decision::Held(state(StateStatus::InProgress, LIMIT, None)),
            ),
            case(
                "at the retry limit: exhausted",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(waiting(LIMIT, Some(5)))),
                Decision::Exhausted(waiting(LIMIT, Some(5))),
            ),
            case(
                "a retry not yet due waits, requeued just after it is",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(waiting(1, Some(12)))),
                Decision::Waiting {
                    state: waiting(1, Some(12)),
                    requeue: Duration::from_secs(120) + Duration::from_millis(20),
                },
            ),
            case(
                "a retry due now is claimed, eligible since it was due",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(waiting(LIMIT - 1, Some(10)))),
                claim(Some(70), at(10)),
            ),
            case(
                "a retry with no time is due, eligible now",
                shown_phase(Phase::RetryWaiting),
                found(open(), Some(waiting(1, None))),
                claim(Some(70), now),
            ),
            case(
                "a claim the cleanser recovered is announced when claimed",
                shown_phase(Phase::InProgress),
                found(open(), Some(recovered())),
                Decision::Claim {
                    candidate: candidate(RequestType::OwnerContract, Some(70)),
                    eligible_at: at(5),
                    recovered: Some(
                        "recovered: claim of a dead replica; last held by replica-b".into(),
                    ),
                },
            ),
            case(
                "a recovery the CR shows already is not announced again",
                Shown {
                    reason: Some("recovered: claim of a dead replica"),
                    ..shown_phase(Phase::RetryWaiting)
                },
                found(open(), Some(recovered())),
                claim(Some(70), at(5)),
            ),
        ];
        let mut failed = Vec::new();
        for case in cases {
            let cr = cr(case.cr);
            let facts = Facts {
                cr: &cr,
                now,
                stopping: case.stopping,
                retry_limit: LIMIT,
                lookup: case.lookup,
                retry_acted: case.retry_acted,
            };
            let got = decide(&facts);
            if got != case.want {
                failed.push(format!(
                    "{}:\n  got  {got:?}\n  want {:?}",
                    case.name, case.want
                ));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    #[test]
    fn after_attempt_shows_every_outcome() {
        let retry = |retry_count| AttemptOutcome::RetryScheduled {
            step: Step::Store,
            reason: RetryReason::transient("store system timed out"),
            next_retry_time: at(20),
            retry_count,
        };
        let before = waiting(3, Some(5));
        // Name, outcome, the state row it started from, claimed at once.
        let fleet = crate::db::FleetPause {
            paused_by: "ann".into(),
            reason: Some("month-end close".into()),
            paused_at: at(10),
        };
        let held_back = Decision::FleetPaused {
            reason: "fleet paused by ann since 2026-12-07T09:10:00Z: month-end close; \
                     `autoapproval resume --all` resumes"
                .into(),
        };
        let cases: [(&str, AttemptOutcome, Option<&State>, bool, Decision); 17] = [
            (
                "shadow mode would have approved: shown with its time, retries kept",
                AttemptOutcome::WouldApprove {
                    step: Step::Store,
                    would_approve_at: at(3),
                    next_retry_time: at(50),
                },
                Some(&before),
                false,
                Decision::WouldApprove {
                    step: Step::Store,
                    would_approve_at: at(3),
                    next_retry_time: at(50),
                    retry_count: 3,
                },
            ),
            (
                "refused at once: read to say why",
                AttemptOutcome::NotClaimed,
                None,
                true,
                Decision::Read { resume: false },
            ),
            (
                "decided before the claim at once: read to say by whom",
                AttemptOutcome::Superseded(RequestStatus::Rejected),
                None,
                true,
                Decision::Read { resume: false },
            ),
            (
                "vanished at once: read to say so",
                AttemptOutcome::Vanished,
                None,
                true,
                Decision::Read { resume: false },
            ),
            (
                "approved at once: no retries",
                AttemptOutcome::Approved,
                None,
                true,
                Decision::Approved { retry_count: 0 },
            ),
            (
                "a retry scheduled at once",
                retry(1),
                None,
                true,
                Decision::RetryScheduled {
                    step: Step::Store,
                    reason: "store system timed out".into(),
                    next_retry_time: at(20),
                    retry_count: 1,
                },
            ),
            (
                "approved on a retry: its retries shown",
                AttemptOutcome::Approved,
                Some(&before),
                false,
                Decision::Approved { retry_count: 3 },
            ),
            (
                "a retry below the limit waits",
                retry(LIMIT - 1),
                Some(&before),
                false,
                Decision::RetryScheduled {
                    step: Step::Store,
                    reason: "store system timed out".into(),
                    next_retry_time: at(20),
                    retry_count: LIMIT - 1,
                },
            ),
            (
                "the last retry gives up",
                retry(LIMIT),
                Some(&before),
                false,
                Decision::GaveUp {
                    step: Step::Store,
                    reason: "store system timed out".into(),
                    retry_count: LIMIT,
                },
            ),
            (
                "a person decided mid-chain",
                AttemptOutcome::Superseded(RequestStatus::Canceled),
                Some(&before),
                false,
                Decision::Superseded(RequestStatus::Canceled),
            ),
            (
                "the row vanished mid-chain",
                AttemptOutcome::Vanished,
                Some(&before),
                false,
                Decision::RequestNotFound,
            ),
            (
                "not claimed: is it paused elsewhere?",
                AttemptOutcome::NotClaimed,
                Some(&before),
                false,
                Decision::LookForPause,
            ),
            (
                "not claimed on a new request: is it paused elsewhere?",
                AttemptOutcome::NotClaimed,
                None,
                false,
                Decision::LookForPause,
            ),
            (
                "the claim was taken over",
                AttemptOutcome::FenceLost,
                Some(&before),
                false,
                Decision::FenceLost,
            ),
            (
                "the claim at once was taken over",
                AttemptOutcome::FenceLost,
                None,
                true,
                Decision::FenceLost,
            ),
            (
                "the fleet is paused: shown at once, with who, since when and why",
                AttemptOutcome::FleetPaused(fleet.clone()),
                None,
                true,
                held_back.clone(),
            ),
            (
                "the fleet is paused when a retry is due: shown",
                AttemptOutcome::FleetPaused(fleet),
                Some(&before),
                false,
                held_back,
            ),
        ];
        for (name, outcome, before, at_once, want) in cases {
            assert_eq!(
                after_attempt(outcome, before, LIMIT, at_once),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn a_request_not_claimed_is_shown_paused_only_when_the_database_says_so() {
        let pause = Pause {
            paused_by: "dba".into(),
            cr_uid: None,
            paused_at: at(3),
        };
        let cases = [
            (
                "paused by hand",
                Some(&pause),
                Decision::PausedElsewhere {
                    reason: "paused in the database by dba at 2026-12-07 09:03:00 UTC; set spec.paused to true, then false, to resume".into(),
                },
            ),
            ("not paused", None, Decision::NotClaimed),
        ];
        for (name, pause, want) in cases {
            assert_eq!(after_pause_lookup(pause), want, "{name}");
        }
    }
}
