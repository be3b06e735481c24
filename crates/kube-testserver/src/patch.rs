//! Patch types: JSON merge patch, JSON patch, strategic merge patch and a simplified server-side apply.

use crate::error::{ApiError, ApiResult, Cause};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// Applies an RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> ApiResult<()> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    json_patch::patch(target, &p).map_err(|e| {
        let mut err = ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {e}"),
        );
        err.details = Some(json!({}));
        err
    })
}

/// The merge key of a list field, as the built-in types declare it (`patchMergeKey`). `ports` is
/// keyed by `containerPort` in a container and by `port` in a Service: the items tell which.
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    Some(match field {
        "conditions" => "type",
        "ownerReferences" => "uid",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "ports" if items.iter().any(|p| p.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        _ => return None,
    })
}

fn primitive_merge(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch using the list semantics of the built-in types we serve.
pub fn strategic(target: &mut Value, patch: &Value) -> ApiResult<()> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    }
    smp_map(target, patch);
    Ok(())
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn smp_map(target: &mut Value, patch: &Value) {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    for (k, pv) in pm {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(tl), Some(dels)) = (
                target.get_mut(field).and_then(Value::as_array_mut),
                pv.as_array(),
            ) {
                tl.retain(|x| !dels.contains(x));
            }
            continue;
        }
        let Some(tm) = target.as_object_mut() else {
            return;
        };
        if pv.is_null() || pv.get("$patch").and_then(Value::as_str) == Some("delete") {
            tm.remove(k);
            continue;
        }
        match (tm.get_mut(k), pv) {
            (Some(tv @ Value::Object(_)), Value::Object(_)) => smp_map(tv, pv),
            (Some(Value::Array(tl)), Value::Array(pl)) => {
                if let Some(mk) = merge_key(k, pl) {
                    merge_list(tl, pl, mk);
                } else if primitive_merge(k) {
                    for x in pl {
                        if !tl.contains(x) {
                            tl.push(x.clone());
                        }
                    }
                } else {
                    *tl = pl.iter().map(strip_directives).collect();
                }
            }
            _ => {
                tm.insert(k.clone(), strip_directives(pv));
            }
        }
    }
}

fn merge_list(tl: &mut Vec<Value>, pl: &[Value], mk: &str) {
    if pl
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *tl = pl
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return;
    }
    for pe in pl {
        let key = pe.get(mk);
        let pos = key.and_then(|kv| tl.iter().position(|te| te.get(mk) == Some(kv)));
        if pe.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(p) = pos {
                tl.remove(p);
            }
            continue;
        }
        match pos {
            Some(p) => smp_map(&mut tl[p], pe),
            None => tl.push(strip_directives(pe)),
        }
    }
}

/// A field path inside an object.
pub type FieldPath = Vec<String>;

const IDENT: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The leaf field paths of an object (lists are atomic leaves), without identity fields.
pub fn leaves(v: &Value) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    walk(v, &mut vec![], &mut out);
    out
}

fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                if path.is_empty() && (k == "apiVersion" || k == "kind") {
                    continue;
                }
                if path.len() == 1 && path[0] == "metadata" && IDENT.contains(&k.as_str()) {
                    continue;
                }
                path.push(k.clone());
                walk(child, path, out);
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

fn get_path<'a>(v: &'a Value, p: &FieldPath) -> Option<&'a Value> {
    p.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_path(v: &mut Value, p: &FieldPath) {
    if let Some((last, parents)) = p.split_last() {
        let mut cur = v;
        for k in parents {
            match cur.get_mut(k) {
                Some(n) => cur = n,
                None => return,
            }
        }
        if let Some(m) = cur.as_object_mut() {
            m.remove(last);
        }
    }
}

fn to_fields_v1(set: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for p in set {
        let mut cur = &mut root;
        for k in p {
            let entry = cur
                .entry(format!("f:{k}"))
                .or_insert_with(|| Value::Object(Map::new()));
            match entry.as_object_mut() {
                Some(m) => cur = m,
                None => break,
            }
        }
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value) -> BTreeSet<FieldPath> {
    fn rec(v: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        let m = v.as_object();
        let kids: Vec<_> = m
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("f:"))
            .collect();
        if kids.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in kids {
            path.push(k[2..].to_string());
            rec(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    rec(v, &mut vec![], &mut out);
    out
}

struct Entry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    fields: BTreeSet<FieldPath>,
}

impl Entry {
    /// The manager as kube-apiserver names it in a conflict: quoted, with its subresource,
    /// and for an update the API version it wrote with.
    fn described(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            out.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == "Update" {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }
}

fn read_managed(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e
                .get("manager")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            operation: e
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            subresource: e
                .get("subresource")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            api_version: e
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
        })
        .collect()
}

fn write_managed(obj: &mut Value, mut entries: Vec<Entry>, now: &str) {
    // kube-apiserver's order: Apply entries before Update ones, then by manager, API version
    // and subresource (each entry's time being now here).
    entries.sort_by(|a, b| {
        (&a.operation, &a.manager, &a.api_version, &a.subresource).cmp(&(
            &b.operation,
            &b.manager,
            &b.api_version,
            &b.subresource,
        ))
    });
    let arr: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": now,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if arr.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

fn dotted(p: &FieldPath) -> String {
    p.iter().map(|k| format!(".{k}")).collect()
}

/// Records an Update-operation manager for a non-apply write (old → new).
pub fn track_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: &str,
    now: &str,
) {
    let mut entries = old.map(read_managed).unwrap_or_default();
    let empty = Value::Null;
    let oldv = old.unwrap_or(&empty);
    let all: BTreeSet<FieldPath> = leaves(oldv).union(&leaves(new)).cloned().collect();
    let changed: BTreeSet<FieldPath> = all
        .into_iter()
        .filter(|p| get_path(oldv, p) != get_path(new, p))
        .collect();
    if changed.is_empty() {
        write_managed(new, entries, now);
        return;
    }
    let present = leaves(new);
    for e in entries.iter_mut() {
        e.fields.retain(|p| !changed.contains(p));
    }
    let api_version = new
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mine: BTreeSet<FieldPath> = changed
        .into_iter()
        .filter(|p| present.contains(p))
        .collect();
    match entries
        .iter_mut()
        .find(|e| e.manager == manager && e.operation == "Update" && e.subresource == subresource)
    {
        Some(e) => e.fields.extend(mine),
        None => entries.push(Entry {
            manager: manager.into(),
            operation: "Update".into(),
            subresource: subresource.into(),
            api_version,
            fields: mine,
        }),
    }
    write_managed(new, entries, now);
}

fn deep_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                match t.get_mut(k) {
                    Some(tv) if tv.is_object() && v.is_object() => deep_merge(tv, v),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, a) => *t = a.clone(),
    }
}

