//! Coordination: `coordination.k8s.io/v1` Leases split the requests into K
//! shards held by the live replicas, and elect the one leader that runs the
//! cleanser and the CR garbage collector. Every Lease call is here.
//!
//! Each replica keeps a member Lease; every retry period it renews what it
//! holds, takes free or expired shards up to its fair share and hands one
//! back when another live replica is below it. Expiry is judged by the local
//! time at which a Lease was last seen to change, as client-go does, so clock
//! skew between nodes does not matter. Acquiring a shard raises its fencing
//! token in the DB to the Lease's new generation and recovers the claims the
//! previous holder left (see `Store::fence_shard`).

pub mod balance;
pub mod shards;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::channel::mpsc;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use self::shards::{ShardGuard, Shards};
use crate::cleanser::Cleanser;
use crate::clock::SharedClock;
use crate::telemetry::Metrics;

/// Label on every Lease of the controller, naming its role.
pub const ROLE_LABEL: &str = "autoapproval.io/lease-role";
/// Name prefix of the shard Leases (`autoapproval-shard-<n>`).
pub const SHARD_LEASE_PREFIX: &str = "autoapproval-shard-";
/// Name prefix of the member Leases (`autoapproval-member-<replica>`).
pub const MEMBER_LEASE_PREFIX: &str = "autoapproval-member-";
/// Name of the leader Lease.
pub const LEADER_LEASE: &str = "autoapproval-leader";
const FIELD_MANAGER: &str = "autoapproval";

/// Lease timings, as controller-runtime names them.
#[derive(Clone, Debug)]
pub struct CoordinationSettings {
    /// K.
    pub shard_count: u32,
    /// How long a Lease stays valid without a renew.
    pub lease_duration: Duration,
    /// A holder that could not renew for this long stops claiming.
    pub renew_deadline: Duration,
    /// Delay between coordination turns.
    pub retry_period: Duration,
}

