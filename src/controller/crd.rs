//! The `AutoApproval` custom resource: one per request under auto-approval,
//! a mirror of the database for `kubectl get autoapprovals`. The database
//! stays the source of truth; deleting a CR loses nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::CustomResourceExt;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::domain::RequestType;

/// Label carrying the request type.
pub const TYPE_LABEL: &str = "autoapproval.io/request-type";
/// Label carrying the shard, `request_id mod K`.
pub const SHARD_LABEL: &str = "autoapproval.io/shard";
/// Annotation asking for a retry now: its value (a timestamp, say) is acted
/// on once and echoed in `status.lastRetryRequest`.
pub const RETRY_ANNOTATION: &str = "autoapproval.io/retry-requested-at";
/// The field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "autoapproval";

/// Asks the controller to auto-approve one request of the business table.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "autoapproval.io",
    version = "v1alpha1",
    kind = "AutoApproval",
    plural = "autoapprovals",
    shortname = "aa",
    category = "autoapproval",
    namespaced,
    status = "AutoApprovalStatus",
    doc = "A contract request under auto-approval, mirrored from the database",
    printcolumn = r#"{"name":"Request","type":"integer","jsonPath":".spec.requestId"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.requestType"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Since","type":"date","jsonPath":".status.since"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Step","type":"string","priority":1,"jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Holder","type":"string","priority":1,"jsonPath":".status.holder"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.lastReason"}"#,
    printcolumn = r#"{"name":"Retry Asked","type":"string","priority":1,"jsonPath":".status.lastRetryRequest"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AutoApprovalSpec {
    /// The request's id in the business table; immutable (the CR is named after it).
    #[schemars(range(min = 1))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("requestId is immutable"))]
    pub request_id: i64,
    /// The request's type; only auto-approvable types are accepted. Immutable:
    /// when the database's type changes, the controller replaces the CR.
    #[x_kube(validation = Rule::new("self == oldSelf").message("requestType is immutable"))]
    pub request_type: ApprovalType,
    /// While true the controller never claims the request.
    #[serde(default)]
    pub paused: bool,
}

/// The auto-approvable request types, spelled as in the database.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApprovalType {
    /// Owner contract: owner → store processors.
    OwnerContract,
    /// Ad contract: the ad campaign processor.
    AdContract,
}

impl ApprovalType {
    /// The domain type.
    pub fn request_type(self) -> RequestType {
        match self {
            ApprovalType::OwnerContract => RequestType::OwnerContract,
            ApprovalType::AdContract => RequestType::AdContract,
        }
    }

    /// The CR type of an auto-approvable domain type.
    pub fn from_request_type(t: RequestType) -> Option<Self> {
        match t {
            RequestType::OwnerContract => Some(ApprovalType::OwnerContract),
            RequestType::AdContract => Some(ApprovalType::AdContract),
            _ => None,
        }
    }
}

/// Where a request stands, as last observed by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoApprovalStatus {
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The processor the request last reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Retries when the outcome last changed (`since`); retries with the
    /// same outcome are not written: the database keeps the live count
    /// (`autoapproval request show ID`).
    #[serde(default)]
    pub retry_count: i32,
    /// The retry scheduled when the outcome last changed (`since`); later
    /// retries with the same outcome are not written: the database keeps the
    /// schedule (`autoapproval request show ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry_time: Option<DateTime<Utc>>,
    /// Why the request last had to wait, or why it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reason: Option<String>,
    /// The replica that made the last change of outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// When the outcome (phase, step, reason, conditions) last changed:
    /// what this status shows is true since then, retried or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Shadow mode's latest would-decision: `Approve` (every gate passed) or
    /// `Hold` (the step and reason say which gate); absent when never run in shadow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_decision: Option<String>,
    /// Shadow mode: when it would first have approved the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_approve_at: Option<DateTime<Utc>>,
    /// The value of the `autoapproval.io/retry-requested-at` annotation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_retry_request: Option<String>,
    /// Conditions (metav1.Condition): Ready, Approved and Stalled, one of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Where the request stands: Pending (seen, not yet claimed), InProgress (a
