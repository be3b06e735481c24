//! Shards: noticing losses, renewing what is held, balancing to the fair
//! share (the decision is `balance::plan`), acquiring free or expired
//! shards with their fence, and handing drained shards back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::fence::next_generation;
use super::lease::{is_member, shard_lease_name, shard_of_lease};
use super::{Coordinator, balance};

// === impl Coordinator ===

impl Coordinator {
    /// Shards whose Lease now names another holder are lost at once.
    pub(super) fn notice_losses(&mut self, leases: &[Lease]) {
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

    pub(super) fn lose(&mut self, shard: u32, to: &str) {
        self.shards.remove(shard);
        self.mine.remove(&shard_lease_name(shard));
        self.metrics.shard_lost();
        warn!(shard, to, "shard lost: no more claims in it");
    }

    pub(super) async fn renew_shards(&mut self, sent: Instant, now: DateTime<Utc>) {
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

    /// Hands back the shards being drained once no reconcile runs in them
    /// (or the renew deadline passed: the new owner's fence covers the rest).
    pub(super) async fn release_drained(&mut self, now: DateTime<Utc>) {
        for (shard, in_flight) in self.shards.draining() {
            if in_flight > 0 && !self.shards.is_overdue(shard) {
                continue;
            }
            self.release_shard(shard, now).await;
        }
    }

    /// Hands a shard back; false when the Lease could not be written (it
    /// then expires).
    pub(super) async fn release_shard(&mut self, shard: u32, now: DateTime<Utc>) -> bool {
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

    pub(super) async fn balance(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
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

    pub(super) async fn acquire_shard(
        &mut self,
        shard: u32,
        existing: Option<Lease>,
        sent: Instant,
        now: DateTime<Utc>,
    ) {
        let previous = existing
            .as_ref()
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let db_token = match self.db_token(shard).await {
            Ok(token) => token,
            Err(error) => {
                warn!(shard, %error, "cannot read the shard's fencing token; not acquiring");
                return;
            }
        };
        let generation = next_generation(existing.as_ref(), db_token);
        let name = shard_lease_name(shard);
        let Some(lease) = self.take(&name, "shard", existing, generation, now).await else {
            return;
        };
        self.mine.insert(name.clone(), lease.clone());
        match self.fence(shard, generation).await {
            Ok(Some(recovered)) => {
                self.shards.insert(shard, generation, sent);
                self.metrics.shard_acquired(previous.is_some());
                if let Some(old) = &previous {
                    self.lease_event(
                        &lease,
                        "ShardFailover",
                        format!(
                            "{} took shard {shard} from {old}, whose Lease expired; {} claims recovered",
                            self.identity(),
                            recovered.len()
                        ),
                    );
                }
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
}
