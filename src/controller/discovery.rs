//! Discovery: the loop that turns candidate rows into AutoApproval CRs and
//! re-triggers due retries. Fixed delay between turns (not a cron), a random
//! first delay so replicas start spread out, and a NOTIFY wake-up so a new or
//! changed request is seen in milliseconds; the poll stays as the
//! level-triggered safety net.
//!
//! A turn does not step over the requests that wait. It reads the new
//! requests above a cursor (the newest request id when the last turn
//! began) and the due retries ([`Database::fresh_candidates`]); the whole
//! candidate query, which reads every open request of the held shards,
//! runs for a few shards per poll in rotation, so that each held shard is
//! swept once every [`SWEEP_TURNS`] polls: that sweep finds what the cursor
//! cannot (a request committed after a newer one was seen, a pause lifted,
//! a request put back in the window) when no notification did. A change of
//! the held shards, a reconnected listener or lost notifications make the
//! next turn whole.
//!
//! Whichever paths found them (the fresh query, the sweep, a notification),
//! a turn takes at most each type's limit, in the candidate queries' order:
//! by status, then oldest `sort_time`. The paths' finds are merged into one
//! list by [`Database::candidates_among`], which keeps that order; while a
//! backlog waits (the last turn filled a page), notified new requests are
//! left to the turn, so that a backlog is served oldest first.
//!
//! Until the CR cache's first sync (a restarted replica lists every CR
//! first: seconds at 100,000), the Controller reconciles nothing, so
//! discovery attempts the notified new requests of its shards itself, each
//! from its CR's create response; everything else waits for the first turn
//! after the sync, which is whole.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use rand::Rng;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cached::CachedAutoApproval;
use super::crd::{self, ApprovalType, AutoApproval, FIELD_MANAGER};
use super::reconcile::{self, Context};
use crate::approval::TurnConfig;
use crate::clock::SharedClock;
use crate::coordination::{Acquired, Shards};
use crate::db::{Database, DbError, RequestChange, ShardFilter};
use crate::domain::{Candidate, RequestType};
use crate::telemetry::Metrics;

/// Timings and scope of discovery.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// Delay between the end of one turn and the start of the next.
    pub poll_period: Duration,
    /// Delay after a turn that filled a page: there is a backlog.
    pub backlog_delay: Duration,
    /// Wake on the request table's NOTIFY.
    pub notify: bool,
    /// K, for the shard label.
    pub shard_count: u32,
    /// Limits and window of the candidate queries.
    pub turn: TurnConfig,
    /// Retries at or beyond this are not selected.
    pub retry_limit: i32,
    /// The CR of an abandoned request deleted is not put back.
    pub abandoned: super::gc::Abandonment,
    /// A CR create the API server has not answered after this long is
    /// given up (a later turn creates it again): the kube client waits for
    /// an answer without limit, and one create left unanswered would hold
    /// the loop, and every request of the held shards with it, while the
    /// Leases are renewed.
    pub api_timeout: Duration,
}

/// Why a CR create failed.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The API server answered with an error, or the call failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The API server did not answer within the discovery's API timeout.
    #[error("no answer from the API server within {0:?}")]
    Unanswered(Duration),
}

impl CreateError {
    /// The CR is there already (409 AlreadyExists).
    fn exists(&self) -> bool {
        matches!(self, Self::Api(kube::Error::Api(s)) if s.code == 409)
    }
}

/// Errors that stop one discovery turn (the loop goes on).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] DbError),
}

/// The discovery loop of one replica.
pub struct Discovery {
    /// The store.
    pub store: Database,
    /// The CRs' namespace.
    pub api: Api<AutoApproval>,
    /// The controller's CR cache.
    pub cache: Cache<CachedAutoApproval>,
    /// Feeds `Controller::reconcile_on`.
    pub trigger: Trigger,
    /// The clock.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Metrics,
    /// Its timings and scope, validated at start-up.
    pub settings: DiscoveryConfig,
    /// The shards this replica holds: discovery touches no other.
    pub shards: Arc<Shards>,
    /// The reconciles' context, for the attempts made before the cache's
    /// first sync.
    pub context: Arc<Context>,
    /// The fleet's brake: its resume makes the next turn whole at once.
    pub brake: Arc<super::fleet::FleetBrake>,
    /// At most this many of those at once (the Controller's concurrency).
    pub concurrency: usize,
    /// CRs this loop created that the cache has not shown yet, and when: a
    /// turn that finds their request again (a backlog's whole turn finds
    /// the same head until it is claimed) does not post them again while
    /// their watch event is on its way, for at most a poll period.
    pub created: std::sync::Mutex<std::collections::BTreeMap<i64, Instant>>,
}

/// Feeds `Controller::reconcile_on`: bounded by [`TRIGGER_CAPACITY`]; a
/// sender finding it full waits. The controller's scheduler takes from it
/// whatever its reconciles are doing (it keeps one entry per CR), so the
/// wait is short and never circular.
pub type Trigger = tokio::sync::mpsc::Sender<ObjectRef<CachedAutoApproval>>;

