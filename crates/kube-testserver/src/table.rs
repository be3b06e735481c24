//! `meta.k8s.io/v1` Table output for `kubectl get`: CRD printer columns and built-in defaults.

use crate::jsonpath;
use crate::resources::{Flavor, PrinterColumn, ResourceType};
use crate::util::{human_age, s};
use serde_json::{Value, json};

/// Whether the Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.contains("as=Table")
}

fn col(name: &str, type_: &str, format: &str, desc: &str, path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: format.into(),
        description: desc.into(),
        priority: 0,
        json_path: path.into(),
    }
}

/// The columns for a resource type and version (after the implicit Name column).
pub fn columns(rt: &ResourceType, version: &str) -> Vec<PrinterColumn> {
    let age = col(
        "Age",
        "date",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        ".metadata.creationTimestamp",
    );
    match rt.flavor {
        Flavor::Custom => rt
            .columns
            .get(version)
            .cloned()
            .unwrap_or_else(|| vec![age]),
        Flavor::Lease => vec![
            col(
                "Holder",
                "string",
                "",
                "The holder of the lease",
                ".spec.holderIdentity",
            ),
            age,
        ],
        Flavor::Namespace => vec![
            col(
                "Status",
                "string",
                "",
                "The status of the namespace",
                ".status.phase",
            ),
            age,
        ],
        Flavor::Crd => vec![col(
            "Created At",
            "date",
            "",
            "",
            ".metadata.creationTimestamp",
        )],
        _ => vec![age],
    }
}

fn cell(c: &PrinterColumn, obj: &Value, crd_raw_date: bool) -> Value {
    let found = jsonpath::eval(obj, &c.json_path);
    let Some(v) = found.first() else {
        return Value::Null;
    };
    match c.type_.as_str() {
        "date" => match v.as_str() {
            Some(ts) if crd_raw_date => json!(ts),
            Some(ts) => json!(human_age(ts)),
            None => Value::Null,
        },
        "string" => match v {
            Value::String(x) => json!(x),
            other => {
                let parts: Vec<String> = found
                    .iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| x.to_string())
                    })
                    .collect();
                if found.len() > 1 {
                    json!(parts.join(" "))
                } else {
                    json!(other.to_string())
                }
            }
        },
        "integer" => match v.as_i64() {
            Some(n) => json!(n),
            None => (*v).clone(),
        },
        _ => (*v).clone(),
    }
}

/// Builds a Table for objects; `include` is the includeObject mode (None, Metadata, Object).
pub fn table(
    rt: &ResourceType,
    version: &str,
    items: &[Value],
    include: &str,
    meta: Value,
) -> Value {
    let cols = columns(rt, version);
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names", "priority": 0}),
    ];
    for c in &cols {
        defs.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    let raw_date = rt.flavor == Flavor::Crd;
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![json!(s(o, "/metadata/name"))];
            cells.extend(cols.iter().map(|c| cell(c, o, raw_date)));
            let mut row = json!({"cells": cells});
            match include {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({})),
                    })
                }
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs, "rows": rows})
}
