//! The install path an operator walks: the README's `tested` blocks run verbatim with the real
//! kubectl v1.35 and helm v4 against the test API server and the real kube-apiserver (install
//! with its migration hook, status, `helm test`, upgrade with a CRD that gains a printer column,
//! history, rollback, uninstall), each step's output checked, the chart's replica approving a
//! request as the chart's ServiceAccount; and the chart refusing a bad value of each kind by name before
//! anything is stored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::chart_values::DIGEST;
use crate::support::{
    CHART_KINDS, Cli, Db, Kubelet, On, RESTRICTED, RESTRICTED_WARN, approved_through_kubectl,
    as_operator_of_own_server, eventually, kubectl_name, on_both_servers, parse_yaml_stream, repo,
    tool, with_cli_on_test_server,
};

const NAMESPACE: &str = "autoapproval";
const RELEASE: &str = "autoapproval";
/// The request the chart's replica approves.
const APPROVED: i64 = 701;

/// The commands of the block marked `<!-- tested: {name} ... -->` in README.md (the install)
/// or docs/INSTALL.md (the rest), continuation lines joined as the shell joins them.
fn readme_block(name: &str) -> Vec<String> {
    let readme = ["README.md", "docs/INSTALL.md"]
        .map(|file| std::fs::read_to_string(repo().join(file)).unwrap())
        .join("\n");
    let marker = format!("<!-- tested: {name}");
    let at = readme.find(&marker).unwrap_or_else(|| {
        panic!("neither README.md nor docs/INSTALL.md has a block marked {marker} -->")
    });
    let block = &readme[at..];
    let start = block
        .find("```sh\n")
        .expect("a ```sh block after the marker")
        + 6;
    let end = block[start..].find("```").expect("the block's end") + start;
    let mut commands = vec![];
    let mut current = String::new();
    for line in block[start..end].lines() {
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
        .into_iter()
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|c| !c.is_empty())
        .collect()
}

/// What one command printed.
struct Step {
    command: String,
    stdout: String,
    stderr: String,
}

/// Runs a README block from `work`, each command required to succeed.
fn run_block(cli: &Cli, name: &str, work: &Path) -> Vec<Step> {
    run_amended(cli, name, work, |command| command)
}

/// Runs a README block from `work` with each command passed through `amend` first (to add a
/// flag an operator would add), each required to succeed.
fn run_amended(cli: &Cli, name: &str, work: &Path, amend: impl Fn(String) -> String) -> Vec<Step> {
    readme_block(name)
        .into_iter()
        .map(amend)
        .map(|command| {
            let (step, succeeded) = run_step(cli, command, work);
            assert!(
                succeeded,
                "README `{name}` step failed: {}\n{}{}",
                step.command, step.stderr, step.stdout
            );
            step
        })
        .collect()
}

/// Runs one command from `work`: what it printed, and whether it succeeded.
fn run_step(cli: &Cli, command: String, work: &Path) -> (Step, bool) {
    let out = cli.shell(&command, work);
    let step = Step {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        command,
    };
    (step, out.status.success())
}

/// The step whose command starts with `prefix`.
fn step<'a>(steps: &'a [Step], prefix: &str) -> &'a Step {
    steps
        .iter()
        .find(|s| s.command.starts_with(prefix))
        .unwrap_or_else(|| panic!("no README step starts with {prefix:?}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A working copy holding what the README's commands read: `crds/` and the chart.
fn working_copy(dir: &Path) -> PathBuf {
    let work = dir.join("work");
    copy_dir(&repo().join("crds"), &work.join("crds"));
    copy_dir(
        &repo().join("deploy/helm/autoapproval"),
        &work.join("deploy/helm/autoapproval"),
    );
    work
}

/// Adds a printer column to the working copy's CRD, as a newer release's CRD would.
fn add_printer_column(work: &Path) -> &'static str {
    let path = work.join("crds/autoapproval.yaml");
    let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array_mut()
        .expect("printer columns");
    columns.push(json!({"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"}));
    std::fs::write(&path, serde_yaml::to_string(&crd).unwrap()).unwrap();
    "PAUSED"
}

fn revisions(history: &str) -> Vec<(u32, String, String)> {
    history
        .lines()
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').map(str::trim).collect();
            (
                cols[0]
                    .parse()
                    .unwrap_or_else(|_| panic!("history line: {l}")),
                cols[2].to_owned(),
                cols.last().unwrap().to_string(),
            )
        })
        .collect()
}

