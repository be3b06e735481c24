//! `autoapproval-lab demo`: the controller's main job on a throwaway stack. Three
//! replicas work a mixed workload to its end; the demo shows the progress,
//! checks every request's end in the database and in its CR, and exits 0
//! only when each one ended where it should.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::harness::{NewRequest, RequestEnd};
use crate::stack::{ControlPlaneKind, Program, Stack, StackArgs, StackError, install_termination};
use autoapproval::controller::crd::{AutoApproval, Phase};
use autoapproval::domain::RequestType;
use autoapproval::external::System;
use autoapproval::flags::parse_duration;
use autoapproval_sim::{FaultKind, Faults, SimConfig};

/// Arguments of `demo`.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Where the stack comes from.
    #[command(flatten)]
    pub stack: StackArgs,
    /// Owner contracts approvable at once (a fifth as many ad contracts are added).
    #[arg(long, env = "AUTOAPPROVAL_DEMO_REQUESTS", default_value_t = 40)]
    pub requests: u32,
    /// Controller replicas, each a child process.
    #[arg(long, env = "AUTOAPPROVAL_DEMO_REPLICAS", default_value_t = 3)]
    pub replicas: u32,
    /// Owner-system calls the simulator answers with 500 (transient failures).
    #[arg(long, env = "AUTOAPPROVAL_DEMO_FAILURES", default_value_t = 6)]
    pub failures: u32,
    /// Give up, and exit 1, when the requests have not all ended by then.
    #[arg(long, env = "AUTOAPPROVAL_DEMO_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// How the printed watch command calls kubectl.
    #[arg(long, env = "AUTOAPPROVAL_DEMO_KUBECTL", default_value = "kubectl")]
    pub kubectl: String,
    /// After the summary, stay up (for kubectl) until Ctrl-C [default: off].
    #[arg(long, env = "AUTOAPPROVAL_DEMO_KEEP_RUNNING", default_value_t = false)]
    pub keep_running: bool,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The stack failed.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// A setting is invalid.
    #[error("invalid setting {flag}: {message}")]
    Setting {
        /// The flag.
        flag: &'static str,
        /// Why.
        message: &'static str,
    },
    /// Requests did not reach their expected end in time.
    #[error("{0} request(s) did not reach their expected end within the timeout (listed above)")]
    Unfinished(usize),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted; everything the demo started is stopped")]
    Interrupted,
}

/// The groups of the workload and where each must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// Owner contracts approvable at once.
    Ready,
    /// Ad contracts for stores that exist.
    Ads,
    /// Owner contracts whose documents are released a few seconds in.
    DocumentsLater,
    /// An owner contract a person approves while it waits.
    ByHand,
    /// An ad contract for a store that does not exist.
    MissingStore,
}

impl Group {
    const ALL: [Group; 5] = [
        Group::Ready,
        Group::Ads,
        Group::DocumentsLater,
        Group::ByHand,
        Group::MissingStore,
    ];

    fn label(self) -> &'static str {
        match self {
            Group::Ready => "owner contracts, approvable at once",
            Group::Ads => "ad contracts, store exists",
            Group::DocumentsLater => "owner contracts, documents released at 3 s",
            Group::ByHand => "owner contract a person approves at 4 s",
            Group::MissingStore => "ad contract for a missing store",
        }
    }

    /// The CR phase it must end in.
    fn expected_phase(self) -> Phase {
        match self {
            Group::Ready | Group::Ads | Group::DocumentsLater => Phase::Approved,
            Group::ByHand => Phase::Superseded,
            Group::MissingStore => Phase::RetryWaiting,
        }
    }

    /// Whether the database row is where the group must end.
    fn db_ended(self, end: &RequestEnd) -> bool {
        match self {
            Group::Ready | Group::Ads | Group::DocumentsLater => {
                end.status == "APPROVED"
                    && end.decided_by.as_deref() == Some("autoapproval")
                    && end.state.is_none()
            }
            Group::ByHand => {
                end.status == "APPROVED"
                    && end.decided_by.as_deref() == Some(PERSON)
                    && end.state.is_none()
            }
            Group::MissingStore => {
                end.status == "PENDING"
                    && end.state.as_deref() == Some("RETRY_WAITING")
                    && end
                        .last_reason
                        .as_deref()
                        .is_some_and(|r| r.contains("does not exist"))
            }
        }
    }
}

const PERSON: &str = "person:demo";
const MISSING_STORE: i64 = 9999;
const FIRST_STORE: i64 = 7001;
const RELEASE_AT: Duration = Duration::from_secs(3);
const BY_HAND_AT: Duration = Duration::from_secs(4);

/// One seeded request.
struct Seeded {
    id: i64,
    group: Group,
}

