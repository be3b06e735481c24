//! The seed's new design as the seed built it on MySQL 8 with Redis, run on
//! the lab's MariaDB: every replica polls the candidates (the read pool)
//! every 10 s with a fixed delay after a random first delay; per candidate
//! it takes a Redis lock (`SET key value NX PX ttl`), re-checks the request
//! and its state row on the writer, records IN_PROGRESS (an INSERT for a
//! new request, a plain UPDATE of a waiting one: the lock is what makes it
//! exclusive), runs the chain, and releases the lock; a turn queries again,
//! up to three rounds, while a round claimed nothing. A cleanser under a
//! ShedLock lock revives stuck claims and deletes finished rows.
//!
//! The chain, its fenced writes and the candidate query are ours (the same
//! as every design of the benchmark); the lock, the re-check and the state
//! write are the seed's, with their SQL here. Failed claims are counted by
//! the reasons the seed names: lock contention (Redis refused the lock) and
//! stale candidates (the writer's re-check found the request taken, done
//! or not due: the candidate was read before another replica's claim).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use sqlx::MySqlPool;
use tracing::{debug, info, warn};

use autoapproval::approval::{TurnConfig, WOKEN_BEFORE_COMPLETION};
use autoapproval::clock::SystemClock;
use autoapproval::db::{Completion, Database, DbError, RetryWrite};
use autoapproval::domain::{Candidate, Claim, Fence, RequestType};
use autoapproval::external::ExternalSystems;
use autoapproval::processors::{Chain, ChainContext, ChainError, ChainOutcome, RetryReason, Seen};
use autoapproval::retry::{RetryClass, RetryPolicy};
use autoapproval::telemetry::Metrics;

use crate::harness::SeedQueue;

/// The seed's "up to three queries a turn".
pub const MAX_ROUNDS: usize = 3;
/// The cleanser's ShedLock name.
const CLEANSER_LOCK: &str = "autoApproveCleanser";
/// Compare-and-delete: a lock is released only by the holder that took it
/// (its own value), never one that expired and was taken by another.
const UNLOCK: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0"#;

/// Why the design stopped or an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedRedisError {
    /// Redis could not be reached or answered an error.
    #[error("Redis at {url}: {source}")]
    Redis {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
    /// The store failed.
    #[error(transparent)]
    Database(#[from] DbError),
}

/// The per-request locks in Redis.
#[derive(Clone)]
pub struct RedisLocks {
    conn: redis::aio::MultiplexedConnection,
    url: String,
    prefix: String,
    ttl: Duration,
}

impl RedisLocks {
    /// A connection to `url`; locks are `<prefix>:<request id>`, expiring after `ttl`.
    pub async fn connect(url: &str, prefix: &str, ttl: Duration) -> Result<Self, SeedRedisError> {
        let fail = |source| SeedRedisError::Redis {
            url: url.to_owned(),
            source,
        };
        let client = redis::Client::open(url).map_err(fail)?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(fail)?;
        Ok(Self {
            conn,
            url: url.to_owned(),
            prefix: prefix.to_owned(),
            ttl,
        })
    }

    /// One round trip, to tell that Redis answers.
    pub async fn ping(&self) -> Result<(), SeedRedisError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|source| SeedRedisError::Redis {
                url: self.url.clone(),
                source,
            })?;
        Ok(())
    }

    fn key(&self, request_id: i64) -> String {
        format!("{}:{request_id}", self.prefix)
    }

    /// `SET key value NX PX ttl`: true when this call took the lock.
    pub async fn try_lock(&self, request_id: i64, value: &str) -> redis::RedisResult<bool> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(request_id))
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.is_some())
    }

    /// Releases the lock when it is still `value`'s.
    pub async fn unlock(&self, request_id: i64, value: &str) -> redis::RedisResult<()> {
        let _: i64 = redis::Script::new(UNLOCK)
            .key(self.key(request_id))
            .arg(value)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

/// Failed claims by the seed's reasons, served on `/metrics`.
#[derive(Debug, Default)]
pub struct FailedClaims {
    /// Redis refused the lock: another replica holds the request.
    pub lock_contention: AtomicU64,
    /// The writer's re-check refused it: the (replica) candidate was stale.
    pub stale_candidate: AtomicU64,
    /// Redis could not be asked: the request waits for the next turn.
    pub redis_unavailable: AtomicU64,
}

/// The metric the bench reads the failed claims from.
pub const FAILED_CLAIMS_METRIC: &str = "seed_failed_claims_total";

impl FailedClaims {
    /// As Prometheus text, one series per reason.
    pub fn encode(&self) -> String {
        [
            ("lock_contention", &self.lock_contention),
            ("stale_candidate", &self.stale_candidate),
            ("redis_unavailable", &self.redis_unavailable),
        ]
        .iter()
        .map(|(reason, n)| {
            format!(
                "{FAILED_CLAIMS_METRIC}{{reason=\"{reason}\"}} {}\n",
                n.load(Ordering::Relaxed)
            )
        })
        .collect()
    }
}

/// How one candidate ended for this worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Locked, re-checked, recorded and run.
    Claimed,
    /// Not claimed (counted in [`FailedClaims`]).
    Failed,
}

