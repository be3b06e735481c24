//! JSON ⇄ k8s-pb messages: the conversion trait, its scalar and container impls, the
//! apimachinery types whose JSON is not their message's shape (Time, Quantity, IntOrString, …)
//! and the `messages!` macro that implements it for every message of `fields.rs`.

use base64::Engine;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{FieldsV1, MicroTime, Time};
use k8s_pb::apimachinery::pkg::runtime::RawExtension;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A value that does not fit its protobuf field, with the JSON path of the field.
#[derive(Debug, thiserror::Error)]
#[error("{at}: {problem}")]
pub struct FieldError {
    /// JSON path of the field, e.g. `.spec.replicas`.
    pub at: String,
    /// What is wrong with it.
    pub problem: String,
}

pub(crate) fn bad(at: &str, problem: impl Into<String>) -> FieldError {
    FieldError {
        at: if at.is_empty() { ".".into() } else { at.into() },
        problem: problem.into(),
    }
}

/// A protobuf value with a JSON form.
pub trait Json: Sized {
    /// The JSON form, or None for a value JSON leaves out (Go's `omitempty`).
    fn to_json(&self) -> Option<Value>;
    /// Reads the JSON form found at `at`.
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError>;
}

/// Sets a field unless it is absent or an empty string: Go's JSON leaves both out, and the
/// protobuf encoder of Go writes every non-pointer string, empty or not.
pub fn put(out: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    match v {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(v) => {
            out.insert(key.to_owned(), v);
        }
    }
}

/// Reads one field of `obj`; a missing or null field is the field's empty value.
pub fn take<T: Json + Default>(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<T, FieldError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => T::from_json(v, &format!("{at}.{key}")),
    }
}

pub(crate) fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, FieldError> {
    v.as_object()
        .ok_or_else(|| bad(at, format!("expected an object, got {v}")))
}

// === scalars and containers ===

impl Json for String {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.clone()))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| bad(at, format!("expected a string, got {v}")))
    }
}

impl Json for bool {
    fn to_json(&self) -> Option<Value> {
        Some(Value::Bool(*self))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        v.as_bool()
            .ok_or_else(|| bad(at, format!("expected a boolean, got {v}")))
    }
}

impl Json for i64 {
    fn to_json(&self) -> Option<Value> {
        Some(Value::from(*self))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        v.as_i64()
            .ok_or_else(|| bad(at, format!("expected an integer, got {v}")))
    }
}

impl Json for i32 {
    fn to_json(&self) -> Option<Value> {
        Some(Value::from(*self))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        i32::try_from(i64::from_json(v, at)?)
            .map_err(|_| bad(at, format!("{v} does not fit a 32-bit integer")))
    }
}

impl Json for f64 {
    fn to_json(&self) -> Option<Value> {
        serde_json::Number::from_f64(*self).map(Value::Number)
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        v.as_f64()
            .ok_or_else(|| bad(at, format!("expected a number, got {v}")))
    }
}

impl<T: Json> Json for Option<T> {
    fn to_json(&self) -> Option<Value> {
        self.as_ref().and_then(Json::to_json)
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        if v.is_null() {
            return Ok(None);
        }
        T::from_json(v, at).map(Some)
    }
}

impl<T: Json> Json for Box<T> {
    fn to_json(&self) -> Option<Value> {
        (**self).to_json()
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        T::from_json(v, at).map(Box::new)
    }
}

impl<T: Json> Json for Vec<T> {
    fn to_json(&self) -> Option<Value> {
        if self.is_empty() {
            return None;
        }
        // An item with no JSON form (an empty Time) is still an item: keep the positions.
        Some(Value::Array(
            self.iter()
                .map(|x| x.to_json().unwrap_or(Value::Null))
                .collect(),
        ))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        let items = v
            .as_array()
            .ok_or_else(|| bad(at, format!("expected an array, got {v}")))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| T::from_json(x, &format!("{at}[{i}]")))
            .collect()
    }
}

