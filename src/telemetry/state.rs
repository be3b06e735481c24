//! The metrics of what the replica and its leader observe rather than
//! count: the census, the database's reachability, the pools, K, and the
//! API server requests the kube client layer reports.

use std::time::Duration;

use crate::db::Pool;

use super::{KubeLabels, Metrics, NoLabels, PoolLabel, StateLabels, VerbLabel};
use crate::db::RequestCensus;

// === impl Metrics ===

impl Metrics {
    /// Records K, the configured shard count.
    pub fn shards(&self, shard_count: u32) {
        self.shard_count.set(i64::from(shard_count));
    }

    /// Publishes the leader's census: requests by state and the backlog's
    /// age. Every state is set, zeros included, so a panel has its lines.
    pub fn census(&self, census: &RequestCensus, backlog_age: Duration) {
        let set = |state: &str, reason_class: &str, n: i64| {
            self.requests
                .get_or_create(&StateLabels {
                    state: state.into(),
                    reason_class: reason_class.into(),
                })
                .set(n);
        };
        set("in_progress", "", census.in_progress);
        set("waiting", "transient", census.waiting_transient);
        set("waiting", "condition_not_met", census.waiting_condition);
        set("exhausted", "", census.exhausted);
        self.backlog_age
            .get_or_create(&NoLabels::new())
            .set(backlog_age.as_secs_f64());
    }

    /// Withdraws the census (this replica no longer leads, or could not
    /// count): the series disappear instead of showing stale numbers, so a
    /// sum over replicas counts the leader's only.
    pub fn census_withdrawn(&self) {
        self.requests.clear();
        self.backlog_age.clear();
    }

    /// Shows the fleet's pause as last read (`None`: the fleet runs).
    pub fn fleet_pause(&self, pause: Option<&crate::db::FleetPause>) {
        self.fleet_paused.set(i64::from(pause.is_some()));
        self.fleet_paused_since
            .set(pause.map_or(0, |p| p.paused_at.timestamp()));
    }

    /// Records whether the database behind `pool` answered the census ping.
    pub fn database_up(&self, pool: &str, up: bool) {
        self.database_up
            .get_or_create(&PoolLabel { pool: pool.into() })
            .set(i64::from(up));
    }

    /// Exports the size of `pool` under `name` from now on, read at every scrape.
    pub fn watch_pool(&self, name: &'static str, pool: Pool) {
        if let Ok(mut pools) = self.pools.lock() {
            pools.retain(|(n, _)| *n != name);
            pools.push((name, pool));
        }
    }

    /// Counts one request to the API server; `status` is the HTTP code or `error`.
    pub fn kube_request(&self, verb: &str, status: &str, took: Option<Duration>) {
        self.kube_requests
            .get_or_create(&KubeLabels {
                verb: verb.into(),
                status: status.into(),
            })
            .inc();
        if let Some(took) = took {
            self.kube_request_duration
                .get_or_create(&VerbLabel { verb: verb.into() })
                .observe(took.as_secs_f64());
        }
    }

    pub(super) fn refresh_pools(&self) {
        let Ok(pools) = self.pools.lock() else { return };
        for (name, pool) in pools.iter() {
            let label = PoolLabel {
                pool: (*name).into(),
            };
            self.pool_connections
                .get_or_create(&label)
                .set(i64::from(pool.size()));
            self.pool_idle
                .get_or_create(&label)
                .set(i64::try_from(pool.num_idle()).unwrap_or(i64::MAX));
            self.pool_max
                .get_or_create(&label)
                .set(i64::from(pool.max_connections()));
        }
    }
}