impl Default for CoordinationSettings {
    fn default() -> Self {
        Self {
            shard_count: 16,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// When a Lease was last seen to change, by the local clock.
#[derive(Debug)]
struct Seen {
    version: String,
    changed: Instant,
}

/// The coordination loop of one replica.
pub struct Coordinator {
    api: Api<Lease>,
    shards: Arc<Shards>,
    cleanser: Arc<Cleanser>,
    clock: SharedClock,
    metrics: Metrics,
    settings: CoordinationSettings,
    leader: watch::Sender<bool>,
    acquired: mpsc::UnboundedSender<u32>,
    seen: HashMap<String, Seen>,
    /// When the last successful list was sent.
    last_list: Option<Instant>,
    /// The last version we wrote of each Lease we hold.
    mine: HashMap<String, Lease>,
    leader_renewed: Option<Instant>,
}

/// What the rest of the replica observes of the coordination.
pub struct Handles {
    /// The shards held.
    pub shards: Arc<Shards>,
    /// True while this replica is the leader.
    pub leader: watch::Receiver<bool>,
    /// Shards as they are acquired: their CRs need a reconcile.
    pub acquired: mpsc::UnboundedReceiver<u32>,
}

impl Coordinator {
    /// A coordinator for `identity` (unique among replicas: the pod name).
    pub fn new(
        api: Api<Lease>,
        identity: &str,
        cleanser: Arc<Cleanser>,
        clock: SharedClock,
        metrics: Metrics,
        settings: CoordinationSettings,
    ) -> (Self, Handles) {
        let shards = Shards::new(identity, settings.shard_count, settings.renew_deadline);
        let (leader, leader_rx) = watch::channel(false);
        let (acquired, acquired_rx) = mpsc::unbounded();
        let coordinator = Self {
            api,
            shards: shards.clone(),
            cleanser,
            clock,
            metrics,
            settings,
            leader,
            acquired,
            seen: HashMap::new(),
            last_list: None,
            mine: HashMap::new(),
            leader_renewed: None,
        };
        let handles = Handles {
            shards,
            leader: leader_rx,
            acquired: acquired_rx,
        };
        (coordinator, handles)
    }

    fn identity(&self) -> &str {
        self.shards.identity()
    }

    /// Runs turns until `release` turns true, then hands every Lease back
    /// (the caller has released its claims by then). Shutting down only
    /// stops acquiring: held shards keep being renewed while chains finish.
    pub async fn run(mut self, mut release: watch::Receiver<bool>) {
        // Turns start every retry period, however long the last one took.
        let mut every = tokio::time::interval(self.settings.retry_period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.turn().await,
                _ = async { release.wait_for(|r| *r).await.map(|_| ()) } => break,
            }
        }
        self.release_all().await;
    }

    /// One turn: membership, renewals, then acquisitions and hand-backs.
    pub async fn turn(&mut self) {
        let sent = Instant::now();
        let now = self.clock.now();
        self.renew_member(now).await;
        let listed = self
            .api
            .list(&ListParams::default().labels(ROLE_LABEL))
            .await;
        let leases = match listed {
            Ok(list) => Some(list.items),
            Err(error) => {
                self.metrics.lease_renew_failure();
                warn!(%error, "cannot list Leases; renewing what is held");
                None
            }
        };
        if let Some(leases) = &leases {
            self.observe(leases, sent);
            self.notice_losses(leases);
        }
        self.renew_shards(sent, now).await;
        self.release_drained(now).await;
        if let Some(leases) = leases {
            self.balance(&leases, sent, now).await;
            self.lead(&leases, sent, now).await;
            if *self.leader.borrow() {
                self.collect_members(&leases).await;
            }
        }
        let leading = self
            .leader_renewed
            .is_some_and(|at| at.elapsed() < self.settings.renew_deadline);
        self.leader
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
        self.metrics.coordination(self.shards.held().len(), leading);
    }

    /// Records when each Lease last changed. A change seen now happened
    /// after the previous list: when that list is recent (one turn ago),
    /// its time is the change's, so a dead holder's Lease expires one retry
    /// period sooner than with "now". The holder stops claiming at its renew
    /// deadline, which validation keeps that period below the duration.
    fn observe(&mut self, leases: &[Lease], at: Instant) {
        let since = self
            .last_list
            .filter(|last| at.duration_since(*last) <= self.settings.retry_period.mul_f64(1.5))
            .unwrap_or(at);
        self.last_list = Some(at);
        for lease in leases {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let version = lease.metadata.resource_version.clone().unwrap_or_default();
            match self.seen.get_mut(&name) {
                Some(seen) if seen.version == version => {}
                Some(seen) => {
                    seen.version = version;
                    seen.changed = since;
                }
                None => {
                    self.seen.insert(
                        name,
                        Seen {
                            version,
                            changed: at,
                        },
                    );
                }
            }
        }
    }

    /// The holder of a Lease unless it is released or expired.
    fn live_holder<'l>(&self, lease: &'l Lease) -> Option<&'l str> {
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
        let duration = spec
            .lease_duration_seconds
            .map_or(self.settings.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let expired = self
            .seen
            .get(name)
            .is_some_and(|seen| seen.changed.elapsed() > duration);
        (!expired).then_some(holder)
    }

    /// Shards whose Lease now names another holder are lost at once.
    fn notice_losses(&mut self, leases: &[Lease]) {
        let held = self.shards.held();
        for lease in leases {
            let Some(shard) = shard_of_lease(lease, self.settings.shard_count) else {
                continue;
            };
            if !held.contains(&shard) {
                continue;
            }
            let holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder != Some(self.identity()) {
                self.lose(shard, holder.unwrap_or("nobody"));
            }
        }
    }

    fn lose(&mut self, shard: u32, to: &str) {
        self.shards.remove(shard);
        self.mine.remove(&shard_lease_name(shard));
        self.metrics.shard_lost();
        warn!(shard, to, "shard lost: no more claims in it");
    }

    async fn renew_shards(&mut self, sent: Instant, now: DateTime<Utc>) {
        for shard in self.shards.held() {
            let name = shard_lease_name(shard);
            let overdue = self.shards.is_overdue(shard);
            match self.renew(&name, now).await {
                Ok(true) => {
                    self.shards.renewed(shard, sent);
                    if overdue {
                        // Reconciles refused meanwhile dropped their requeues.
                        info!(
                            shard,
                            "shard renewed again after its renew deadline: claiming resumes"
                        );
                        let _ = self.acquired.unbounded_send(shard);
                    }
                }
                Ok(false) => self.lose(shard, "another replica"),
                Err(error) => {
                    self.metrics.lease_renew_failure();
                    if self.shards.is_overdue(shard) {
                        warn!(shard, %error, "cannot renew the shard's Lease past the renew deadline: not claiming in it");
                    } else {
                        debug!(shard, %error, "shard Lease renew failed; retrying");
                    }
                }
            }
        }
    }

    /// Renews a Lease we hold; false when it turned out to be someone else's.
    async fn renew(&mut self, name: &str, now: DateTime<Utc>) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.mine.get(name).cloned() else {
            return Ok(false);
        };
        for _ in 0..2 {
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(micro_time(now));
            }
            match self.api.replace(name, &post_params(), &lease).await {
                Ok(renewed) => {
                    self.mine.insert(name.to_owned(), renewed);
                    return Ok(true);
                }
                // Someone wrote it since: still ours only if it still names us
                // at the same generation.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let fresh = self.api.get(name).await?;
                    let ours = fresh.spec.as_ref().is_some_and(|s| {
                        s.holder_identity.as_deref() == Some(self.identity())
                            && s.lease_transitions
                                == lease.spec.as_ref().and_then(|s| s.lease_transitions)
                    });
                    if !ours {
                        return Ok(false);
                    }
                    lease = fresh;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(false)
    }

    /// Hands back the shards being drained once no reconcile runs in them
    /// (or the renew deadline passed: the new owner's fence covers the rest).
    async fn release_drained(&mut self, now: DateTime<Utc>) {
        for (shard, in_flight) in self.shards.draining() {
            if in_flight > 0 && !self.shards.is_overdue(shard) {
                continue;
            }
            self.release_shard(shard, now).await;
        }
    }

    /// Hands a shard back; false when the Lease could not be written (it
    /// then expires).
    async fn release_shard(&mut self, shard: u32, now: DateTime<Utc>) -> bool {
        let name = shard_lease_name(shard);
        self.shards.remove(shard);
        match self.release(&name, now).await {
            Ok(()) => {
                info!(shard, "shard released");
                true
            }
            Err(error) => {
                warn!(shard, %error, "could not release the shard's Lease; it will expire");
                false
            }
        }
    }

    async fn release(&mut self, name: &str, now: DateTime<Utc>) -> Result<(), kube::Error> {
        let Some(mut lease) = self.mine.remove(name) else {
            return Ok(());
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(micro_time(now));
        }
        self.api
            .replace(name, &post_params(), &lease)
            .await
            .map(drop)
    }

    async fn balance(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
        let k = self.settings.shard_count;
        let mut by_shard: BTreeMap<u32, &Lease> = BTreeMap::new();
        let mut members: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        members.insert(self.identity().to_owned(), self.shards.held());
        for lease in leases {
            if let Some(shard) = shard_of_lease(lease, k) {
                by_shard.insert(shard, lease);
            } else if is_member(lease)
                && let Some(holder) = self.live_holder(lease)
            {
                members.entry(holder.to_owned()).or_default();
            }
        }
        let held = self.shards.held();
        let mut free = Vec::new();
        for shard in 0..k {
            if held.contains(&shard) {
                continue;
            }
            match by_shard.get(&shard).and_then(|l| self.live_holder(l)) {
                // A live holder other than us (our own name on a shard we do
                // not hold is a former run of this replica: take it over).
                Some(holder) if holder != self.identity() => {
                    if let Some(shards) = members.get_mut(holder) {
                        shards.push(shard);
                    }
                }
                _ => free.push(shard),
            }
        }
        let view = balance::View {
            shard_count: k,
            me: self.identity(),
            members: members
                .iter()
                .map(|(name, shards)| (name.as_str(), shards.clone()))
                .collect(),
            free,
        };
        let plan = balance::plan(&view);
        if let Some(shard) = plan.give_up {
            let running = self.shards.drain(shard);
            info!(
                shard,
                running, "handing a shard back to balance the replicas"
            );
        }
        if self.shards.is_stopping() {
            return;
        }
        for shard in plan.acquire {
            let existing = by_shard.get(&shard).copied().cloned();
            self.acquire_shard(shard, existing, sent, now).await;
        }
    }

    async fn acquire_shard(
        &mut self,
        shard: u32,
        existing: Option<Lease>,
        sent: Instant,
        now: DateTime<Utc>,
    ) {
        let k = self.settings.shard_count;
        let previous = existing
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let db_token = match self.cleanser.store().shard_token(k, shard).await {
            Ok(token) => token.unwrap_or(0),
            Err(error) => {
                warn!(shard, %error, "cannot read the shard's fencing token; not acquiring");
                return;
            }
        };
        let lease_generation = existing
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_transitions)
            .map_or(0, i64::from);
        let generation = lease_generation.max(db_token) + 1;
        let name = shard_lease_name(shard);
        let Some(lease) = self.take(&name, "shard", existing, generation, now).await else {
            return;
        };
        self.mine.insert(name.clone(), lease);
        let identity = self.identity().to_owned();
        match self
            .cleanser
            .take_over_shard(k, shard, generation, &identity)
            .await
        {
            Ok(Some(recovered)) => {
                self.shards.insert(shard, generation, sent);
                self.metrics.shard_acquired(previous.is_some());
                info!(
                    shard,
                    generation,
                    previous = previous.as_deref().unwrap_or("none"),
                    recovered = recovered.len(),
                    "shard acquired"
                );
                let _ = self.acquired.unbounded_send(shard);
            }
            Ok(None) => {
                warn!(
                    shard,
                    generation, "the shard was fenced at a later generation; handing it back"
                );
                let _ = self.release(&name, now).await;
            }
            Err(error) => {
                warn!(shard, %error, "cannot fence the shard; handing it back");
                let _ = self.release(&name, now).await;
            }
        }
    }