/// Capacity of [`Trigger`] and of the channels into discovery.
pub const TRIGGER_CAPACITY: usize = 1024;

/// Polls over which every held shard is swept once by the whole candidate
/// query (one minute at the default 10 s poll period).
pub const SWEEP_TURNS: usize = 6;

/// What the cheap turns rely on: every new request of `shards` up to
/// `since` was seen by a turn (none yet: the next turn is whole).
#[derive(Debug, Default)]
struct Cursor {
    shards: BTreeSet<u32>,
    since: Option<i64>,
    /// Where the sweep's rotation over the held shards is.
    rotation: usize,
}

/// Why a turn runs, which decides how much it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TurnKind {
    /// The poll: fresh candidates and a few shards swept.
    Poll,
    /// A change or a shard handed over: fresh candidates.
    Woken,
    /// Notifications may be lost: every held shard swept.
    Whole,
}

/// What became of a CR that discovery created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Creation {
    Created,
    /// It was there already; its reconcile was asked for.
    Existed,
    /// The API server refused or failed; a later turn tries again.
    Failed,
}

/// Changes heard from the database, into discovery: bounded by
/// [`TRIGGER_CAPACITY`]. A full channel drops the change and raises `lost`,
/// and discovery then runs a whole turn: every change is recorded in the
/// database (the wake row, the state row), so the turn finds what the
/// dropped notifications named.
#[derive(Clone)]
pub struct ChangeSender {
    tx: tokio::sync::mpsc::Sender<RequestChange>,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl ChangeSender {
    /// False once discovery is gone.
    fn send(&self, change: RequestChange) -> bool {
        use tokio::sync::mpsc::error::TrySendError;
        match self.tx.try_send(change) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }
}

/// The receiving end of [`ChangeSender`].
pub struct Changes {
    rx: tokio::sync::mpsc::Receiver<RequestChange>,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

/// A bounded channel of request changes.
pub fn changes_channel() -> (ChangeSender, Changes) {
    let (tx, rx) = tokio::sync::mpsc::channel(TRIGGER_CAPACITY);
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    (
        ChangeSender {
            tx,
            lost: lost.clone(),
        },
        Changes { rx, lost },
    )
}

/// What one turn did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnSummary {
    /// Candidate rows returned.
    pub candidates: usize,
    /// CRs created.
    pub created: usize,
    /// Reconciles triggered for CRs already there.
    pub triggered: usize,
    /// Whether a query filled its page (more work is waiting).
    pub full: bool,
}

impl Discovery {
    /// Runs until `stopping` is cancelled. `deleted` carries the request ids
    /// of CRs deleted from the API server: a CR whose request is still open
    /// is put back at once, since the DB, not the CR, says what is left.
    /// `acquired` carries shards just acquired: their CRs are reconciled and
    /// a turn looks for their new candidates. `cut_off` turns true when the
    /// shutdown's grace is over: the attempts discovery runs itself are cut
    /// off then, as the Controller's are.
    pub async fn run(
        self,
        stopping: CancellationToken,
        mut deleted: tokio::sync::mpsc::Receiver<i64>,
        acquired: Arc<Acquired>,
        cut_off: CancellationToken,
    ) {
        let (changes_tx, mut changes) = changes_channel();
        if self.settings.notify {
            tokio::spawn(listen(self.store.clone(), changes_tx, stopping.clone()));
        } else {
            drop(changes_tx);
        }
        let period = self.settings.poll_period;
        let first = period.mul_f64(rand::rng().random::<f64>());
        debug!(delay = ?first, "first discovery turn after a random delay");
        let mut next_turn = Instant::now() + first;
        let mut early = JoinSet::new();
        loop {
            tokio::select! {
                () = wait_ready(&self.cache) => break,
                Some(first) = changes.rx.recv() => {
                    // A lost notification needs no note: the first turn
                    // after the sync is whole.
                    let woken = drain(first, &mut changes);
                    self.metrics.notify_wakeup();
                    self.attempt_before_sync(&woken.ids, &mut early).await;
                }
                () = stopping.cancelled() => return finish(early, &cut_off).await,
            }
        }
        debug!(
            attempts = early.len(),
            "CR cache ready; discovery starts (attempts begun before the sync go on)"
        );
        let mut cursor = Cursor::default();
        // The last turn filled a page: more candidates wait than it took.
        let mut backlog = false;
        loop {
            // A closed channel (NOTIFY off, or the listener gone at
            // shutdown) disables its branch; the poll and the stop remain.
            let mut kind = TurnKind::Woken;
            let mut resumed = false;
            let woken = tokio::select! {
                () = tokio::time::sleep_until(next_turn) => {
                    kind = TurnKind::Poll;
                    Woken::default()
                }
                Some(first) = changes.rx.recv() => drain(first, &mut changes),
                Some(first) = deleted.recv() => {
                    self.restore(&drain_ids(first, &mut deleted)).await;
                    continue;
                }
                shards = acquired.take() => {
                    self.reconcile_shards(&shards).await;
                    self.restore_paused().await;
                    Woken::default()
                }
                // The fleet's pause held requests back: their CRs wait for
                // this turn, which is whole, so that the cursor and the
                // sweep's rotation step over none of them.
                () = self.brake.resumed() => {
                    resumed = true;
                    Woken::default()
                }
                Some(_) = early.join_next(), if !early.is_empty() => continue,
                () = stopping.cancelled() => return finish(early, &cut_off).await,
            };
            if !woken.ids.is_empty() {
                self.metrics.notify_wakeup();
                // Changes in other replicas' shards are theirs to work: no
                // turn here, and the poll keeps its time.
                let workable = self.workable_among(&woken.ids);
                if workable.is_empty() && !woken.reconnected {
                    continue;
                }
                // Only new requests (no CR yet, so no state row and no wake
                // row to apply): one look at them instead of a whole turn.
                // The poll keeps its time; it remains the safety net.
                // While a backlog waits, they are the next turn's (due
                // within the backlog delay) to order among it: a backlog is
                // served oldest first.
                let all_new = workable
                    .iter()
                    .all(|id| self.cache.get(&self.key(*id)).is_none());
                if !woken.reconnected && all_new && backlog {
                    continue;
                }
                if !woken.reconnected && all_new {
                    match self.look_at(&workable).await {
                        Ok(summary) => {
                            if summary.full {
                                backlog = true;
                                next_turn = Instant::now() + self.settings.backlog_delay;
                            }
                            continue;
                        }
                        Err(error) => {
                            warn!(%error, "looking at new requests failed; a whole turn instead")
                        }
                    }
                }
            }
            if woken.reconnected || resumed {
                kind = TurnKind::Whole;
            }
            // A turn for a change leaves the poll its time, so that the
            // sweep goes round however often requests change.
            let turn = self.turn(&mut cursor, kind).await;
            if let Err(error) = &turn {
                warn!(%error, "discovery turn failed");
            }
            // After the turn, which took the woken candidates in order.
            self.wake(&woken.ids).await;
            if kind == TurnKind::Poll {
                self.restore_paused().await;
            }
            backlog = matches!(&turn, Ok(summary) if summary.full);
            let delay = match turn {
                Ok(summary) if summary.full => Some(self.settings.backlog_delay),
                _ if kind == TurnKind::Woken => None,
                _ => Some(period),
            };
            if let Some(delay) = delay {
                next_turn = Instant::now() + delay;
            }
        }
    }