/// replica runs its chain), RetryWaiting (waits for its next retry time),
/// Approved (approved by the controller), Superseded (a person decided
/// first), Exhausted (the retry limit was reached; a person must look),
/// Paused (spec.paused, or paused in the database; never claimed), Invalid
/// (names no request the controller can work on).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Seen, not yet claimed.
    Pending,
    /// A replica holds the claim and runs the chain.
    InProgress,
    /// Waiting for the next retry time.
    RetryWaiting,
    /// Approved by the controller.
    Approved,
    /// A person decided before the controller did.
    Superseded,
    /// The retry limit was reached; a person must look at it.
    Exhausted,
    /// `spec.paused` is set.
    Paused,
    /// The CR names no request the controller can work on.
    Invalid,
}

impl Phase {
    /// The spelling in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::InProgress => "InProgress",
            Phase::RetryWaiting => "RetryWaiting",
            Phase::Approved => "Approved",
            Phase::Superseded => "Superseded",
            Phase::Exhausted => "Exhausted",
            Phase::Paused => "Paused",
            Phase::Invalid => "Invalid",
        }
    }

    /// Whether nothing more will happen to the request.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Approved | Phase::Superseded | Phase::Invalid)
    }
}

/// The deterministic CR name of a request.
pub fn cr_name(request_id: i64) -> String {
    format!("request-{request_id}")
}

/// The shard of a request among `shard_count`.
pub fn shard_of(request_id: i64, shard_count: u32) -> u32 {
    request_id.rem_euclid(i64::from(shard_count.max(1))) as u32
}

/// The labels of a request's CR.
pub fn labels(
    request_id: i64,
    request_type: RequestType,
    shard_count: u32,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TYPE_LABEL.to_owned(), request_type.as_str().to_owned()),
        (
            SHARD_LABEL.to_owned(),
            shard_of(request_id, shard_count).to_string(),
        ),
    ])
}

/// A new CR for a request.
pub fn for_request(request_id: i64, approval_type: ApprovalType, shard_count: u32) -> AutoApproval {
    let mut cr = AutoApproval::new(
        &cr_name(request_id),
        AutoApprovalSpec {
            request_id,
            request_type: approval_type,
            paused: false,
        },
    );
    cr.metadata.labels = Some(labels(
        request_id,
        approval_type.request_type(),
        shard_count,
    ));
    cr
}

/// Deletes exactly the CR seen (by uid), not a newer one of the same name:
/// true when this call deleted it, false when it was gone already or has
/// been replaced meanwhile (404, 409).
pub async fn delete_seen(
    api: &kube::Api<AutoApproval>,
    name: &str,
    uid: Option<String>,
) -> Result<bool, kube::Error> {
    use kube::api::{DeleteParams, Preconditions};

    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// The `fieldsV1` pointer of annotation `key` in a managedFields entry.
pub fn annotation_field(key: &str) -> String {
    format!(
        "/f:metadata/f:annotations/f:{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

/// The CRD manifest as YAML, what `autoapproval crd` prints and
/// `crds/autoapproval.yaml` holds.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&AutoApproval::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shards_are_deterministic() {
        assert_eq!(cr_name(42), "request-42");
        assert_eq!(shard_of(42, 16), 10);
        assert_eq!(shard_of(42, 0), 0);
        let cr = for_request(42, ApprovalType::AdContract, 16);
        let labels = cr.metadata.labels.unwrap_or_default();
        assert_eq!(labels[TYPE_LABEL], "AD_CONTRACT");
        assert_eq!(labels[SHARD_LABEL], "10");
    }

    #[test]
    fn the_schema_requires_a_request_id_and_a_known_type() {
        let crd = serde_json::to_value(AutoApproval::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(required, ["requestId", "requestType"]);
        assert_eq!(
            spec["properties"]["requestType"]["enum"],
            serde_json::json!(["OWNER_CONTRACT", "AD_CONTRACT"])
        );
        assert_eq!(spec["properties"]["paused"]["default"], false);
    }

    #[test]
    fn conditions_are_a_map_keyed_by_type() {
        let crd = serde_json::to_value(AutoApproval::crd()).unwrap();
        let conditions = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        let required = conditions["items"]["required"].as_array().unwrap();
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(required.iter().any(|r| r == field), "{field} required");
        }
    }
}