on_both_servers!(the_readme_install_test_upgrade_rollback_and_uninstall_steps_work_with_real_helm);
/// The README's blocks verbatim, kubectl and helm as the operator (on the real kube-apiserver its
/// admin); the test plays the Job controller and kubelet (no kube-controller-manager or kubelet
/// runs): the hook Job's `autoapproval migrate` runs on the test's database, and the Deployment's
/// replica runs as the chart's ServiceAccount, on the real server authorized only by the Role the
/// chart installed; `helm test` passes once it is ready, and it approves a request.
async fn the_readme_install_test_upgrade_rollback_and_uninstall_steps_work_with_real_helm(
    db: Db,
    on: On,
) {
    as_operator_of_own_server(on, db, NAMESPACE, lifecycle).await;
}

/// Helm 3 is what many clusters still run: the same README steps with the newest Helm 3 any
/// registry here serves (scripts/install-tools.sh), on the real kube-apiserver.
#[sqlx::test(migrations = false)]
async fn the_readme_steps_work_with_helm_3_too(pool: sqlx::PgPool) {
    let db = Db::Postgres(crate::support::migrated(pool).await);
    as_operator_of_own_server(On::RealServer, db, NAMESPACE, |cli, kubelet, db, rt| {
        let helm3 = cli.with_helm(&tool("helm3"));
        let version = helm3.shell("helm version --short", &helm3.dir);
        let version = String::from_utf8_lossy(&version.stdout).into_owned();
        assert!(version.starts_with("v3."), "Helm 3 expected, got {version}");
        lifecycle(&helm3, kubelet, db, rt);
    })
    .await;
}

/// The README's install block, verbatim, on a database without the binding (an empty one): the
/// hook Job migrates, then its `autoapproval check` as the controller's role refuses as every
/// replica would, so `helm install` fails naming the hook Job, the Job stays for `kubectl logs`
/// (whose output, here the played kubelet's log, names the missing view), the release is
/// `failed` and nothing else was created; then the fix docs/TROUBLESHOOTING.md gives (the binding
/// made, `helm uninstall`, the same `helm install`) deploys.
#[sqlx::test(migrations = false)]
async fn the_readme_install_on_a_database_without_the_binding_fails_naming_the_missing_view(
    pool: sqlx::PgPool,
) {
    as_operator_of_own_server(
        On::RealServer,
        Db::Postgres(pool),
        NAMESPACE,
        |cli, kubelet, db, rt| install_without_binding(cli, kubelet, db, rt, ""),
    )
    .await;
}

/// The same with the newest Helm 3, whose message differs (`job autoapproval-migrate failed:
/// PodFailurePolicy`) and names the Job too, and with `--wait` added, which fails the same way.
#[sqlx::test(migrations = false)]
async fn the_readme_install_without_the_binding_fails_with_helm_3_too(pool: sqlx::PgPool) {
    as_operator_of_own_server(
        On::RealServer,
        Db::Postgres(pool),
        NAMESPACE,
        |cli, kubelet, db, rt| {
            let helm3 = cli.with_helm(&tool("helm3"));
            install_without_binding(&helm3, kubelet, db, rt, " --wait");
        },
    )
    .await;
}

