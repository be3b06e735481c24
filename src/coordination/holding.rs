//! Whether this replica can hold shards at all. A Lease write that keeps failing (the
//! namespace does not exist, the Role refuses a verb) leaves a replica holding nothing while
//! every other check passes: this names the Lease, the verb and the API server's answer, and
//! tells readiness, so "I cannot hold any shard" is never mistaken for "others hold them all".

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Coordinator;
use crate::outage::{Outage, Report};

/// How often a lasting failure to hold shards is logged again.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// A Lease call the API server refused (a conflict is not one: another replica wrote first).
#[derive(Clone, Debug)]
pub(super) struct LeaseFailure {
    lease: String,
    verb: &'static str,
    code: Option<u16>,
    answer: String,
}

/// Since when this replica has held no shard it may claim in while its Lease calls fail,
/// and the last refusal: readiness fails once this lasts `--api-liveness-timeout`.
#[derive(Clone, Debug)]
pub struct Stuck {
    /// When the replica began to be unable to hold any shard.
    pub since: Instant,
    /// The refused call, in words.
    pub why: String,
}

/// What the coordinator remembers of failing Lease calls between turns.
#[derive(Debug)]
pub(super) struct Holding {
    /// The first refusal of the current turn.
    failure: Option<LeaseFailure>,
    /// A Lease call of the current turn got no answer: the turn says nothing either way.
    unanswered: bool,
    outage: Outage,
    stuck: tokio::sync::watch::Sender<Option<Stuck>>,
}

impl Holding {
    /// Nothing failed yet; `stuck` is published to readiness.
    pub(super) fn new(stuck: tokio::sync::watch::Sender<Option<Stuck>>) -> Self {
        Self {
            failure: None,
            unanswered: false,
            outage: Outage::new(REPORT_EVERY),
            stuck,
        }
    }
}

/// What to do about a refusal, in words: the fix an operator applies.
fn hint(verb: &str, code: Option<u16>, namespace: &str) -> String {
    match code {
        Some(403) => format!(
            "the Role bound to this replica's ServiceAccount must grant `{verb}` on leases (coordination.k8s.io) in namespace {namespace}"
        ),
        Some(404) if verb == "create" => {
            format!("namespace {namespace} does not exist: create it, or correct --namespace")
        }
        _ => "see the API server's answer".to_owned(),
    }
}

// === impl Coordinator ===

impl Coordinator {
    /// Records a Lease call that failed (not a 409): counted, and, when the API server
    /// answered it, kept as the turn's refusal if it is the first. A call left unanswered is
    /// an outage of the API server, which the Lease list reports and liveness acts on.
    pub(super) fn lease_call_failed(
        &mut self,
        lease: &str,
        verb: &'static str,
        error: &kube::Error,
    ) {
        self.metrics.lease_renew_failure();
        debug!(lease, verb, %error, "Lease call failed");
        let kube::Error::Api(status) = error else {
            self.holding.unanswered = true;
            return;
        };
        let code = Some(status.code);
        self.holding.failure.get_or_insert_with(|| LeaseFailure {
            lease: lease.to_owned(),
            verb,
            code,
            answer: error.to_string(),
        });
    }

    /// At the end of a turn: says whether Lease calls failed in it (when that begins, every
    /// minute while it lasts, and once when it ends) and publishes whether this replica
    /// holds no shard it may claim in because of it.
    pub(super) fn report_holding(&mut self, sent: Instant) {
        let namespace = self.api.namespace().unwrap_or("default").to_owned();
        let failure = self.holding.failure.take();
        let unanswered = std::mem::take(&mut self.holding.unanswered);
        let workable = self.shards.workable().len();
        if failure.is_none() && unanswered {
            // Neither refused nor proven able: the API server's outage is reported as such.
            return;
        }
        match &failure {
            Some(f) => {
                let hint = hint(f.verb, f.code, &namespace);
                let code = f.code.unwrap_or(0);
                match self.holding.outage.failed(sent) {
                    Report::Began => warn!(
                        namespace, lease = %f.lease, verb = f.verb, code, answer = %f.answer, hint, workable,
                        "cannot hold shards: the API server refused a Lease call"
                    ),
                    Report::Still(for_) => warn!(
                        namespace, lease = %f.lease, verb = f.verb, code, answer = %f.answer, hint, workable,
                        failing_s = for_.as_secs(),
                        "still cannot hold shards: Lease calls keep failing"
                    ),
                    _ => {}
                }
            }
            None => {
                if let Report::Ended(after) = self.holding.outage.succeeded(sent) {
                    info!(
                        namespace,
                        failing_s = after.as_secs(),
                        workable,
                        "Lease calls succeed again: shards can be held"
                    );
                }
            }
        }
        // Holding no shard is normal when others hold them all; it is an outage only
        // while this replica's own Lease calls fail.
        let stuck = failure.filter(|_| workable == 0);
        self.metrics.cannot_hold_shards(stuck.is_some());
        self.holding
            .stuck
            .send_if_modified(|current| match (&stuck, current.as_mut()) {
                (None, None) => false,
                (None, Some(_)) => {
                    *current = None;
                    true
                }
                (Some(f), Some(was)) => {
                    was.why = describe(f, &namespace);
                    false
                }
                (Some(f), None) => {
                    *current = Some(Stuck {
                        since: sent,
                        why: describe(f, &namespace),
                    });
                    true
                }
            });
    }
}

/// A refusal as readiness shows it.
fn describe(f: &LeaseFailure, namespace: &str) -> String {
    format!(
        "the API server refused to {} Lease {namespace}/{}: {} ({})",
        f.verb,
        f.lease,
        f.answer,
        hint(f.verb, f.code, namespace)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_names_its_fix() {
        assert!(hint("update", Some(403), "mydb").contains("must grant `update` on leases"));
        assert!(hint("create", Some(404), "mydb").contains("namespace mydb does not exist"));
        assert_eq!(
            hint("update", Some(500), "mydb"),
            "see the API server's answer"
        );
    }
}
