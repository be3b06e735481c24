//! Discovery: the loop that turns candidate rows into AutoApproval CRs and
//! re-triggers due retries. Fixed delay between turns (not a cron), a random
//! first delay so replicas start spread out, and a NOTIFY wake-up so a new or
//! changed request is seen in milliseconds; the poll stays as the
//! level-triggered safety net.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::crd::{self, ApprovalType, AutoApproval, FIELD_MANAGER};
use crate::approval::TurnConfig;
use crate::clock::SharedClock;
use crate::coordination::Shards;
use crate::domain::{Candidate, RequestType};
use crate::store::{RequestChange, ShardFilter, Store, StoreError};
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
}

/// Errors that stop one discovery turn (the loop goes on).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The discovery loop of one replica.
pub struct Discovery {
    /// The store.
    pub store: Store,
    /// The CRs' namespace.
    pub api: Api<AutoApproval>,
    /// The controller's CR cache.
    pub cache: Cache<AutoApproval>,
    /// Feeds `Controller::reconcile_on`.
    pub trigger: mpsc::UnboundedSender<ObjectRef<AutoApproval>>,
    /// The clock.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Metrics,
    /// Its timings and scope, validated at start-up.
    pub settings: DiscoveryConfig,
    /// The shards this replica holds: discovery touches no other.
    pub shards: Arc<Shards>,
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
    /// Runs until `stopping` turns true. `deleted` carries the request ids
    /// of CRs deleted from the API server: a CR whose request is still open
    /// is put back at once, since the DB, not the CR, says what is left.
    /// `acquired` carries shards just acquired: their CRs are reconciled and
    /// a turn looks for their new candidates.
    pub async fn run(
        self,
        mut stopping: watch::Receiver<bool>,
        mut deleted: mpsc::UnboundedReceiver<i64>,
        mut acquired: mpsc::UnboundedReceiver<u32>,
    ) {
        let (changes_tx, mut changes) = mpsc::unbounded();
        if self.settings.notify {
            tokio::spawn(listen(self.store.clone(), changes_tx, stopping.clone()));
        } else {
            drop(changes_tx);
        }
        let period = self.settings.poll_period;
        let first = period.mul_f64(rand::rng().random::<f64>());
        debug!(delay = ?first, "first discovery turn after a random delay");
        let mut next_turn = Instant::now() + first;
        tokio::select! {
            () = wait_ready(&self.cache) => debug!("CR cache ready; discovery starts"),
            () = stopped(&mut stopping) => return,
        }
        loop {
            // A closed channel (NOTIFY off, or the listener gone at
            // shutdown) disables its branch; the poll and the stop remain.
            let woken = tokio::select! {
                () = tokio::time::sleep_until(next_turn) => Woken::default(),
                Some(first) = changes.next() => drain(first, &mut changes),
                Some(first) = deleted.next() => {
                    self.restore(&drain_ids(first, &mut deleted)).await;
                    continue;
                }
                Some(first) = acquired.next() => {
                    let mut shards = BTreeSet::from([first]);
                    while let Ok(shard) = acquired.try_recv() {
                        shards.insert(shard);
                    }
                    self.reconcile_shards(&shards);
                    Woken::default()
                }
                () = stopped(&mut stopping) => return,
            };
            if !woken.ids.is_empty() {
                self.metrics.notify_wakeup();
                self.wake(&woken.ids);
                // Changes in other replicas' shards are theirs to work: no
                // turn here, and the poll keeps its time.
                let ours = self.ours();
                let mine: Vec<i64> = woken.ids.iter().copied().filter(|id| ours(*id)).collect();
                if mine.is_empty() && !woken.reconnected {
                    continue;
                }
                // Only new requests (no CR yet, so no state row and no wake
                // row to apply): one look at them instead of a whole turn.
                // The poll keeps its time; it remains the safety net.
                if !woken.reconnected
                    && mine
                        .iter()
                        .all(|id| self.cache.get(&self.key(*id)).is_none())
                {
                    match self.look_at(&mine).await {
                        Ok(_) => continue,
                        Err(error) => {
                            warn!(%error, "looking at new requests failed; a whole turn instead")
                        }
                    }
                }
            }
            let delay = match self.turn().await {
                Ok(summary) if summary.full => self.settings.backlog_delay,
                Ok(_) => period,
                Err(error) => {
                    warn!(%error, "discovery turn failed");
                    period
                }
            };
            next_turn = Instant::now() + delay;
        }
    }

