//! The poll turn of the seed's design: every candidate query, then an
//! attempt at each candidate. Only the lab's baselines and the tests run it
//! (feature `test-support`); the controller finds work through discovery.

use std::sync::Arc;

use futures::StreamExt;
use tracing::warn;

use super::{Approver, AttemptOutcome, TurnConfig};
use crate::db::{DbError, ShardFilter};
use crate::domain::{Candidate, Fence, RequestType};

/// What one turn did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnReport {
    /// Candidates returned.
    pub candidates: usize,
    /// Outcomes per request, in completion order.
    pub outcomes: Vec<(i64, AttemptOutcome)>,
    /// Attempts that failed with a store error (already released).
    pub errors: usize,
}

impl TurnReport {
    /// How many attempts won their claim.
    pub fn claimed(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|(_, o)| {
                !matches!(
                    o,
                    AttemptOutcome::NotClaimed | AttemptOutcome::FleetPaused(_)
                )
            })
            .count()
    }
}

/// Runs the candidate query of each auto-approvable type and attempts every
/// candidate, `concurrency` at a time.
pub async fn run_turn(
    approver: &Arc<Approver>,
    turn: &TurnConfig,
    fence: &Fence,
    shards: Option<ShardFilter>,
) -> Result<TurnReport, DbError> {
    let now = approver.clock.now();
    let mut candidates = Vec::new();
    for request_type in RequestType::AUTO_APPROVABLE {
        let query = turn.query(
            request_type,
            now,
            approver.config.retry.limit,
            shards.clone(),
        );
        let found = approver.store.candidates(&query).await?;
        approver
            .metrics
            .candidates(request_type.as_str(), found.len() as u64);
        candidates.extend(found);
    }
    Ok(attempt_all(approver, &candidates, fence, turn.concurrency).await)
}

/// Attempts each candidate, `concurrency` at a time; one failing or
/// malformed request never stops the others.
pub async fn attempt_all(
    approver: &Arc<Approver>,
    candidates: &[Candidate],
    fence: &Fence,
    concurrency: usize,
) -> TurnReport {
    let mut report = TurnReport {
        candidates: candidates.len(),
        ..TurnReport::default()
    };
    let mut attempts = futures::stream::iter(
        candidates
            .iter()
            .map(|c| async move { (c.request_id, approver.attempt(c, fence).await) }),
    )
    .buffer_unordered(concurrency.max(1));
    while let Some((request_id, result)) = attempts.next().await {
        match result {
            Ok(outcome) => report.outcomes.push((request_id, outcome)),
            Err(error) => {
                warn!(request_id, %error, "attempt failed");
                report.errors += 1;
            }
        }
    }
    report
}
