//! Label selectors (full kube grammar) and field selectors (metadata.name, metadata.namespace).

use crate::error::{ApiError, ApiResult};
use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }
    fn word(&mut self) -> String {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() {
            let c = self.s[self.i];
            if c.is_ascii_whitespace() || b",()=!".contains(&c) {
                break;
            }
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
    fn eat(&mut self, t: &str) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }
}

fn bad(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} in selector \"{sel}\""
    ))
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && k.matches('/').count() <= 1
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub fn parse(sel: &str) -> ApiResult<Self> {
        let mut lx = Lexer {
            s: sel.as_bytes(),
            i: 0,
        };
        let mut reqs = vec![];
        if sel.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        loop {
            let req = if lx.eat("!") {
                let k = lx.word();
                if !valid_key(&k) {
                    return Err(bad(sel, "invalid label key"));
                }
                Req::NotExists(k)
            } else {
                let k = lx.word();
                if !valid_key(&k) {
                    return Err(bad(sel, "invalid label key"));
                }
                if lx.eat("==") || lx.eat("=") {
                    Req::Eq(k, lx.word())
                } else if lx.eat("!=") {
                    Req::Ne(k, lx.word())
                } else {
                    let save = lx.i;
                    let op = lx.word();
                    match op.as_str() {
                        "in" | "notin" => {
                            if !lx.eat("(") {
                                return Err(bad(sel, "expected '('"));
                            }
                            let mut vals = vec![];
                            loop {
                                if lx.eat(")") {
                                    break;
                                }
                                let v = lx.word();
                                vals.push(v);
                                if lx.eat(",") {
                                    continue;
                                }
                                if lx.eat(")") {
                                    break;
                                }
                                return Err(bad(sel, "expected ',' or ')'"));
                            }
                            if op == "in" {
                                Req::In(k, vals)
                            } else {
                                Req::NotIn(k, vals)
                            }
                        }
                        "" => {
                            lx.i = save;
                            Req::Exists(k)
                        }
                        _ => return Err(bad(sel, "found unexpected operator")),
                    }
                }
            };
            reqs.push(req);
            match lx.peek() {
                None => break,
                Some(b',') => {
                    lx.i += 1;
                }
                Some(_) => return Err(bad(sel, "expected ','")),
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector over metadata.name / metadata.namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `metadata.name=x,metadata.namespace!=y`.
    pub fn parse(sel: &str) -> ApiResult<Self> {
        Self::parse_with(sel, &[])
    }

    /// Parses a selector that may also name the `extra` fields of the kind.
    pub fn parse_with(sel: &str, extra: &[&str]) -> ApiResult<Self> {
        let mut out = vec![];
        for part in sel.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{sel}'; can't understand '{part}'"
                )));
            };
            let k = k.trim();
            if k != "metadata.name" && k != "metadata.namespace" && !extra.contains(&k) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Whether an object matches.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let ptr = crate::events::pointer(k);
            let actual = obj.pointer(&ptr).and_then(Value::as_str).unwrap_or("");
            (actual == v) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn grammar() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        for (s, want) in [
            ("", true),
            ("a=1", true),
            ("a==1", true),
            ("a!=1", false),
            ("a in (1, 2)", true),
            ("a notin (1,2)", false),
            ("c notin (1)", true),
            ("b", true),
            ("!b", false),
            ("!c", true),
            ("a=1,b in (x),!c", true),
            ("a=1,b=y", false),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
        assert!(LabelSelector::parse("a in 1").is_err());
        assert!(LabelSelector::parse("a=1 b").is_err());
    }
}
