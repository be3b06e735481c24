//! Structural-schema handling for custom resources: pruning, defaulting and validation.

use crate::error::Cause;
use serde_json::{Map, Value};

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

/// Removes fields the schema does not know, like the apiextensions server's pruning.
pub fn prune(obj: &mut Value, schema: &Value) {
    if let Some(m) = obj.as_object_mut() {
        for (k, v) in m.iter_mut() {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(s) = schema.pointer(&format!("/properties/{}", escape(k))) {
                prune_node(v, s);
            }
        }
        if !preserves(schema) && schema.get("properties").is_some() {
            let props = schema.get("properties").and_then(Value::as_object);
            m.retain(|k, _| {
                matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                    || props.is_some_and(|p| p.contains_key(k))
            });
        }
    }
}

fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

fn prune_node(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                if !preserves(schema) {
                    m.retain(|k, _| props.contains_key(k));
                }
                for (k, child) in m.iter_mut() {
                    if let Some(s) = props.get(k) {
                        prune_node(child, s);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    prune_node(child, ap);
                }
            } else if !preserves(schema)
                && schema.get("type").and_then(Value::as_str) == Some("object")
            {
                // An object without properties or additionalProperties keeps nothing (structural rule).
                if schema.get("x-kubernetes-embedded-resource").is_none()
                    && schema.get("x-kubernetes-int-or-string").is_none()
                {
                    m.clear();
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for child in a.iter_mut() {
                    prune_node(child, items);
                }
            }
        }
        _ => {}
    }
}

/// Applies `default` values from the schema to missing fields.
pub fn apply_defaults(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    if !m.contains_key(k)
                        && let Some(d) = s.get("default")
                    {
                        m.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = m.get_mut(k) {
                        apply_defaults(child, s);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    apply_defaults(child, ap);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for child in a.iter_mut() {
                    apply_defaults(child, items);
                }
            }
        }
        _ => {}
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// Validates an object against a structural schema; returns every failure.
pub fn validate(obj: &Value, schema: &Value) -> Vec<Cause> {
    let mut out = vec![];
    // Root: validate everything but apiVersion/kind/metadata.
    if let Some(m) = obj.as_object() {
        let mut filtered = Map::new();
        for (k, v) in m {
            if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                filtered.insert(k.clone(), v.clone());
            }
        }
        let mut root = schema.clone();
        if let Some(req) = root.get_mut("required").and_then(Value::as_array_mut) {
            req.retain(|r| !matches!(r.as_str(), Some("apiVersion" | "kind" | "metadata")));
        }
        node(&Value::Object(filtered), &root, "", &mut out);
    }
    out
}

/// Runs the schema's `x-kubernetes-validations` CEL rules, as kube-apiserver
/// does after defaulting; transition rules (`oldSelf`) only when `old` is
/// given (an update). A rule that fails is a `FieldValueInvalid` cause at its
/// field, with the rule's message.
pub fn validate_cel(obj: &Value, old: Option<&Value>, schema: &Value) -> Vec<Cause> {
    let Err(errors) = kube_cel::validate(schema, obj, old) else {
        return vec![];
    };
    errors
        .iter()
        .map(|e| {
            let value = obj
                .pointer(&format!("/{}", e.field_path.replace('.', "/")))
                .map_or("object", type_name);
            Cause {
                reason: "FieldValueInvalid",
                field: e.field_path.clone(),
                message: format!("Invalid value: {value:?}: {}", e.message),
            }
        })
        .collect()
}

fn cause(out: &mut Vec<Cause>, reason: &'static str, field: &str, message: String) {
    out.push(Cause {
        reason,
        message,
        field: field.to_string(),
    });
}

