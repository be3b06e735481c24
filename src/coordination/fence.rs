//! Fencing tokens: every Lease is written with `leaseTransitions` = a new
//! generation, and a shard's generation is also raised in the database
//! (`shard_fence`) before its first claim, so a replica that lost the shard
//! can neither claim nor write under its older token.

use k8s_openapi::api::coordination::v1::Lease;

use std::future::Future;
use std::time::Duration;

use super::Coordinator;
use crate::db::DbError;

/// Why a shard could not be fenced this turn (it is then not acquired).
#[derive(Debug, thiserror::Error)]
pub(super) enum FenceError {
    /// The database refused or failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The database did not answer within a retry period.
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),
}

/// The generation a new holder writes: one above both the Lease's own
/// (`leaseTransitions`, 0 when absent) and the database's token for it (0
/// for Leases that fence nothing), so it is strictly newer than any token a
/// previous holder could still be writing under.
pub(super) fn next_generation(existing: Option<&Lease>, db_token: i64) -> i64 {
    let lease_generation = existing
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.lease_transitions)
        .map_or(0, i64::from);
    lease_generation.max(db_token) + 1
}

// === impl Coordinator ===

impl Coordinator {
    /// The shard's current token in the database (0 if never fenced).
    pub(super) async fn db_token(&self, shard: u32) -> Result<i64, FenceError> {
        let k = self.settings.shard_count;
        let read = self.cleanser.database().shard_token(k, shard);
        Ok(self.bounded(read).await??.unwrap_or(0))
    }

    /// `call`, or [`FenceError::Timeout`] once it outlasts a retry period:
    /// a slow database must not hold the turn that renews every Lease.
    async fn bounded<T>(&self, call: impl Future<Output = T>) -> Result<T, FenceError> {
        let limit = self.settings.retry_period;
        tokio::time::timeout(limit, call)
            .await
            .map_err(|_| FenceError::Timeout(limit))
    }

    /// Raises the shard's token to `generation` and recovers the previous
    /// holder's claims; `None` when it is already fenced at a later one.
    pub(super) async fn fence(
        &self,
        shard: u32,
        generation: i64,
    ) -> Result<Option<Vec<i64>>, FenceError> {
        let k = self.settings.shard_count;
        let fence = self
            .cleanser
            .take_over_shard(k, shard, generation, self.identity());
        Ok(self.bounded(fence).await??)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    use super::*;

    fn lease(transitions: Option<i32>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                lease_transitions: transitions,
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_new_generation_is_above_both_the_lease_and_the_database() {
        assert_eq!(next_generation(None, 0), 1);
        assert_eq!(next_generation(Some(&lease(None)), 0), 1);
        assert_eq!(next_generation(Some(&lease(Some(4))), 0), 5);
        // The database ran ahead (the Lease was deleted and recreated).
        assert_eq!(next_generation(Some(&lease(Some(4))), 9), 10);
        assert_eq!(next_generation(None, 7), 8);
        // The Lease ran ahead (a holder took it but died before fencing).
        assert_eq!(next_generation(Some(&lease(Some(12))), 9), 13);
    }
}
