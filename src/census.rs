//! The census behind the state metrics: every replica pings its database
//! pools (`autoapproval_database_up`); the leader alone counts requests by
//! state and the backlog's age, so a sum over replicas counts once, and a
//! replica that stops leading withdraws its numbers instead of leaving
//! stale ones behind.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::clock::SharedClock;
use crate::db::Database;
use crate::telemetry::Metrics;

/// How long the pings of one census may take before every pool counts as down.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// What the census reads and how often.
#[derive(Clone, Debug)]
pub struct CensusConfig {
    /// Delay between two censuses (--census-interval).
    pub interval: Duration,
    /// The candidate window (--window): older requests are not backlog.
    pub window: Duration,
    /// Retries at which a request is exhausted (--retry-limit).
    pub retry_limit: i32,
}

/// Counts and publishes; see the module doc.
pub struct Census {
    /// Where it counts.
    pub store: Database,
    /// "Now" for the backlog's age.
    pub clock: SharedClock,
    /// Where it publishes.
    pub metrics: Metrics,
    /// Interval, window and retry limit.
    pub config: CensusConfig,
}

// === impl Census ===

impl Census {
    /// Runs until `stopping` is cancelled: a census every interval, one at once when
    /// leadership is gained, and the numbers withdrawn when it is lost.
    pub async fn run(self, mut leader: watch::Receiver<bool>, stopping: CancellationToken) {
        let mut every = tokio::time::interval(self.config.interval);
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                changed = leader.changed() => {
                    if changed.is_err() {
                        self.metrics.census_withdrawn();
                        return;
                    }
                    if !*leader.borrow_and_update() {
                        self.metrics.census_withdrawn();
                        continue;
                    }
                }
                () = stopping.cancelled() => {
                    self.metrics.census_withdrawn();
                    return;
                }
            }
            let leading = *leader.borrow_and_update();
            self.once(leading).await;
        }
    }

    /// One census: the pings, and the counts when `leading`.
    pub async fn once(&self, leading: bool) {
        match tokio::time::timeout(PING_TIMEOUT, self.store.ping_pools()).await {
            Ok(answers) => {
                for (pool, answer) in answers {
                    if let Err(error) = &answer {
                        warn!(pool, %error, "census: the database does not answer");
                    }
                    self.metrics.database_up(pool, answer.is_ok());
                }
            }
            Err(_) => {
                warn!(
                    timeout_s = PING_TIMEOUT.as_secs(),
                    "census: the database does not answer in time"
                );
                for (pool, _) in self.store.pools() {
                    self.metrics.database_up(pool, false);
                }
            }
        }
        if !leading {
            self.metrics.census_withdrawn();
            return;
        }
        let now = self.clock.now();
        let window_start = crate::clock::before(now, self.config.window);
        let limit = self.config.retry_limit;
        let counted = async {
            let census = self.store.census(limit).await?;
            let oldest = self.store.oldest_eligible(window_start, now, limit).await?;
            Ok::<_, crate::db::DbError>((census, oldest))
        };
        match counted.await {
            Ok((census, oldest)) => {
                let age = oldest
                    .and_then(|at| (now - at).to_std().ok())
                    .unwrap_or_default();
                self.metrics.census(&census, age);
            }
            Err(error) => {
                // Unknown is better shown as absent than as the last count.
                warn!(%error, "census failed; the state metrics are withdrawn until the next one");
                self.metrics.census_withdrawn();
            }
        }
    }
}
