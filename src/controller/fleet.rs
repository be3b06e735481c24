//! The fleet's brake as one replica sees it. The pause itself is a row in
//! the database that every claim statement tests, so it binds every replica
//! the moment it commits; this module reads it once per poll period for
//! the metrics and the log, and tells discovery of a resume, so that the
//! requests the pause held back are claimed at once instead of at the
//! sweep.
//!
//! The CRs are not rewritten when the fleet pauses (100,000 status writes
//! at once): a request whose reconcile comes while the fleet is paused
//! shows `Paused` with the pause in its reason, the others keep what they
//! showed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::db::{Database, FleetPause};
use crate::telemetry::Metrics;

/// What the reconciles and discovery share about the fleet's pause.
#[derive(Debug, Default)]
pub struct FleetBrake {
    /// A claim was refused by the pause since the watch last read none.
    held_back: AtomicBool,
    /// Discovery's cue: the pause that held requests back is over.
    resumed: Notify,
}

impl FleetBrake {
    /// Notes that the pause refused a claim: its CR waits (`await_change`)
    /// for the whole turn discovery runs at the resume.
    pub fn held_back(&self) {
        self.held_back.store(true, Ordering::Release);
    }

    /// Resolves once a pause that held requests back has ended (a permit is
    /// kept when discovery is busy).
    pub async fn resumed(&self) {
        self.resumed.notified().await;
    }

    /// Takes in what the watch read: true when the pause is over and held
    /// requests back, and discovery was told.
    fn observe(&self, pause: Option<&FleetPause>) -> bool {
        if pause.is_some() || !self.held_back.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.resumed.notify_one();
        true
    }
}

/// How the pause read now differs from the one read before, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Paused (or found paused at start-up).
    Paused,
    /// Another pause than the one seen before (resumed and paused again
    /// between two reads).
    Replaced,
    /// The pause ended.
    Resumed,
}

/// The change from `before` to `now`, if any.
pub(crate) fn change(before: Option<&FleetPause>, now: Option<&FleetPause>) -> Option<Change> {
    match (before, now) {
        (None, Some(_)) => Some(Change::Paused),
        (Some(_), None) => Some(Change::Resumed),
        (Some(a), Some(b)) if a != b => Some(Change::Replaced),
        _ => None,
    }
}

/// Reads the fleet's pause at once and then every `period` (`--poll-period`)
/// until `stopping`: the metrics show it, the log says when it begins and
/// ends, and the brake hears of it. A failed read keeps what was shown.
pub async fn watch(
    brake: Arc<FleetBrake>,
    store: Database,
    metrics: Metrics,
    period: Duration,
    stopping: CancellationToken,
) {
    let mut shown: Option<FleetPause> = None;
    loop {
        match store.fleet_pause().await {
            Ok(now) => {
                metrics.fleet_pause(now.as_ref());
                match (change(shown.as_ref(), now.as_ref()), &now) {
                    (Some(Change::Paused | Change::Replaced), Some(pause)) => warn!(
                        paused_by = %pause.paused_by,
                        reason = pause.reason.as_deref().unwrap_or(""),
                        since = %pause.paused_at,
                        "{}: nothing is claimed until `autoapproval resume --all`",
                        pause.describe()
                    ),
                    (Some(Change::Resumed), _) => {
                        info!("the fleet's pause is over: claims start again")
                    }
                    _ => {}
                }
                if brake.observe(now.as_ref()) {
                    info!("the requests the pause held back are looked for now");
                }
                shown = now;
            }
            Err(error) => {
                warn!(%error, "cannot read whether the fleet is paused; next poll retries")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stopping.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn pause(by: &str) -> FleetPause {
        FleetPause {
            paused_by: by.into(),
            reason: Some("month-end close".into()),
            paused_at: chrono::Utc
                .with_ymd_and_hms(2026, 12, 7, 10, 0, 0)
                .single()
                .unwrap(),
        }
    }

    #[test]
    fn each_change_of_the_pause_is_named_once() {
        let (ann, bob) = (pause("ann"), pause("bob"));
        for (before, now, expected) in [
            (None, None, None),
            (None, Some(&ann), Some(Change::Paused)),
            (Some(&ann), Some(&ann), None),
            (Some(&ann), Some(&bob), Some(Change::Replaced)),
            (Some(&ann), None, Some(Change::Resumed)),
        ] {
            assert_eq!(change(before, now), expected, "{before:?} -> {now:?}");
        }
    }

    #[test]
    fn discovery_hears_of_a_resume_only_when_the_pause_held_something_back() {
        let brake = FleetBrake::default();
        assert!(!brake.observe(None), "nothing held back");
        brake.held_back();
        assert!(!brake.observe(Some(&pause("ann"))), "still paused");
        assert!(brake.observe(None), "resumed with requests held back");
        assert!(!brake.observe(None), "told once");
        // A claim refused just before the read that saw the resume is
        // caught by the next read.
        brake.held_back();
        assert!(brake.observe(None));
    }

    #[test]
    fn a_pause_is_described_with_who_since_when_and_why() {
        assert_eq!(
            pause("ann").describe(),
            "fleet paused by ann since 2026-12-07T10:00:00Z: month-end close"
        );
        let quiet = FleetPause {
            reason: None,
            ..pause("ann")
        };
        assert_eq!(
            quiet.describe(),
            "fleet paused by ann since 2026-12-07T10:00:00Z"
        );
    }
}