    /// Writes us as the holder of a free or expired Lease (creating it when
    /// absent); `None` when another replica was faster or the call failed.
    async fn take(
        &mut self,
        name: &str,
        role: &str,
        existing: Option<Lease>,
        generation: i64,
        now: DateTime<Utc>,
    ) -> Option<Lease> {
        let spec = LeaseSpec {
            holder_identity: Some(self.identity().to_owned()),
            lease_duration_seconds: Some(duration_secs(self.settings.lease_duration)),
            acquire_time: Some(micro_time(now)),
            renew_time: Some(micro_time(now)),
            lease_transitions: Some(i32::try_from(generation).unwrap_or(i32::MAX)),
            ..LeaseSpec::default()
        };
        let result = match existing {
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api.replace(name, &post_params(), &lease).await
            }
            None => {
                let lease = Lease {
                    metadata: lease_meta(name, role),
                    spec: Some(spec),
                };
                self.api.create(&post_params(), &lease).await
            }
        };
        match result {
            Ok(lease) => Some(lease),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(lease = name, "another replica took the Lease first");
                None
            }
            Err(error) => {
                self.metrics.lease_renew_failure();
                debug!(lease = name, %error, "could not take the Lease");
                None
            }
        }
    }

    async fn renew_member(&mut self, now: DateTime<Utc>) {
        let name = member_lease_name(self.identity());
        if self.mine.contains_key(&name) {
            match self.renew(&name, now).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(error) => {
                    self.metrics.lease_renew_failure();
                    debug!(%error, "member Lease renew failed");
                    return;
                }
            }
        }
        let existing = match self.api.get_opt(&name).await {
            Ok(existing) => existing,
            Err(error) => {
                self.metrics.lease_renew_failure();
                debug!(%error, "cannot read the member Lease");
                return;
            }
        };
        let generation = existing
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_transitions)
            .map_or(0, i64::from)
            + 1;
        if let Some(lease) = self.take(&name, "member", existing, generation, now).await {
            info!(lease = %name, "joined as a member");
            self.mine.insert(name, lease);
        }
    }

    /// Holds or takes the leader Lease.
    async fn lead(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
        if self.mine.contains_key(LEADER_LEASE) {
            match self.renew(LEADER_LEASE, now).await {
                Ok(true) => self.leader_renewed = Some(sent),
                Ok(false) => {
                    self.leader_renewed = None;
                    self.metrics.leadership_lost();
                    warn!("leadership lost");
                }
                Err(error) => {
                    self.metrics.lease_renew_failure();
                    debug!(%error, "leader Lease renew failed");
                }
            }
            return;
        }
        if self.shards.is_stopping() {
            return;
        }
        let existing = leases
            .iter()
            .find(|l| l.metadata.name.as_deref() == Some(LEADER_LEASE));
        if let Some(lease) = existing
            && self
                .live_holder(lease)
                .is_some_and(|h| h != self.identity())
        {
            return;
        }
        let generation = existing
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.lease_transitions)
            .map_or(0, i64::from)
            + 1;
        if let Some(lease) = self
            .take(LEADER_LEASE, "leader", existing.cloned(), generation, now)
            .await
        {
            self.mine.insert(LEADER_LEASE.to_owned(), lease);
            self.leader_renewed = Some(sent);
            info!("became the leader: running the cleanser and the CR garbage collector");
        }
    }

    /// The leader deletes member Leases of replicas gone for a while.
    async fn collect_members(&self, leases: &[Lease]) {
        let gone_for = self.settings.lease_duration.saturating_mul(10);
        for lease in leases.iter().filter(|l| is_member(l)) {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            let stale = self
                .seen
                .get(name)
                .is_some_and(|seen| seen.changed.elapsed() > gone_for);
            if stale
                && self
                    .api
                    .delete(name, &DeleteParams::default())
                    .await
                    .is_ok()
            {
                info!(
                    lease = name,
                    "deleted the member Lease of a departed replica"
                );
            }
        }
    }

    /// Hands every Lease back at shutdown.
    async fn release_all(&mut self) {
        let now = self.clock.now();
        let mut kept = 0;
        for shard in self.shards.held() {
            kept += usize::from(!self.release_shard(shard, now).await);
        }
        if self.mine.contains_key(LEADER_LEASE) {
            if let Err(error) = self.release(LEADER_LEASE, now).await {
                kept += 1;
                warn!(%error, "could not release the leader Lease; it will expire");
            }
            self.leader_renewed = None;
            let _ = self.leader.send(false);
        }
        let member = member_lease_name(self.identity());
        if self.mine.remove(&member).is_some()
            && let Err(error) = self.api.delete(&member, &DeleteParams::default()).await
        {
            kept += 1;
            warn!(%error, "could not delete the member Lease; it will expire");
        }
        self.metrics.coordination(0, false);
        if kept == 0 {
            info!("Leases released");
        } else {
            warn!(
                kept,
                "some Leases could not be released; they expire after the lease duration"
            );
        }
    }
}

