//! The CR garbage collector, run by the leader: the CR of a finished
//! request goes after a TTL, the CR of a request that no longer exists goes
//! at the first pass after it is one interval old, the CR of an open request
//! no longer worked (abandoned) goes once it is idle for
//! `--abandoned-after`. Deleting loses nothing: the DB is the truth, and
//! discovery puts back the CR of any request that is still open and not
//! abandoned, and creates it again when an abandoned one is a candidate
//! again. Each pass also deletes the rows of our tables nothing needs any
//! more (`Database::collect_rows`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::reflector::Store as Cache;
use tracing::{info, warn};

use super::cached::CachedAutoApproval;
use super::crd::{self, AutoApproval};
use crate::clock::SharedClock;
use crate::db::{AbandonedQuery, Database, DbError, RowsCollected};
use crate::telemetry::Metrics;

/// When the leader's garbage collector runs and how long a finished CR stays.
#[derive(Clone, Debug)]
pub struct GcConfig {
    /// Delay between passes.
    pub interval: Duration,
    /// How long the CR of a finished request stays.
    pub finished_ttl: Duration,
    /// When an open request's CR counts as abandoned, and how long the rows
    /// of a decided request stay.
    pub abandoned: Abandonment,
}

/// When the CR of an open request is abandoned (`--abandoned-after`):
/// Exhausted, or out of the candidate window, and idle that long. The same
/// period bounds the rows kept for a decided request.
#[derive(Clone, Debug)]
pub struct Abandonment {
    /// Idle this long (request and state row unchanged).
    pub after: Duration,
    /// The candidate window (`--window`).
    pub window: Duration,
    /// The retry limit (`--retry-limit`): a request at it is Exhausted.
    pub retry_limit: i32,
}

impl Abandonment {
    /// The query of abandoned requests at `now`.
    pub fn query(&self, now: chrono::DateTime<chrono::Utc>) -> AbandonedQuery {
        AbandonedQuery {
            window_start: crate::clock::before(now, self.window),
            retry_limit: self.retry_limit,
            idle_for: self.after,
        }
    }
}

/// What one pass deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// CRs of requests finished longer than the TTL ago.
    pub finished: Vec<i64>,
    /// CRs of requests that do not exist.
    pub vanished: Vec<i64>,
    /// CRs of open requests no longer worked.
    pub abandoned: Vec<i64>,
    /// Rows of our tables nothing needs any more.
    pub rows: RowsCollected,
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
        let mut report = GcReport {
            rows: self.collect_rows().await?,
            ..GcReport::default()
        };
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
        let abandoned = self.abandoned(&rows, now).await;
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
                    Ok(_) if abandoned.contains(&id) => "abandoned",
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
                    "abandoned" => report.abandoned.push(id),
                    _ => report.finished.push(id),
                }
            }
        }
        Ok(report)
    }

    /// The open requests among `rows` whose CR may go as abandoned; none
    /// when the database cannot tell (logged): a CR kept costs little.
    async fn abandoned(
        &self,
        rows: &HashMap<i64, crate::db::RequestStatusRow>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> HashSet<i64> {
        let open: Vec<i64> = rows
            .values()
            .filter(|row| matches!(&row.status, Ok(status) if status.is_open()))
            .map(|row| row.request_id)
            .collect();
        let query = self.settings.abandoned.query(now);
        match self.store.abandoned_among(&open, &query).await {
            Ok(ids) => ids.into_iter().collect(),
            Err(error) => {
                warn!(%error, "cannot tell which requests are abandoned; their CRs kept");
                HashSet::new()
            }
        }
    }

    /// Deletes the rows of our tables nothing needs any more: the bodies
    /// and pauses of requests decided (or gone) `--abandoned-after` ago,
    /// and what else [`RowsCollected`] names.
    async fn collect_rows(&self) -> Result<RowsCollected, DbError> {
        let rows = self
            .store
            .collect_rows(self.settings.abandoned.after)
            .await?;
        for (table, n) in [
            ("auto_approve_sent", rows.sent),
            ("auto_approve_pause", rows.pauses),
            ("shard_fence", rows.fences),
            ("autoapproval_manual_token", rows.manual_tokens),
        ] {
            if n > 0 {
                self.metrics.rows_collected(table, n);
                info!(table, rows = n, "rows collected");
            }
        }
        Ok(rows)
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
