//! A tower layer on the kube client that counts every request to the API
//! server by Kubernetes verb and HTTP status, and times the non-watch ones.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::Metrics;

/// Wraps the kube client's service stack (`ClientBuilder::with_layer`).
#[derive(Clone)]
pub struct KubeRequestsLayer {
    metrics: Metrics,
}

impl KubeRequestsLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for KubeRequestsLayer {
    type Service = KubeRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KubeRequests {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`KubeRequestsLayer`] makes.
#[derive(Clone)]
pub struct KubeRequests<S> {
    inner: S,
    metrics: Metrics,
}

impl<S, B, R> Service<Request<B>> for KubeRequests<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb = verb(request.method(), request.uri());
        let started = Instant::now();
        let response = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let result = response.await;
            let status = match &result {
                Ok(response) => response.status().as_str().to_owned(),
                Err(_) => "error".to_owned(),
            };
            // A watch's response is as long as the watch: not a latency.
            let took = (verb != "watch").then(|| started.elapsed());
            metrics.kube_request(verb, &status, took);
            result
        })
    }
}

/// The Kubernetes verb of a request, as the API server's audit log names
/// it: `get`/`list`/`watch` are told apart by the path (an object or a
/// collection) and the `watch` parameter. Other paths (`/version`) are `get`.
pub fn verb(method: &Method, uri: &Uri) -> &'static str {
    let watching = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "watch=true" || p == "watch=1" || p == "watch")
    });
    let collection = is_collection(uri.path());
    match *method {
        Method::GET if watching => "watch",
        Method::GET if collection => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// `/api/v1[/namespaces/NS]/RESOURCE` or `/apis/GROUP/VERSION[/namespaces/NS]/RESOURCE`,
/// without an object name after it.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return false,
    };
    match rest {
        // The namespaces themselves, or a resource inside one.
        ["namespaces"] => true,
        ["namespaces", _ns, resource] => !resource.is_empty(),
        ["namespaces", _ns] => false,
        ["namespaces", _ns, _resource, _name, ..] => false,
        [resource] => !resource.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(method: Method, uri: &str) -> &'static str {
        verb(&method, &uri.parse().unwrap())
    }

    #[test]
    fn requests_are_named_by_the_verb_the_api_server_audits() {
        let leases = "/apis/coordination.k8s.io/v1/namespaces/aa/leases";
        assert_eq!(v(Method::GET, leases), "list");
        assert_eq!(v(Method::GET, &format!("{leases}?labelSelector=x")), "list");
        assert_eq!(v(Method::GET, &format!("{leases}/shard-3")), "get");
        assert_eq!(
            v(
                Method::GET,
                &format!("{leases}?watch=true&resourceVersion=5")
            ),
            "watch"
        );
        assert_eq!(v(Method::PUT, &format!("{leases}/shard-3")), "update");
        assert_eq!(v(Method::POST, leases), "create");
        let cr = "/apis/autoapproval.io/v1alpha1/namespaces/aa/autoapprovals/request-7";
        assert_eq!(v(Method::PATCH, &format!("{cr}/status")), "patch");
        assert_eq!(v(Method::DELETE, cr), "delete");
        assert_eq!(
            v(
                Method::DELETE,
                "/apis/autoapproval.io/v1alpha1/namespaces/aa/autoapprovals"
            ),
            "deletecollection"
        );
        assert_eq!(v(Method::GET, "/api/v1/namespaces"), "list");
        assert_eq!(v(Method::GET, "/api/v1/namespaces/aa"), "get");
        assert_eq!(v(Method::GET, "/api/v1/nodes"), "list");
        assert_eq!(v(Method::GET, "/version"), "get");
        assert_eq!(v(Method::HEAD, "/version"), "other");
    }
}
