//! Resource types the server knows: built-ins and those registered from CRDs.

use serde_json::Value;
use std::collections::BTreeMap;

/// Key of a resource type: (group, plural).
pub type ResKey = (String, String);

/// Which built-in behaviour a resource type has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// core/v1 Namespace.
    Namespace,
    /// apiextensions.k8s.io/v1 CustomResourceDefinition.
    Crd,
    /// coordination.k8s.io/v1 Lease.
    Lease,
    /// core/v1 Event or events.k8s.io/v1 Event.
    Event,
    /// Other built-ins kept as plain storage (ConfigMap, Secret, ...).
    Plain,
    /// A custom resource served from a CRD.
    Custom,
}

/// An additionalPrinterColumn of a CRD (or a built-in default column).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    /// Column name.
    pub name: String,
    /// Column type (string, integer, number, boolean, date).
    pub type_: String,
    /// Column format.
    pub format: String,
    /// Column description.
    pub description: String,
    /// Priority (0 = shown by default).
    pub priority: i64,
    /// JSONPath (simple `.a.b[0]` form).
    pub json_path: String,
}

/// A served resource type.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group, "" for core.
    pub group: String,
    /// Served versions, storage version first.
    pub versions: Vec<String>,
    /// Kind.
    pub kind: String,
    /// List kind.
    pub list_kind: String,
    /// Plural name.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Short names.
    pub short_names: Vec<String>,
    /// Categories.
    pub categories: Vec<String>,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Has a status subresource.
    pub status_subresource: bool,
    /// Behaviour.
    pub flavor: Flavor,
    /// openAPIV3Schema per version (custom resources).
    pub schemas: BTreeMap<String, Value>,
    /// Printer columns per version.
    pub columns: BTreeMap<String, Vec<PrinterColumn>>,
}

impl ResourceType {
    /// The (group, plural) key.
    pub fn key(&self) -> ResKey {
        (self.group.clone(), self.plural.clone())
    }
    /// `apiVersion` string for a version.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }
    /// Whether objects get metadata.generation.
    pub fn has_generation(&self) -> bool {
        matches!(self.flavor, Flavor::Custom | Flavor::Crd)
    }
}

/// One row of the built-in table: what discovery says about a kind we serve from start.
struct Builtin {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    status: bool,
    /// In the `all` category, so `kubectl get all` lists it (as kube-apiserver does).
    all: bool,
    flavor: Flavor,
}

/// The built-in kinds, all at version v1: what the controller uses, plus what its Helm chart renders.
#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    Builtin { group: "", kind: "Namespace", plural: "namespaces", short_names: &["ns"], namespaced: false, status: true, all: false, flavor: Flavor::Namespace },
    Builtin { group: "", kind: "Event", plural: "events", short_names: &["ev"], namespaced: true, status: false, all: false, flavor: Flavor::Event },
    Builtin { group: "", kind: "ConfigMap", plural: "configmaps", short_names: &["cm"], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "", kind: "Secret", plural: "secrets", short_names: &[], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "", kind: "ServiceAccount", plural: "serviceaccounts", short_names: &["sa"], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "", kind: "Pod", plural: "pods", short_names: &["po"], namespaced: true, status: true, all: true, flavor: Flavor::Plain },
    Builtin { group: "", kind: "Service", plural: "services", short_names: &["svc"], namespaced: true, status: true, all: true, flavor: Flavor::Plain },
    Builtin { group: "apps", kind: "Deployment", plural: "deployments", short_names: &["deploy"], namespaced: true, status: true, all: true, flavor: Flavor::Plain },
    Builtin { group: "batch", kind: "Job", plural: "jobs", short_names: &[], namespaced: true, status: true, all: true, flavor: Flavor::Plain },
    Builtin { group: "policy", kind: "PodDisruptionBudget", plural: "poddisruptionbudgets", short_names: &["pdb"], namespaced: true, status: true, all: false, flavor: Flavor::Plain },
    Builtin { group: "networking.k8s.io", kind: "NetworkPolicy", plural: "networkpolicies", short_names: &["netpol"], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "rbac.authorization.k8s.io", kind: "Role", plural: "roles", short_names: &[], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "rbac.authorization.k8s.io", kind: "RoleBinding", plural: "rolebindings", short_names: &[], namespaced: true, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "rbac.authorization.k8s.io", kind: "ClusterRole", plural: "clusterroles", short_names: &[], namespaced: false, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "rbac.authorization.k8s.io", kind: "ClusterRoleBinding", plural: "clusterrolebindings", short_names: &[], namespaced: false, status: false, all: false, flavor: Flavor::Plain },
    Builtin { group: "events.k8s.io", kind: "Event", plural: "events", short_names: &["ev"], namespaced: true, status: false, all: false, flavor: Flavor::Event },
    Builtin { group: "coordination.k8s.io", kind: "Lease", plural: "leases", short_names: &[], namespaced: true, status: false, all: false, flavor: Flavor::Lease },
    Builtin { group: "apiextensions.k8s.io", kind: "CustomResourceDefinition", plural: "customresourcedefinitions", short_names: &["crd", "crds"], namespaced: false, status: true, all: false, flavor: Flavor::Crd },
];