/// Server-side apply (simplified): merges the applied configuration, tracks per-manager leaf ownership,
/// reports conflicts with other managers unless `force`, and removes fields this manager stopped applying.
/// `subresource` is `"status"` for an apply to the status subresource: as in kube-apiserver, a
/// manager's apply to it is an entry of its own, so its main-resource apply is not forgotten.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    subresource: &str,
    force: bool,
    now: &str,
) -> ApiResult<Value> {
    let mine =
        |e: &Entry| e.manager == manager && e.operation == "Apply" && e.subresource == subresource;
    let applied_set = leaves(applied);
    let mut entries = live.map(read_managed).unwrap_or_default();
    let mut result = live.cloned().unwrap_or_else(|| json!({}));
    if live.is_some() {
        let mut conflicts: Vec<(String, FieldPath)> = vec![];
        for p in &applied_set {
            if get_path(&result, p) == get_path(applied, p) {
                continue;
            }
            for e in entries.iter().filter(|e| e.manager != manager) {
                if e.fields.contains(p) {
                    conflicts.push((e.described(), p.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            let n = conflicts.len();
            let causes: Vec<Cause> = conflicts
                .iter()
                .map(|(m, p)| Cause {
                    reason: "FieldManagerConflict",
                    message: format!("conflict with {m}"),
                    field: dotted(p),
                })
                .collect();
            let list: Vec<String> = conflicts
                .iter()
                .map(|(m, p)| format!("conflict with {m}: {}", dotted(p)))
                .collect();
            let mut err = ApiError::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {n} conflict{}: {}",
                    if n == 1 { "" } else { "s" },
                    list.join("\n")
                ),
            );
            err.details = Some(
                json!({"causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>()}),
            );
            return Err(err);
        }
        // Force (or no conflict): other managers lose fields whose value this apply changes.
        for p in &applied_set {
            if get_path(&result, p) != get_path(applied, p) {
                for e in entries.iter_mut().filter(|e| e.manager != manager) {
                    e.fields.remove(p);
                }
            }
        }
        // Fields this manager applied before but no longer applies, and nobody else owns, are removed.
        let previous: BTreeSet<FieldPath> = entries
            .iter()
            .filter(|e| mine(e))
            .flat_map(|e| e.fields.iter().cloned())
            .collect();
        for p in previous.difference(&applied_set) {
            let owned_by_other = entries
                .iter()
                .any(|e| e.manager != manager && e.fields.contains(p));
            if !owned_by_other {
                remove_path(&mut result, p);
            }
        }
    }
    let mut to_merge = applied.clone();
    if let Some(m) = to_merge.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    deep_merge(&mut result, &to_merge);
    entries.retain(|e| !mine(e));
    entries.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        subresource: subresource.into(),
        api_version: applied
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        fields: applied_set,
    });
    write_managed(&mut result, entries, now);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_lists() {
        let mut t = json!({"metadata": {"finalizers": ["a"]}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        strategic(
            &mut t,
            &json!({"metadata": {"finalizers": ["b"]}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "True"}]}}),
        )
        .unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(t["status"]["conditions"][0]["status"], "True");
        assert_eq!(t["status"]["conditions"].as_array().unwrap().len(), 2);
        strategic(
            &mut t,
            &json!({"$deleteFromPrimitiveList/finalizers": ["a"]})
                .as_object()
                .map(|_| json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn service_ports_merge_by_port_and_container_ports_by_container_port() {
        let mut svc =
            json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
        strategic(
            &mut svc,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
        )
        .unwrap();
        assert_eq!(
            svc["spec"]["ports"],
            json!([{"name": "http", "port": 80, "targetPort": 8080}])
        );
        let mut pod = json!({"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]});
        strategic(&mut pod, &json!({"containers": [{"name": "c", "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]})).unwrap();
        assert_eq!(
            pod["containers"][0]["ports"],
            json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
        );
    }

    #[test]
    fn apply_conflicts_and_removal() {
        let a1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}});
        let live = apply(None, &a1, "m1", "", false, "t").unwrap();
        let a2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "9"}});
        let err = apply(Some(&live), &a2, "m2", "", false, "t").unwrap_err();
        assert_eq!(err.code, 409);
        let forced = apply(Some(&live), &a2, "m2", "", true, "t").unwrap();
        assert_eq!(forced["data"]["a"], "9");
        let a1b =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}});
        let after = apply(Some(&forced), &a1b, "m1", "", false, "t").unwrap();
        assert_eq!(after["data"], json!({"a": "9"}));
    }
}
