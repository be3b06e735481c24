//! Shards: noticing losses, balancing to the fair share (the decision is
//! `balance::plan`), acquiring free or expired shards with their fence, and
//! handing drained shards back. Held shards are vouched for by the member
//! Lease (see `leader.rs`), not renewed one by one.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{info, warn};

use super::fence::next_generation;
use super::lease::{
    is_member, member_lease_name, shard_lease_name, shard_of_lease, speaks_protocol,
};
use super::{Coordinator, TAKEN_FROM_ANNOTATION, balance};

/// A shard Lease's holder, for the balance.
enum Holder<'l> {
    /// Nobody, or a former run of this replica: free.
    Nobody,
    /// A replica that may still be claiming in the shard.
    Live(&'l str),
    /// A replica that has stopped claiming; its member Lease, when given,
    /// must be written out first.
    Gone(Option<&'l Lease>),
}

/// What a shard holder's member Lease says of it.
enum MemberState<'l> {
    Live,
    Gone(Option<&'l Lease>),
}

/// The holder a shard Lease is taken from: the one it names, or the one a
/// hand-back after a failed fence kept ([`TAKEN_FROM_ANNOTATION`]).
fn taken_from(lease: &Lease) -> Option<String> {
    let named = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    named.or_else(|| {
        lease
            .metadata
            .annotations
            .as_ref()?
            .get(TAKEN_FROM_ANNOTATION)
            .filter(|h| !h.is_empty())
            .cloned()
    })
}

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
        self.held_leases.remove(&shard_lease_name(shard));
        self.metrics.shard_lost();
        warn!(shard, to, "shard lost: no more claims in it");
    }

    /// Notices live member Leases of replicas of the previous protocol (no
    /// protocol annotation): during a rolling upgrade they would take any
    /// shard Lease they see unrenewed for the lease duration.
    pub(super) fn notice_legacy_members(&mut self, leases: &[Lease]) {
        let legacy = leases
            .iter()
            .filter(|l| is_member(l) && !speaks_protocol(l))
            .any(|l| self.live_holder(l).is_some());
        if legacy != self.legacy_members {
            if legacy {
                warn!(
                    "a replica of the previous coordination protocol is live (an upgrade in progress): renewing shard Leases every turn until it is gone"
                );
            } else {
                info!(
                    "every live replica speaks this coordination protocol: shard Leases are written only when they change hands"
                );
            }
            self.legacy_members = legacy;
        }
    }

    /// Renews every held shard Lease, as the previous protocol expects; a
    /// Lease found naming another replica is lost.
    pub(super) async fn renew_shard_leases(&mut self, now: DateTime<Utc>) {
        for shard in self.shards.held() {
            let name = shard_lease_name(shard);
            match self.renew(&name, now).await {
                Ok(true) => {}
                Ok(false) => self.lose(shard, "another replica"),
                Err(error) => {
                    self.lease_call_failed(&name, "update", &error);
                    warn!(shard, %error, "could not renew the shard's Lease for a replica of the previous protocol");
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

    /// Who holds a shard's Lease, as far as taking it goes. A holder other
    /// than us is live while the shard Lease itself changed within the lease
    /// duration (it was just taken) or its member Lease names it and is
    /// live; gone once its member Lease names someone else, or expired (it
    /// must then be written out of it first), or has been missing for the
    /// lease duration.
    fn shard_holder<'l>(
        &mut self,
        lease: &'l Lease,
        members: &BTreeMap<String, &'l Lease>,
        at: Instant,
    ) -> Holder<'l> {
        let Some(holder) = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
        else {
            return Holder::Nobody;
        };
        // Our own name on a shard we do not hold is a former run of this
        // replica: take it over.
        if holder == self.identity() {
            return Holder::Nobody;
        }
        let name = member_lease_name(holder);
        let member = match members.get(&name) {
            Some(member) => {
                self.absent.remove(&name);
                let names_holder = member
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(holder);
                if !names_holder {
                    MemberState::Gone(None)
                } else if self.live_holder(member).is_some() {
                    MemberState::Live
                } else {
                    MemberState::Gone(Some(*member))
                }
            }
            None => {
                let since = *self.absent.entry(name).or_insert(at);
                if at.duration_since(since) > self.settings.lease_duration {
                    MemberState::Gone(None)
                } else {
                    MemberState::Live
                }
            }
        };
        match member {
            MemberState::Live => Holder::Live(holder),
            _ if self.live_holder(lease).is_some() => Holder::Live(holder),
            MemberState::Gone(evict) => Holder::Gone(evict),
        }
    }

    pub(super) async fn balance(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
        // Without a fresh member Lease nothing vouches for a new shard.
        if !self.member_fresh() {
            return;
        }
        let k = self.settings.shard_count;
        let mut by_shard: BTreeMap<u32, &Lease> = BTreeMap::new();
        let mut member_leases: BTreeMap<String, &Lease> = BTreeMap::new();
        let mut members: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        members.insert(self.identity().to_owned(), self.shards.held());
        for lease in leases {
            if let Some(shard) = shard_of_lease(lease, k) {
                by_shard.insert(shard, lease);
            } else if is_member(lease) {
                if let Some(name) = &lease.metadata.name {
                    member_leases.insert(name.clone(), lease);
                }
                if let Some(holder) = self.live_holder(lease) {
                    members.entry(holder.to_owned()).or_default();
                }
            }
        }
        let held = self.shards.held();
        let mut free = Vec::new();
        let mut gone: BTreeMap<u32, Option<Lease>> = BTreeMap::new();
        for shard in 0..k {
            if held.contains(&shard) {
                continue;
            }
            let Some(lease) = by_shard.get(&shard).copied() else {
                free.push(shard);
                continue;
            };
            match self.shard_holder(lease, &member_leases, sent) {
                Holder::Live(holder) => {
                    if let Some(shards) = members.get_mut(holder) {
                        shards.push(shard);
                    }
                }
                Holder::Nobody => free.push(shard),
                Holder::Gone(evict) => {
                    gone.insert(shard, evict.cloned());
                    free.push(shard);
                }
            }
        }
        // Forget absences of members no shard Lease names any more.
        let named: std::collections::BTreeSet<String> = by_shard
            .values()
            .filter_map(|l| l.spec.as_ref()?.holder_identity.as_deref())
            .map(member_lease_name)
            .collect();
        self.absent.retain(|name, _| named.contains(name));
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
        // Member Leases written out this turn (true) or that could not be.
        let mut evicted: BTreeMap<String, bool> = BTreeMap::new();
        for shard in plan.acquire {
            if let Some(Some(member)) = gone.get(&shard) {
                let name = member.metadata.name.clone().unwrap_or_default();
                let done = match evicted.get(&name) {
                    Some(done) => *done,
                    None => {
                        let done = self.evict(member, now).await;
                        evicted.insert(name, done);
                        done
                    }
                };
                if !done {
                    continue;
                }
            }
            let existing = by_shard.get(&shard).copied().cloned();
            self.acquire_shard(shard, existing, sent, now).await;
        }
    }

    /// Hands back a shard Lease taken but not fenced. The holder it was
    /// taken from is kept on it ([`TAKEN_FROM_ANNOTATION`]): the next
    /// acquisition, this replica's or another's, is that holder's failover,
    /// and is counted and reported as one.
    async fn hand_back_unfenced(&mut self, name: &str, previous: Option<&str>, now: DateTime<Utc>) {
        if let (Some(previous), Some(lease)) = (previous, self.held_leases.get_mut(name)) {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(TAKEN_FROM_ANNOTATION.to_owned(), previous.to_owned());
        }
        let _ = self.release(name, now).await;
    }

    pub(super) async fn acquire_shard(
        &mut self,
        shard: u32,
        existing: Option<Lease>,
        sent: Instant,
        now: DateTime<Utc>,
    ) {
        let previous = existing.as_ref().and_then(taken_from);
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
        self.held_leases.insert(name.clone(), lease.clone());
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
                self.acquired.push(shard);
            }
            Ok(None) => {
                warn!(
                    shard,
                    generation, "the shard was fenced at a later generation; handing it back"
                );
                self.hand_back_unfenced(&name, previous.as_deref(), now)
                    .await;
            }
            Err(error) => {
                warn!(shard, %error, "cannot fence the shard; handing it back");
                self.hand_back_unfenced(&name, previous.as_deref(), now)
                    .await;
            }
        }
    }
}
