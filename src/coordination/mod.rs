//! Coordination: `coordination.k8s.io/v1` Leases split the requests into K
//! shards held by the live replicas, and elect the one leader that runs the
//! cleanser and the CR garbage collector. Every Lease call is here.
//!
//! Each replica keeps a member Lease. Every retry period it lists the
//! Leases, takes free or expired shards up to its fair share and hands one
//! back when another live replica is below it; every few turns (about half
//! the renew deadline) it renews its member Lease, and the leader its leader
//! Lease. A shard Lease is written only when it changes hands: its holder
//! holds it while the holder's member Lease is renewed, so a replica at rest
//! writes one Lease per renewal, however many shards it holds.
//!
//! Expiry is judged by the local time at which a Lease was last seen to
//! change, as client-go does, so clock skew between nodes does not matter.
//! A shard is taken from another replica only when both its Lease and its
//! holder's member Lease have not changed for the lease duration, and only
//! after the taker has written the holder out of that member Lease (with the
//! version it judged, so a renew that landed meanwhile makes it fail): the
//! holder's next renew then fails and it drops every shard. Acquiring a
//! shard raises its fencing token in the DB to the Lease's new generation
//! and recovers the claims the previous holder left (see
//! `Database::fence_shard`).

mod acquire;
mod balance;
mod fence;
mod holding;
mod leader;
mod lease;
mod shards;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use self::holding::Stuck;
pub use self::lease::{
    NameInUse, PROTOCOL_ANNOTATION, delete_unchanged, member_lease_name, refuse_a_live_namesake,
    shard_lease_name,
};
pub use self::shards::{ShardGuard, Shards};
use crate::cleanser::Cleanser;
use crate::clock::SharedClock;
use crate::outage::{Outage, Report};
use crate::telemetry::Metrics;

/// Label on every Lease of the controller, naming its role.
pub const ROLE_LABEL: &str = "autoapproval.io/lease-role";
/// Name prefix of the shard Leases (`autoapproval-shard-<n>`).
pub const SHARD_LEASE_PREFIX: &str = "autoapproval-shard-";
/// Name prefix of the member Leases (`autoapproval-member-<replica>`).
pub const MEMBER_LEASE_PREFIX: &str = "autoapproval-member-";
/// Name of the leader Lease.
pub const LEADER_LEASE: &str = "autoapproval-leader";
/// On a shard Lease handed back because its fence failed: the holder it
/// had been taken from, whose failover the next acquisition completes.
pub const TAKEN_FROM_ANNOTATION: &str = "autoapproval.io/taken-from";
const FIELD_MANAGER: &str = "autoapproval";
/// How often a lasting API server outage is reported again.
const OUTAGE_REPORT_EVERY: Duration = Duration::from_secs(30);

/// Lease timings, as controller-runtime names them.
#[derive(Clone, Debug)]
pub struct CoordinationConfig {
    /// K: requests are split into K shards by id mod K, one Lease each.
    pub shard_count: u32,
    /// How long a Lease stays valid without a renew.
    pub lease_duration: Duration,
    /// A holder that could not renew for this long stops claiming.
    pub renew_deadline: Duration,
    /// Delay between coordination turns.
    pub retry_period: Duration,
}