/// The README's install block on a database without the binding, `extra` added to `helm install`.
fn install_without_binding(
    cli: &Cli,
    kubelet: &Kubelet,
    db: &Db,
    rt: &tokio::runtime::Handle,
    extra: &str,
) {
    let work = working_copy(&cli.dir);
    let mut install = None;
    let mut verbatim = String::new();
    let mut steps = vec![];
    for command in readme_block("install") {
        let is_install = command.starts_with("helm install");
        let command = if is_install {
            verbatim = command.clone();
            command + extra
        } else {
            command
        };
        let (step, succeeded) = run_step(cli, command, &work);
        assert_eq!(
            succeeded, !is_install,
            "only `helm install` fails: {}\n{}{}",
            step.command, step.stderr, step.stdout
        );
        if is_install {
            install = Some(step);
        } else {
            steps.push(step);
        }
    }
    let install = install.expect("the block's helm install");
    // Helm names the hook that failed; the Job's log names the view.
    assert!(
        install.stderr.contains("INSTALLATION FAILED")
            && install.stderr.contains("pre-install")
            && install.stderr.contains("autoapproval-migrate"),
        "helm install names the failed hook Job: {}",
        install.stderr
    );
    let log = kubelet.log();
    assert!(
        log.contains("binding to the business tables")
            && log.contains("relation \"autoapproval_request\" does not exist"),
        "the Job's log (kubectl logs job/autoapproval-migrate) names the view: {log}"
    );
    // The migration itself ran: the check refused, not migrate.
    let store = db.database();
    let report = rt.block_on(store.schema_report()).expect("schema report");
    assert!(report.missing.is_empty(), "{:?}", report.missing);
    assert_eq!(finished(kubelet), ["Job/autoapproval-migrate"]);
    let failed = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "job",
        "autoapproval-migrate",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Failed")].reason}"#,
    ]);
    assert_eq!(
        failed, "PodFailurePolicy",
        "the failed Job stays for kubectl logs, failed at once by the check's exit"
    );
    let status = step(&steps, "helm -n autoapproval status");
    assert!(
        status.stdout.contains("STATUS: failed"),
        "{}",
        status.stdout
    );
    let created = cli.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(
        created, "job.batch/autoapproval-migrate\n",
        "nothing but the hook Job was created"
    );

    // The fix: the binding made (here the reference schema's), uninstall, install again (without
    // --wait: no kube-controller-manager makes the Deployment's pods ready here).
    rt.block_on(store.migrate(true)).expect("the binding");
    let uninstall = cli.shell("helm -n autoapproval uninstall autoapproval", &work);
    assert!(
        uninstall.status.success(),
        "{}",
        String::from_utf8_lossy(&uninstall.stderr)
    );
    let (again, succeeded) = run_step(cli, verbatim, &work);
    assert!(
        succeeded && again.stdout.contains("STATUS: deployed"),
        "{}{}",
        again.stderr,
        again.stdout
    );
    assert_eq!(
        finished(kubelet),
        ["Job/autoapproval-migrate", "Job/autoapproval-migrate"]
    );
}

/// The README's evaluation path on an empty database: its install block with
/// `--set migrations.referenceSchema=true` added to `helm install`, as the README says; the hook
/// creates the reference schema and its binding, the check passes, `helm test` passes and the
/// chart's replica approves a request.
#[sqlx::test(migrations = false)]
async fn the_readmes_evaluation_path_on_an_empty_database_approves_a_request(pool: sqlx::PgPool) {
    as_operator_of_own_server(
        On::RealServer,
        Db::Postgres(pool),
        NAMESPACE,
        evaluation_path,
    )
    .await;
}

fn evaluation_path(cli: &Cli, kubelet: &Kubelet, db: &Db, rt: &tokio::runtime::Handle) {
    const REFERENCE: &str = "--set migrations.referenceSchema=true";
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("add `{REFERENCE}` to `helm install`")),
        "the README documents the evaluation path as {REFERENCE}"
    );
    let work = working_copy(&cli.dir);
    let steps = run_amended(cli, "install", &work, |command| {
        if command.starts_with("helm install") {
            format!("{command} {REFERENCE}")
        } else {
            command
        }
    });
    let install = step(&steps, "helm install");
    assert!(
        install.stdout.contains("STATUS: deployed"),
        "{}",
        install.stdout
    );
    assert_eq!(finished(kubelet), ["Job/autoapproval-migrate"]);
    rt.block_on(eventually("the chart's replica to be ready", || async {
        kubelet.ready().await.then_some(())
    }));
    let steps = run_block(cli, "test", &work);
    let test = step(&steps, "helm -n autoapproval test");
    assert!(
        test.stdout.contains("Phase:          Succeeded"),
        "{}",
        test.stdout
    );
    rt.block_on(approved_through_kubectl(cli, db, NAMESPACE, APPROVED));
}

/// The Jobs and Pods the played kubelet finished, in order.
fn finished(kubelet: &Kubelet) -> Vec<String> {
    kubelet
        .done()
        .into_iter()
        .filter(|d| !d.starts_with("Deployment/"))
        .collect()
}

