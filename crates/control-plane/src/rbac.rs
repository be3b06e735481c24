//! The chart's RBAC, taken from its rendered manifests: what the controller's
//! ServiceAccount is granted in a test or lab namespace.

use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::Deserialize;

use crate::Error;

/// The Role and RoleBinding of `manifests` (deploy/manifests/autoapproval.yaml,
/// the chart rendered with its defaults), moved to `namespace`.
pub fn chart_rbac(manifests: &str, namespace: &str) -> Result<(Role, RoleBinding), Error> {
    let bad = |detail: String| Error::Manifests(detail);
    let mut role = None;
    let mut binding = None;
    for doc in serde_yaml::Deserializer::from_str(manifests) {
        let mut object = serde_json::Value::deserialize(doc).map_err(|e| bad(e.to_string()))?;
        object["metadata"]["namespace"] = namespace.into();
        match object["kind"].as_str() {
            Some("Role") => {
                role = Some(serde_json::from_value(object).map_err(|e| bad(e.to_string()))?);
            }
            Some("RoleBinding") => {
                for subject in object["subjects"].as_array_mut().into_iter().flatten() {
                    subject["namespace"] = namespace.into();
                }
                binding = Some(serde_json::from_value(object).map_err(|e| bad(e.to_string()))?);
            }
            _ => {}
        }
    }
    match (role, binding) {
        (Some(role), Some(binding)) => Ok((role, binding)),
        _ => Err(bad("no Role and RoleBinding".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_role_and_binding_move_to_the_namespace() {
        let manifests = include_str!("../../../deploy/manifests/autoapproval.yaml");
        let (role, binding) = chart_rbac(manifests, "lab-7").expect("the chart's RBAC");
        assert_eq!(role.metadata.namespace.as_deref(), Some("lab-7"));
        assert!(!role.rules.unwrap_or_default().is_empty());
        let subjects = binding.subjects.unwrap_or_default();
        assert!(
            subjects
                .iter()
                .all(|s| s.namespace.as_deref() == Some("lab-7"))
        );
    }

    #[test]
    fn manifests_without_a_role_are_refused() {
        let err = chart_rbac("kind: ConfigMap\nmetadata: {name: x}\n", "ns").unwrap_err();
        assert!(err.to_string().contains("no Role and RoleBinding"), "{err}");
    }
}