impl CoordinationConfig {
    /// Turns between renewals of the member and leader Leases: half the
    /// renew deadline rounded up to whole turns (3 turns, 6 s, by default).
    /// A renew that fails is retried every turn: with a deadline of 4 turns
    /// or more (5 by default), two tries are sent before it.
    pub fn renew_every_turns(&self) -> u64 {
        let half = self.renew_deadline.as_nanos() / 2;
        let turn = self.retry_period.as_nanos().max(1);
        u64::try_from(half.div_ceil(turn))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// When a Lease was last seen to change, by the local clock.
#[derive(Debug)]
struct Seen {
    version: String,
    changed: Instant,
}

/// Shards acquired and not yet taken by discovery. A set, not a queue: at
/// most K entries however often shards change hands before discovery
/// looks, and a shard acquired twice meanwhile is reconciled once.
#[derive(Debug, Default)]
pub struct Acquired {
    shards: std::sync::Mutex<std::collections::BTreeSet<u32>>,
    added: tokio::sync::Notify,
}

impl Acquired {
    /// Records `shard` as just acquired.
    pub fn push(&self, shard: u32) {
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shard);
        // Stores a permit when nobody waits: the next `take` finds it.
        self.added.notify_one();
    }

    /// Waits for shards acquired since the last call and takes them all.
    pub async fn take(&self) -> std::collections::BTreeSet<u32> {
        loop {
            let taken = std::mem::take(&mut *self.shards.lock().unwrap_or_else(|e| e.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
            self.added.notified().await;
        }
    }
}

/// The coordination loop of one replica.
pub(crate) struct Coordinator {
    api: Api<Lease>,
    shards: Arc<Shards>,
    cleanser: Arc<Cleanser>,
    clock: SharedClock,
    metrics: Metrics,
    settings: CoordinationConfig,
    leader: watch::Sender<bool>,
    acquired: Arc<Acquired>,
    seen: HashMap<String, Seen>,
    /// When the last successful list was sent.
    last_list: Option<Instant>,
    /// The last version written of each Lease this replica holds: the base
    /// of its next renew or release.
    held_leases: HashMap<String, Lease>,
    /// Shard Leases whose release failed, as they were to be written: the
    /// release is tried again every turn until it lands or another replica
    /// wrote the Lease. Left alone, such a Lease names us while our member
    /// Lease is live, so nobody would take the shard and we would not
    /// either (we gave it back).
    unreleased: HashMap<String, Lease>,
    leader_renewed: Option<Instant>,
    /// Turns run so far: renewals are due every few of them.
    turns: u64,
    /// The turn in which the member Lease was last written.
    member_turn: Option<u64>,
    /// The turn in which the leader Lease was last written.
    leader_turn: Option<u64>,
    /// When the last successful write of the member Lease was sent: it
    /// vouches for every shard held, and no shard is acquired without it.
    member_renewed: Option<Instant>,
    /// Member Leases found missing, from when: a holder whose member Lease
    /// is gone for the lease duration has stopped claiming.
    absent: HashMap<String, Instant>,
    /// A live member Lease was written by a replica of the previous protocol
    /// (an upgrade in progress): shard Leases are then renewed every turn.
    legacy_members: bool,
    /// The API server's address, for the log lines about it.
    api_server: String,
    outage: Outage,
    /// When a Lease list last succeeded: the liveness probe reads it.
    api_ok: watch::Sender<Instant>,
    /// When the database last answered the loop's ping.
    db_ok: Instant,
    db_outage: Outage,
    /// Every Lease was given back because the database does not answer.
    withdrawn: bool,
    /// Publishes Events on Leases: leadership taken, a shard failed over.
    recorder: crate::events::Publisher,
    /// Lease calls refused: reported by name, and to readiness.
    holding: holding::Holding,
}

/// What the rest of the replica observes of the coordination.
pub(crate) struct Handles {
    /// The shards held.
    pub shards: Arc<Shards>,
    /// True while this replica is the leader.
    pub leader: watch::Receiver<bool>,
    /// Shards as they are acquired: their CRs need a reconcile.
    pub acquired: Arc<Acquired>,
    /// When the API server last answered a Lease list (start-up until then).
    pub api_ok: watch::Receiver<Instant>,
    /// Since when this replica has held no shard it may claim in because its Lease calls
    /// fail (`None` while it can hold shards): readiness reads it.
    pub stuck: watch::Receiver<Option<Stuck>>,
}

// === impl Coordinator ===

impl Coordinator {
    /// A coordinator for `identity` (unique among replicas: the pod name).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        api: Api<Lease>,
        recorder: crate::events::Publisher,
        api_server: &str,
        identity: &str,
        cleanser: Arc<Cleanser>,
        clock: SharedClock,
        metrics: Metrics,
        settings: CoordinationConfig,
    ) -> (Self, Handles) {
        let shards = Shards::new(identity, settings.shard_count, settings.renew_deadline);
        let (leader, leader_rx) = watch::channel(false);
        let acquired = Arc::new(Acquired::default());
        let (api_ok, api_ok_rx) = watch::channel(Instant::now());
        let (stuck, stuck_rx) = watch::channel(None);
        let coordinator = Self {
            api,
            shards: shards.clone(),
            cleanser,
            clock,
            metrics,
            settings,
            leader,
            acquired: acquired.clone(),
            seen: HashMap::new(),
            last_list: None,
            held_leases: HashMap::new(),
            unreleased: HashMap::new(),
            leader_renewed: None,
            turns: 0,
            member_turn: None,
            leader_turn: None,
            member_renewed: None,
            absent: HashMap::new(),
            legacy_members: false,
            api_server: api_server.to_owned(),
            outage: Outage::new(OUTAGE_REPORT_EVERY),
            api_ok,
            db_ok: Instant::now(),
            db_outage: Outage::new(OUTAGE_REPORT_EVERY),
            withdrawn: false,
            recorder,
            holding: holding::Holding::new(stuck),
        };
        let handles = Handles {
            shards,
            leader: leader_rx,
            acquired,
            api_ok: api_ok_rx,
            stuck: stuck_rx,
        };
        (coordinator, handles)
    }

    fn identity(&self) -> &str {
        self.shards.identity()
    }

    /// Publishes a Normal Event about Lease `lease`, as client-go's leader
    /// election does, in a task of its own: a slow API server must not hold
    /// up the turn that renews every Lease.
    fn lease_event(&self, lease: &Lease, reason: &'static str, note: String) {
        use kube::Resource;
        use kube::runtime::events::{Event, EventType};

        let recorder = self.recorder.clone();
        let reference = lease.object_ref(&());
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let event = Event {
                type_: EventType::Normal,
                reason: reason.to_owned(),
                note: Some(note),
                action: "Acquire".to_owned(),
                secondary: None,
            };
            match recorder.publish(&event, &reference).await {
                Ok(()) => metrics.event(reason),
                Err(error) => tracing::debug!(reason, %error, "could not publish a Lease Event"),
            }
        });
    }