fn lifecycle(cli: &Cli, kubelet: &Kubelet, db: &Db, rt: &tokio::runtime::Handle) {
    let work = working_copy(&cli.dir);
    let deployment = |jsonpath: &str| {
        let output = format!("jsonpath={jsonpath}");
        cli.kubectl(&["-n", NAMESPACE, "get", "deployment", RELEASE, "-o", &output])
    };
    let replicas = || deployment("{.spec.replicas}");
    let image = || deployment("{.spec.template.spec.containers[0].image}");
    let pinned = format!("registry.example.com/autoapproval@{DIGEST}");

    // Install, the image pinned by digest as a production install pins it.
    let steps = run_amended(cli, "install", &work, |command| {
        if command.starts_with("helm install") {
            format!("{command} --set image.digest={DIGEST}")
        } else {
            command
        }
    });
    assert_eq!(
        step(&steps, "kubectl create namespace").stdout,
        "namespace/autoapproval created\n"
    );
    let crd = step(&steps, "kubectl apply --server-side -f crds/");
    assert_eq!(
        crd.stdout,
        "customresourcedefinition.apiextensions.k8s.io/autoapprovals.autoapproval.io serverside-applied\n"
    );
    let secret = step(&steps, "kubectl -n autoapproval create secret generic");
    assert_eq!(secret.stdout, "secret/autoapproval created\n");
    let template = r#"go-template={{index .data "database-url" | base64decode}}"#;
    let url = cli.kubectl(&["-n", NAMESPACE, "get", "secret", RELEASE, "-o", template]);
    assert_eq!(
        url,
        "postgres://autoapproval:PASSWORD@primary:5432/contracts"
    );

    let install = step(&steps, "helm install");
    for line in [
        "NAME: autoapproval",
        "NAMESPACE: autoapproval",
        "STATUS: deployed",
        "REVISION: 1",
    ] {
        assert!(
            install.stdout.contains(line),
            "helm install: no {line:?}:\n{}",
            install.stdout
        );
    }
    assert!(
        install.stdout.contains(&format!(
            "autoapproval {} is installed in namespace autoapproval (3 replicas)",
            env!("CARGO_PKG_VERSION")
        )),
        "NOTES: {}",
        install.stdout
    );
    assert!(!install.stdout.contains("WARNING"), "{}", install.stdout);
    assert_eq!(
        finished(kubelet),
        ["Job/autoapproval-migrate"],
        "the pre-install hook ran"
    );
    let status = step(&steps, "helm -n autoapproval status");
    assert!(
        status.stdout.contains("STATUS: deployed") && status.stdout.contains("REVISION: 1"),
        "{}",
        status.stdout
    );
    let aa = step(&steps, "kubectl -n autoapproval get autoapprovals");
    assert_eq!(aa.stdout, "");
    assert_eq!(aa.stderr, "No resources found in autoapproval namespace.\n");

    // What helm stored is what the chart renders with the same values, the hooks aside; and
    // the cluster holds exactly that (the succeeded hook Job was deleted by its policy).
    let install_line = &install.command;
    let template = install_line.replacen("helm install", "helm template", 1) + " --skip-tests";
    let rendered = cli.shell(&template, &work);
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let rendered: Vec<Value> = parse_yaml_stream(&String::from_utf8_lossy(&rendered.stdout))
        .into_iter()
        .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect();
    let manifest = cli.shell(
        &format!("helm -n {NAMESPACE} get manifest {RELEASE}"),
        &work,
    );
    let mut manifest = parse_yaml_stream(&String::from_utf8_lossy(&manifest.stdout));
    // Installed, the Deployment carries the checksum of the Secret it read (helm's lookup);
    // `helm template` reaches no cluster and leaves it out, as the plain manifests do.
    let secret_checksum = |objs: &mut [Value]| -> Option<Value> {
        let deployment = objs.iter_mut().find(|o| o["kind"] == "Deployment")?;
        let annotations =
            deployment["spec"]["template"]["metadata"]["annotations"].as_object_mut()?;
        annotations.remove("checksum/secret")
    };
    assert!(
        secret_checksum(&mut manifest).is_some(),
        "the installed Deployment has checksum/secret"
    );
    let by_name = |objs: &[Value]| -> std::collections::BTreeMap<String, Value> {
        objs.iter().map(|o| (kubectl_name(o), o.clone())).collect()
    };
    assert_eq!(by_name(&manifest), by_name(&rendered), "helm get manifest");
    let stored: BTreeSet<String> = cli
        .kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(stored, by_name(&manifest).into_keys().collect());
    assert_eq!(replicas(), "3");
    assert_eq!(image(), pinned, "the digest, not the tag");

    // From here the namespace enforces the Pod Security Standard `restricted`, as a hardened
    // cluster's do: kube-apiserver's PodSecurity admission refuses the test Pod and warns of the
    // Deployment's and the hook Job's pod templates if they fall short (the test API server has no
    // such admission).
    cli.kubectl(&["label", "namespace", NAMESPACE, RESTRICTED, RESTRICTED_WARN]);

    // helm test, once the replica is ready: its Pod fetches /readyz through the Service.
    rt.block_on(eventually("the chart's replica to be ready", || async {
        kubelet.ready().await.then_some(())
    }));
    let steps = run_block(cli, "test", &work);
    let test = step(&steps, "helm -n autoapproval test");
    for line in [
        "TEST SUITE:     autoapproval-test-readyz",
        "Phase:          Succeeded",
    ] {
        assert!(
            test.stdout.contains(line),
            "helm test: no {line:?}:\n{}",
            test.stdout
        );
    }
    assert_eq!(
        finished(kubelet)[1..],
        ["Pod/autoapproval-test-readyz Succeeded"],
        "the test hook ran"
    );
    let pods = cli.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(
        pods, "",
        "the succeeded test Pod was deleted by its hook policy"
    );

    // The installed replica approves a request end to end.
    rt.block_on(approved_through_kubectl(cli, db, NAMESPACE, APPROVED));

    // Upgrade, with a CRD that gained a printer column.
    let sample = cli.dir.join("aa.yaml");
    std::fs::write(
        &sample,
        "apiVersion: autoapproval.io/v1alpha1\nkind: AutoApproval\nmetadata: {name: request-1, namespace: autoapproval}\nspec: {requestId: 1, requestType: OWNER_CONTRACT, paused: true}\n",
    )
    .unwrap();
    cli.kubectl(&["apply", "-f", sample.to_str().unwrap()]);
    let header = add_printer_column(&work);
    let before = cli.kubectl(&["-n", NAMESPACE, "get", "autoapprovals"]);
    assert!(!before.lines().next().unwrap().contains(header), "{before}");
    // The database password rotated in the Secret: the upgrade rolls the pods to read it.
    let checksum = || deployment(r#"{.spec.template.metadata.annotations.checksum/secret}"#);
    let installed_checksum = checksum();
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "patch",
        "secret",
        RELEASE,
        "--type",
        "merge",
        "-p",
        r#"{"data":{"database-url":"cG9zdGdyZXM6Ly9hdXRvYXBwcm92YWw6Uk9UQVRFREBwcmltYXJ5OjU0MzIvY29udHJhY3Rz"}}"#,
    ]);
    let steps = run_block(cli, "upgrade", &work);
    assert_ne!(
        checksum(),
        installed_checksum,
        "a rotated Secret changes the pod template's checksum/secret"
    );
    let crd = step(
        &steps,
        "kubectl apply --server-side --force-conflicts -f crds/",
    );
    assert_eq!(
        crd.stdout,
        "customresourcedefinition.apiextensions.k8s.io/autoapprovals.autoapproval.io serverside-applied\n"
    );
    let table = cli.kubectl(&["-n", NAMESPACE, "get", "autoapprovals"]);
    let mut lines = table.lines();
    assert!(
        lines.next().unwrap().contains(header),
        "the new column: {table}"
    );
    assert!(lines.next().unwrap().contains("true"), "its value: {table}");
    let upgrade = step(&steps, "helm upgrade");
    assert!(
        !upgrade.stderr.contains("PodSecurity"),
        "the templates meet `restricted`: {}",
        upgrade.stderr
    );
    assert!(
        upgrade
            .stdout
            .contains("Release \"autoapproval\" has been upgraded."),
        "{}",
        upgrade.stdout
    );
    assert!(
        upgrade.stdout.contains("REVISION: 2") && upgrade.stdout.contains("(2 replicas)"),
        "{}",
        upgrade.stdout
    );
    assert_eq!(
        finished(kubelet)[2..],
        ["Job/autoapproval-migrate"],
        "the pre-upgrade hook ran"
    );
    assert_eq!(replicas(), "2");
    assert_eq!(image(), pinned, "--reuse-values kept the digest");
    let history = revisions(&step(&steps, "helm -n autoapproval history").stdout);
    assert_eq!(
        history,
        [
            (1, "superseded".to_owned(), "Install complete".to_owned()),
            (2, "deployed".to_owned(), "Upgrade complete".to_owned()),
        ]
    );
    // --reuse-values kept the install's settings.
    let esign = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "configmap",
        RELEASE,
        "-o",
        "jsonpath={.data.AUTOAPPROVAL_ESIGN_URL}",
    ]);
    assert_eq!(esign, "http://esign:8080");

    // Rollback.
    let steps = run_block(cli, "rollback", &work);
    let rollback = step(&steps, "helm -n autoapproval rollback");
    assert_eq!(rollback.stdout, "Rollback was a success! Happy Helming!\n");
    assert_eq!(replicas(), "3");
    let history = cli.shell(&format!("helm -n {NAMESPACE} history {RELEASE}"), &work);
    let history = revisions(&String::from_utf8_lossy(&history.stdout));
    assert_eq!(history.len(), 3);
    assert_eq!(
        history[2],
        (3, "deployed".to_owned(), "Rollback to 1".to_owned())
    );
    assert_eq!(finished(kubelet).len(), 3, "no hook runs on rollback");

    // Uninstall: the CRD (from crds/) and the user's Secret remain, nothing else.
    let steps = run_block(cli, "uninstall", &work);
    assert_eq!(
        step(&steps, "helm uninstall").stdout,
        "release \"autoapproval\" uninstalled\n"
    );
    let left = cli.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(left, "");
    let secrets = cli.kubectl(&["get", "secrets", "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(
        secrets, "secret/autoapproval\n",
        "no release record is left"
    );
    let crds = cli.kubectl(&["get", "crds", "-o", "name"]);
    assert_eq!(
        crds,
        "customresourcedefinition.apiextensions.k8s.io/autoapprovals.autoapproval.io\n"
    );
}