/// The built-in resource types served from start.
pub fn builtins() -> Vec<ResourceType> {
    BUILTINS
        .iter()
        .map(|b| ResourceType {
            group: b.group.into(),
            versions: vec!["v1".into()],
            kind: b.kind.into(),
            list_kind: format!("{}List", b.kind),
            plural: b.plural.into(),
            singular: b.kind.to_lowercase(),
            short_names: b.short_names.iter().map(|s| s.to_string()).collect(),
            categories: if b.all { vec!["all".into()] } else { vec![] },
            namespaced: b.namespaced,
            status_subresource: b.status,
            flavor: b.flavor,
            schemas: BTreeMap::new(),
            columns: BTreeMap::new(),
        })
        .collect()
}

fn str_of(v: &Value, ptr: &str) -> String {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn strs_of(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Builds the resource type a CRD object describes (None if it has no served version).
pub fn from_crd(crd: &Value) -> Option<ResourceType> {
    let group = str_of(crd, "/spec/group");
    let kind = str_of(crd, "/spec/names/kind");
    let plural = str_of(crd, "/spec/names/plural");
    let mut singular = str_of(crd, "/spec/names/singular");
    if singular.is_empty() {
        singular = kind.to_lowercase();
    }
    let mut list_kind = str_of(crd, "/spec/names/listKind");
    if list_kind.is_empty() {
        list_kind = format!("{kind}List");
    }
    let namespaced = str_of(crd, "/spec/scope") != "Cluster";
    let mut versions = vec![];
    let mut schemas = BTreeMap::new();
    let mut columns = BTreeMap::new();
    let mut status_subresource = false;
    let mut storage_first: Option<String> = None;
    for v in crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let name = str_of(v, "/name");
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage_first = Some(name.clone());
        }
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(name.clone(), s.clone());
        }
        let mut cols = vec![];
        for c in v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // kube-apiserver describes an undescribed column by its JSONPath.
            let description = match str_of(c, "/description") {
                d if d.is_empty() => format!(
                    "Custom resource definition column (in JSONPath format): {}",
                    str_of(c, "/jsonPath")
                ),
                d => d,
            };
            cols.push(PrinterColumn {
                name: str_of(c, "/name"),
                type_: str_of(c, "/type"),
                format: str_of(c, "/format"),
                description,
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                json_path: str_of(c, "/jsonPath"),
            });
        }
        if !cols.is_empty() {
            columns.insert(name.clone(), cols);
        }
        versions.push(name);
    }
    if let Some(s) = storage_first
        && let Some(pos) = versions.iter().position(|v| *v == s)
    {
        let v = versions.remove(pos);
        versions.insert(0, v);
    }
    if versions.is_empty() || group.is_empty() || plural.is_empty() || kind.is_empty() {
        return None;
    }
    Some(ResourceType {
        group,
        versions,
        kind,
        list_kind,
        plural,
        singular,
        short_names: strs_of(crd, "/spec/names/shortNames"),
        categories: strs_of(crd, "/spec/names/categories"),
        namespaced,
        status_subresource,
        flavor: Flavor::Custom,
        schemas,
        columns,
    })
}
