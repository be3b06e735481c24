//! The stack on the real control plane (`--control-plane real`): etcd and
//! kube-apiserver from crates/control-plane, the CRD established, and a namespace
//! whose ServiceAccount the chart's Role binds, so the replicas run as the chart runs
//! them, RBAC enforced. Also what the two servers cost: their CPU, etcd's size, and
//! the API writes by kind from kube-apiserver's own metrics.

use std::collections::BTreeMap;
use std::path::Path;

use control_plane::{ControlPlane, TestNamespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};

use super::StackError;
use autoapproval::controller::crd::AutoApproval;

/// The chart rendered with its defaults: its Role and RoleBinding are what the
/// replicas are granted.
const MANIFESTS: &str = include_str!("../../../../deploy/manifests/autoapproval.yaml");

fn kube_err(what: &'static str) -> impl FnOnce(kube::Error) -> StackError {
    move |e| StackError::Kube(format!("{what}: {e}"))
}

/// etcd and kube-apiserver with the CRD and the stack's namespace.
pub struct RealServer {
    /// Dropped last: its drop ends both servers.
    plane: ControlPlane,
    ns: TestNamespace,
    /// The admin, default namespace the stack's: the lab's own set-up and reads.
    admin: kube::Client,
}

/// CPU seconds the two servers have used so far.
#[derive(Clone, Copy, Debug)]
pub struct ServerCpu {
    /// kube-apiserver's utime + stime, all its threads.
    pub apiserver: f64,
    /// etcd's.
    pub etcd: f64,
}

// === impl RealServer ===

impl RealServer {
    /// Starts etcd and kube-apiserver, establishes the CRD and makes the namespace
    /// with the chart's Role bound to its ServiceAccount.
    pub async fn start() -> Result<Self, StackError> {
        let plane = ControlPlane::start().await?;
        let ns = plane.namespace("lab").await?;
        let admin = ns.admin_client().await?;
        let server = Self { plane, ns, admin };
        server.install_crd().await?;
        server.bind_chart_role().await?;
        Ok(server)
    }

    async fn install_crd(&self) -> Result<(), StackError> {
        // Established is enough: the lab never asks kubectl to explain it.
        control_plane::install_crd(&self.admin, &AutoApproval::crd(), None).await?;
        Ok(())
    }

    async fn bind_chart_role(&self) -> Result<(), StackError> {
        let (role, binding) = control_plane::chart_rbac(MANIFESTS, &self.ns.name)?;
        Api::<Role>::namespaced(self.admin.clone(), &self.ns.name)
            .create(&PostParams::default(), &role)
            .await
            .map_err(kube_err("creating the chart's Role"))?;
        Api::<RoleBinding>::namespaced(self.admin.clone(), &self.ns.name)
            .create(&PostParams::default(), &binding)
            .await
            .map_err(kube_err("creating the chart's RoleBinding"))?;
        Ok(())
    }

    /// The stack's namespace.
    pub fn namespace(&self) -> &str {
        &self.ns.name
    }

    /// The kubeconfig of the chart's ServiceAccount: what the replicas run as.
    pub fn kubeconfig(&self) -> &Path {
        &self.ns.kubeconfig
    }

    /// A client of the admin, default namespace the stack's.
    pub fn admin(&self) -> kube::Client {
        self.admin.clone()
    }

    /// kube-apiserver's and etcd's CPU so far; `None` when either is not running.
    pub fn cpu_seconds(&self) -> Option<ServerCpu> {
        let of = |name: &str, pid: Option<u32>| {
            let seconds = pid.and_then(super::replicas::cpu_seconds);
            if seconds.is_none() {
                tracing::warn!(?pid, "{name}'s CPU not found in /proc: its row stays empty");
            }
            seconds
        };
        Some(ServerCpu {
            apiserver: of("kube-apiserver", self.plane.apiserver_pid())?,
            etcd: of("etcd", self.plane.etcd_pid())?,
        })
    }

    /// etcd's database size now, in bytes.
    pub async fn etcd_db_bytes(&self) -> Result<u64, StackError> {
        Ok(self.plane.etcd_db_size_bytes().await?)
    }

    /// Writes kube-apiserver has served so far, by verb and resource as the
    /// in-memory server keys them (`"patch autoapprovals"`): every client's,
    /// kube-apiserver's own upkeep (its Lease, every 10 s) included.
    pub async fn writes(&self) -> Result<BTreeMap<String, u64>, StackError> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| StackError::Kube(format!("a /metrics request: {e}")))?;
        let text = self
            .admin
            .request_text(request)
            .await
            .map_err(kube_err("kube-apiserver's /metrics"))?;
        Ok(writes_in(&text))
    }
}

/// `apiserver_request_total`'s writes by verb and resource: POST is `create`, PUT
/// `update`, PATCH and APPLY (server-side apply) `patch`; subresources fold into
/// their resource, as in the in-memory server's counts.
fn writes_in(metrics: &str) -> BTreeMap<String, u64> {
    let mut writes = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(name)?.strip_prefix("=\""))
                .map(|v| v.trim_end_matches('"'))
        };
        let verb = match label("verb") {
            Some("POST") => "create",
            Some("PUT") => "update",
            Some("PATCH" | "APPLY") => "patch",
            Some("DELETE") => "delete",
            Some("DELETECOLLECTION") => "deletecollection",
            _ => continue,
        };
        let (Some(resource), Ok(n)) = (label("resource"), value.trim().parse::<f64>()) else {
            continue;
        };
        *writes.entry(format!("{verb} {resource}")).or_default() += n as u64;
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_keyed_like_the_in_memory_servers() {
        let text = "# TYPE apiserver_request_total counter\n\
            apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"autoapproval.io\",resource=\"autoapprovals\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1alpha1\"} 5\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"autoapproval.io\",resource=\"autoapprovals\",scope=\"resource\",subresource=\"status\",verb=\"APPLY\",version=\"v1alpha1\"} 4\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"autoapproval.io\",resource=\"autoapprovals\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1alpha1\"} 1\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"PUT\",version=\"v1\"} 7\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"events\",scope=\"resource\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 3\n";
        assert_eq!(
            writes_in(text),
            BTreeMap::from([
                ("create autoapprovals".to_owned(), 5),
                ("patch autoapprovals".to_owned(), 5),
                ("update leases".to_owned(), 7),
            ])
        );
    }
}