    /// Reconciles the cached CRs of `shards` (just acquired: the previous
    /// holder's requeue timers are gone with it), except those that wait
    /// quietly beyond one poll period: the candidate query finds each when
    /// it is due, and a change to its request makes it due (the wake row).
    /// Of those, only the ones whose request was decided meanwhile (a
    /// person's decision wakes nothing) are reconciled, found by one query.
    async fn reconcile_shards(&self, shards: &BTreeSet<u32>) {
        let horizon = self.clock.now()
            + chrono::Duration::from_std(self.settings.poll_period).unwrap_or_default();
        let (mut reconciled, mut settled) = (0, Vec::new());
        for cr in self.cache.state() {
            if !shards.contains(&self.shards.shard_of(cr.spec.request_id)) {
                continue;
            }
            if cr.settled_until().is_some_and(|due| due > horizon) {
                settled.push(cr);
                continue;
            }
            // By the CR's own name: a misnamed one is reconciled too,
            // to be reported.
            self.reconcile(ObjectRef::from_obj(&*cr)).await;
            reconciled += 1;
        }
        let ids: Vec<i64> = settled.iter().map(|cr| cr.spec.request_id).collect();
        let decided = match self.store.request_statuses(&ids).await {
            Ok(rows) => rows
                .into_iter()
                .filter(|row| !matches!(&row.status, Ok(status) if status.is_open()))
                .map(|row| row.request_id)
                .collect::<BTreeSet<i64>>(),
            Err(error) => {
                warn!(%error, "cannot tell which waiting requests were decided; reconciling them all");
                ids.iter().copied().collect()
            }
        };
        for cr in settled
            .iter()
            .filter(|cr| decided.contains(&cr.spec.request_id))
        {
            self.reconcile(ObjectRef::from_obj(&**cr)).await;
        }
        debug!(
            ?shards,
            reconciled,
            settled = settled.len(),
            decided = decided.len(),
            "reconciling the CRs of acquired shards"
        );
    }

    /// Asks for a reconcile of `key`; waits while the controller's queue is full.
    async fn reconcile(&self, key: ObjectRef<CachedAutoApproval>) {
        // Closed only when the controller is gone, at shutdown.
        let _ = self.trigger.send(key).await;
    }

    /// Whether a request is in a shard this replica can work now (one
    /// look at the held shards, for a whole batch).
    fn workable(&self) -> impl Fn(i64) -> bool + '_ {
        let held = self.shards.workable();
        move |request_id| held.contains(&self.shards.shard_of(request_id))
    }

