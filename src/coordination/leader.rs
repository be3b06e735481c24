//! Membership and leadership: the member Lease every replica keeps, the
//! leader Lease that elects the one cleanser and CR garbage collector, and
//! the leader's removal of departed members' Leases.

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::fence::next_generation;
use super::lease::{
    delete_unchanged, is_member, member_lease_name, micro_time, post_params, shard_lease_name,
};
use super::{Coordinator, LEADER_LEASE};

// === impl Coordinator ===

impl Coordinator {
    /// Renews the member Lease when due, or takes it when not held. A
    /// renew that finds it written by someone else means another replica
    /// judged this one gone and may take its shards: every shard is dropped
    /// at once, before the Lease is taken again.
    pub(super) async fn renew_member(&mut self, sent: Instant, now: DateTime<Utc>) {
        let name = member_lease_name(self.identity());
        if self.held_leases.contains_key(&name) {
            if !self.renew_due(self.member_turn) {
                return;
            }
            match self.renew(&name, now).await {
                Ok(true) => {
                    self.member_renewed(sent);
                    return;
                }
                Ok(false) => self.evicted(),
                Err(error) => {
                    self.lease_call_failed(&name, "update", &error);
                    return;
                }
            }
        }
        let existing = match self.api.get_opt(&name).await {
            Ok(existing) => existing,
            Err(error) => {
                self.lease_call_failed(&name, "get", &error);
                return;
            }
        };
        let generation = next_generation(existing.as_ref(), 0);
        if let Some(lease) = self.take(&name, "member", existing, generation, now).await {
            info!(lease = %name, "joined as a member");
            self.held_leases.insert(name, lease);
            self.member_renewed(sent);
        }
    }

    /// A write of the member Lease sent at `sent` succeeded: it vouches for
    /// every shard held until the renew deadline.
    fn member_renewed(&mut self, sent: Instant) {
        self.member_turn = Some(self.turns);
        self.member_renewed = Some(sent);
        for shard in self.shards.renewed_all(sent) {
            // Reconciles refused meanwhile dropped their requeues.
            info!(
                shard,
                "member Lease renewed again after the renew deadline: claiming resumes"
            );
            self.acquired.push(shard);
        }
    }

    /// Our member Lease no longer names us: drop every shard.
    fn evicted(&mut self) {
        let lost = self.shards.remove_all();
        for shard in &lost {
            self.held_leases.remove(&shard_lease_name(*shard));
            self.metrics.shard_lost();
        }
        self.member_renewed = None;
        warn!(
            shards = ?lost,
            "the member Lease was written by another replica (this one was judged gone): every shard lost"
        );
    }

    /// Writes a replica judged gone out of its member Lease, with the
    /// version that was judged: false when it was renewed meanwhile (409) or
    /// the call failed. Once written, that replica's next renew fails and it
    /// drops its shards, so they can be taken.
    pub(super) async fn evict(&mut self, member: &Lease, now: DateTime<Utc>) -> bool {
        let name = member.metadata.name.clone().unwrap_or_default();
        let mut lease = member.clone();
        let gone = lease.spec.as_mut().and_then(|spec| {
            spec.renew_time = Some(micro_time(now));
            spec.holder_identity.take()
        });
        match self.api.replace(&name, &post_params(), &lease).await {
            Ok(_) => {
                info!(
                    lease = %name,
                    holder = gone.as_deref().unwrap_or("nobody"),
                    "the member Lease expired: wrote its holder out before taking its shards"
                );
                true
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(lease = %name, "the member Lease changed since it was judged expired");
                false
            }
            Err(error) => {
                self.lease_call_failed(&name, "update", &error);
                false
            }
        }
    }

    /// Holds or takes the leader Lease.
    pub(super) async fn lead(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
        if self.held_leases.contains_key(LEADER_LEASE) {
            if !self.renew_due(self.leader_turn) {
                return;
            }
            match self.renew(LEADER_LEASE, now).await {
                Ok(true) => {
                    self.leader_renewed = Some(sent);
                    self.leader_turn = Some(self.turns);
                }
                Ok(false) => {
                    // Someone else's now: forgotten, so that a later turn
                    // takes it again once it is free or expired.
                    self.held_leases.remove(LEADER_LEASE);
                    self.leader_renewed = None;
                    self.metrics.leadership_lost();
                    warn!("leadership lost");
                }
                Err(error) => self.lease_call_failed(LEADER_LEASE, "update", &error),
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
        let generation = next_generation(existing, 0);
        if let Some(lease) = self
            .take(LEADER_LEASE, "leader", existing.cloned(), generation, now)
            .await
        {
            self.lease_event(
                &lease,
                "LeaderElection",
                format!("{} became leader", self.identity()),
            );
            self.held_leases.insert(LEADER_LEASE.to_owned(), lease);
            self.leader_renewed = Some(sent);
            self.leader_turn = Some(self.turns);
            info!("became the leader: running the cleanser and the CR garbage collector");
        }
    }

    /// The leader deletes member Leases of replicas gone for a while.
    pub(super) async fn collect_members(&self, leases: &[Lease]) {
        let gone_for = self.settings.lease_duration.saturating_mul(10);
        for lease in leases.iter().filter(|l| is_member(l)) {
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            let stale = self
                .seen
                .get(name)
                .is_some_and(|seen| seen.changed.elapsed() > gone_for);
            // Deleted only as judged: a renew since makes it answer 409.
            if stale && delete_unchanged(&self.api, lease).await.is_ok() {
                info!(
                    lease = name,
                    "deleted the member Lease of a departed replica"
                );
            }
        }
    }
}
