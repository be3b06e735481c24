//! The processor chain: owner → store → ad campaign, a small state machine.
//! Each processor knows its successor; the runner only looks the named one up,
//! re-reads the request from the primary before every step, and stops as soon
//! as a person has decided.

mod ad_campaign;
pub mod filters;
mod owner;
mod store_approval;

use std::fmt;

use async_trait::async_trait;
use tracing::Instrument;

use crate::clock::Clock;
use crate::db::{Database, DbError, SentKey};
use crate::domain::{Claim, Facts, Request, RequestStatus, RequestType};
use crate::external::{Dedup, ErrorKind, ExternalError, ExternalSystems, IdempotencyKey};
use crate::retry::RetryClass;
use crate::telemetry::Metrics;

/// A step of the chain: shown in the status, labels metrics, and names
/// the idempotency key of its creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Creates the owner.
    Owner,
    /// Creates the store.
    Store,
    /// Approves the ad campaign.
    AdCampaign,
}

impl Step {
    /// Where the chain starts for a request type; `None` when not auto-approvable.
    /// A retry always starts here again: every gate runs again, and only
    /// the creations whose results are stored are skipped.
    fn first_for(request_type: RequestType) -> Option<Step> {
        match request_type {
            RequestType::OwnerContract => Some(Step::Owner),
            RequestType::AdContract => Some(Step::AdCampaign),
            _ => None,
        }
    }

    /// Stable name for status, metrics and idempotency keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Owner => "owner",
            Step::Store => "store",
            Step::AdCampaign => "ad-campaign",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request has to wait, and how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryReason {
    /// Condition not met, or transient failure.
    pub class: RetryClass,
    /// A short human reason, e.g. `documents not released`.
    pub reason: String,
    /// Whether it counts towards the retry limit: failures do (a
    /// downstream or our database failing, a refusal), waits for a
    /// condition the business system will change do not.
    pub counted: bool,
}

impl RetryReason {
    /// An unmet condition.
    pub fn condition(reason: impl Into<String>) -> Self {
        Self {
            class: RetryClass::ConditionNotMet,
            reason: reason.into(),
            counted: false,
        }
    }

    /// A transient failure of our own (a timeout): backs off exponentially.
    pub fn transient(reason: impl Into<String>) -> Self {
        Self {
            class: RetryClass::Transient,
            reason: reason.into(),
            counted: true,
        }
    }

    /// A failed external call: transient errors back off, refusals wait long.
    pub fn external(error: &ExternalError) -> Self {
        let class = match error.kind {
            ErrorKind::Transient => RetryClass::Transient,
            ErrorKind::Permanent => RetryClass::ConditionNotMet,
        };
        // A refusal waits the long interval but counts: the same call
        // would be refused every ten minutes for the whole window.
        Self {
            class,
            reason: error.to_string(),
            counted: true,
        }
    }
}

/// What a processor answers.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Transition {
    /// Go on with this processor.
    Next(Step),
    /// Every step is done: approve.
    Success,
    /// Stop here and retry later from the first step.
    Retry(RetryReason),
}

/// Failures that end the chain without an outcome.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// Our fence no longer matches: another worker holds the request now.
    #[error("claim on request {0} was lost")]
    FenceLost(i64),
    /// The claim's shard was lost, or its renewal is overdue: another
    /// replica may take it, so the chain stops before any further call.
    #[error("the shard of request {0} was lost or its renewal is overdue")]
    ShardLost(i64),
}

/// What a processor gets to work with.
pub struct ChainContext<'a> {
    /// The store (primary re-reads and fenced writes).
    pub store: &'a Database,
    /// The four external systems, each behind its own concurrency limit.
    pub external: &'a ExternalSystems,
    /// The claim every write carries.
    pub claim: &'a Claim,
    /// The clock every time the step writes is read from (injected for tests).
    pub clock: &'a dyn Clock,
    /// Where the step counts its external calls and outcomes.
    pub metrics: &'a Metrics,
    /// Whether the claim's shard is still held and renewed: checked before
    /// every external call, so a chain whose shard was lost calls nothing.
    pub held: &'a (dyn Fn() -> bool + Send + Sync),
    /// Where the gates note what they passed on outside the request row;
    /// [`Chain::run`] starts it afresh and hands it to the completion.
    pub seen: &'a Seen,
    /// Shadow mode: every gate runs, but no creation is sent and nothing
    /// is written to the request or the ledger; a creation the step would
    /// make is taken as made (counted), and the chain goes on to the next
    /// step's gates as if it had succeeded.
    pub shadow: bool,
}

