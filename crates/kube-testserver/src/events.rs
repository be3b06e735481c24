//! The two views of an Event, as kube-apiserver serves them: one stored
//! event is readable as `events.k8s.io/v1` and as core `v1`. The controller
//! writes the former; `kubectl describe` lists the latter with an
//! `involvedObject.*` field selector.

use crate::error::Cause;
use serde_json::{Map, Value};

/// What kube-apiserver refuses in a new `events.k8s.io/v1` Event in namespace `ns` (the
/// rules of its `ValidateEventCreate` a controller can break): a missing `eventTime`, the
/// regarded object's namespace not the event's, and, with an `eventTime`, a missing reporting
/// controller, instance, action or reason.
pub fn refused_new(event: &Value, ns: &str) -> Vec<Cause> {
    let text = |p: &str| event.pointer(p).and_then(Value::as_str).unwrap_or("");
    let regarding_ns = text("/regarding/namespace");
    let timed = !text("/eventTime").is_empty();
    let mut causes = vec![];
    let namespace_mismatch = if timed {
        regarding_ns.is_empty() && ns != "kube-system"
    } else if regarding_ns.is_empty() {
        !ns.is_empty() && ns != "default"
    } else {
        regarding_ns != ns
    };
    if namespace_mismatch {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: "involvedObject.namespace".into(),
            message: format!("Invalid value: {regarding_ns:?}: does not match event.namespace"),
        });
    }
    let required = |field: &str| Cause {
        reason: "FieldValueRequired",
        field: field.into(),
        message: "Required value".into(),
    };
    if timed {
        for (pointer, field) in [
            ("/reportingController", "reportingController"),
            ("/reportingInstance", "reportingInstance"),
            ("/action", "action"),
            ("/reason", "reason"),
        ] {
            if text(pointer).is_empty() {
                causes.push(required(field));
            }
        }
    } else {
        causes.push(required("eventTime"));
    }
    causes
}

/// The core/v1 Event fields a field selector may name besides metadata.name
/// and metadata.namespace (kube-apiserver's `EventToSelectableFields`).
pub const CORE_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Where a selectable core/v1 field lives in the object.
pub fn pointer(field: &str) -> String {
    match field {
        // The selector's `source` is the source's component.
        "source" => "/source/component".into(),
        f => format!("/{}", f.replace('.', "/")),
    }
}

/// An `events.k8s.io/v1` Event as core `v1` shows it (the field renames of
/// kube-apiserver's conversion; everything else is carried over).
pub fn to_core(event: &Value) -> Value {
    let Some(fields) = event.as_object() else {
        return event.clone();
    };
    let mut out = Map::new();
    for (k, v) in fields {
        let name = match k.as_str() {
            "regarding" => "involvedObject",
            "note" => "message",
            "reportingController" => "reportingComponent",
            "deprecatedSource" => "source",
            "deprecatedFirstTimestamp" => "firstTimestamp",
            "deprecatedLastTimestamp" => "lastTimestamp",
            "deprecatedCount" => "count",
            other => other,
        };
        out.insert(name.to_string(), v.clone());
    }
    out.insert("apiVersion".into(), "v1".into());
    out.insert("kind".into(), "Event".into());
    // core/v1 always carries an involvedObject.
    out.entry("involvedObject")
        .or_insert_with(|| Value::Object(Map::new()));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_new_style_event_reads_as_a_core_event() {
        let e = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "x.1", "namespace": "default"},
            "regarding": {"kind": "AutoApproval", "name": "request-1", "uid": "u"},
            "note": "approved", "reason": "Approved", "type": "Normal",
            "reportingController": "autoapproval", "deprecatedCount": 2,
            "eventTime": "2026-12-03T00:00:00.000000Z",
        });
        let c = to_core(&e);
        assert_eq!(c["apiVersion"], "v1");
        assert_eq!(c["involvedObject"]["name"], "request-1");
        assert_eq!(c["message"], "approved");
        assert_eq!(c["reportingComponent"], "autoapproval");
        assert_eq!(c["count"], 2);
        assert_eq!(c["eventTime"], e["eventTime"]);
        assert!(c.get("note").is_none() && c.get("regarding").is_none());
        assert_eq!(pointer("involvedObject.uid"), "/involvedObject/uid");
        assert_eq!(pointer("source"), "/source/component");
    }
}
