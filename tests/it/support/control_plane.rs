//! The real kube-apiserver and etcd (crates/control-plane), one per test run: the CRD
//! installed once, and per test a namespace of its own where the chart's Role and
//! RoleBinding grant the controller's ServiceAccount what the chart grants it.

use autoapproval::controller::crd::AutoApproval;
use control_plane::{ControlPlane, Options, TestNamespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::{Client, CustomResourceExt, Resource};
use tokio::sync::OnceCell;

use super::cluster::eventually;
use super::tools::repo;

/// A test's namespace on the real control plane.
pub struct RealNamespace {
    pub plane: &'static ControlPlane,
    pub ns: TestNamespace,
    /// The admin, default namespace the test's: the tests' own set-up and checks.
    pub admin: Client,
    /// The chart's ServiceAccount: what the controller runs as.
    pub controller: Client,
}

/// The shared control plane, failing the test with the command that builds a missing
/// binary.
pub async fn control_plane() -> &'static ControlPlane {
    let plane = ControlPlane::shared()
        .await
        .unwrap_or_else(|e| panic!("the real control plane: {e}"));
    static CRD: OnceCell<()> = OnceCell::const_new();
    CRD.get_or_init(|| async {
        install_crd(plane).await;
    })
    .await;
    plane
}

/// A control plane of the test's own (one it may kill, restart or compact), the CRD
/// installed. Leaked, as the shared one is static: [`ControlPlane::stop`] ends it, else
/// the test binary's exit does.
pub async fn private_control_plane(options: Options) -> &'static ControlPlane {
    let plane = ControlPlane::start_with(options)
        .await
        .unwrap_or_else(|e| panic!("a private control plane: {e}"));
    let plane: &'static ControlPlane = Box::leak(Box::new(plane));
    install_crd(plane).await;
    plane
}

/// The CRD, once per control plane, then established and its schema published in
/// the OpenAPI that `kubectl explain` reads (a moment after it is established).
async fn install_crd(plane: &ControlPlane) {
    let admin = plane.admin_client().await.expect("admin client");
    let openapi = format!(
        "/openapi/v3/apis/{}/{}",
        AutoApproval::group(&()),
        AutoApproval::version(&())
    );
    let probe = control_plane::OpenApiProbe {
        path: &openapi,
        needle: "requestId",
    };
    control_plane::install_crd(&admin, &AutoApproval::crd(), Some(probe))
        .await
        .expect("the real kube-apiserver serves the CRD");
}

/// A fresh namespace with the chart's Role, changed by `edit`, bound to the
/// controller's ServiceAccount.
pub async fn real_namespace(edit: impl FnOnce(&mut Role)) -> RealNamespace {
    real_namespace_on(control_plane().await, edit).await
}

/// Like `real_namespace`, on `plane` (one from [`private_control_plane`]).
pub async fn real_namespace_on(
    plane: &'static ControlPlane,
    edit: impl FnOnce(&mut Role),
) -> RealNamespace {
    let ns = plane.namespace("it").await.expect("a test namespace");
    let admin = ns.admin_client().await.expect("admin client");
    let (mut role, binding) = chart_rbac(&ns.name);
    edit(&mut role);
    Api::<Role>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &role)
        .await
        .expect("the chart's Role");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the chart's RoleBinding");
    let controller = ns.client().await.expect("the ServiceAccount's client");
    RealNamespace {
        plane,
        ns,
        admin,
        controller,
    }
}

/// The Role and RoleBinding of deploy/manifests (the chart rendered with its
/// defaults), moved to `namespace`.
pub fn chart_rbac(namespace: &str) -> (Role, RoleBinding) {
    let path = repo().join("deploy/manifests/autoapproval.yaml");
    let yaml = std::fs::read_to_string(&path).expect("deploy/manifests/autoapproval.yaml");
    control_plane::chart_rbac(&yaml, namespace).expect("the chart's Role and RoleBinding")
}

/// Removes the Role's rule on `resource` (e.g. `"autoapprovals/status"`).
pub fn without_rule(role: &mut Role, resource: &str) {
    let rules = role.rules.as_mut().expect("rules");
    let before = rules.len();
    rules.retain(|r| {
        !r.resources
            .as_ref()
            .is_some_and(|rs| rs.iter().any(|x| x == resource))
    });
    assert_eq!(rules.len() + 1, before, "one rule on {resource}");
}

/// The chart's Role less `verb` on `resource`.
pub fn without_verb(role: &mut Role, resource: &str, verb: &str) {
    let rule = role
        .rules
        .as_mut()
        .expect("rules")
        .iter_mut()
        .find(|r| {
            r.resources
                .as_deref()
                .is_some_and(|rs| rs.iter().any(|x| x == resource))
        })
        .unwrap_or_else(|| panic!("a rule on {resource}"));
    let before = rule.verbs.len();
    rule.verbs.retain(|v| v != verb);
    assert_eq!(
        rule.verbs.len() + 1,
        before,
        "{verb} on {resource} is granted"
    );
}

/// `autoapproval run --replica-name rbac-1 <args>` as the chart's ServiceAccount under the
/// chart's Role changed by `edit`, with request `id` waiting, until its log holds the line
/// `until(the ServiceAccount's user name)`; then stopped with SIGTERM: its whole log.
pub async fn log_with_role(
    db: &super::Db,
    edit: impl FnOnce(&mut Role),
    args: &[&str],
    id: i64,
    until: impl Fn(&str) -> String,
) -> String {
    let real = super::real_namespace(edit).await;
    let sim = super::simulator().await;
    let sim_url = sim.base_url();
    // No --namespace: the kubeconfig's, as a pod's own namespace would be. Each call has a
    // namespace of its own on one database, so one fleet name for them all (a fleet's name
    // defaults to its namespace, and a database refuses a second fleet).
    let args = [&["--replica-name", "rbac-1", "--fleet", "rbac"][..], args].concat();
    let mut child = super::spawn_run_on_sim(&real.ns.kubeconfig, db, &args, &sim_url);
    let log = super::capture_stderr(&mut child);
    super::owner_now(id).insert(db).await;
    let until = until(&real.ns.service_account_user());
    eventually(&format!("a log line saying {until}"), || async {
        log.lock().expect("log").contains(&until).then_some(())
    })
    .await;
    super::sigterm(child.id().expect("pid"));
    let _ = child.wait().await;
    log.lock().expect("log").clone()
}