/// The request and its state row on the writer, as the re-check reads them.
#[derive(sqlx::FromRow)]
struct Recheck {
    status: String,
    request_type: String,
    state_id: Option<i64>,
    state_status: Option<String>,
    due: Option<i64>,
    retry_count: Option<i32>,
    transient_streak: Option<i32>,
}

/// One replica of the design.
pub struct SeedWorker {
    /// Candidate queries (read pool) and the chain's reads and fenced writes.
    pub store: Database,
    /// The writer, for the re-check and the state write.
    pub writer: MySqlPool,
    /// The external systems.
    pub external: ExternalSystems,
    /// The chain's metrics.
    pub metrics: Metrics,
    /// The per-request locks.
    pub locks: RedisLocks,
    /// The failed claims, by reason.
    pub failed: Arc<FailedClaims>,
    /// The replica's name: the state rows' holder and the locks' value.
    pub holder: String,
    /// Candidate limits and attempts at once.
    pub turn: TurnConfig,
    /// Retry waits and limit (ours, the seed's 10 minutes and 300).
    pub retry: RetryPolicy,
    /// The chain.
    pub chain: Chain,
}

impl SeedWorker {
    /// One turn: query, attempt every candidate, and query again while a
    /// round claimed nothing, up to [`MAX_ROUNDS`].
    pub async fn turn(&self) -> Result<(), DbError> {
        for _ in 0..MAX_ROUNDS {
            let now = Utc::now();
            let mut candidates = Vec::new();
            for request_type in RequestType::AUTO_APPROVABLE {
                let query = self.turn.query(request_type, now, self.retry.limit, None);
                candidates.extend(self.store.candidates(&query).await?);
            }
            if candidates.is_empty() {
                return Ok(());
            }
            let claimed = futures::stream::iter(candidates.iter().map(|c| self.attempt(c)))
                .buffer_unordered(self.turn.concurrency.max(1))
                .filter(|a| std::future::ready(*a == Attempt::Claimed))
                .count()
                .await;
            if claimed > 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Lock, re-check, record, run, unlock.
    pub async fn attempt(&self, candidate: &Candidate) -> Attempt {
        let id = candidate.request_id;
        match self.locks.try_lock(id, &self.holder).await {
            Ok(true) => {}
            Ok(false) => return self.failed(&self.failed.lock_contention),
            // No lock, no work: later is safe, twice is not (the seed's rule).
            Err(error) => {
                warn!(request_id = id, %error, "Redis unavailable; skipped this turn");
                return self.failed(&self.failed.redis_unavailable);
            }
        }
        let attempt = match self.claim(id).await {
            Ok(Some(claim)) => {
                self.run(&claim).await;
                Attempt::Claimed
            }
            Ok(None) => self.failed(&self.failed.stale_candidate),
            Err(error) => {
                warn!(request_id = id, %error, "re-check failed");
                Attempt::Failed
            }
        };
        if let Err(error) = self.locks.unlock(id, &self.holder).await {
            // It expires after its ttl.
            warn!(request_id = id, %error, "could not release the Redis lock");
        }
        attempt
    }

    fn failed(&self, counter: &AtomicU64) -> Attempt {
        counter.fetch_add(1, Ordering::Relaxed);
        Attempt::Failed
    }

    /// The re-check on the writer and the IN_PROGRESS write; `None` when the
    /// candidate is no longer one.
    async fn claim(&self, request_id: i64) -> Result<Option<Claim>, DbError> {
        let fail = |operation| move |source| DbError::Database { operation, source };
        let now = Utc::now();
        let row: Option<Recheck> = sqlx::query_as(
            "SELECT r.status, r.request_type, s.id AS state_id, s.status AS state_status,
                    CAST(s.next_retry_time <= ? AS SIGNED) AS due, s.retry_count, s.transient_streak
               FROM approval_request r
               LEFT JOIN auto_approve_state s ON s.request_id = r.id
              WHERE r.id = ?",
        )
        .bind(now.naive_utc())
        .bind(request_id)
        .fetch_optional(&self.writer)
        .await
        .map_err(fail("re-check a candidate on the writer"))?;
        let Some(row) = row else { return Ok(None) };
        if !matches!(row.status.as_str(), "PENDING" | "RETRY" | "ING") {
            return Ok(None);
        }
        let fence = Fence::new(self.holder.clone(), 0);
        let state_id = match (row.state_id, row.state_status.as_deref()) {
            (None, _) => {
                let inserted = sqlx::query(
                    "INSERT INTO auto_approve_state
                         (request_id, request_type, status, holder, fencing_token, created_at, modified_at)
                     VALUES (?, ?, 'IN_PROGRESS', ?, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
                )
                .bind(request_id)
                .bind(&row.request_type)
                .bind(&self.holder)
                .execute(&self.writer)
                .await;
                match inserted {
                    Ok(done) => done.last_insert_id() as i64,
                    // UNIQUE (request_id): another replica created it first.
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => return Ok(None),
                    Err(source) => {
                        return Err(DbError::Database {
                            operation: "record a claim",
                            source,
                        });
                    }
                }
            }
            (Some(state_id), Some("RETRY_WAITING"))
                if row.due == Some(1) && row.retry_count.unwrap_or(0) < self.retry.limit =>
            {
                // Not conditional on the status: the lock made it exclusive.
                sqlx::query(
                    "UPDATE auto_approve_state
                        SET status = 'IN_PROGRESS', holder = ?, fencing_token = 0, claim_nonce = 0,
                            modified_at = UTC_TIMESTAMP(6), woken_at = NULL
                      WHERE id = ?",
                )
                .bind(&self.holder)
                .bind(state_id)
                .execute(&self.writer)
                .await
                .map_err(fail("record a claim"))?;
                state_id
            }
            _ => return Ok(None),
        };
        // The chain reads the facts after this claim: the wakes recorded
        // before it are consumed here, as the product's claim does, or the
        // completion would take them for a change during the attempt.
        sqlx::query("DELETE FROM auto_approve_wake WHERE request_id = ?")
            .bind(request_id)
            .execute(&self.writer)
            .await
            .map_err(fail("consume the wakes before the claim"))?;
        Ok(Some(Claim {
            state_id,
            request_id,
            retry_count: row.retry_count.unwrap_or(0),
            transient_streak: row.transient_streak.unwrap_or(0),
            fence,
            // The seed's claim is its Redis lock: the row's nonce stays 0.
            nonce: 0,
            requested_at: None,
        }))
    }

    /// Runs the chain under `claim` and writes its outcome; a failure leaves
    /// the row IN_PROGRESS for the cleanser, as in the seed.
    async fn run(&self, claim: &Claim) {
        let cx = ChainContext {
            store: &self.store,
            external: &self.external,
            claim,
            clock: &SystemClock,
            metrics: &self.metrics,
            held: &|| true,
            seen: &Seen::default(),
            shadow: false,
        };
        let outcome = match self.chain.run(&cx, &|_| {}).await {
            Ok(outcome) => outcome,
            Err(ChainError::FenceLost(id) | ChainError::ShardLost(id)) => {
                warn!(request_id = id, "state row taken over mid-chain; stopping");
                return;
            }
            Err(ChainError::Database(error)) => {
                warn!(request_id = claim.request_id, %error, "chain failed; the cleanser revives it");
                return;
            }
        };
        let written = match outcome {
            ChainOutcome::Success(facts) => self
                .store
                .complete(claim, &facts)
                .await
                .map(|c| c == Completion::Approved),
            ChainOutcome::Retry { step, reason } => self.retry(claim, step.as_str(), &reason).await,
            // The seed knows no wake: a fact changed between steps waits
            // as any unmet condition.
            ChainOutcome::Changed { step } => {
                let reason = RetryReason::condition(WOKEN_BEFORE_COMPLETION);
                self.retry(claim, step.as_str(), &reason).await
            }
            ChainOutcome::Closed(_) | ChainOutcome::Vanished => self.store.drop_claim(claim).await,
        };
        match written {
            Ok(true) => debug!(request_id = claim.request_id, "attempt ended"),
            Ok(false) => warn!(
                request_id = claim.request_id,
                "state row changed under the claim"
            ),
            Err(error) => warn!(request_id = claim.request_id, %error, "outcome not written"),
        }
    }

    async fn retry(
        &self,
        claim: &Claim,
        step: &str,
        reason: &RetryReason,
    ) -> Result<bool, DbError> {
        let now = Utc::now();
        let transient = reason.class == RetryClass::Transient;
        let streak = if transient {
            claim.transient_streak + 1
        } else {
            0
        };
        let write = RetryWrite {
            next_retry_time: self.retry.next_retry_time(
                now,
                reason.class,
                streak,
                &mut rand::rng(),
            ),
            transient,
            counted: reason.counted,
            reason: &reason.reason,
            step,
        };
        Ok(self
            .store
            .schedule_retry(claim, &write, now)
            .await?
            .is_some())
    }
}

/// The worker's loop: a random first delay up to one period, then turns
/// with a fixed delay between the end of one and the start of the next.
pub async fn poll_loop(worker: &SeedWorker, period: Duration) {
    tokio::time::sleep(period.mul_f64(rand::random::<f64>())).await;
    loop {
        if let Err(error) = worker.turn().await {
            warn!(%error, "poll turn failed");
        }
        tokio::time::sleep(period).await;
    }
}

/// The cleanser: every `period`, on whichever replica takes the ShedLock
/// lock, stuck claims (untouched for `stuck_after`) go back to
/// RETRY_WAITING with a memo and rows of finished requests are deleted.
pub async fn cleanser(
    store: &Database,
    locks: &SeedQueue,
    holder: &str,
    period: Duration,
    stuck_after: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        match locks.try_lock(CLEANSER_LOCK, holder, period).await {
            Ok(Some(lock)) => {
                match store.cleanse(stuck_after, now()).await {
                    Ok(report) => info!(
                        recovered = report.recovered.len(),
                        deleted = report.deleted,
                        "cleanser ran"
                    ),
                    Err(error) => warn!(%error, "cleanser failed"),
                }
                if let Err(error) = locks.unlock(lock, holder, period / 2).await {
                    warn!(%error, "could not release the cleanser's lock");
                }
            }
            Ok(None) => {}
            Err(error) => warn!(%error, "could not take the cleanser's lock"),
        }
    }
}

fn now() -> DateTime<Utc> {
    Utc::now()
}