    /// The requests among `request_ids` in a shard this replica can work now.
    fn workable_among(&self, request_ids: &[i64]) -> Vec<i64> {
        let workable = self.workable();
        request_ids
            .iter()
            .copied()
            .filter(|id| workable(*id))
            .collect()
    }

    /// Which of `request_ids` are candidates, by the candidate queries'
    /// conditions (both types) in one statement.
    async fn candidates_among(&self, request_ids: &[i64]) -> Result<Vec<Candidate>, DbError> {
        // Of the query only its window, time and limits are used.
        let query = self.settings.turn.query(
            RequestType::OwnerContract,
            self.clock.now(),
            self.settings.retry_limit,
            None,
        );
        self.store.candidates_among(request_ids, &query).await
    }

    /// The abandoned requests among `request_ids` (the garbage collector
    /// deleted their CRs on purpose); none when the database cannot tell
    /// (logged): a CR put back is collected again.
    async fn abandoned_among(&self, request_ids: &[i64]) -> std::collections::HashSet<i64> {
        let query = self.settings.abandoned.query(self.clock.now());
        match self.store.abandoned_among(request_ids, &query).await {
            Ok(ids) => ids.into_iter().collect(),
            Err(error) => {
                warn!(%error, "cannot tell whether deleted AutoApprovals were abandoned");
                std::collections::HashSet::new()
            }
        }
    }

    /// Puts back the CRs of deleted AutoApprovals whose request is still
    /// open and not abandoned; a finished, unknown or abandoned request's CR
    /// stays deleted (an abandoned one comes back once it is a candidate).
    async fn restore(&self, request_ids: &[i64]) {
        // Deleted: creating their CR again is no duplicate of ours (an
        // abandoned one's, once it is a candidate again).
        {
            let mut created = self.created_list();
            for id in request_ids {
                created.remove(id);
            }
        }
        let workable = self.workable();
        let abandoned = self.abandoned_among(request_ids).await;
        for &request_id in request_ids {
            if !workable(request_id)
                || self.cache.get(&self.key(request_id)).is_some()
                || abandoned.contains(&request_id)
            {
                continue;
            }
            let request = match self.store.request(request_id).await {
                Ok(Some(request)) if request.status.is_open() => request,
                Ok(_) => continue,
                Err(error) => {
                    warn!(request_id, %error, "cannot tell whether a deleted AutoApproval is still needed");
                    continue;
                }
            };
            let Some(approval_type) = ApprovalType::from_request_type(request.request_type) else {
                continue;
            };
            // A pause outlives its CR: the new one comes back paused.
            let paused = match self.store.pause_of(request_id).await {
                Ok(pause) => pause.is_some(),
                Err(error) => {
                    warn!(request_id, %error, "cannot tell whether a deleted AutoApproval was paused");
                    continue;
                }
            };
            info!(
                request_id,
                paused, "AutoApproval deleted while its request is open; recreating it"
            );
            self.create(request_id, approval_type, paused).await;
        }
    }

    /// Puts back the missing CR of each paused open request of our shards.
    /// A paused request is no candidate, so nothing else brings its CR
    /// back when the deletion was seen while its shard was elsewhere, or
    /// its re-creation failed (guarantee 4: the pause is lifted on the CR).
    async fn restore_paused(&self) {
        let paused = match self.store.paused_requests().await {
            Ok(ids) => ids,
            Err(error) => {
                warn!(%error, "cannot list the paused requests; a missing CR of theirs waits for the next poll");
                return;
            }
        };
        let missing: Vec<i64> = self
            .workable_among(&paused)
            .into_iter()
            .filter(|id| self.cache.get(&self.key(*id)).is_none())
            .collect();
        if !missing.is_empty() {
            self.restore(&missing).await;
        }
    }

    /// Before the cache's first sync: the new requests among `changed` in
    /// our shards get their CR and are attempted here, from the create
    /// response, since the Controller reconciles nothing before the sync.
    /// A request whose CR exists, or that has a state row, waits for the
    /// first turn after the sync: whole, it finds whatever is due.
    async fn attempt_before_sync(&self, changed: &[i64], early: &mut JoinSet<()>) {
        let workable = self.workable_among(changed);
        if workable.is_empty() {
            return;
        }
        // In the documented order, at most a turn's worth: the first turn
        // after the sync takes the rest among whatever else waits.
        let found = match self.candidates_among(&workable).await {
            Ok(found) => {
                let new = found.into_iter().filter(|c| c.state_id.is_none()).collect();
                self.take(new).taken
            }
            Err(error) => {
                warn!(%error, "looking at new requests before the CR cache's sync failed; the first turn after it finds them");
                return;
            }
        };
        for candidate in &found {
            let request_id = candidate.request_id;
            let Some(approval_type) = ApprovalType::from_request_type(candidate.request_type)
            else {
                continue;
            };
            self.metrics.candidates(candidate.request_type.as_str(), 1);
            let created = match self.post(request_id, approval_type, false).await {
                Ok(created) => created,
                // There already: its reconcile comes with the sync.
                Err(error) if error.exists() => continue,
                Err(error) => {
                    warn!(request_id, %error, "could not create AutoApproval");
                    continue;
                }
            };
            self.metrics.cr_created();
            while early.len() >= self.concurrency.max(1) {
                early.join_next().await;
            }
            debug!(
                request_id,
                "AutoApproval created; attempted before the CR cache's sync"
            );
            let cr = Arc::new(CachedAutoApproval::of(&created));
            let context = self.context.clone();
            early.spawn(async move {
                // Errors are logged and counted by the reconcile; its
                // requeue is the first turn's after the sync.
                let _ = reconcile::reconcile(cr, context).await;
            });
        }
    }

