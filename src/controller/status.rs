//! Projecting what the database says about a request onto the CR status:
//! pure logic, so the conditions' transition times are easy to test.

use chrono::{DateTime, Utc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::cached::{CachedStatus, outcome_digest};
use super::crd::{AutoApprovalStatus, Condition, Phase};

/// `t` as a metav1 Time, to the second as the API server keeps it, so a
/// status read back compares equal to the one written.
fn api_time(t: DateTime<Utc>) -> Time {
    Time(Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// What reconcile observed, to be shown in the status.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// The phase.
    pub phase: Phase,
    /// The step last reached.
    pub step: Option<String>,
    /// Retries so far.
    pub retry_count: i32,
    /// When a waiting request is due.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// Why it waits or ended.
    pub reason: Option<String>,
    /// Who holds or last held the claim.
    pub holder: Option<String>,
    /// Shadow mode's would-decision of this attempt, if it made one.
    pub would: Option<Would>,
}

/// What shadow mode would have done, shown beside the phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Would {
    /// `Approve` or `Hold`.
    pub decision: &'static str,
    /// When it would first have approved, if it would have.
    pub approve_at: Option<DateTime<Utc>>,
}

impl Observed {
    /// A phase with nothing else known.
    pub fn phase(phase: Phase, reason: impl Into<Option<String>>) -> Self {
        Self {
            phase,
            step: None,
            retry_count: 0,
            next_retry_time: None,
            reason: reason.into(),
            holder: None,
            would: None,
        }
    }
}

/// The status to write for `observed`, keeping each condition's
/// lastTransitionTime while its status does not change. `since` is `now`:
/// a status is written only when its outcome changed ([`same_outcome`]).
pub fn project(
    previous: Option<&CachedStatus>,
    observed: &Observed,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> AutoApprovalStatus {
    let message = observed.reason.clone().unwrap_or_default();
    let approved = match observed.phase {
        Phase::Approved => "True",
        Phase::Superseded | Phase::Invalid | Phase::Exhausted => "False",
        _ => "Unknown",
    };
    let stalled = match observed.phase {
        Phase::Exhausted | Phase::Invalid | Phase::Paused => "True",
        _ => "False",
    };
    // Ready: nothing more will be done and nothing is wrong.
    let ready = match observed.phase {
        Phase::Approved | Phase::Superseded => "True",
        _ => "False",
    };
    let conditions = [
        ("Ready", ready),
        ("Approved", approved),
        ("Stalled", stalled),
    ]
    .into_iter()
    .map(|(type_, status)| {
        let last_transition_time = previous
            .and_then(|p| p.condition(type_))
            .filter(|c| &*c.status == status)
            .map_or_else(|| api_time(now), |c| c.at.clone());
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: observed.phase.as_str().to_owned(),
            message: message.clone(),
            last_transition_time,
            observed_generation: generation,
        }
    })
    .collect();
    AutoApprovalStatus {
        phase: Some(observed.phase),
        step: observed.step.clone(),
        retry_count: observed.retry_count,
        next_retry_time: observed.next_retry_time,
        last_reason: observed.reason.clone(),
        holder: observed.holder.clone(),
        observed_generation: generation,
        since: DateTime::from_timestamp(now.timestamp(), 0),
        last_retry_request: previous.and_then(|p| p.last_retry_request.as_deref().map(Into::into)),
        // A would-decision stays until the next one: a status written
        // after a restart, or once active, still shows what shadow saw.
        would_decision: match &observed.would {
            Some(would) => Some(would.decision.to_owned()),
            None => previous.and_then(|p| p.would_decision.as_deref().map(Into::into)),
        },
        would_approve_at: observed
            .would
            .as_ref()
            .and_then(|w| w.approve_at)
            .or_else(|| previous.and_then(|p| p.would_approve_at)),
        conditions,
    }
}

/// Whether `status` shows the same outcome as the one the CR shows: same
/// phase, step, reason, conditions, generation and retry request echoed.
/// Then nothing is written and no Event published, whatever moved in the
/// retry count, the schedule or the holder: those are the database's, and
/// the status shows them as of the last change (`since`). This keeps a
/// waiting request's retries from writing to the API server at all.
pub fn same_outcome(shown: Option<&CachedStatus>, status: &AutoApprovalStatus) -> bool {
    shown.is_some_and(|shown| shown.outcome == outcome_digest(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, 9, minute, 0)
            .single()
            .unwrap()
    }

    fn condition<'a>(s: &'a AutoApprovalStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn transition_times_move_only_when_a_condition_changes() {
        let waiting = Observed {
            retry_count: 1,
            next_retry_time: Some(at(10)),
            ..Observed::phase(Phase::RetryWaiting, Some("documents not released".into()))
        };
        let first = project(None, &waiting, Some(1), at(0));
        assert_eq!(condition(&first, "Approved").status, "Unknown");
        assert_eq!(
            condition(&first, "Approved").last_transition_time,
            api_time(at(0))
        );

        let again = project(Some(&CachedStatus::of(&first)), &waiting, Some(1), at(5));
        assert!(
            same_outcome(Some(&CachedStatus::of(&first)), &again),
            "same observation, same outcome: nothing to write"
        );
        assert_eq!(again.conditions, first.conditions);

        let done = project(
            Some(&CachedStatus::of(&again)),
            &Observed::phase(Phase::Approved, None),
            Some(1),
            at(7),
        );
        assert_eq!(condition(&done, "Approved").status, "True");
        assert_eq!(
            condition(&done, "Approved").last_transition_time,
            api_time(at(7))
        );
        assert_eq!(
            condition(&done, "Stalled").last_transition_time,
            api_time(at(0))
        );
        assert_eq!(done.next_retry_time, None);
    }

    #[test]
    fn a_retry_with_the_same_outcome_is_the_same_status_and_a_new_reason_is_not() {
        let waiting = |retry_count, due, reason: &str, holder: &str| Observed {
            retry_count,
            next_retry_time: Some(at(due)),
            holder: Some(holder.into()),
            step: Some("owner".into()),
            ..Observed::phase(Phase::RetryWaiting, Some(reason.to_owned()))
        };
        let first = project(
            None,
            &waiting(1, 10, "documents not released", "r1"),
            Some(1),
            at(0),
        );
        let shown = CachedStatus::of(&first);
        assert!(
            !same_outcome(None, &first),
            "a CR without status shows nothing yet"
        );

        let retried = project(
            Some(&shown),
            &waiting(2, 20, "documents not released", "r2"),
            Some(1),
            at(10),
        );
        assert!(
            same_outcome(Some(&shown), &retried),
            "another retry, another holder, the same outcome: nothing to write"
        );

        let other_reason = project(
            Some(&shown),
            &waiting(3, 30, "e-contract not signed", "r1"),
            Some(1),
            at(20),
        );
        assert!(
            !same_outcome(Some(&shown), &other_reason),
            "a new reason is written"
        );
        assert_eq!(other_reason.since, Some(at(20)));

        let exhausted = project(
            Some(&shown),
            &Observed {
                phase: Phase::Exhausted,
                next_retry_time: None,
                ..waiting(300, 10, "documents not released", "r1")
            },
            Some(1),
            at(30),
        );
        assert!(
            !same_outcome(Some(&shown), &exhausted),
            "a new phase is written"
        );

        let respec = project(
            Some(&shown),
            &waiting(2, 20, "documents not released", "r1"),
            Some(2),
            at(10),
        );
        assert!(
            !same_outcome(Some(&shown), &respec),
            "a new generation is acknowledged"
        );
    }

    #[test]
    fn ready_only_once_nothing_more_will_be_done() {
        for (phase, ready) in [
            (Phase::Approved, "True"),
            (Phase::Superseded, "True"),
            (Phase::Pending, "False"),
            (Phase::InProgress, "False"),
            (Phase::RetryWaiting, "False"),
            (Phase::Exhausted, "False"),
            (Phase::Paused, "False"),
            (Phase::Invalid, "False"),
        ] {
            let s = project(None, &Observed::phase(phase, None), Some(3), at(0));
            let c = condition(&s, "Ready");
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                (ready, phase.as_str()),
                "{phase:?}"
            );
            assert_eq!(c.observed_generation, Some(3));
        }
    }

    #[test]
    fn stalled_phases_need_a_person() {
        for (phase, stalled) in [
            (Phase::Exhausted, "True"),
            (Phase::Invalid, "True"),
            (Phase::Paused, "True"),
            (Phase::RetryWaiting, "False"),
            (Phase::Superseded, "False"),
        ] {
            let s = project(None, &Observed::phase(phase, None), None, at(0));
            assert_eq!(condition(&s, "Stalled").status, stalled, "{phase:?}");
            assert_eq!(condition(&s, "Stalled").reason, phase.as_str());
        }
    }
}
