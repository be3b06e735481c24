//! The cleanser: brings back claims stuck IN_PROGRESS (a worker died) and
//! deletes state rows of requests that are already decided. One runner at a
//! time; the coordination module decides which replica.

use std::time::Duration;

use tracing::info;

use crate::clock::SharedClock;
use crate::db::{CleanseReport, Database, DbError};
use crate::telemetry::Metrics;

/// Makes every request shadow mode left waiting due at `now`, logging how
/// many: the switch from shadow to active loses nothing.
pub async fn hand_over_shadow(
    store: &Database,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<u64, DbError> {
    let handed = store.hand_over_shadow(now).await?;
    if handed > 0 {
        info!(
            handed,
            "requests shadow mode left waiting are due again: acting on them now"
        );
    }
    Ok(handed)
}

/// Runs cleanser passes.
pub struct Cleanser {
    store: Database,
    clock: SharedClock,
    metrics: Metrics,
    stuck_threshold: Duration,
}

impl Cleanser {
    /// A cleanser that treats claims untouched for `stuck_threshold` as stuck.
    /// The threshold must be well above the longest chain, or a live claim
    /// would be taken for a dead one.
    pub fn new(
        store: Database,
        clock: SharedClock,
        metrics: Metrics,
        stuck_threshold: Duration,
    ) -> Self {
        Self {
            store,
            clock,
            metrics,
            stuck_threshold,
        }
    }

    /// The store.
    pub fn database(&self) -> &Database {
        &self.store
    }

    /// Fences a shard just acquired at generation `token` by `holder` and
    /// recovers the claims its previous holder left behind (a replica that
    /// died, or lost the shard, mid-chain): they are due again at once.
    /// `None` when the shard is already fenced at a later generation.
    pub async fn take_over_shard(
        &self,
        shard_count: u32,
        shard: u32,
        token: i64,
        holder: &str,
    ) -> Result<Option<Vec<i64>>, DbError> {
        let now = self.clock.now();
        let recovered = self
            .store
            .fence_shard(shard_count, shard, token, holder, now)
            .await?;
        if let Some(recovered) = &recovered {
            self.metrics.cleansed(recovered.len() as u64, 0);
            for request_id in recovered {
                info!(
                    request_id,
                    shard, "recovered a claim left by the shard's previous holder"
                );
            }
        }
        Ok(recovered)
    }

    /// One pass. A controller that acts (its store not in shadow) also
    /// hands over what replicas still in shadow mode left waiting, so a
    /// rolling switch from shadow to active strands nothing.
    pub async fn run_once(&self) -> Result<CleanseReport, DbError> {
        let now = self.clock.now();
        if !self.store.is_shadow() {
            hand_over_shadow(&self.store, now).await?;
        }
        let report = self.store.cleanse(self.stuck_threshold, now).await?;
        self.metrics
            .cleansed(report.recovered.len() as u64, report.deleted);
        for request_id in &report.recovered {
            info!(request_id, "recovered a stuck claim");
        }
        if report.deleted > 0 {
            info!(
                deleted = report.deleted,
                "deleted state rows of finished requests"
            );
        }
        Ok(report)
    }
}
