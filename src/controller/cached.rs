//! The AutoApproval as each replica keeps it in memory: what reconcile,
//! discovery and the garbage collector read, and nothing else. Every replica
//! caches every CR, so at 100,000 waiting requests each byte here is 100 KB
//! of RSS (issue 21: ≤ 2.5 KB per CR, where the full object took 4–10 KB).
//!
//! The watch deserializes straight into this type: managedFields, labels,
//! other parties' annotations and the status' strings are read past, never
//! kept. The status is kept as what [`super::status::project`] needs to
//! build the next one (the phase, the conditions' transitions, the retry
//! acknowledged) and a digest of the whole, so a status that would not
//! change is still not written.

use std::hash::{DefaultHasher, Hasher};

use chrono::{DateTime, Utc};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ObjectMeta, Time};
use kube::Resource;
use serde::Deserialize;

use super::crd::{
    AutoApproval, AutoApprovalSpec, AutoApprovalStatus, Phase, RETRY_ANNOTATION, annotation_field,
};

/// The conditions the controller writes, in the order it writes them.
pub const CONDITION_TYPES: [&str; 3] = ["Ready", "Approved", "Stalled"];

/// One AutoApproval as cached: metadata cut to name, namespace, uid,
/// resourceVersion (the watcher resumes from it) and generation.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "Wire")]
pub struct CachedAutoApproval {
    metadata: ObjectMeta,
    /// The spec, whole (three small fields).
    pub spec: AutoApprovalSpec,
    /// When the CR was created, in seconds (the collector's grace).
    pub created_at: Option<i64>,
    /// The retry asked for on the CR, and who asked.
    pub retry: Option<Box<RetryAsk>>,
    /// The status as reconcile needs it; `None` before the first write.
    pub status: Option<Box<CachedStatus>>,
}

/// The `autoapproval.io/retry-requested-at` annotation and its writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryAsk {
    /// Its value, acted on once.
    pub value: String,
    /// The field manager that set it (managedFields), shown in the Event.
    pub manager: Option<String>,
}

/// One condition's status and since when.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// True, False or Unknown.
    pub status: Box<str>,
    /// Its lastTransitionTime.
    pub at: Time,
}

/// What reconcile reads of a status.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedStatus {
    /// The phase shown.
    pub phase: Option<Phase>,
    /// When a waiting request is due again.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// The generation the status describes.
    pub observed_generation: Option<i64>,
    /// Digest of the last reason shown (a recovery is announced once).
    pub last_reason: Option<u64>,
    /// The retry request last acted on (echoed by every status write).
    pub last_retry_request: Option<Box<str>>,
    /// Shadow mode's latest would-decision (kept by every status write).
    pub would_decision: Option<Box<str>>,
    /// Shadow mode's first would-approve time (kept by every status write).
    pub would_approve_at: Option<DateTime<Utc>>,
    /// Ready, Approved and Stalled, as in [`CONDITION_TYPES`].
    pub conditions: [Option<Transition>; 3],
    /// Digest of the whole status, as [`digest`] computes it.
    pub digest: u64,
    /// Digest of its outcome, as [`outcome_digest`] computes it.
    pub outcome: u64,
}

impl CachedStatus {
    /// The cached form of a whole status.
    pub fn of(status: &AutoApprovalStatus) -> Self {
        let mut conditions: [Option<Transition>; 3] = Default::default();
        for (slot, type_) in conditions.iter_mut().zip(CONDITION_TYPES) {
            *slot = status
                .conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| Transition {
                    status: c.status.as_str().into(),
                    at: c.last_transition_time.clone(),
                });
        }
        Self {
            phase: status.phase,
            next_retry_time: status.next_retry_time,
            observed_generation: status.observed_generation,
            last_reason: status.last_reason.as_deref().map(text_digest),
            last_retry_request: status.last_retry_request.as_deref().map(Into::into),
            would_decision: status.would_decision.as_deref().map(Into::into),
            would_approve_at: status.would_approve_at,
            conditions,
            digest: digest(status),
            outcome: outcome_digest(status),
        }
    }

    /// The condition of `type_` (one of [`CONDITION_TYPES`]).
    pub fn condition(&self, type_: &str) -> Option<&Transition> {
        let i = CONDITION_TYPES.iter().position(|t| *t == type_)?;
        self.conditions[i].as_ref()
    }

    /// Whether the last reason shown is `reason`.
    pub fn shows_reason(&self, reason: &str) -> bool {
        self.last_reason == Some(text_digest(reason))
    }
}