/// Runs the demo; everything it started is stopped on every path.
pub async fn run(args: DemoArgs) -> Result<(), DemoError> {
    if args.replicas == 0 {
        return Err(DemoError::Setting {
            flag: "--replicas",
            message: "must be at least 1",
        });
    }
    if args.requests == 0 {
        return Err(DemoError::Setting {
            flag: "--requests",
            message: "must be at least 1",
        });
    }
    let mut interrupt = install_termination()?;
    let out = Out::new();
    let database = args.stack.database.name();
    let server = match args.stack.control_plane {
        ControlPlaneKind::Memory => "the test API server",
        ControlPlaneKind::Real => {
            "kube-apiserver and etcd (RBAC: the replicas run as the chart's ServiceAccount)"
        }
    };
    out.line(&format!(
        "starting {database}, {server} and the simulator..."
    ));
    // Not raced against Ctrl-C: a start cut short would leave its directory.
    let mut stack = Stack::start(&args.stack, "demo", SimConfig::default()).await?;
    let result = if interrupt.caught() {
        Err(DemoError::Interrupted)
    } else {
        tokio::select! {
            result = demo(&mut stack, &args, &out) => result,
            () = interrupt.recv() => Err(DemoError::Interrupted),
        }
    };
    let result = match result {
        Ok(()) if args.keep_running => {
            out.line("staying up until Ctrl-C (--keep-running)");
            interrupt.recv().await;
            Ok(())
        }
        other => other,
    };
    if result.is_err() {
        for replica in stack.replicas() {
            out.line(&format!(
                "{}'s last log lines: {}",
                replica.name(),
                crate::stack::process::tail(replica.log())
            ));
        }
    }
    out.line(&format!(
        "stopping the replicas, the simulator, the API server and {database}..."
    ));
    let failed = result.is_err() && !matches!(result, Err(DemoError::Interrupted));
    if failed {
        out.line(&format!("logs kept in {}", stack.dir().display()));
    }
    stack.shutdown(failed).await;
    result
}