/// What an attempt's gates passed on outside the request row, for the
/// completion to re-check ([`Facts::econtract_status`]).
#[derive(Debug, Default)]
pub struct Seen {
    econtract_status: std::sync::Mutex<Option<String>>,
}

impl Seen {
    /// A gate passed on the ledger's saying `status` of the request's
    /// e-contract (read there, or written there by the sync).
    pub fn econtract_status(&self, status: &str) {
        *self.lock() = Some(status.to_owned());
    }

    /// What was noted, leaving nothing.
    fn take_econtract_status(&self) -> Option<String> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.econtract_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl ChainContext<'_> {
    /// Shadow mode: the creation in `system` the step would make now is
    /// counted and taken as made, and nothing is sent.
    pub(crate) fn would_create(&self, system: crate::external::System) {
        self.metrics.shadow_creation_skipped(system.as_str());
        tracing::info!(
            request_id = self.claim.request_id,
            %system,
            "shadow mode: the creation is not sent; taken as made"
        );
    }

    /// Makes an external call, counting its result, once the claim's shard
    /// is seen still held and renewed; fails with [`ChainError::ShardLost`]
    /// otherwise, and nothing is sent (the call's future has not started).
    pub async fn call<T>(
        &self,
        system: crate::external::System,
        call: impl std::future::Future<Output = Result<T, ExternalError>>,
    ) -> Result<Result<T, ExternalError>, ChainError> {
        if !(self.held)() {
            return Err(ChainError::ShardLost(self.claim.request_id));
        }
        let started = tokio::time::Instant::now();
        let result = call.await;
        self.metrics
            .external_call_took(system.as_str(), started.elapsed());
        let label = match &result {
            Ok(_) => "ok",
            Err(e) if e.kind == ErrorKind::Transient => "transient",
            Err(_) => "permanent",
        };
        self.metrics.external_call(system.as_str(), label);
        Ok(result)
    }

    /// The key to send `base`'s creation under: its newest generation
    /// recorded, unless the downstream refused that body (400 or 422, which
    /// created nothing), then the next one (`<base>#<n>`), so a body built
    /// after a refusal goes under a key of its own. A lost answer ends no
    /// key: its retry resends the recorded body under the same one.
    pub(crate) async fn key_for(&self, base: IdempotencyKey) -> Result<IdempotencyKey, ChainError> {
        let keys = self.store.sent_keys(self.claim.request_id).await?;
        Ok(base.generation(current_generation(&base, &keys)))
    }

    /// The body to send under `key`: the one an earlier attempt recorded
    /// for it, else `fresh`, recorded now, before anything is sent. A key
    /// names one creation, and a strict downstream refuses it with another
    /// body, so the first body is resent verbatim until the result is saved
    /// even when the request changed meanwhile (a rename). A change that
    /// makes another creation must make another key (the campaign's store).
    pub(crate) async fn body_for<T>(&self, key: &IdempotencyKey, fresh: T) -> Result<T, ChainError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
    {
        let text = serde_json::to_string(&fresh).map_err(|e| recorded_body_error(key, e))?;
        let Some(recorded) = self
            .store
            .record_sent(self.claim, key.as_str(), &text)
            .await?
        else {
            return Err(ChainError::FenceLost(self.claim.request_id));
        };
        let body: T = serde_json::from_str(&recorded).map_err(|e| recorded_body_error(key, e))?;
        if body != fresh {
            self.metrics.recorded_body_resent();
            tracing::info!(
                request_id = self.claim.request_id,
                key = key.as_str(),
                "the request changed (renamed, say) since its creation was first sent under this key; the recorded body is sent again"
            );
        }
        Ok(body)
    }