    /// Runs turns until `release` is cancelled, then hands every Lease back
    /// (the caller has released its claims by then). Shutting down only
    /// stops acquiring: held shards keep being renewed while chains finish.
    pub async fn run(mut self, release: tokio_util::sync::CancellationToken) {
        // Turns start every retry period, however long the last one took.
        let mut every = tokio::time::interval(self.settings.retry_period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.turn().await,
                () = release.cancelled() => break,
            }
        }
        self.release_all().await;
    }

    /// One turn: membership, losses, then acquisitions and hand-backs.
    /// A replica that has not reached the database for the renew deadline
    /// holds nothing: it could claim nothing, and its shards would wait for
    /// their Leases to expire while the others can work them.
    async fn turn(&mut self) {
        let sent = Instant::now();
        if !self.database_answers(sent).await {
            if !self.withdrawn {
                warn!(
                    "no answer from the database for the renew deadline: giving every Lease back until it answers"
                );
                self.release_all().await;
                self.withdrawn = true;
            }
            return;
        }
        self.withdrawn = false;
        self.turns += 1;
        let now = self.clock.now();
        self.renew_member(sent, now).await;
        let listed = self
            .api
            .list(&ListParams::default().labels(ROLE_LABEL))
            .await;
        let api = self.api_server.as_str();
        let leases = match listed {
            Ok(list) => {
                let _ = self.api_ok.send(sent);
                if let Report::Ended(after) = self.outage.succeeded(sent) {
                    info!(
                        api,
                        outage_s = after.as_secs(),
                        "the API server answers again"
                    );
                }
                Some(list.items)
            }
            Err(error) => {
                self.metrics.lease_renew_failure();
                // A 403 is an answer, not an outage: the Role lacks the rule, and
                // nothing is claimed until it is granted.
                let forbidden = matches!(&error, kube::Error::Api(s) if s.code == 403);
                match self.outage.failed(sent) {
                    Report::Began if forbidden => {
                        warn!(api, %error, "forbidden to list Leases: the Role must grant it; no shard is taken until then");
                    }
                    Report::Still(for_) if forbidden => {
                        warn!(api, %error, outage_s = for_.as_secs(), "still forbidden to list Leases");
                    }
                    Report::Began => {
                        warn!(api, %error, "cannot reach the API server to list Leases; renewing what is held");
                    }
                    Report::Still(for_) => {
                        warn!(api, %error, outage_s = for_.as_secs(), "still cannot reach the API server");
                    }
                    _ => debug!(api, %error, "cannot list Leases"),
                }
                None
            }
        };
        if let Some(leases) = &leases {
            self.observe(leases, sent);
            self.notice_losses(leases);
            self.notice_legacy_members(leases);
        }
        if self.legacy_members {
            self.renew_shard_leases(now).await;
        }
        self.release_drained(now).await;
        self.retry_releases(now).await;
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
        self.report_holding(sent);
    }

    /// Pings the database (bounded by a retry period); false once it has
    /// not answered for the renew deadline. Outages are logged as the API
    /// server's are: when they begin, every 30 s, when they end.
    async fn database_answers(&mut self, sent: Instant) -> bool {
        let ping = self.cleanser.database().ping();
        let answered = tokio::time::timeout(self.settings.retry_period, ping).await;
        match answered {
            Ok(Ok(())) => {
                if let Report::Ended(after) = self.db_outage.succeeded(sent) {
                    info!(outage_s = after.as_secs(), "the database answers again");
                }
                self.db_ok = sent;
                true
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "no answer within a retry period".to_owned(),
                };
                match self.db_outage.failed(sent) {
                    Report::Began => warn!(%error, "cannot reach the database"),
                    Report::Still(lasted) => {
                        warn!(%error, outage_s = lasted.as_secs(), "still cannot reach the database");
                    }
                    _ => debug!(%error, "database ping failed"),
                }
                sent.duration_since(self.db_ok) < self.settings.renew_deadline
            }
        }
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
        record_changes(&mut self.seen, leases, at, since);
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

    /// Whether a renewal written in turn `last` is due again.
    fn renew_due(&self, last: Option<u64>) -> bool {
        last.is_none_or(|turn| self.turns.saturating_sub(turn) >= self.settings.renew_every_turns())
    }

    /// Whether the member Lease was written within the renew deadline.
    fn member_fresh(&self) -> bool {
        self.member_renewed
            .is_some_and(|at| at.elapsed() < self.settings.renew_deadline)
    }

    /// Hands every Lease back at shutdown.
    async fn release_all(&mut self) {
        let now = self.clock.now();
        self.member_renewed = None;
        self.member_turn = None;
        self.leader_turn = None;
        let mut kept = 0;
        for shard in self.shards.held() {
            kept += usize::from(!self.release_shard(shard, now).await);
        }
        if self.held_leases.contains_key(LEADER_LEASE) {
            if let Err(error) = self.release(LEADER_LEASE, now).await {
                kept += 1;
                warn!(%error, "could not release the leader Lease; it will expire");
            }
            self.leader_renewed = None;
            let _ = self.leader.send(false);
        }
        let member = member_lease_name(self.identity());
        if self.held_leases.remove(&member).is_some()
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

/// Records in `seen` the Leases of a list taken at `at` whose version
/// changed (at `since`; a Lease new to us at `at`), and forgets the Leases
/// the list no longer has: a departed replica's member Lease, deleted, is
/// not remembered for the life of the process.
fn record_changes(seen: &mut HashMap<String, Seen>, leases: &[Lease], at: Instant, since: Instant) {
    for lease in leases {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        match seen.get_mut(&name) {
            Some(seen) if seen.version == version => {}
            Some(seen) => {
                seen.version = version;
                seen.changed = since;
            }
            None => {
                seen.insert(
                    name,
                    Seen {
                        version,
                        changed: at,
                    },
                );
            }
        }
    }
    let listed: std::collections::HashSet<&str> = leases
        .iter()
        .filter_map(|l| l.metadata.name.as_deref())
        .collect();
    seen.retain(|name, _| listed.contains(name.as_str()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, version: &str) -> Lease {
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                resource_version: Some(version.to_owned()),
                ..Default::default()
            },
            spec: None,
        }
    }

    #[test]
    fn a_lease_gone_from_the_list_is_forgotten() {
        let mut seen = HashMap::new();
        let (first, second) = (Instant::now(), Instant::now() + Duration::from_secs(2));
        let leases = [
            listed("autoapproval-member-a", "1"),
            listed("autoapproval-member-b", "1"),
        ];
        record_changes(&mut seen, &leases, first, first);
        assert_eq!(seen.len(), 2);
        let leases = [listed("autoapproval-member-a", "2")];
        record_changes(&mut seen, &leases, second, first);
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["autoapproval-member-a"]);
        assert_eq!(seen["autoapproval-member-a"].version, "2");
        assert_eq!(
            seen["autoapproval-member-a"].changed, first,
            "changed since the last list"
        );
    }

    fn timings(renew_deadline_ms: u64, retry_period_ms: u64) -> CoordinationConfig {
        CoordinationConfig {
            shard_count: 16,
            lease_duration: Duration::from_secs(3600),
            renew_deadline: Duration::from_millis(renew_deadline_ms),
            retry_period: Duration::from_millis(retry_period_ms),
        }
    }

    #[test]
    fn renewals_come_every_half_renew_deadline_in_whole_turns() {
        // The defaults: 10 s and 2 s, a renew every 3 turns (6 s), tried
        // again at 8 s, both before the 10-s deadline.
        assert_eq!(timings(10_000, 2_000).renew_every_turns(), 3);
        assert_eq!(timings(3_000, 500).renew_every_turns(), 3);
        assert_eq!(timings(8_000, 2_000).renew_every_turns(), 2);
        // A deadline barely above a turn: renew every turn.
        assert_eq!(timings(2_100, 2_000).renew_every_turns(), 1);
    }
}