impl<T: Json> Json for BTreeMap<String, T> {
    fn to_json(&self) -> Option<Value> {
        if self.is_empty() {
            return None;
        }
        Some(Value::Object(
            self.iter()
                .map(|(k, x)| (k.clone(), x.to_json().unwrap_or(Value::Null)))
                .collect(),
        ))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        object(v, at)?
            .iter()
            .map(|(k, x)| Ok((k.clone(), T::from_json(x, &format!("{at}.{k}"))?)))
            .collect()
    }
}

// === apimachinery types with their own JSON ===

/// metav1.Time: RFC 3339 to the second in JSON; the zero time is absent on both sides.
impl Json for Time {
    fn to_json(&self) -> Option<Value> {
        let secs = self.seconds.unwrap_or(0);
        if secs == 0 && self.nanos.unwrap_or(0) == 0 {
            return None;
        }
        let t = chrono::DateTime::from_timestamp(secs, 0)?;
        Some(Value::String(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        let t = timestamp(v, at)?;
        // Go's metav1.Time keeps whole seconds in protobuf as in JSON.
        Ok(Time {
            seconds: Some(t.timestamp()),
            nanos: Some(0),
        })
    }
}

/// metav1.MicroTime: RFC 3339 with microseconds.
impl Json for MicroTime {
    fn to_json(&self) -> Option<Value> {
        let secs = self.seconds.unwrap_or(0);
        let nanos = u32::try_from(self.nanos.unwrap_or(0)).unwrap_or(0);
        if secs == 0 && nanos == 0 {
            return None;
        }
        let t = chrono::DateTime::from_timestamp(secs, nanos)?;
        Some(Value::String(
            t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        ))
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        let t = timestamp(v, at)?;
        Ok(MicroTime {
            seconds: Some(t.timestamp()),
            nanos: Some(i32::try_from(t.timestamp_subsec_micros() * 1000).unwrap_or(0)),
        })
    }
}

fn timestamp(v: &Value, at: &str) -> Result<chrono::DateTime<chrono::Utc>, FieldError> {
    let s = String::from_json(v, at)?;
    chrono::DateTime::parse_from_rfc3339(&s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| bad(at, format!("{s:?} is not an RFC 3339 time: {e}")))
}

/// resource.Quantity: its canonical string in JSON.
impl Json for Quantity {
    fn to_json(&self) -> Option<Value> {
        self.string.clone().map(Value::String)
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        let string = match v {
            Value::Number(n) => n.to_string(),
            _ => String::from_json(v, at)?,
        };
        Ok(Quantity {
            string: Some(string),
        })
    }
}

/// intstr.IntOrString: a JSON number (type 0) or string (type 1).
impl Json for IntOrString {
    fn to_json(&self) -> Option<Value> {
        match self.r#type.unwrap_or(0) {
            0 => Some(Value::from(self.int_val.unwrap_or(0))),
            _ => Some(Value::String(self.str_val.clone().unwrap_or_default())),
        }
    }
    fn from_json(v: &Value, at: &str) -> Result<Self, FieldError> {
        match v {
            Value::String(s) => Ok(IntOrString {
                r#type: Some(1),
                int_val: Some(0),
                str_val: Some(s.clone()),
            }),
            _ => Ok(IntOrString {
                r#type: Some(0),
                int_val: Some(i32::from_json(v, at)?),
                str_val: Some(String::new()),
            }),
        }
    }
}

/// runtime.RawExtension: embedded JSON, carried as its bytes.
impl Json for RawExtension {
    fn to_json(&self) -> Option<Value> {
        raw_to_json(self.raw.as_deref())
    }
    fn from_json(v: &Value, _at: &str) -> Result<Self, FieldError> {
        Ok(RawExtension {
            raw: Some(v.to_string().into_bytes()),
        })
    }
}

/// metav1.FieldsV1: the managed-fields set, JSON carried as its bytes.
impl Json for FieldsV1 {
    fn to_json(&self) -> Option<Value> {
        raw_to_json(self.raw.as_deref())
    }
    fn from_json(v: &Value, _at: &str) -> Result<Self, FieldError> {
        Ok(FieldsV1 {
            raw: Some(v.to_string().into_bytes()),
        })
    }
}

fn raw_to_json(raw: Option<&[u8]>) -> Option<Value> {
    let raw = raw.filter(|r| !r.is_empty())?;
    serde_json::from_slice(raw).ok()
}

// === fields with their own JSON form (`as …` in the table) ===

/// `map<string, bytes>` fields (Secret.data, ConfigMap.binaryData): base64 values in JSON.
pub mod bytes_map {
    use super::*;