    /// Makes a creation in `system` once: `create`'s result, or, when the
    /// system ignores idempotency keys (`dedup` is `Lookup`), what an
    /// earlier attempt made and `find` looks up first (that attempt's answer
    /// was lost). `find` answers only a creation made from the current
    /// inputs; it is not called when the system honours keys. A creation
    /// the downstream refused (nothing made) ends `key` ([`Self::key_for`]).
    pub(crate) async fn create_once<T>(
        &self,
        system: crate::external::System,
        dedup: Dedup,
        key: &IdempotencyKey,
        find: impl std::future::Future<Output = Result<Option<T>, ExternalError>>,
        create: impl std::future::Future<Output = Result<T, ExternalError>>,
    ) -> Result<Result<T, ExternalError>, ChainError> {
        if dedup == Dedup::Lookup {
            match self.call(system, find).await? {
                Ok(Some(found)) => {
                    self.metrics.creation_found(system.as_str());
                    tracing::info!(
                        request_id = self.claim.request_id,
                        %system,
                        "an earlier attempt's creation was found and is taken instead of a new one"
                    );
                    return Ok(Ok(found));
                }
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        let created = self.call(system, create).await?;
        if let Err(e) = &created
            && e.refused
        {
            if !self.store.refuse_sent(self.claim, key.as_str()).await? {
                return Err(ChainError::FenceLost(self.claim.request_id));
            }
            tracing::info!(
                request_id = self.claim.request_id,
                %system,
                key = key.as_str(),
                error = %e,
                "the downstream refused the body and created nothing; the key is ended, the next attempt sends a new body under a new key"
            );
        }
        Ok(created)
    }
}

/// The generation of `base` to send under, given the keys recorded for the
/// request: the newest of `base`'s, or the one after it when its body was
/// refused; the first when none is recorded.
fn current_generation(base: &IdempotencyKey, recorded: &[SentKey]) -> u32 {
    let newest = recorded
        .iter()
        .filter_map(|k| {
            IdempotencyKey::recorded(k.key.clone())
                .generation_of(base)
                .map(|n| (n, k.refused))
        })
        .max_by_key(|(n, _)| *n);
    match newest {
        None => 1,
        Some((n, true)) => n.saturating_add(1),
        Some((n, false)) => n,
    }
}

/// A recorded body that does not (de)serialize: refused by name, retried
/// with backoff as any database failure after the claim.
fn recorded_body_error(key: &IdempotencyKey, error: serde_json::Error) -> DbError {
    DbError::Database {
        operation: "read the body recorded under an idempotency key",
        source: sqlx::Error::Decode(format!("key {}: {error}", key.as_str()).into()),
    }
}

/// One processor of the chain.
#[async_trait]
trait Processor: Send + Sync {
    /// Which step this is.
    fn step(&self) -> Step;

    /// Does this step's work on a freshly read, open request.
    async fn process(
        &self,
        cx: &ChainContext<'_>,
        request: &Request,
    ) -> Result<Transition, ChainError>;
}

/// How a chain run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainOutcome {
    /// Every step done: the request may be approved while these facts,
    /// which every gate passed on, still hold.
    Success(Facts),
    /// A fact read by an earlier step differs at a later step's re-read:
    /// the gates did not all pass on the same facts. Due again at once;
    /// `step` is where it was seen.
    Changed {
        /// The step whose re-read saw the change.
        step: Step,
    },
    /// Must wait; `step` is where it stopped.
    Retry {
        /// The step that asked for the retry.
        step: Step,
        /// Why.
        reason: RetryReason,
    },
    /// A person decided meanwhile (or the request is otherwise terminal).
    Closed(RequestStatus),
    /// The request row no longer exists.
    Vanished,
}

/// The processors, looked up by step.
pub struct Chain {
    processors: Vec<Box<dyn Processor>>,
}

impl Default for Chain {
    fn default() -> Self {
        let filters = filters::all();
        Self {
            processors: vec![
                Box::new(owner::OwnerProcessor::new(filters::for_step(
                    &filters,
                    Step::Owner,
                ))),
                Box::new(store_approval::StoreProcessor::new(filters::for_step(
                    &filters,
                    Step::Store,
                ))),
                Box::new(ad_campaign::AdCampaignProcessor::new(filters::for_step(
                    &filters,
                    Step::AdCampaign,
                ))),
            ],
        }
    }
}

// Longer than any real chain; guards against a processor naming itself.
const MAX_TRANSITIONS: usize = 8;

impl Chain {
    /// Runs the chain for a claimed request, from its first step. `on_step`
    /// is told each step as it starts (status projection, heartbeats).
    pub async fn run(
        &self,
        cx: &ChainContext<'_>,
        on_step: &(dyn Fn(Step) + Send + Sync),
    ) -> Result<ChainOutcome, ChainError> {
        let mut step = None;
        // The facts of the first read: every later step must read the same,
        // or a gate of an earlier step passed on what is no longer so.
        let mut first: Option<Facts> = None;
        cx.seen.take_econtract_status();
        for _ in 0..MAX_TRANSITIONS {
            // Every step sees fresh data: the previous one changed the
            // outside world, the e-sign ledger syncs by itself, and a person
            // may have decided in between.
            let Some(request) = cx.store.request(cx.claim.request_id).await? else {
                return Ok(ChainOutcome::Vanished);
            };
            if !request.status.is_open() {
                return Ok(ChainOutcome::Closed(request.status));
            }
            let current = match step {
                Some(s) => s,
                None => match Step::first_for(request.request_type) {
                    Some(s) => s,
                    None => {
                        return Ok(ChainOutcome::Retry {
                            step: Step::Owner,
                            reason: RetryReason::condition(format!(
                                "request type {} is not auto-approvable",
                                request.request_type
                            )),
                        });
                    }
                },
            };
            let read = Facts::of(&request);
            if first.as_ref().is_some_and(|first| *first != read) {
                return Ok(ChainOutcome::Changed { step: current });
            }
            let facts = first.get_or_insert(read);
            on_step(current);
            let Some(processor) = self.processors.iter().find(|p| p.step() == current) else {
                return Ok(ChainOutcome::Retry {
                    step: current,
                    reason: RetryReason::condition(format!("no processor for step {current}")),
                });
            };
            let span = tracing::info_span!("step", step = current.as_str());
            match processor.process(cx, &request).instrument(span).await? {
                Transition::Next(next) => step = Some(next),
                Transition::Success => {
                    return Ok(ChainOutcome::Success(Facts {
                        econtract_status: cx.seen.take_econtract_status(),
                        ..facts.clone()
                    }));
                }
                Transition::Retry(reason) => {
                    return Ok(ChainOutcome::Retry {
                        step: current,
                        reason,
                    });
                }
            }
        }
        Ok(ChainOutcome::Retry {
            step: step.unwrap_or(Step::Owner),
            reason: RetryReason::condition("processor chain did not terminate"),
        })
    }
}

/// Runs `filters` in order; the first that is not satisfied decides the retry.
async fn run_filters(
    filters: &[std::sync::Arc<dyn filters::Filter>],
    step: Step,
    cx: &ChainContext<'_>,
    request: &Request,
) -> Result<Option<RetryReason>, ChainError> {
    for filter in filters
        .iter()
        .filter(|f| f.applies(step, request.request_type))
    {
        if let filters::Verdict::Wait(reason) = filter.check(cx, request).await? {
            return Ok(Some(reason));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::System;

    fn failed(kind: ErrorKind) -> ExternalError {
        ExternalError {
            system: System::Store,
            operation: "create_store",
            kind,
            message: "no".into(),
            refused: false,
        }
    }

    #[test]
    fn a_refused_body_ends_its_key_and_a_lost_answer_does_not() {
        let base = IdempotencyKey::new(7, "owner");
        let sent = |key: &str, refused| SentKey {
            key: key.into(),
            refused,
        };
        // Name, the keys recorded for request 7, the key to send under.
        let cases = [
            ("nothing sent yet: the first key", vec![], "7:owner"),
            (
                "a body sent, its answer lost: the same key",
                vec![sent("7:owner", false)],
                "7:owner",
            ),
            (
                "the first body refused: the second key",
                vec![sent("7:owner", true)],
                "7:owner#2",
            ),
            (
                "the second body sent: the second key again",
                vec![sent("7:owner", true), sent("7:owner#2", false)],
                "7:owner#2",
            ),
            (
                "two refused: the third",
                vec![sent("7:owner#2", true), sent("7:owner", true)],
                "7:owner#3",
            ),
            (
                "another step's and another request's keys do not count",
                vec![
                    sent("7:store", true),
                    sent("7:owner-x", true),
                    sent("77:owner", true),
                ],
                "7:owner",
            ),
        ];
        for (name, recorded, key) in cases {
            let generation = current_generation(&base, &recorded);
            assert_eq!(base.generation(generation).as_str(), key, "{name}");
        }
    }

    #[test]
    fn each_reason_to_wait_has_its_class_and_counts_as_named() {
        // Name, the reason, its class, whether it counts towards the limit.
        let cases = [
            (
                "an unmet condition waits long and does not count",
                RetryReason::condition("documents not released"),
                RetryClass::ConditionNotMet,
                false,
            ),
            (
                "our own transient failure backs off and counts",
                RetryReason::transient("processing timed out"),
                RetryClass::Transient,
                true,
            ),
            (
                "a downstream's transient failure backs off and counts",
                RetryReason::external(&failed(ErrorKind::Transient)),
                RetryClass::Transient,
                true,
            ),
            (
                "a downstream's refusal waits long but counts",
                RetryReason::external(&failed(ErrorKind::Permanent)),
                RetryClass::ConditionNotMet,
                true,
            ),
        ];
        for (name, reason, class, counted) in cases {
            assert_eq!((reason.class, reason.counted), (class, counted), "{name}");
        }
    }

    #[test]
    fn each_request_type_starts_its_chain_where_named() {
        let cases = [
            (
                "an owner contract",
                RequestType::OwnerContract,
                Some(Step::Owner),
            ),
            (
                "an ad contract",
                RequestType::AdContract,
                Some(Step::AdCampaign),
            ),
            (
                "a menu change is not auto-approved",
                RequestType::MenuChange,
                None,
            ),
        ];
        for (name, request_type, first) in cases {
            assert_eq!(Step::first_for(request_type), first, "{name}");
        }
    }
}
