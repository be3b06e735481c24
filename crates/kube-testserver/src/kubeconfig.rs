//! Kubeconfig generation for kubectl and kube::Client.

use serde_json::json;

/// A kubeconfig (YAML) pointing at `url` with context `testserver` and namespace `default`.
pub fn render(url: &str) -> Result<String, serde_yaml::Error> {
    let v = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": "testserver", "cluster": {"server": url}}],
        "users": [{"name": "testserver", "user": {}}],
        "contexts": [{"name": "testserver", "context": {"cluster": "testserver", "user": "testserver", "namespace": "default"}}],
        "current-context": "testserver",
    });
    serde_yaml::to_string(&v)
}