/// A digest of a whole status, over its canonical JSON (the struct's field
/// order): equal statuses have equal digests, and a status read back from the
/// API server digests as the one written.
pub fn digest(status: &AutoApprovalStatus) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serializing a plain struct does not fail; an empty digest would only
    // cost one needless write.
    hasher.write(&serde_json::to_vec(status).unwrap_or_default());
    hasher.finish()
}

fn text_digest(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(text.as_bytes());
    hasher.finish()
}

impl CachedAutoApproval {
    /// The cached form of a whole CR (what the watch would have given).
    pub fn of(cr: &AutoApproval) -> Self {
        let retry = cr
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RETRY_ANNOTATION))
            .map(|value| {
                Box::new(RetryAsk {
                    value: value.clone(),
                    manager: retry_manager(
                        cr.metadata
                            .managed_fields
                            .iter()
                            .flatten()
                            .map(|m| (m.manager.as_deref(), m.fields_v1.as_ref())),
                    ),
                })
            });
        Self {
            metadata: ObjectMeta {
                name: cr.metadata.name.clone(),
                namespace: cr.metadata.namespace.clone(),
                uid: cr.metadata.uid.clone(),
                resource_version: cr.metadata.resource_version.clone(),
                generation: cr.metadata.generation,
                ..ObjectMeta::default()
            },
            spec: cr.spec.clone(),
            created_at: cr
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
            retry,
            status: cr.status.as_ref().map(|s| Box::new(CachedStatus::of(s))),
        }
    }

    /// The phase shown, if any.
    pub fn phase(&self) -> Option<Phase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// The retry asked for and not yet acted on.
    pub fn retry_pending(&self) -> Option<&RetryAsk> {
        let retry = self.retry.as_deref()?;
        let done = self
            .status
            .as_ref()
            .and_then(|s| s.last_retry_request.as_deref());
        (done != Some(retry.value.as_str())).then_some(retry)
    }

    /// When a CR that nothing asks anything of is due again: it waits its
    /// retry, its status describes its spec, it is not paused and no retry
    /// request is pending. `None` when it needs a reconcile on sight.
    pub fn settled_until(&self) -> Option<DateTime<Utc>> {
        let status = self.status.as_ref()?;
        let settled = status.phase == Some(Phase::RetryWaiting)
            && !self.spec.paused
            && status.observed_generation == self.metadata.generation
            && self.retry_pending().is_none();
        status.next_retry_time.filter(|_| settled)
    }

    /// Drops what the watcher needed and nothing after it reads: the
    /// resourceVersion (the watcher resumes from its own copy). Status
    /// writes are server-side applies, never conditional on it.
    pub fn forget_version(&mut self) {
        self.metadata.resource_version = None;
    }
}

/// The manager of the last managedFields entry that set the retry
/// annotation.
fn retry_manager<'a>(
    entries: impl DoubleEndedIterator<Item = (Option<&'a str>, Option<&'a FieldsV1>)>,
) -> Option<String> {
    let pointer = annotation_field(RETRY_ANNOTATION);
    entries
        .rev()
        .find(|(_, fields)| fields.is_some_and(|f| f.0.pointer(&pointer).is_some()))
        .and_then(|(manager, _)| manager.map(str::to_owned))
}

