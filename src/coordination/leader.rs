//! Membership and leadership: the member Lease every replica keeps, the
//! leader Lease that elects the one cleanser and CR garbage collector, and
//! the leader's removal of departed members' Leases.

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::fence::next_generation;
use super::lease::{is_member, member_lease_name};
use super::{Coordinator, LEADER_LEASE};

// === impl Coordinator ===

impl Coordinator {
    pub(super) async fn renew_member(&mut self, now: DateTime<Utc>) {
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
        let generation = next_generation(existing.as_ref(), 0);
        if let Some(lease) = self.take(&name, "member", existing, generation, now).await {
            info!(lease = %name, "joined as a member");
            self.mine.insert(name, lease);
        }
    }

    /// Holds or takes the leader Lease.
    pub(super) async fn lead(&mut self, leases: &[Lease], sent: Instant, now: DateTime<Utc>) {
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
            self.mine.insert(LEADER_LEASE.to_owned(), lease);
            self.leader_renewed = Some(sent);
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
}
