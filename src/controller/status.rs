//! Projecting what the database says about a request onto the CR status:
//! pure logic, so the conditions' transition times are easy to test.

use chrono::{DateTime, Utc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::cached::CachedStatus;
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
/// lastTransitionTime while its status does not change.
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
        assert_eq!(
            again, first,
            "same observation, same status: nothing to write"
        );

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