    /// Reconciles the CRs of changed requests in our shards that are not
    /// candidates (decided, claimed, paused, out of the window: the CR
    /// shows it). Those that are candidates are the turn's, which ran just
    /// before: it took them in the documented order, up to its limit, and
    /// leaves the rest to the next turns; a reconcile for each on arrival
    /// would run them in whatever order the Controller's queue holds them.
    /// The change's transaction already recorded the wake in the database
    /// (migration 0009), for every request and whoever holds its shard, so
    /// a change notified while a shard changes hands is found due by the
    /// next holder's first turn.
    async fn wake(&self, changed: &[i64]) {
        let workable = self.workable();
        let cached: Vec<i64> = changed
            .iter()
            .copied()
            .filter(|id| workable(*id) && self.cache.get(&self.key(*id)).is_some())
            .collect();
        if cached.is_empty() {
            return;
        }
        let candidates: BTreeSet<i64> = match self.candidates_among(&cached).await {
            Ok(found) => found.iter().map(|c| c.request_id).collect(),
            Err(error) => {
                warn!(%error, "cannot tell which changed requests are candidates; reconciling them all");
                BTreeSet::new()
            }
        };
        for request_id in cached.into_iter().filter(|id| !candidates.contains(id)) {
            self.reconcile(self.key(request_id)).await;
        }
    }

    /// The notified requests alone, by the candidate queries' conditions in
    /// one statement: a CR for each that is a candidate.
    async fn look_at(&self, request_ids: &[i64]) -> Result<TurnSummary, DiscoveryError> {
        let mut found = self.take(self.candidates_among(request_ids).await?);
        // A request without a CR may still have a state row: an abandoned
        // one, its CR collected. Its change revives it once its wake is
        // applied (one statement, only when some notified request is not a
        // candidate).
        if found.taken.len() + found.left.len() < request_ids.len()
            && self.revived_among(request_ids).await?
        {
            found = self.take(self.candidates_among(request_ids).await?);
        }
        let mut summary = TurnSummary {
            // More than a turn takes: the next turn, soon, takes the rest.
            full: !found.left.is_empty(),
            ..TurnSummary::default()
        };
        for candidate in &found.taken {
            self.metrics.candidates(candidate.request_type.as_str(), 1);
            summary.candidates += 1;
            self.ensure(candidate, &mut summary).await;
        }
        debug!(
            ?summary,
            notified = request_ids.len(),
            "looked at notified new requests"
        );
        Ok(summary)
    }

    /// Applies the wakes of the held shards (as a turn does first); true
    /// when one of `request_ids` was made due by it.
    async fn revived_among(&self, request_ids: &[i64]) -> Result<bool, DiscoveryError> {
        let filter = ShardFilter {
            shard_count: i64::from(self.shards.shard_count()),
            shards: self.shards.workable().into_iter().map(i64::from).collect(),
        };
        let woken = self
            .store
            .apply_wakes(Some(&filter), self.clock.now(), self.settings.retry_limit)
            .await?;
        Ok(woken.iter().any(|id| request_ids.contains(id)))
    }