fn node(v: &Value, s: &Value, path: &str, out: &mut Vec<Cause>) {
    let disp = if path.is_empty() { "<root>" } else { path };
    if v.is_null() {
        if s.get("nullable").and_then(Value::as_bool) == Some(true) {
            return;
        }
        if s.get("type").is_some() {
            let t = s.get("type").and_then(Value::as_str).unwrap_or("");
            cause(
                out,
                "FieldValueInvalid",
                disp,
                format!("Invalid value: \"null\": {disp} in body must be of type {t}: \"null\""),
            );
        }
        return;
    }
    if s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            cause(
                out,
                "FieldValueInvalid",
                disp,
                format!(
                    "Invalid value: {}: {disp} in body must be of type integer-or-string",
                    render(v)
                ),
            );
        }
        return;
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let actual = type_name(v);
        let ok = actual == t || (t == "number" && actual == "integer");
        if !ok {
            cause(
                out,
                "FieldValueTypeInvalid",
                disp,
                format!(
                    "Invalid value: \"{actual}\": {disp} in body must be of type {t}: \"{actual}\""
                ),
            );
            return;
        }
    }
    if let Some(en) = s.get("enum").and_then(Value::as_array)
        && !en.contains(v)
    {
        let list: Vec<String> = en.iter().map(render).collect();
        cause(
            out,
            "FieldValueNotSupported",
            disp,
            format!(
                "Unsupported value: {}: supported values: {}",
                render(v),
                list.join(", ")
            ),
        );
    }
    match v {
        Value::Object(m) => {
            if let Some(req) = s.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !m.contains_key(r) {
                        cause(
                            out,
                            "FieldValueRequired",
                            &join(path, r),
                            "Required value".into(),
                        );
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            let ap = s.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in m {
                if let Some(cs) = props.and_then(|p| p.get(k)) {
                    node(child, cs, &join(path, k), out);
                } else if let Some(cs) = ap {
                    node(child, cs, &join(path, k), out);
                }
            }
            if let Some(n) = s.get("maxProperties").and_then(Value::as_u64)
                && m.len() as u64 > n
            {
                cause(
                    out,
                    "FieldValueTooMany",
                    disp,
                    format!("Too many: {}: must have at most {n} items", m.len()),
                );
            }
            if let Some(n) = s.get("minProperties").and_then(Value::as_u64)
                && (m.len() as u64) < n
            {
                cause(
                    out,
                    "FieldValueInvalid",
                    disp,
                    format!(
                        "Invalid value: {}: {disp} in body should have at least {n} properties",
                        m.len()
                    ),
                );
            }
        }
        Value::Array(a) => {
            if let Some(items) = s.get("items") {
                for (i, child) in a.iter().enumerate() {
                    node(child, items, &format!("{path}[{i}]"), out);
                }
            }
            if let Some(n) = s.get("maxItems").and_then(Value::as_u64)
                && a.len() as u64 > n
            {
                cause(
                    out,
                    "FieldValueTooMany",
                    disp,
                    format!("Too many: {}: must have at most {n} items", a.len()),
                );
            }
            if let Some(n) = s.get("minItems").and_then(Value::as_u64)
                && (a.len() as u64) < n
            {
                cause(
                    out,
                    "FieldValueInvalid",
                    disp,
                    format!(
                        "Invalid value: {}: {disp} in body should have at least {n} items",
                        a.len()
                    ),
                );
            }
            if s.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
                for (i, x) in a.iter().enumerate() {
                    if a[..i].contains(x) {
                        cause(
                            out,
                            "FieldValueDuplicate",
                            &format!("{path}[{i}]"),
                            format!("Duplicate value: {}", render(x)),
                        );
                    }
                }
            }
        }
        Value::String(st) => {
            let len = st.chars().count() as u64;
            if let Some(n) = s.get("maxLength").and_then(Value::as_u64)
                && len > n
            {
                cause(
                    out,
                    "FieldValueTooLong",
                    disp,
                    format!("Too long: may not be more than {n} bytes"),
                );
            }
            if let Some(n) = s.get("minLength").and_then(Value::as_u64)
                && len < n
            {
                cause(
                    out,
                    "FieldValueInvalid",
                    disp,
                    format!(
                        "Invalid value: {}: {disp} in body should be at least {n} chars long",
                        render(v)
                    ),
                );
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(p) {
                    Ok(re) if !re.is_match(st) => cause(
                        out,
                        "FieldValueInvalid",
                        disp,
                        format!(
                            "Invalid value: {}: {disp} in body should match '{p}'",
                            render(v)
                        ),
                    ),
                    _ => {}
                }
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
                let excl = s.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
                if x < min || (excl && x == min) {
                    let word = if excl {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    cause(
                        out,
                        "FieldValueInvalid",
                        disp,
                        format!(
                            "Invalid value: {}: {disp} in body should be {word} {}",
                            render(v),
                            num(min)
                        ),
                    );
                }
            }
            if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
                let excl = s.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
                if x > max || (excl && x == max) {
                    let word = if excl {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    cause(
                        out,
                        "FieldValueInvalid",
                        disp,
                        format!(
                            "Invalid value: {}: {disp} in body should be {word} {}",
                            render(v),
                            num(max)
                        ),
                    );
                }
            }
            if let Some(m) = s.get("multipleOf").and_then(Value::as_f64)
                && m != 0.0
                && (x / m).fract() != 0.0
            {
                cause(
                    out,
                    "FieldValueInvalid",
                    disp,
                    format!(
                        "Invalid value: {}: {disp} in body should be a multiple of {}",
                        render(v),
                        num(m)
                    ),
                );
            }
        }
        _ => {}
    }
}

fn num(f: f64) -> String {
    if f.fract() == 0.0 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cel_transition_rules_run_on_updates_only() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "id": {"type": "integer", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "id is immutable"}]},
            "size": {"type": "integer", "x-kubernetes-validations": [{"rule": "self < 10", "message": "too big"}]}}}}});
        let old = json!({"spec": {"id": 1, "size": 1}});
        assert!(
            validate_cel(&old, None, &schema).is_empty(),
            "a create has no oldSelf"
        );
        assert!(
            validate_cel(&json!({"spec": {"id": 1, "size": 2}}), Some(&old), &schema).is_empty()
        );
        let causes = validate_cel(&json!({"spec": {"id": 2, "size": 12}}), Some(&old), &schema);
        let shown: Vec<String> = causes
            .iter()
            .map(|c| format!("{} {}: {}", c.reason, c.field, c.message))
            .collect();
        assert_eq!(
            shown,
            [
                "FieldValueInvalid spec.id: Invalid value: \"integer\": id is immutable",
                "FieldValueInvalid spec.size: Invalid value: \"integer\": too big"
            ]
        );
    }

    #[test]
    fn required_enum_min_prune() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["requestId"],
            "properties": {"requestId": {"type": "integer", "minimum": 1}, "requestType": {"type": "string", "enum": ["A", "B"]},
              "paused": {"type": "boolean", "default": false}}}}});
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"}, "spec": {"requestType": "C", "junk": 1}, "junk": 2});
        prune(&mut o, &schema);
        apply_defaults(&mut o, &schema);
        assert_eq!(
            o,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"}, "spec": {"requestType": "C", "paused": false}})
        );
        let c = validate(&o, &schema);
        let msgs: Vec<String> = c
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert!(
            msgs.contains(&"spec.requestId: Required value".to_string()),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("spec.requestType: Unsupported value: \"C\"")),
            "{msgs:?}"
        );
        let o = json!({"spec": {"requestId": 0}});
        let c = validate(&o, &schema);
        assert_eq!(
            c[0].message,
            "Invalid value: 0: spec.requestId in body should be greater than or equal to 1"
        );
    }
}
