//! OpenAPI v3 documents: the root index and one document per group-version, enough for kubectl's
//! server-side field-validation check (PATCH operations carrying `fieldValidation`) and `kubectl explain`.

use crate::discovery::fnv;
use crate::resources::{Flavor, ResourceType};
use crate::store::Store;
use serde_json::{Map, Value, json};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn all_gvs(st: &Store) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    for rt in st.types.values() {
        for v in &rt.versions {
            let gv = (rt.group.clone(), v.clone());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
    }
    out
}

/// The `/openapi/v3` root index.
pub fn root(st: &Store) -> Value {
    let mut paths = Map::new();
    for (g, v) in all_gvs(st) {
        if let Some(doc) = gv_doc(st, &g, &v) {
            let p = gv_path(&g, &v);
            let hash = format!("{:016X}", fnv(&doc.to_string()));
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

fn schema_name(rt: &ResourceType, version: &str) -> String {
    let g = if rt.group.is_empty() {
        "io.k8s.api.core".to_string()
    } else {
        rt.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{g}.{version}.{}", rt.kind)
}

fn params() -> Vec<Value> {
    [
        "dryRun",
        "fieldManager",
        "fieldValidation",
        "force",
        "pretty",
    ]
    .iter()
    .map(|n| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
    .collect()
}

/// The document for one group-version (path is `api/v1` or `apis/{group}/{version}`).
pub fn gv_doc(st: &Store, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for rt in st
        .types
        .values()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
    {
        let gvk = json!([{"group": rt.group, "version": version, "kind": rt.kind}]);
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let coll = if rt.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", rt.plural)
        } else {
            format!("{base}/{}", rt.plural)
        };
        let name = schema_name(rt, version);
        let body_ref = json!({"$ref": format!("#/components/schemas/{name}")});
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": body_ref}}}});
        let op = |action: &str, content: Value| {
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk[0],
                "parameters": params(),
                "requestBody": {"content": content},
                "responses": ok,
            })
        };
        let json_body = json!({"*/*": {"schema": body_ref}});
        let mut patch_ct = json!({
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
        });
        if rt.flavor != Flavor::Custom && rt.flavor != Flavor::Crd {
            // Built-ins accept strategic merge patch, but we do not publish the patch metadata kubectl
            // would need to compute one from OpenAPI; kubectl then falls back to its compiled-in types.
            patch_ct
                .as_object_mut()
                .map(|m| m.remove("application/strategic-merge-patch+json"));
        }
        let mut item = Map::new();
        item.insert("get".into(), json!({"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk[0], "responses": ok}));
        item.insert("put".into(), op("put", json_body.clone()));
        item.insert("patch".into(), op("patch", patch_ct));
        item.insert("delete".into(), json!({"x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk[0], "parameters": params(), "responses": ok}));
        item.insert(
            "parameters".into(),
            json!([{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]),
        );
        paths.insert(format!("{coll}/{{name}}"), Value::Object(item));
        paths.insert(
            coll,
            json!({
                "get": {"x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk[0], "responses": ok},
                "post": op("post", json_body),
            }),
        );
        let mut schema = rt.schemas.get(version).cloned().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        if let Some(m) = schema.as_object_mut() {
            let props = m.entry("properties").or_insert_with(|| json!({}));
            if let Some(p) = props.as_object_mut() {
                p.entry("apiVersion")
                    .or_insert_with(|| json!({"type": "string"}));
                p.entry("kind").or_insert_with(|| json!({"type": "string"}));
                p.insert(
                    "metadata".into(),
                    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                );
            }
            m.insert("x-kubernetes-group-version-kind".into(), gvk.clone());
        }
        schemas.insert(name, schema);
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0-testserver"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