impl Resource for CachedAutoApproval {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        AutoApproval::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        AutoApproval::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        AutoApproval::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        AutoApproval::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

// === the wire form: read, cut down, dropped ===

#[derive(Deserialize)]
struct Wire {
    metadata: WireMeta,
    spec: AutoApprovalSpec,
    #[serde(default)]
    status: Option<AutoApprovalStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    managed_fields: Option<Vec<WireManagedField>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireManagedField {
    manager: Option<String>,
    fields_v1: Option<FieldsV1>,
}

impl From<Wire> for CachedAutoApproval {
    fn from(wire: Wire) -> Self {
        let Wire {
            metadata: meta,
            spec,
            status,
        } = wire;
        let retry = meta
            .annotations
            .and_then(|mut a| a.remove(RETRY_ANNOTATION))
            .map(|value| {
                Box::new(RetryAsk {
                    value,
                    manager: retry_manager(
                        meta.managed_fields
                            .iter()
                            .flatten()
                            .map(|m| (m.manager.as_deref(), m.fields_v1.as_ref())),
                    ),
                })
            });
        Self {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                generation: meta.generation,
                ..ObjectMeta::default()
            },
            spec,
            created_at: meta.creation_timestamp.map(|t| t.0.as_second()),
            retry,
            status: status.map(|s| Box::new(CachedStatus::of(&s))),
        }
    }
}

/// A digest of what [`super::status::same_outcome`] compares: the status without the
/// fields that only describe the last change (retry count, schedule,
/// holder, `since`).
pub fn outcome_digest(status: &AutoApprovalStatus) -> u64 {
    let outcome = AutoApprovalStatus {
        retry_count: 0,
        next_retry_time: None,
        holder: None,
        since: None,
        ..status.clone()
    };
    digest(&outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::crd::{ApprovalType, for_request};
    use crate::controller::status::{Observed, project};

    #[test]
    fn the_watch_keeps_our_retry_annotation_its_writer_and_nothing_else() {
        let json = serde_json::json!({
            "apiVersion": "autoapproval.io/v1alpha1",
            "kind": "AutoApproval",
            "metadata": {
                "name": "request-7", "namespace": "ns", "uid": "u-7",
                "resourceVersion": "12", "generation": 2,
                "creationTimestamp": "2026-12-02T09:00:00Z",
                "labels": {"autoapproval.io/shard": "7"},
                "annotations": {
                    RETRY_ANNOTATION: "now",
                    "kubectl.kubernetes.io/last-applied-configuration": "{…}"
                },
                "managedFields": [
                    {"manager": "autoapproval", "operation": "Apply",
                     "fieldsV1": {"f:status": {}}},
                    {"manager": "kubectl-annotate", "operation": "Update",
                     "fieldsV1": {"f:metadata": {"f:annotations": {
                         "f:autoapproval.io/retry-requested-at": {}}}}}
                ]
            },
            "spec": {"requestId": 7, "requestType": "OWNER_CONTRACT"},
            "status": {"phase": "RetryWaiting", "retryCount": 1, "lastReason": "documents not released"}
        });
        let cr: CachedAutoApproval = serde_json::from_value(json).unwrap();
        assert_eq!(cr.meta().name.as_deref(), Some("request-7"));
        assert_eq!(cr.meta().uid.as_deref(), Some("u-7"));
        assert_eq!(cr.meta().generation, Some(2));
        assert!(cr.meta().labels.is_none() && cr.meta().annotations.is_none());
        assert!(cr.meta().managed_fields.is_none());
        assert_eq!(
            cr.retry.as_deref(),
            Some(&RetryAsk {
                value: "now".into(),
                manager: Some("kubectl-annotate".into())
            })
        );
        assert_eq!(cr.created_at, Some(1_796_202_000));
        let status = cr.status.as_ref().unwrap();
        assert_eq!(status.phase, Some(Phase::RetryWaiting));
        assert!(status.shows_reason("documents not released"));
        assert!(!status.shows_reason("recovered: claim expired"));
    }

    #[test]
    fn a_status_read_back_digests_as_the_one_written() {
        let observed = Observed {
            retry_count: 2,
            next_retry_time: Some(chrono::Utc::now()),
            ..Observed::phase(Phase::RetryWaiting, Some("documents not released".into()))
        };
        let written = project(None, &observed, Some(1), chrono::Utc::now());
        let read_back: AutoApprovalStatus =
            serde_json::from_slice(&serde_json::to_vec(&written).unwrap()).unwrap();
        assert_eq!(digest(&read_back), digest(&written));
        let cached = CachedStatus::of(&read_back);
        let again = project(Some(&cached), &observed, Some(1), chrono::Utc::now());
        assert_eq!(digest(&again), cached.digest, "nothing changed: no write");
        let moved = Observed {
            retry_count: 3,
            ..observed
        };
        let next = project(Some(&cached), &moved, Some(1), chrono::Utc::now());
        assert_ne!(digest(&next), cached.digest);
    }

    #[test]
    fn only_a_quiet_waiting_cr_is_settled() {
        let due = chrono::Utc::now() + chrono::Duration::minutes(10);
        let waiting = Observed {
            next_retry_time: Some(due),
            ..Observed::phase(Phase::RetryWaiting, None)
        };
        let mut full = for_request(3, ApprovalType::OwnerContract, 16);
        full.metadata.generation = Some(1);
        full.status = Some(project(None, &waiting, Some(1), chrono::Utc::now()));
        assert_eq!(CachedAutoApproval::of(&full).settled_until(), Some(due));

        let mut paused = full.clone();
        paused.spec.paused = true;
        paused.metadata.generation = Some(2);
        assert_eq!(CachedAutoApproval::of(&paused).settled_until(), None);

        let mut asked = full.clone();
        asked.metadata.annotations = Some([(RETRY_ANNOTATION.to_owned(), "now".to_owned())].into());
        assert_eq!(CachedAutoApproval::of(&asked).settled_until(), None);

        let mut pending = full;
        pending.status = Some(project(
            None,
            &Observed::phase(Phase::Pending, None),
            Some(1),
            chrono::Utc::now(),
        ));
        assert_eq!(CachedAutoApproval::of(&pending).settled_until(), None);
    }
}