    /// One turn: a CR for each new candidate, a reconcile for each one
    /// whose CR exists. Whole (the candidate query of each type over every
    /// held shard) when `kind` says so or the cursor does not hold for the
    /// shards held now; otherwise the fresh candidates, and on a poll the
    /// whole query over the next shards of the sweep's rotation.
    async fn turn(
        &self,
        cursor: &mut Cursor,
        kind: TurnKind,
    ) -> Result<TurnSummary, DiscoveryError> {
        let started = Instant::now();
        let now = self.clock.now();
        let mut summary = TurnSummary::default();
        let held: BTreeSet<u32> = self.shards.workable().into_iter().collect();
        if held.is_empty() {
            debug!("no shard held: no discovery turn");
            return Ok(summary);
        }
        let filter = |shards: &BTreeSet<u32>| ShardFilter {
            shard_count: i64::from(self.shards.shard_count()),
            shards: shards.iter().copied().map(i64::from).collect(),
        };
        // The wakes the business system recorded become due retries before
        // the candidate queries look for them.
        let woken = self
            .store
            .apply_wakes(Some(&filter(&held)), now, self.settings.retry_limit)
            .await?;
        if !woken.is_empty() {
            debug!(woken = woken.len(), "woken requests due again");
        }
        // Read before the queries: a request inserted after this is above it.
        let newest = self.store.newest_request_id().await?;
        let mut whole = kind == TurnKind::Whole || cursor.since.is_none() || cursor.shards != held;
        // Every path's candidates, taken as one list in the documented order,
        // at most each type's limit.
        let mut found = Vec::new();
        if !whole {
            let previous = cursor.since.unwrap_or_default();
            for request_type in RequestType::AUTO_APPROVABLE {
                let query = self.settings.turn.query(
                    request_type,
                    now,
                    self.settings.retry_limit,
                    Some(filter(&held)),
                );
                let fresh = self.store.fresh_candidates(&query, previous).await?;
                self.metrics
                    .candidates(request_type.as_str(), fresh.len() as u64);
                summary.candidates += fresh.len();
                let new = fresh.iter().filter(|c| c.state_id.is_none()).count();
                // A full page of new requests or of due retries: more wait
                // than a turn takes, and only the whole query, in its order,
                // knows which come first (a backlog is served oldest first).
                if new as i64 >= query.limit || (fresh.len() - new) as i64 >= query.limit {
                    whole = true;
                    break;
                }
                found.extend(fresh);
            }
        }
        if whole {
            *cursor = Cursor {
                shards: held.clone(),
                since: None,
                rotation: 0,
            };
            let complete = self.sweep(&filter(&held), now, &mut summary).await?;
            cursor.since = complete.then_some(newest);
        } else {
            let mut since = newest;
            let mut swept = None;
            if kind == TurnKind::Poll {
                let shards: Vec<u32> = held.iter().copied().collect();
                let per_turn = shards.len().div_ceil(SWEEP_TURNS);
                let start = cursor.rotation % shards.len();
                let these: BTreeSet<u32> = shards
                    .iter()
                    .cycle()
                    .skip(start)
                    .take(per_turn)
                    .copied()
                    .collect();
                let (rows, full) = self.sweep_rows(&filter(&these), now, &mut summary).await?;
                let ids: BTreeSet<i64> = rows.iter().map(|c| c.request_id).collect();
                found.extend(rows);
                swept = Some((ids, !full, (start + per_turn) % shards.len()));
            }
            let turn = self.in_order(found).await?;
            summary.full |= !turn.left.is_empty();
            let mut ensured_all = BTreeSet::new();
            for candidate in &turn.left {
                if candidate.state_id.is_none() {
                    since = since.min(candidate.request_id - 1);
                }
            }
            for candidate in &turn.taken {
                if self.ensure(candidate, &mut summary).await {
                    ensured_all.insert(candidate.request_id);
                } else if candidate.state_id.is_none() {
                    since = since.min(candidate.request_id - 1);
                }
            }
            cursor.since = Some(since.max(cursor.since.unwrap_or_default()));
            // A sweep that filled its page, or whose candidates were not all
            // taken and ensured, goes on with the same shards.
            if let Some((ids, not_full, next)) = swept
                && not_full
                && ids.iter().all(|id| ensured_all.contains(id))
            {
                cursor.rotation = next;
            }
        }
        self.metrics
            .turn(summary.candidates, started.elapsed().as_secs_f64());
        debug!(?summary, whole, "discovery turn");
        Ok(summary)
    }

    /// The whole candidate query of each type over `shards`; true when it
    /// saw everything: no page was full and every CR it needed is there.
    /// Each type's page is in the documented order already.
    async fn sweep(
        &self,
        shards: &ShardFilter,
        now: chrono::DateTime<chrono::Utc>,
        summary: &mut TurnSummary,
    ) -> Result<bool, DiscoveryError> {
        let (found, full) = self.sweep_rows(shards, now, summary).await?;
        let mut complete = !full;
        for candidate in &found {
            complete &= self.ensure(candidate, summary).await;
        }
        Ok(complete)
    }

    /// The rows of the whole candidate query of each type over `shards`,
    /// and whether a page was full.
    async fn sweep_rows(
        &self,
        shards: &ShardFilter,
        now: chrono::DateTime<chrono::Utc>,
        summary: &mut TurnSummary,
    ) -> Result<(Vec<Candidate>, bool), DiscoveryError> {
        let (mut rows, mut full) = (Vec::new(), false);
        for request_type in RequestType::AUTO_APPROVABLE {
            let query = self.settings.turn.query(
                request_type,
                now,
                self.settings.retry_limit,
                Some(shards.clone()),
            );
            let found = self.store.candidates(&query).await?;
            self.metrics
                .candidates(request_type.as_str(), found.len() as u64);
            let page_full = found.len() as i64 >= query.limit;
            summary.full |= page_full;
            full |= page_full;
            summary.candidates += found.len();
            rows.extend(found);
        }
        Ok((rows, full))
    }