/// One bad value of each kind: helm refuses the install before storing anything, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_refuses_a_bad_value_of_each_kind_by_name_before_storing_anything() {
    with_cli_on_test_server(refusals).await;
}

fn refusals(cli: &Cli) {
    let chart = repo().join("deploy/helm/autoapproval");
    let chart = chart.to_str().unwrap();
    cli.kubectl(&["create", "namespace", NAMESPACE]);
    let urls = [
        "config.esignUrl=http://esign:8080",
        "config.ownerUrl=http://owner:8080",
        "config.storeUrl=http://store:8080",
        "config.adUrl=http://ad:8080",
    ];
    // (what is wrong, --set, the value helm must name, what it must say about it)
    let cases: [(&str, &str, &str, &str); 13] = [
        (
            "not an integer",
            "replicaCount=abc",
            "/replicaCount",
            "want integer",
        ),
        (
            "below the minimum",
            "config.shards=0",
            "/config/shards",
            "minimum",
        ),
        (
            "outside the enum",
            "image.pullPolicy=Sometimes",
            "/image/pullPolicy",
            "must be one of",
        ),
        (
            "not a boolean",
            "config.notify=maybe",
            "/config/notify",
            "want boolean",
        ),
        (
            "not a duration",
            "config.pollPeriod=10x",
            "/config/pollPeriod",
            "does not match pattern",
        ),
        (
            "not a URL",
            "config.esignUrl=esign:8080",
            "/config/esignUrl",
            "does not match pattern",
        ),
        (
            "not host:port",
            "config.listen=metrics",
            "/config/listen",
            "does not match pattern",
        ),
        (
            "a misspelt key",
            "config.pollPerod=10s",
            "'pollPerod' not allowed",
            "additional properties",
        ),
        (
            "a missing URL",
            "config.adUrl=",
            "/config/adUrl",
            "is not valid uri",
        ),
        (
            "a wrong type deeper down",
            "service.port=http",
            "/service/port",
            "want integer",
        ),
        (
            "a share above 1",
            "tracing.samplingRatio=1.5",
            "/tracing/samplingRatio",
            "does not match pattern",
        ),
        (
            "a collector over TLS, which the exporter cannot speak",
            "tracing.endpoint=https://collector:4318",
            "/tracing/endpoint",
            "does not match pattern",
        ),
        (
            "tracing on without a collector",
            "tracing.enabled=true",
            "/tracing/endpoint",
            "minLength",
        ),
    ];
    for (what, bad, named, says) in cases {
        let mut args = vec!["install", RELEASE, chart, "-n", NAMESPACE];
        for url in urls {
            args.extend(["--set", url]);
        }
        args.extend(["--set", bad]);
        let out = cli.helm_output(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {bad} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(named)
                && stderr.contains(says),
            "{what}: {bad}: helm's refusal must name {named}: {stderr}"
        );
        // Refused, not half-installed: no release record, no object.
        assert_eq!(
            cli.kubectl(&["get", "secrets", "-n", NAMESPACE, "-o", "name"]),
            "",
            "{what}"
        );
        assert_eq!(
            cli.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]),
            "",
            "{what}"
        );
    }
    // The same URLs and nothing bad install.
    let mut args = vec!["install", RELEASE, chart, "-n", NAMESPACE, "--no-hooks"];
    for url in urls {
        args.extend(["--set", url]);
    }
    let out = cli.helm_output(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