/// The Lease name of a shard.
pub fn shard_lease_name(shard: u32) -> String {
    format!("{SHARD_LEASE_PREFIX}{shard}")
}

/// The member Lease name of a replica: its identity made a valid name.
pub fn member_lease_name(identity: &str) -> String {
    let mut name: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    name.truncate(253 - MEMBER_LEASE_PREFIX.len());
    format!("{MEMBER_LEASE_PREFIX}{}", name.trim_end_matches(['-', '.']))
}

fn shard_of_lease(lease: &Lease, shard_count: u32) -> Option<u32> {
    let name = lease.metadata.name.as_deref()?;
    let shard: u32 = name.strip_prefix(SHARD_LEASE_PREFIX)?.parse().ok()?;
    (shard < shard_count).then_some(shard)
}

fn is_member(lease: &Lease) -> bool {
    lease
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(MEMBER_LEASE_PREFIX))
}

fn lease_meta(name: &str, role: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(
            [
                (ROLE_LABEL.to_owned(), role.to_owned()),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "autoapproval".to_owned(),
                ),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

fn micro_time(at: DateTime<Utc>) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(at.timestamp_micros())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

fn duration_secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lease_names_are_valid_names() {
        assert_eq!(
            member_lease_name("pod-7f9c"),
            "autoapproval-member-pod-7f9c"
        );
        assert_eq!(
            member_lease_name("Host_Name."),
            "autoapproval-member-host-name"
        );
        assert!(member_lease_name(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn shard_leases_are_recognised_only_within_k() {
        let lease = |name: &str| Lease {
            metadata: lease_meta(name, "shard"),
            spec: None,
        };
        assert_eq!(shard_of_lease(&lease("autoapproval-shard-3"), 16), Some(3));
        assert_eq!(shard_of_lease(&lease("autoapproval-shard-16"), 16), None);
        assert_eq!(shard_of_lease(&lease("autoapproval-leader"), 16), None);
    }
}