    /// Reconciles every cached CR of `shards` (just acquired: the previous
    /// holder's requeue timers are gone with it).
    fn reconcile_shards(&self, shards: &BTreeSet<u32>) {
        let mut n = 0;
        for cr in self.cache.state() {
            if shards.contains(&self.shards.shard_of(cr.spec.request_id)) {
                // By the CR's own name: a misnamed one is reconciled too,
                // to be reported.
                let _ = self.trigger.unbounded_send(ObjectRef::from_obj(&*cr));
                n += 1;
            }
        }
        debug!(?shards, crs = n, "reconciling the CRs of acquired shards");
    }

    /// Whether a request is in a shard this replica can work now (one
    /// look at the held shards, for a whole batch).
    fn ours(&self) -> impl Fn(i64) -> bool + '_ {
        let held = self.shards.workable();
        move |request_id| held.contains(&self.shards.shard_of(request_id))
    }

    /// Puts back the CRs of deleted AutoApprovals whose request is still
    /// open; a finished or unknown request's CR stays deleted.
    async fn restore(&self, request_ids: &[i64]) {
        let ours = self.ours();
        for &request_id in request_ids {
            if !ours(request_id) || self.cache.get(&self.key(request_id)).is_some() {
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

    /// Reconciles the CRs of changed requests in our shards. The change's
    /// transaction already recorded the wake in the database (migration
    /// 0009), for every request and whoever holds its shard, so a change
    /// notified while a shard changes hands is found due by the next
    /// holder's first turn.
    fn wake(&self, changed: &[i64]) {
        let ours = self.ours();
        for request_id in changed.iter().copied().filter(|id| ours(*id)) {
            let key = self.key(request_id);
            if self.cache.get(&key).is_some() {
                let _ = self.trigger.unbounded_send(key);
            }
        }
    }

    /// The notified requests alone, by the candidate queries' conditions in
    /// one statement: a CR for each that is a candidate.
    async fn look_at(&self, request_ids: &[i64]) -> Result<TurnSummary, DiscoveryError> {
        let now = self.clock.now();
        let query = self.settings.turn.query(
            RequestType::OwnerContract,
            now,
            self.settings.retry_limit,
            None,
        );
        let found = self.store.candidates_among(request_ids, &query).await?;
        let mut summary = TurnSummary::default();
        for candidate in &found {
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

    /// One turn: the candidate query of each type; a CR for each new
    /// candidate, a reconcile for each one whose CR exists.
    pub async fn turn(&self) -> Result<TurnSummary, DiscoveryError> {
        let now = self.clock.now();
        let mut summary = TurnSummary::default();
        let held = self.shards.workable();
        if held.is_empty() {
            debug!("no shard held: no discovery turn");
            return Ok(summary);
        }
        let filter = ShardFilter {
            shard_count: i64::from(self.shards.shard_count()),
            shards: held.into_iter().map(i64::from).collect(),
        };
        // The wakes the business system recorded become due retries before
        // the candidate queries look for them.
        let woken = self
            .store
            .apply_wakes(Some(&filter), now, self.settings.retry_limit)
            .await?;
        if !woken.is_empty() {
            debug!(woken = woken.len(), "woken requests due again");
        }
        for request_type in RequestType::AUTO_APPROVABLE {
            let query = self.settings.turn.query(
                request_type,
                now,
                self.settings.retry_limit,
                Some(filter.clone()),
            );
            let found = self.store.candidates(&query).await?;
            self.metrics
                .candidates(request_type.as_str(), found.len() as u64);
            summary.full |= found.len() as i64 >= query.limit;
            summary.candidates += found.len();
            for candidate in &found {
                self.ensure(candidate, &mut summary).await;
            }
        }
        self.metrics.turn(summary.candidates);
        debug!(?summary, "discovery turn");
        Ok(summary)
    }

    async fn ensure(&self, candidate: &Candidate, summary: &mut TurnSummary) {
        let key = self.key(candidate.request_id);
        if let Some(cr) = self.cache.get(&key) {
            // A CR without status has a reconcile pending from its watch
            // event; one with status and still a candidate needs another.
            if candidate.state_id.is_some() || cr.status.is_some() {
                let _ = self.trigger.unbounded_send(key);
                summary.triggered += 1;
            }
            return;
        }
        let Some(approval_type) = ApprovalType::from_request_type(candidate.request_type) else {
            return;
        };
        if self
            .create(candidate.request_id, approval_type, false)
            .await
        {
            summary.created += 1;
        }
    }

    /// Creates the CR of a request; true when this call created it. An
    /// AlreadyExists means the cache lags the API: the CR is there, so the
    /// reconcile is triggered instead.
    async fn create(&self, request_id: i64, approval_type: ApprovalType, paused: bool) -> bool {
        let mut cr = crd::for_request(request_id, approval_type, self.settings.shard_count);
        cr.spec.paused = paused;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        match self.api.create(&params, &cr).await {
            Ok(_) => {
                self.metrics.cr_created();
                debug!(request_id, "AutoApproval created");
                true
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let _ = self.trigger.unbounded_send(self.key(request_id));
                false
            }
            Err(error) => {
                warn!(request_id, %error, "could not create AutoApproval");
                false
            }
        }
    }

    fn key(&self, request_id: i64) -> ObjectRef<AutoApproval> {
        let ns = self.api_namespace();
        ObjectRef::new(&crd::cr_name(request_id)).within(&ns)
    }

    fn api_namespace(&self) -> String {
        self.api.namespace().unwrap_or("default").to_owned()
    }
}

/// The deleted CRs' request ids already waiting in the channel.
fn drain_ids(first: i64, deleted: &mut mpsc::UnboundedReceiver<i64>) -> Vec<i64> {
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
fn drain(first: RequestChange, changes: &mut mpsc::UnboundedReceiver<RequestChange>) -> Woken {
    let mut ids = BTreeSet::new();
    let mut reconnected = false;
    let mut add = |change: RequestChange| match change {
        RequestChange::Changed(id) => {
            ids.insert(id);
        }
        RequestChange::Reconnected => reconnected = true,
        RequestChange::Malformed(_) => {}
    };
    add(first);
    while let Ok(change) = changes.try_recv() {
        add(change);
    }
    Woken {
        ids: ids.into_iter().collect(),
        reconnected,
    }
}

/// Forwards request changes from LISTEN; reconnects with backoff. A
/// reconnection is forwarded too, so discovery runs a full turn.
async fn listen(
    store: Store,
    tx: mpsc::UnboundedSender<RequestChange>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let connected = tokio::select! {
            changes = store.request_changes() => changes,
            () = stopped(&mut stopping) => return,
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
                    () = stopped(&mut stopping) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        // A turn after (re)connecting catches whatever was missed.
        if tx.unbounded_send(RequestChange::Reconnected).is_err() {
            return;
        }
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                () = stopped(&mut stopping) => return,
            };
            match change {
                Ok(RequestChange::Malformed(payload)) => {
                    warn!(%payload, "request-changed notification without a request id; ignored");
                }
                Ok(change) => {
                    if tx.unbounded_send(change).is_err() {
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

/// Resolves once `stopping` is true (or its sender is gone).
pub(crate) async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// Waits for the cache's first sync. A fresh wait each 100 ms: with several
/// waiters on one store, a wake-up can be missed.
pub(crate) async fn wait_ready(cache: &Cache<AutoApproval>) {
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
        let (tx, mut rx) = mpsc::unbounded();
        for change in [
            RequestChange::Changed(5),
            RequestChange::Reconnected,
            RequestChange::Changed(3),
        ] {
            tx.unbounded_send(change).unwrap();
        }
        let first = RequestChange::Changed(5);
        assert_eq!(
            drain(first, &mut rx),
            Woken {
                ids: vec![3, 5],
                reconnected: true
            }
        );
        tx.unbounded_send(RequestChange::Changed(9)).unwrap();
        let only_changes = drain(RequestChange::Changed(8), &mut rx);
        assert_eq!(only_changes.ids, [8, 9]);
        assert!(!only_changes.reconnected);
    }
}