    /// The candidates several paths found, as one list in the candidate
    /// queries' order (status, then oldest `sort_time`: one statement by
    /// primary key, which also drops those that stopped being candidates),
    /// at most each type's limit taken; the rest are left to a later turn.
    async fn in_order(&self, found: Vec<Candidate>) -> Result<Turn, DbError> {
        let ids: BTreeSet<i64> = found.iter().map(|c| c.request_id).collect();
        let ordered = if ids.len() > 1 {
            let ids: Vec<i64> = ids.into_iter().collect();
            self.candidates_among(&ids).await?
        } else {
            found
        };
        Ok(self.take(ordered))
    }

    /// Of candidates in the documented order, what one turn takes.
    fn take(&self, ordered: Vec<Candidate>) -> Turn {
        let now = self.clock.now();
        take_in_order(ordered, |request_type| {
            self.settings
                .turn
                .query(request_type, now, self.settings.retry_limit, None)
                .limit
        })
    }

    /// The candidate's CR created or its reconcile asked for; false when
    /// its CR could not be created (a later turn must see it again).
    async fn ensure(&self, candidate: &Candidate, summary: &mut TurnSummary) -> bool {
        let key = self.key(candidate.request_id);
        if let Some(cr) = self.cache.get(&key) {
            self.created_list().remove(&candidate.request_id);
            // A CR without status has a reconcile pending from its watch
            // event; one with status and still a candidate needs another.
            if candidate.state_id.is_some() || cr.status.is_some() {
                self.reconcile(key).await;
                summary.triggered += 1;
            }
            return true;
        }
        let Some(approval_type) = ApprovalType::from_request_type(candidate.request_type) else {
            return true;
        };
        {
            let mut created = self.created_list();
            let period = self.settings.poll_period;
            created.retain(|_, at| at.elapsed() < period);
            if created.contains_key(&candidate.request_id) {
                return true;
            }
        }
        let creation = self
            .create(candidate.request_id, approval_type, false)
            .await;
        if creation != Creation::Failed {
            self.created_list()
                .insert(candidate.request_id, Instant::now());
        }
        match creation {
            Creation::Created => {
                summary.created += 1;
                true
            }
            Creation::Existed => true,
            Creation::Failed => false,
        }
    }

    fn created_list(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<i64, Instant>> {
        self.created.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates the CR of a request. An AlreadyExists means the cache lags
    /// the API: the CR is there, so the reconcile is triggered instead.
    async fn create(&self, request_id: i64, approval_type: ApprovalType, paused: bool) -> Creation {
        match self.post(request_id, approval_type, paused).await {
            Ok(_) => {
                self.metrics.cr_created();
                debug!(request_id, "AutoApproval created");
                Creation::Created
            }
            Err(error) if error.exists() => {
                self.reconcile(self.key(request_id)).await;
                Creation::Existed
            }
            Err(error) => {
                warn!(request_id, %error, "could not create AutoApproval");
                Creation::Failed
            }
        }
    }

    /// The create call of a request's CR, bounded by the API timeout (a
    /// create that lands after all is found by the next attempt's 409).
    async fn post(
        &self,
        request_id: i64,
        approval_type: ApprovalType,
        paused: bool,
    ) -> Result<AutoApproval, CreateError> {
        let mut cr = crd::for_request(request_id, approval_type, self.settings.shard_count);
        cr.spec.paused = paused;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let limit = self.settings.api_timeout;
        match tokio::time::timeout(limit, self.api.create(&params, &cr)).await {
            Ok(created) => Ok(created?),
            Err(_) => Err(CreateError::Unanswered(limit)),
        }
    }

    fn key(&self, request_id: i64) -> ObjectRef<CachedAutoApproval> {
        let ns = self.api_namespace();
        ObjectRef::new(&crd::cr_name(request_id)).within(&ns)
    }

    fn api_namespace(&self) -> String {
        self.api.namespace().unwrap_or("default").to_owned()
    }
}

/// What a turn takes of the candidates its paths found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Turn {
    /// In the documented order, at most each type's limit.
    taken: Vec<Candidate>,
    /// Beyond a type's limit: a later turn takes them.
    left: Vec<Candidate>,
}

/// Takes, of `ordered` (in the documented order), at most `limit` of each
/// type, keeping the order; the rest are left.
fn take_in_order(ordered: Vec<Candidate>, limit: impl Fn(RequestType) -> i64) -> Turn {
    let mut turn = Turn::default();
    let mut seen = BTreeSet::new();
    for candidate in ordered {
        if !seen.insert(candidate.request_id) {
            continue;
        }
        let of_type = turn
            .taken
            .iter()
            .filter(|c| c.request_type == candidate.request_type)
            .count() as i64;
        if of_type < limit(candidate.request_type) {
            turn.taken.push(candidate);
        } else {
            turn.left.push(candidate);
        }
    }
    turn
}

/// The deleted CRs' request ids already waiting in the channel.
fn drain_ids(first: i64, deleted: &mut tokio::sync::mpsc::Receiver<i64>) -> Vec<i64> {
    let mut ids = BTreeSet::from([first]);
    while let Ok(id) = deleted.try_recv() {
        ids.insert(id);
    }
    ids.into_iter().collect()
}

/// What the notifications waiting in the channel said.
#[derive(Debug, Default, PartialEq)]
struct Woken {
    /// The changed requests, deduplicated.
    ids: Vec<i64>,
    /// The listener reconnected: notifications may be lost, so a whole turn.
    reconnected: bool,
}

/// Everything already waiting in the channel.
fn drain(first: RequestChange, changes: &mut Changes) -> Woken {
    let mut ids = BTreeSet::new();
    // Changes dropped on a full channel: a whole turn finds them.
    let mut reconnected = changes
        .lost
        .swap(false, std::sync::atomic::Ordering::Relaxed);
    let mut add = |change: RequestChange| match change {
        RequestChange::Changed(id) => {
            ids.insert(id);
        }
        RequestChange::Reconnected => reconnected = true,
        RequestChange::Malformed(_) => {}
    };
    add(first);
    while let Ok(change) = changes.rx.try_recv() {
        add(change);
    }
    Woken {
        ids: ids.into_iter().collect(),
        reconnected,
    }
}

/// Forwards request changes from LISTEN; reconnects with backoff. A
/// reconnection is forwarded too, so discovery runs a full turn.
async fn listen(store: Database, tx: ChangeSender, stopping: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let connected = tokio::select! {
            changes = store.request_changes() => changes,
            () = stopping.cancelled() => return,
        };
        let mut changes = match connected {
            Ok(changes) => {
                info!("listening for request changes");
                backoff = Duration::from_millis(200);
                changes
            }
            Err(error) => {
                warn!(%error, retry_in = ?backoff, "cannot LISTEN for request changes; polling only");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stopping.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        // A turn after (re)connecting catches whatever was missed.
        if !tx.send(RequestChange::Reconnected) {
            return;
        }
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                () = stopping.cancelled() => return,
            };
            match change {
                Ok(RequestChange::Malformed(payload)) => {
                    warn!(%payload, "request-changed notification without a request id; ignored");
                }
                Ok(change) => {
                    if !tx.send(change) {
                        return;
                    }
                }
                Err(error) => {
                    warn!(%error, "LISTEN connection failed; reconnecting");
                    break;
                }
            }
        }
    }
}