async fn demo(stack: &mut Stack, args: &DemoArgs, out: &Out) -> Result<(), DemoError> {
    let shards = 16u32;
    for i in 0..args.replicas {
        let name = format!("replica-{i}");
        let mut argv = stack.run_args(&name);
        argv.extend(["--shards".into(), shards.to_string()]);
        stack.spawn(Program::Controller, &name, &argv).await?;
    }
    out.line(&format!(
        "started {} controller replicas; waiting until they hold all {shards} shards...",
        args.replicas
    ));
    stack.wait_ready(Some(shards)).await?;

    let sim = stack.sim().ok_or(StackError::Kube("no simulator".into()))?;
    let ads = (args.requests / 5).max(1);
    for store in 0..ads {
        sim.add_store(FIRST_STORE + i64::from(store), true);
    }
    sim.set_faults(Faults::fail_next(
        System::Owner,
        args.failures,
        FaultKind::Error,
    ))
    .map_err(StackError::Sim)?;

    let harness = stack.harness()?.clone();
    let mut seeded = Vec::new();
    let mut plan: Vec<(Group, NewRequest)> = Vec::new();
    let owner = |name: String, documents_released| NewRequest {
        request_type: RequestType::OwnerContract,
        business_name: name,
        documents_released,
        target_store_number: None,
    };
    let ad = |name: String, store| NewRequest {
        request_type: RequestType::AdContract,
        business_name: name,
        documents_released: true,
        target_store_number: Some(store),
    };
    for i in 0..args.requests {
        plan.push((Group::Ready, owner(format!("Shop {i}"), true)));
    }
    for i in 0..ads {
        plan.push((
            Group::Ads,
            ad(format!("Ad {i}"), FIRST_STORE + i64::from(i)),
        ));
    }
    for i in 0..8 {
        plan.push((Group::DocumentsLater, owner(format!("Waiting {i}"), false)));
    }
    plan.push((Group::ByHand, owner("Decided by a person".into(), false)));
    plan.push((
        Group::MissingStore,
        ad("No such store".into(), MISSING_STORE),
    ));
    let started = Instant::now();
    for (group, request) in &plan {
        let id = harness
            .insert_request(request)
            .await
            .map_err(StackError::from)?;
        seeded.push(Seeded { id, group: *group });
    }
    out.line(&format!(
        "seeded {} requests; the simulator fails the next {} owner-system calls with 500",
        seeded.len(),
        args.failures
    ));

    let ids: Vec<i64> = seeded.iter().map(|s| s.id).collect();
    let of = |g: Group| -> Vec<i64> {
        seeded
            .iter()
            .filter(|s| s.group == g)
            .map(|s| s.id)
            .collect()
    };
    let (waiting, by_hand) = (of(Group::DocumentsLater), of(Group::ByHand));
    let client = stack.client()?;
    let mut released = false;
    let mut decided = false;
    let mut progress = Progress::new(out.tty);
    let deadline = started + args.timeout;
    let view = loop {
        stack.check_replicas()?;
        let elapsed = started.elapsed();
        if !released && elapsed >= RELEASE_AT {
            harness
                .release_documents(&waiting)
                .await
                .map_err(StackError::from)?;
            progress.event(
                out,
                &format!(
                    "{:>5.1} s  documents released for {} requests",
                    elapsed.as_secs_f64(),
                    waiting.len()
                ),
            );
            released = true;
        }
        if !decided && elapsed >= BY_HAND_AT {
            for id in &by_hand {
                harness
                    .approve_by_hand(*id, PERSON)
                    .await
                    .map_err(StackError::from)?;
            }
            progress.event(
                out,
                &format!(
                    "{:>5.1} s  a person approved request {by_hand:?} by hand",
                    elapsed.as_secs_f64()
                ),
            );
            decided = true;
        }
        let view = View::read(&harness, &client, &seeded, &ids).await?;
        progress.show(out, &view, elapsed);
        if released && decided && view.all_ended() {
            break view;
        }
        if Instant::now() > deadline {
            progress.finish();
            for (seeded, end, phase) in view.unfinished() {
                out.line(&format!(
                    "  request {} ({}): database {} / {} / {}, CR {}",
                    seeded.id,
                    seeded.group.label(),
                    end.map_or("missing", |e| e.status.as_str()),
                    end.and_then(|e| e.state.as_deref())
                        .unwrap_or("no state row"),
                    end.and_then(|e| e.last_reason.as_deref()).unwrap_or("-"),
                    phase.map_or("no phase", Phase::as_str),
                ));
            }
            return Err(DemoError::Unfinished(view.unfinished().len()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    progress.finish();
    summary(stack, out, &view, started.elapsed(), args).await
}

/// What the database and the CRs say now.
struct View<'a> {
    rows: Vec<(&'a Seeded, Option<RequestEnd>, Option<Phase>)>,
}

impl<'a> View<'a> {
    async fn read(
        harness: &crate::harness::Harness,
        client: &kube::Client,
        seeded: &'a [Seeded],
        ids: &[i64],
    ) -> Result<View<'a>, StackError> {
        let mut ends: BTreeMap<i64, RequestEnd> = harness
            .ends(ids)
            .await?
            .into_iter()
            .map(|e| (e.request_id, e))
            .collect();
        let crs = kube::Api::<AutoApproval>::default_namespaced(client.clone())
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| StackError::Kube(format!("listing AutoApprovals: {e}")))?
            .items;
        let phases: BTreeMap<i64, Phase> = crs
            .into_iter()
            .filter_map(|cr| Some((cr.spec.request_id, cr.status?.phase?)))
            .collect();
        Ok(View {
            rows: seeded
                .iter()
                .map(|s| (s, ends.remove(&s.id), phases.get(&s.id).copied()))
                .collect(),
        })
    }

    fn ended(s: &Seeded, end: Option<&RequestEnd>, phase: Option<Phase>) -> bool {
        end.is_some_and(|e| s.group.db_ended(e)) && phase == Some(s.group.expected_phase())
    }

    fn all_ended(&self) -> bool {
        self.rows
            .iter()
            .all(|(s, end, phase)| Self::ended(s, end.as_ref(), *phase))
    }

    fn unfinished(&self) -> Vec<(&Seeded, Option<&RequestEnd>, Option<Phase>)> {
        self.rows
            .iter()
            .filter(|(s, end, phase)| !Self::ended(s, end.as_ref(), *phase))
            .map(|(s, end, phase)| (*s, end.as_ref(), *phase))
            .collect()
    }

    /// Per group: (total, ended, count per CR phase).
    fn by_group(&self) -> Vec<(Group, usize, usize, BTreeMap<&'static str, usize>)> {
        Group::ALL
            .iter()
            .map(|g| {
                let rows: Vec<_> = self.rows.iter().filter(|(s, _, _)| s.group == *g).collect();
                let ended = rows
                    .iter()
                    .filter(|(s, end, phase)| Self::ended(s, end.as_ref(), *phase))
                    .count();
                let mut phases = BTreeMap::new();
                for (_, _, phase) in &rows {
                    *phases
                        .entry(phase.map_or("no CR yet", Phase::as_str))
                        .or_default() += 1;
                }
                (*g, rows.len(), ended, phases)
            })
            .collect()
    }
}

/// Live progress: a table redrawn in place on a terminal, a plain line per
/// change otherwise.
struct Progress {
    tty: bool,
    drawn: usize,
    last: String,
}

impl Progress {
    fn new(tty: bool) -> Self {
        Self {
            tty,
            drawn: 0,
            last: String::new(),
        }
    }

    fn show(&mut self, out: &Out, view: &View<'_>, elapsed: Duration) {
        let groups = view.by_group();
        if self.tty {
            let mut text = String::new();
            if self.drawn > 0 {
                // Up to the table's first line, and clear to the end.
                text.push_str(&format!("\x1b[{}A\x1b[J", self.drawn));
            }
            text.push_str(&format!(
                "{:<44} {:>12} {:>9}   CR phases ({:.1} s)\n",
                "group",
                "expected",
                "ended",
                elapsed.as_secs_f64()
            ));
            for (group, total, ended, phases) in &groups {
                let phases: Vec<String> = phases.iter().map(|(p, n)| format!("{p} {n}")).collect();
                text.push_str(&format!(
                    "{:<44} {:>12} {:>5}/{:<3}   {}\n",
                    group.label(),
                    group.expected_phase().as_str(),
                    ended,
                    total,
                    phases.join(", ")
                ));
            }
            self.drawn = groups.len() + 1;
            out.raw(&text);
        } else {
            let parts: Vec<String> = groups
                .iter()
                .map(|(g, total, ended, _)| format!("{} {ended}/{total}", short(*g)))
                .collect();
            let line = parts.join(", ");
            if line != self.last {
                out.line(&format!("{:>5.1} s  ended: {line}", elapsed.as_secs_f64()));
                self.last = line;
            }
        }
    }

    /// A line between redraws: on a terminal the table is cleared and drawn
    /// again below it at the next [`Progress::show`].
    fn event(&mut self, out: &Out, text: &str) {
        if self.tty && self.drawn > 0 {
            out.raw(&format!("\x1b[{}A\x1b[J", self.drawn));
            self.drawn = 0;
        }
        out.line(text);
    }

    /// Leaves the last table on screen; what follows prints below it.
    fn finish(&mut self) {
        self.drawn = 0;
    }
}

fn short(g: Group) -> &'static str {
    match g {
        Group::Ready => "at once",
        Group::Ads => "ads",
        Group::DocumentsLater => "documents later",
        Group::ByHand => "by hand",
        Group::MissingStore => "missing store",
    }
}

async fn summary(
    stack: &Stack,
    out: &Out,
    view: &View<'_>,
    took: Duration,
    args: &DemoArgs,
) -> Result<(), DemoError> {
    let harness = stack.harness()?;
    out.line("");
    out.line(&format!(
        "Every request reached its expected end in {:.1} s ({} replicas, 16 shards, {}):",
        took.as_secs_f64(),
        args.replicas,
        args.stack.database.name()
    ));
    for (group, total, _, _) in view.by_group() {
        out.line(&format!(
            "  {:>3} × {:<44} → {}",
            total,
            group.label(),
            match group {
                Group::Ready | Group::Ads | Group::DocumentsLater => "Approved by autoapproval",
                Group::ByHand => "Superseded: the person's approval stands, nothing else written",
                Group::MissingStore =>
                    "RetryWaiting: store does not exist, waits for a person or the store",
            }
        ));
    }
    let pickups = harness.pickups_ms().await.map_err(StackError::from)?;
    if let Some(p) = crate::bench::report::Percentiles::of(&pickups) {
        out.line(&format!(
            "  pickup latency, eligible → claimed ({} requests, from insert or from the document release; all inserted in one burst, {} build): p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            pickups.len(),
            if cfg!(debug_assertions) { "debug" } else { "release" },
            p.p50, p.p95, p.p99, p.max
        ));
    }
    if let Some(sim) = stack.sim() {
        let stats = sim.stats();
        let calls: u64 = stats.calls.values().sum();
        let duplicates = crate::bench::report::duplicate_creations(&stats);
        out.line(&format!(
            "  transient failures: {} owner-system calls answered 500, each retried with backoff; external calls {calls}, duplicate creations {duplicates}",
            stats.faults_injected.error
        ));
    }
    let failed = stack.failed_claims(&reqwest::Client::new()).await;
    let lost = failed.get("claim lost").copied().unwrap_or(0.0);
    out.line(&format!("  failed claims across replicas: {lost}"));
    out.line("");
    out.line(&format!(
        "Watch it: {} --kubeconfig {} get autoapprovals",
        args.kubectl,
        stack.kubeconfig().display()
    ));
    if !args.keep_running {
        out.line("  (the stack is removed when the demo exits; add --keep-running to keep it up for that)");
    }
    Ok(())
}

/// Where the demo writes: stdout, with a flag for whether it is a terminal.
struct Out {
    tty: bool,
}

impl Out {
    fn new() -> Self {
        Self {
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn raw(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }

    fn line(&self, text: &str) {
        self.raw(&format!("{text}\n"));
    }
}
