//! Shadow mode's records: what the controller would have done with each
//! request (migration 0006 on PostgreSQL, 0005 on MySQL), the hand-over
//! when it starts acting, and the rows `shadow-report` compares with what
//! actually happened to the requests.

use chrono::{DateTime, Utc};

use super::DbError;
use crate::domain::RequestType;

/// What shadow mode would have done with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WouldDecision {
    /// Every gate passed: it would have approved.
    Approve,
    /// A gate (or a failure) held it: it would have waited.
    Hold,
}

impl WouldDecision {
    /// The spelling in `auto_approve_shadow.decision`.
    pub fn as_str(self) -> &'static str {
        match self {
            WouldDecision::Approve => "APPROVE",
            WouldDecision::Hold => "HOLD",
        }
    }

    /// The spelling in metrics, Events and the CR status.
    pub fn label(self) -> &'static str {
        match self {
            WouldDecision::Approve => "approve",
            WouldDecision::Hold => "hold",
        }
    }
}

/// One evaluation in shadow mode, to record.
#[derive(Clone, Debug)]
pub struct ShadowRecord<'a> {
    /// The request evaluated.
    pub request_id: i64,
    /// Its type.
    pub request_type: RequestType,
    /// What it would have done.
    pub decision: WouldDecision,
    /// The step whose gate held it, or the last step when approved.
    pub step: &'a str,
    /// Why it was held, or what approving would have made.
    pub reason: &'a str,
}

/// A request shadow mode evaluated, beside what happened to it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ShadowOutcome {
    /// The request.
    pub request_id: i64,
    /// Its type, as recorded.
    pub request_type: String,
    /// The latest would-decision, `APPROVE` or `HOLD`.
    pub decision: String,
    /// The step of the latest evaluation.
    pub step: String,
    /// Its reason.
    pub reason: String,
    /// The first evaluation.
    pub first_seen_at: DateTime<Utc>,
    /// The first evaluation at which every gate passed, if one did.
    pub would_approve_at: Option<DateTime<Utc>>,
    /// The request's status now, through the binding (`None`: gone).
    pub status: Option<String>,
    /// When it was decided, if it was.
    pub decided_at: Option<DateTime<Utc>>,
    /// Who decided it, if it was.
    pub decided_by: Option<String>,
}

interface! {
    /// Shadow records: see the methods on [`Database`].
    trait Shadows {
        /// Records an evaluation in shadow mode: the latest decision, step
        /// and reason, and the first time it would have approved, which a
        /// later evaluation never moves. The request's would-approve time as
        /// now recorded.
        #[tracing::instrument(name = "store.record_shadow", skip_all)]
        fn record_shadow(
            &self,
            record: &ShadowRecord<'_>,
            now: DateTime<Utc>,
        ) -> Result<Option<DateTime<Utc>>, DbError>;
        /// A controller that acts again: every request shadow mode left
        /// waiting (held, or left alone once it would have approved) is due
        /// at `now`, and its record marked handed over. The rows made due.
        #[tracing::instrument(name = "store.hand_over_shadow", skip_all)]
        fn hand_over_shadow(&self, now: DateTime<Utc>) -> Result<u64, DbError>;
        /// The requests first evaluated in shadow mode at or after `since`,
        /// each with its status, decided_at and decided_by now.
        #[tracing::instrument(name = "store.shadow_outcomes", skip_all)]
        fn shadow_outcomes(&self, since: DateTime<Utc>) -> Result<Vec<ShadowOutcome>, DbError>;
    }
}