/// At shutdown: the attempts discovery began itself run on through the
/// grace period (each holds its shard's guard, so the shutdown waits for
/// it like any chain in flight) and are aborted once `cut_off` says the
/// grace is over, before the claims are released: no chain outlives its
/// claim.
async fn finish(mut early: JoinSet<()>, cut_off: &CancellationToken) {
    tokio::select! {
        () = async { while early.join_next().await.is_some() {} } => {}
        () = cut_off.cancelled() => {
            early.abort_all();
            // Each ends at its next await; none is left running.
            while early.join_next().await.is_some() {}
        }
    }
}

/// Waits for the cache's first sync. A fresh wait each 100 ms: with several
/// waiters on one store, a wake-up can be missed.
pub(crate) async fn wait_ready(cache: &Cache<CachedAutoApproval>) {
    loop {
        tokio::select! {
            _ = cache.wait_until_ready() => return,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconnect_among_changes_still_asks_for_a_whole_turn() {
        let (tx, mut rx) = changes_channel();
        for change in [
            RequestChange::Changed(5),
            RequestChange::Reconnected,
            RequestChange::Changed(3),
        ] {
            assert!(tx.send(change));
        }
        let first = RequestChange::Changed(5);
        assert_eq!(
            drain(first, &mut rx),
            Woken {
                ids: vec![3, 5],
                reconnected: true
            }
        );
        assert!(tx.send(RequestChange::Changed(9)));
        let only_changes = drain(RequestChange::Changed(8), &mut rx);
        assert_eq!(only_changes.ids, [8, 9]);
        assert!(!only_changes.reconnected);
    }

    #[test]
    fn a_turn_takes_each_types_limit_in_the_order_given() {
        let owner = |id| Candidate {
            request_id: id,
            request_type: RequestType::OwnerContract,
            state_id: None,
        };
        let ad = |id| Candidate {
            request_type: RequestType::AdContract,
            ..owner(id)
        };
        // As the candidate queries order them, one path's find repeated.
        let ordered = vec![owner(102), ad(7), owner(103), owner(102), ad(9), owner(101)];
        let turn = take_in_order(ordered, |t| match t {
            RequestType::AdContract => 1,
            _ => 2,
        });
        assert_eq!(turn.taken, [owner(102), ad(7), owner(103)]);
        assert_eq!(turn.left, [ad(9), owner(101)]);
    }

    #[test]
    fn changes_dropped_on_a_full_channel_ask_for_a_whole_turn() {
        let (tx, mut rx) = changes_channel();
        for id in 0..=TRIGGER_CAPACITY as i64 {
            assert!(tx.send(RequestChange::Changed(id)));
        }
        let woken = drain(RequestChange::Changed(-1), &mut rx);
        assert!(woken.reconnected, "one change was dropped");
        assert_eq!(woken.ids.len(), TRIGGER_CAPACITY + 1);
        assert!(!drain(RequestChange::Changed(1), &mut rx).reconnected);
    }
}
