//! Discovery documents: /version, /api, /apis and per group-version resource lists.

use crate::resources::{Flavor, ResourceType};
use crate::store::Store;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The `/version` document.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": "v1.35.0-testserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// The `/api` document.
pub fn api(addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]
    })
}

/// Groups (other than core) and their versions, in a stable order (built-ins first).
pub fn groups(st: &Store) -> BTreeMap<String, Vec<String>> {
    let mut g: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rt in st.types.values().filter(|t| !t.group.is_empty()) {
        let e = g.entry(rt.group.clone()).or_default();
        for v in &rt.versions {
            if !e.contains(v) {
                e.push(v.clone());
            }
        }
    }
    for vs in g.values_mut() {
        vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    }
    g
}

/// Kube's version ordering: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// The `/apis` document.
pub fn apis(st: &Store) -> Value {
    let groups: Vec<Value> = groups(st).iter().map(|(n, vs)| group_doc(n, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The `/apis/{group}` document, if the group exists.
pub fn group(st: &Store, name: &str) -> Option<Value> {
    let g = groups(st);
    let vs = g.get(name)?;
    let mut d = group_doc(name, vs);
    d["kind"] = json!("APIGroup");
    d["apiVersion"] = json!("v1");
    Some(d)
}

fn verbs(rt: &ResourceType) -> Vec<&'static str> {
    let _ = rt;
    vec![
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
}

/// The types served at a group-version.
fn served<'a>(
    st: &'a Store,
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = &'a ResourceType> + 'a {
    st.types
        .values()
        .filter(move |t| t.group == group && t.versions.iter().any(|v| v == version))
}

/// Adds short names and categories (built-ins only keep `all`), as both discovery forms show them.
fn add_names(r: &mut Value, rt: &ResourceType) {
    if !rt.short_names.is_empty() {
        r["shortNames"] = json!(rt.short_names);
    }
    let builtin = rt.flavor != Flavor::Custom && rt.flavor != Flavor::Crd;
    let shown = !builtin || rt.categories.iter().any(|c| c == "all");
    if shown && !rt.categories.is_empty() {
        r["categories"] = json!(rt.categories);
    }
}

/// The media type of aggregated discovery the client asked for, if any (v2 preferred).
pub fn aggregated_media_type(accept: &str) -> Option<&'static str> {
    let wants = |v: &str| {
        accept.split(',').any(|part| {
            let params: Vec<&str> = part.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io")
                && params.contains(&v)
                && params.contains(&"as=APIGroupDiscoveryList")
        })
    };
    if wants("v=v2") {
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    } else if wants("v=v2beta1") {
        Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")
    } else {
        None
    }
}

/// Aggregated discovery (`apidiscovery.k8s.io`) for `/api` (`core`) or `/apis`.
pub fn aggregated(st: &Store, core: bool, media_type: &str) -> Value {
    let api_version = if media_type.contains("v=v2beta1") {
        "apidiscovery.k8s.io/v2beta1"
    } else {
        "apidiscovery.k8s.io/v2"
    };
    let groups: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_string()])]
    } else {
        groups(st).into_iter().collect()
    };
    let items: Vec<Value> = groups
        .iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|version| {
                    let resources: Vec<Value> = served(st, group, version)
                        .map(|rt| {
                            let kind = json!({"group": group, "version": version, "kind": rt.kind});
                            let mut r = json!({
                                "resource": rt.plural,
                                "responseKind": kind,
                                "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
                                "singularResource": rt.singular,
                                "verbs": verbs(rt),
                            });
                            add_names(&mut r, rt);
                            if rt.status_subresource {
                                r["subresources"] = json!([{
                                    "subresource": "status",
                                    "responseKind": kind,
                                    "verbs": ["get", "patch", "update"],
                                }]);
                            }
                            r
                        })
                        .collect();
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": group}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items})
}

/// The resource list for a group-version, if it exists.
pub fn resource_list(st: &Store, group: &str, version: &str) -> Option<Value> {
    let mut res = vec![];
    for rt in served(st, group, version) {
        let mut r = json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": verbs(rt),
            "storageVersionHash": format!("{:x}", fnv(&format!("{}/{}", rt.group, rt.plural)) & 0xffff_ffff),
        });
        add_names(&mut r, rt);
        res.push(r);
        if rt.status_subresource {
            res.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced, "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    if res.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res}),
    )
}

/// FNV-1a hash, used for stable hashes in discovery and OpenAPI.
pub fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
