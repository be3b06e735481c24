//! Errors: the library's own [`Error`] and [`ApiError`], a `metav1.Status` failure answer.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Errors returned by the library API (start-up, kubeconfig writing).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// Serialising the kubeconfig failed.
    #[error("yaml error: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// One cause inside a `metav1.Status` of reason Invalid.
#[derive(Debug, Clone)]
pub struct Cause {
    /// Machine-readable reason, e.g. `FieldValueRequired`.
    pub reason: &'static str,
    /// Human-readable message, e.g. `Required value`.
    pub message: String,
    /// Field path, e.g. `spec.requestId`.
    pub field: String,
}

/// A failure answered as a `metav1.Status` body, shaped like kube-apiserver's.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Status reason, e.g. `NotFound`.
    pub reason: &'static str,
    /// Status message.
    pub message: String,
    /// `details`, if any.
    pub details: Option<Value>,
    /// Optional Retry-After seconds (429).
    pub retry_after: Option<u64>,
}

/// Identity of a resource used to build error messages.
pub struct What<'a> {
    /// API group ("" for core).
    pub group: &'a str,
    /// Plural resource name.
    pub plural: &'a str,
    /// Kind.
    pub kind: &'a str,
}

impl What<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    fn details(&self, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": self.plural});
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

impl ApiError {
    /// A bare error with code, reason and message.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 404 for an unknown path.
    pub fn no_route() -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
            ),
        )
    }
    /// 415 for a strategic merge patch of a custom resource, which has no patch strategies.
    pub fn unsupported_custom_patch() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }
    /// 422 for a PUT of a custom resource without the resourceVersion it replaces.
    pub fn resource_version_required(group: &str, plural: &str, name: &str) -> Self {
        let message = "Invalid value: 0: must be specified for an update";
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{plural}.{group} \"{name}\" is invalid: metadata.resourceVersion: {message}"),
        );
        e.details = Some(
            json!({"name": name, "group": group, "kind": plural, "causes": [
                {"reason": "FieldValueInvalid", "message": message, "field": "metadata.resourceVersion"}
            ]}),
        );
        e
    }
    /// 404 NotFound for a named object.
    pub fn not_found(w: &What, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", w.qualified(), name),
        );
        e.details = Some(w.details(name));
        e
    }
    /// 409 AlreadyExists.
    pub fn already_exists(w: &What, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", w.qualified(), name),
        );
        e.details = Some(w.details(name));
        e
    }
    /// 409 Conflict for a stale resourceVersion.
    pub fn conflict(w: &What, name: &str) -> Self {
        Self::conflict_msg(
            w,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    /// 409 Conflict with a custom message tail.
    pub fn conflict_msg(w: &What, name: &str, tail: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                w.qualified(),
                name,
                tail
            ),
        );
        e.details = Some(w.details(name));
        e
    }
    /// 422 Invalid with field causes.
    pub fn invalid(w: &What, name: &str, causes: Vec<Cause>) -> Self {
        let group_kind = if w.group.is_empty() {
            w.kind.to_string()
        } else {
            format!("{}.{}", w.kind, w.group)
        };
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{group_kind} \"{name}\" is invalid: {joined}"),
        );
        let mut d = json!({"name": name, "kind": w.kind, "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>()});
        if !w.group.is_empty() {
            d["group"] = json!(w.group);
        }
        e.details = Some(d);
        e
    }
    /// 410 Gone / Expired for an old resourceVersion.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }
    /// The `metav1.Status` body.
    pub fn status_body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        if let Some(s) = self.retry_after {
            let d = v.get("details").cloned().unwrap_or_else(|| json!({}));
            let mut d = d;
            d["retryAfterSeconds"] = json!(s);
            v["details"] = d;
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.status_body().to_string();
        let mut resp = (code, [("content-type", "application/json")], body).into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = s.to_string().parse()
        {
            resp.headers_mut().insert("retry-after", v);
        }
        resp
    }
}

/// Result alias for API operations.
pub type ApiResult<T> = std::result::Result<T, ApiError>;
