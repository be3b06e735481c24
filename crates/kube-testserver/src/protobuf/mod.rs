//! Protobuf for the built-in kinds, as kube-apiserver speaks it to client-go: the `k8s\0`
//! envelope around a `runtime.Unknown`, in request bodies, responses and length-delimited watch
//! frames. The messages are k8s-pb's; custom resources stay JSON, as in kube-apiserver.

mod fields;
mod json;

pub use json::FieldError;

use json::{Json, bad};
use k8s_pb::api;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use prost::Message;
use serde_json::Value;

/// The media type; watch responses add `;stream=watch`.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes before every encoded object.
const MAGIC: &[u8] = b"k8s\0";

/// A kind the server speaks in protobuf.
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    decode: fn(&[u8]) -> Result<Value, FieldError>,
    encode: fn(&Value) -> Result<Vec<u8>, FieldError>,
}

fn decode_as<T: Message + Default + Json>(raw: &[u8]) -> Result<Value, FieldError> {
    let message = T::decode(raw).map_err(|e| bad("", format!("not a valid message: {e}")))?;
    Ok(message
        .to_json()
        .unwrap_or_else(|| Value::Object(Default::default())))
}

fn encode_as<T: Message + Json>(v: &Value) -> Result<Vec<u8>, FieldError> {
    Ok(T::from_json(v, "")?.encode_to_vec())
}

macro_rules! kinds {
    ($( $api_version:literal $kind:ident $list:ident = $($module:ident)::+ ),* $(,)?) => {
        &[ $(
            Kind {
                api_version: $api_version,
                kind: stringify!($kind),
                decode: decode_as::<$($module)::+::$kind>,
                encode: encode_as::<$($module)::+::$kind>,
            },
            Kind {
                api_version: $api_version,
                kind: stringify!($list),
                decode: decode_as::<$($module)::+::$list>,
                encode: encode_as::<$($module)::+::$list>,
            },
        )* ]
    };
}

/// Every built-in kind the server stores (and its list), in the versions it serves them.
static KINDS: &[Kind] = kinds![
    "v1" Namespace NamespaceList = api::core::v1,
    "v1" Secret SecretList = api::core::v1,
    "v1" ConfigMap ConfigMapList = api::core::v1,
    "v1" ServiceAccount ServiceAccountList = api::core::v1,
    "v1" Service ServiceList = api::core::v1,
    "v1" Pod PodList = api::core::v1,
    "v1" Event EventList = api::core::v1,
    "apps/v1" Deployment DeploymentList = api::apps::v1,
    "batch/v1" Job JobList = api::batch::v1,
    "rbac.authorization.k8s.io/v1" Role RoleList = api::rbac::v1,
    "rbac.authorization.k8s.io/v1" RoleBinding RoleBindingList = api::rbac::v1,
    "rbac.authorization.k8s.io/v1" ClusterRole ClusterRoleList = api::rbac::v1,
    "rbac.authorization.k8s.io/v1" ClusterRoleBinding ClusterRoleBindingList = api::rbac::v1,
    "policy/v1" PodDisruptionBudget PodDisruptionBudgetList = api::policy::v1,
    "networking.k8s.io/v1" NetworkPolicy NetworkPolicyList = api::networking::v1,
    "coordination.k8s.io/v1" Lease LeaseList = api::coordination::v1,
    "events.k8s.io/v1" Event EventList = api::events::v1,
];

/// Kinds of meta.k8s.io, whatever group-version the envelope names: client-go sends
/// DeleteOptions as `meta.k8s.io/v1` or as the resource's own group-version.
static META_KINDS: &[Kind] = &[
    Kind {
        api_version: "v1",
        kind: "Status",
        decode: decode_as::<meta::Status>,
        encode: encode_as::<meta::Status>,
    },
    Kind {
        api_version: "meta.k8s.io/v1",
        kind: "DeleteOptions",
        decode: decode_as::<meta::DeleteOptions>,
        encode: encode_as::<meta::DeleteOptions>,
    },
];

fn find(api_version: &str, kind: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.api_version == api_version && k.kind == kind)
        .or_else(|| META_KINDS.iter().find(|k| k.kind == kind))
}

/// The server speaks this kind in protobuf.
pub fn serves(api_version: &str, kind: &str) -> bool {
    find(api_version, kind).is_some()
}

/// The Accept header puts protobuf first, as client-go's typed clients do.
pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.trim().starts_with(MEDIA_TYPE))
}

/// A protobuf request body, as the JSON object it carries (apiVersion and kind included).
pub fn decode(body: &[u8]) -> Result<Value, FieldError> {
    let raw = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("", "a protobuf body starts with the bytes k8s\\0"))?;
    let unknown = Unknown::decode(raw)
        .map_err(|e| bad("", format!("not a runtime.Unknown envelope: {e}")))?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let codec = find(&api_version, &kind).ok_or_else(|| {
        bad(
            "",
            format!(
                "{kind} {api_version} is not served in protobuf (custom resources are JSON only)"
            ),
        )
    })?;
    let mut v = (codec.decode)(unknown.raw.as_deref().unwrap_or_default())?;
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), Value::String(api_version));
        o.insert("kind".into(), Value::String(kind));
    }
    Ok(v)
}

/// A JSON object (with apiVersion and kind) in its protobuf envelope.
pub fn encode(v: &Value) -> Result<Vec<u8>, FieldError> {
    let api_version = v["apiVersion"].as_str().unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or_default();
    let codec = find(api_version, kind).ok_or_else(|| {
        bad(
            "",
            format!("{kind} {api_version} is not served in protobuf"),
        )
    })?;
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some((codec.encode)(v)?),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    unknown
        .encode(&mut out)
        .map_err(|e| bad("", e.to_string()))?;
    Ok(out)
}

/// One watch event as a frame of a protobuf watch stream: a 4-byte big-endian length, then a
/// `meta.v1.WatchEvent` whose object is the enveloped object.
pub fn watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>, FieldError> {
    let event = meta::WatchEvent {
        r#type: Some(event_type.to_owned()),
        object: Some(RawExtension {
            raw: Some(encode(object)?),
        }),
    };
    let body = event.encode_to_vec();
    let len = u32::try_from(body.len()).map_err(|_| bad("", "watch event too large"))?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend(body);
    Ok(out)
}
