//! A tiny JSONPath evaluator for the forms printer columns use: `.a.b`, `.a[0]`, `.a[*].b`, `.a[?(@.k=="v")].b`.

use serde_json::Value;

#[derive(Debug, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    Filter(String, String),
}

fn parse(path: &str) -> Option<Vec<Step>> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .unwrap_or(p);
    let p = p.strip_prefix('$').unwrap_or(p);
    let b = p.as_bytes();
    let mut i = 0;
    let mut steps = vec![];
    while i < b.len() {
        match b[i] {
            b'.' => {
                i += 1;
                let start = i;
                while i < b.len() && b[i] != b'.' && b[i] != b'[' {
                    i += 1;
                }
                if i > start {
                    steps.push(Step::Field(p[start..i].to_string()));
                }
            }
            b'[' => {
                let end = p[i..].find(']')? + i;
                let inner = p[i + 1..end].trim();
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|x| x.strip_suffix(')'))
                {
                    let (k, v) = f.split_once("==")?;
                    let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
                    steps.push(Step::Filter(k.trim().to_string(), v.to_string()));
                } else if let Some(q) = inner.strip_prefix('\'').and_then(|x| x.strip_suffix('\''))
                {
                    steps.push(Step::Field(q.to_string()));
                } else {
                    steps.push(Step::Index(inner.parse().ok()?));
                }
                i = end + 1;
            }
            _ => {
                let start = i;
                while i < b.len() && b[i] != b'.' && b[i] != b'[' {
                    i += 1;
                }
                steps.push(Step::Field(p[start..i].to_string()));
            }
        }
    }
    Some(steps)
}

/// Evaluates a simple JSONPath; returns every match.
pub fn eval<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let Some(steps) = parse(path) else {
        return vec![];
    };
    let mut cur = vec![obj];
    for st in &steps {
        let mut next = vec![];
        for v in cur {
            match st {
                Step::Field(f) => next.extend(v.get(f)),
                Step::Index(n) => next.extend(v.get(*n)),
                Step::All => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter(k, want) => {
                    for e in v.as_array().into_iter().flatten() {
                        let ok = match e.get(k) {
                            Some(Value::String(s)) => s == want,
                            Some(other) => {
                                *other == Value::String(want.clone())
                                    || other.to_string().as_str() == want.as_str()
                            }
                            None => false,
                        };
                        if ok {
                            next.push(e);
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forms() {
        let o = json!({"spec": {"a": 1}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]}});
        assert_eq!(eval(&o, ".spec.a"), vec![&json!(1)]);
        assert_eq!(eval(&o, ".status.conditions[1].type"), vec![&json!("X")]);
        assert_eq!(
            eval(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![&json!("True")]
        );
        assert_eq!(eval(&o, "{.status.conditions[*].type}").len(), 2);
        assert!(eval(&o, ".spec.missing").is_empty());
    }
}