    pub fn to_json(v: &BTreeMap<String, Vec<u8>>) -> Option<Value> {
        if v.is_empty() {
            return None;
        }
        Some(Value::Object(
            v.iter()
                .map(|(k, b)| {
                    let s = base64::engine::general_purpose::STANDARD.encode(b);
                    (k.clone(), Value::String(s))
                })
                .collect(),
        ))
    }

    pub fn from_json(v: &Value, at: &str) -> Result<BTreeMap<String, Vec<u8>>, FieldError> {
        object(v, at)?
            .iter()
            .map(|(k, x)| Ok((k.clone(), decode_base64(x, &format!("{at}.{k}"))?)))
            .collect()
    }
}

fn decode_base64(v: &Value, at: &str) -> Result<Vec<u8>, FieldError> {
    let s = String::from_json(v, at)?;
    base64::engine::general_purpose::STANDARD
        .decode(s.as_bytes())
        .map_err(|e| bad(at, format!("not base64: {e}")))
}

/// Structs Go embeds: their fields sit in the parent's JSON object.
pub mod inline {
    use super::*;

    pub fn to_json<T: Json>(v: &Option<T>) -> Option<Map<String, Value>> {
        match v.as_ref()?.to_json()? {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    pub fn from_json<T: Json>(parent: &Value, at: &str) -> Result<Option<T>, FieldError> {
        T::from_json(parent, at).map(Some)
    }
}

/// Implements [`Json`] for each message of the table: `path::Message { field: "jsonName" [as via], … }`.
macro_rules! messages {
    (@put $out:ident, $json:literal, $val:expr) => {
        $crate::protobuf::json::put(&mut $out, $json, $crate::protobuf::json::Json::to_json($val))
    };
    (@put $out:ident, $json:literal, $val:expr, inline) => {
        if let Some(m) = inline::to_json($val) {
            $out.extend(m);
        }
    };
    (@put $out:ident, $json:literal, $val:expr, $via:ident) => {
        $crate::protobuf::json::put(&mut $out, $json, $via::to_json($val))
    };
    (@take $v:ident, $obj:ident, $at:ident, $json:literal) => {
        $crate::protobuf::json::take($obj, $json, $at)
    };
    (@take $v:ident, $obj:ident, $at:ident, $json:literal, inline) => {
        inline::from_json($v, $at)
    };
    (@take $v:ident, $obj:ident, $at:ident, $json:literal, $via:ident) => {
        match $obj.get($json) {
            None | Some(serde_json::Value::Null) => Ok(Default::default()),
            Some(x) => $via::from_json(x, &format!("{}.{}", $at, $json)),
        }
    };
    ($( $($seg:ident)::+ { $( $field:ident : $json:literal $(as $via:ident)? ),* $(,)? } )*) => { $(
        impl Json for $($seg)::+ {
            fn to_json(&self) -> Option<serde_json::Value> {
                #[allow(unused_mut)]
                let mut out = serde_json::Map::new();
                $( $crate::protobuf::json::messages!(@put out, $json, &self.$field $(, $via)?); )*
                Some(serde_json::Value::Object(out))
            }
            fn from_json(
                v: &serde_json::Value,
                at: &str,
            ) -> Result<Self, $crate::protobuf::json::FieldError> {
                #[allow(unused_variables)]
                let obj = $crate::protobuf::json::object(v, at)?;
                Ok(Self {
                    $( $field: $crate::protobuf::json::messages!(@take v, obj, at, $json $(, $via)?)?, )*
                })
            }
        }
    )* };
}
pub(crate) use messages;
