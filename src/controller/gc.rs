//! The CR garbage collector, run by the leader: the CR of a finished
//! request goes after a TTL, the CR of a request that no longer exists goes
//! at the first pass after it is one interval old. Deleting loses nothing:
//! the DB is the truth, and discovery puts back the CR of any request that
//! is still open.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::reflector::Store as Cache;
use tracing::{info, warn};

use super::cached::CachedAutoApproval;
use super::crd::{self, AutoApproval};
use crate::clock::SharedClock;
use crate::db::{Database, DbError};
use crate::telemetry::Metrics;

/// When the leader's garbage collector runs and how long a finished CR stays.
#[derive(Clone, Debug)]
pub struct GcConfig {
    /// Delay between passes.
    pub interval: Duration,
    /// How long the CR of a finished request stays.
    pub finished_ttl: Duration,
}

/// What one pass deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// CRs of requests finished longer than the TTL ago.
    pub finished: Vec<i64>,
    /// CRs of requests that do not exist.
    pub vanished: Vec<i64>,
}

/// The garbage collector.
pub struct Collector {
    /// The CRs' namespace.
    pub api: Api<AutoApproval>,
    /// The controller's CR cache.
    pub cache: Cache<CachedAutoApproval>,
    /// The store.
    pub store: Database,
    /// The clock.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Metrics,
    /// Its timings and scope, validated at start-up.
    pub settings: GcConfig,
}

impl Collector {
    /// One pass over the cached CRs.
    pub async fn run_once(&self) -> Result<GcReport, DbError> {
        let crs = self.cache.state();
        let ids: Vec<i64> = crs.iter().map(|cr| cr.spec.request_id).collect();
        let mut report = GcReport::default();
        if ids.is_empty() {
            return Ok(report);
        }
        let rows: HashMap<i64, _> = self
            .store
            .request_statuses(&ids)
            .await?
            .into_iter()
            .map(|row| (row.request_id, row))
            .collect();
        let now = self.clock.now();
        for cr in &crs {
            let id = cr.spec.request_id;
            let reason = match rows.get(&id) {
                // A CR created moments ago may name a request not yet
                // visible (or a typo the holder is reporting as Invalid):
                // it gets one interval before it counts as vanished.
                None if self.age(cr, now) < self.settings.interval => continue,
                None => "vanished",
                Some(row) => match &row.status {
                    Ok(status)
                        if !status.is_open() && row.unchanged_for >= self.settings.finished_ttl =>
                    {
                        "finished"
                    }
                    Ok(_) => continue,
                    Err(error) => {
                        warn!(request_id = id, %error, "cannot tell whether the request is finished; CR kept");
                        continue;
                    }
                },
            };
            if self.delete(cr).await {
                self.metrics.cr_collected(reason);
                info!(
                    request_id = id,
                    reason, "AutoApproval deleted by the garbage collector"
                );
                match reason {
                    "vanished" => report.vanished.push(id),
                    _ => report.finished.push(id),
                }
            }
        }
        Ok(report)
    }

    fn age(&self, cr: &CachedAutoApproval, now: chrono::DateTime<chrono::Utc>) -> Duration {
        cr.created_at
            .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
            .and_then(|created| (now - created).to_std().ok())
            .unwrap_or_default()
    }

    /// Deletes exactly the CR seen; false when it is gone, replaced or
    /// the API server refused (logged).
    async fn delete(&self, cr: &CachedAutoApproval) -> bool {
        use kube::ResourceExt;
        crd::delete_seen(&self.api, &cr.name_any(), cr.uid())
            .await
            .unwrap_or_else(|error| {
                warn!(request_id = cr.spec.request_id, %error, "could not delete AutoApproval");
                false
            })
    }
}
