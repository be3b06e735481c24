//! The Lease primitive, no policy: names, labels, and taking, renewing and
//! releasing one Lease with optimistic concurrency (a 409 means someone
//! else wrote it first). Which Leases to hold is decided elsewhere.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use tracing::{debug, info, warn};

use super::{Coordinator, FIELD_MANAGER, MEMBER_LEASE_PREFIX, ROLE_LABEL, SHARD_LEASE_PREFIX};

// === impl Coordinator ===

impl Coordinator {
    /// Writes us as the holder of a free or expired Lease (creating it when
    /// absent); `None` when another replica was faster or the call failed.
    pub(super) async fn take(
        &mut self,
        name: &str,
        role: &str,
        existing: Option<Lease>,
        generation: i64,
        now: DateTime<Utc>,
    ) -> Option<Lease> {
        let spec = LeaseSpec {
            holder_identity: Some(self.identity().to_owned()),
            lease_duration_seconds: Some(duration_secs(self.settings.lease_duration)),
            acquire_time: Some(micro_time(now)),
            renew_time: Some(micro_time(now)),
            lease_transitions: Some(i32::try_from(generation).unwrap_or(i32::MAX)),
            ..LeaseSpec::default()
        };
        let verb = if existing.is_some() {
            "update"
        } else {
            "create"
        };
        let result = match existing {
            Some(mut lease) => {
                lease.spec = Some(spec);
                // Taken now: a failed fence's note has served its purpose.
                if let Some(annotations) = lease.metadata.annotations.as_mut() {
                    annotations.remove(super::TAKEN_FROM_ANNOTATION);
                }
                mark_protocol(&mut lease);
                self.api.replace(name, &post_params(), &lease).await
            }
            None => {
                let mut lease = Lease {
                    metadata: lease_meta(name, role),
                    spec: Some(spec),
                };
                mark_protocol(&mut lease);
                self.api.create(&post_params(), &lease).await
            }
        };
        match result {
            Ok(lease) => Some(lease),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(lease = name, "another replica took the Lease first");
                None
            }
            Err(error) => {
                self.lease_call_failed(name, verb, &error);
                None
            }
        }
    }

    /// Renews a Lease we hold; false when it turned out to be someone else's.
    pub(super) async fn renew(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.held_leases.get(name).cloned() else {
            return Ok(false);
        };
        for _ in 0..2 {
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(micro_time(now));
            }
            mark_protocol(&mut lease);
            match self.api.replace(name, &post_params(), &lease).await {
                Ok(renewed) => {
                    self.held_leases.insert(name.to_owned(), renewed);
                    return Ok(true);
                }
                // Someone wrote it since: still held only if it still names us
                // at the same generation.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let fresh = self.api.get(name).await?;
                    let still_held = fresh.spec.as_ref().is_some_and(|s| {
                        s.holder_identity.as_deref() == Some(self.identity())
                            && s.lease_transitions
                                == lease.spec.as_ref().and_then(|s| s.lease_transitions)
                    });
                    if !still_held {
                        return Ok(false);
                    }
                    lease = fresh;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(false)
    }

    pub(super) async fn release(
        &mut self,
        name: &str,
        now: DateTime<Utc>,
    ) -> Result<(), kube::Error> {
        let Some(mut lease) = self.held_leases.remove(name) else {
            return Ok(());
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(micro_time(now));
        }
        let written = self.api.replace(name, &post_params(), &lease).await;
        if let Err(error) = &written
            && !written_by_another(error)
        {
            self.unreleased.insert(name.to_owned(), lease);
        }
        written.map(drop)
    }

    /// Writes again the releases that failed. The write is conditional on
    /// the version we last wrote, so a Lease taken since (by another
    /// replica, or by us again) answers 409 and is left as it is.
    pub(super) async fn retry_releases(&mut self, now: DateTime<Utc>) {
        let pending: Vec<String> = self.unreleased.keys().cloned().collect();
        for name in pending {
            let Some(mut lease) = self.unreleased.remove(&name) else {
                continue;
            };
            if self.held_leases.contains_key(&name) {
                continue;
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.renew_time = Some(micro_time(now));
            }
            match self.api.replace(&name, &post_params(), &lease).await {
                Ok(_) => info!(lease = %name, "Lease released on a later try"),
                Err(error) if written_by_another(&error) => {
                    debug!(lease = %name, %error, "a Lease whose release failed was written since");
                }
                Err(error) => {
                    debug!(lease = %name, %error, "releasing the Lease failed again; next turn");
                    self.unreleased.insert(name, lease);
                }
            }
        }
    }
}

/// Deletes `lease` only as it was read: when it was written since (a
/// member renewed just after it was judged departed), the API server
/// answers 409 and the Lease stays.
pub async fn delete_unchanged(api: &Api<Lease>, lease: &Lease) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: lease.metadata.resource_version.clone(),
            uid: lease.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    let name = lease.metadata.name.as_deref().unwrap_or_default();
    api.delete(name, &params).await.map(drop)
}

/// Another live replica holds our name: its member Lease changed while we
/// watched it (the name, then the Lease's).
#[derive(Debug, thiserror::Error)]
#[error(
    "--replica-name {0:?} is the name of another live replica (its member Lease {1} is being renewed): \
     give each replica its own name (the pod's name, $POD_NAME, is the default)"
)]
pub struct NameInUse(String, String);

/// Returns once no live replica holds `identity`'s member Lease, or refuses
/// the name. A Lease naming `identity` that the clock says is older than
/// `lease_duration`, or that stays unchanged for that long (a former run of
/// this replica, killed), is free; one that changes meanwhile is renewed by
/// a live replica of the same name, which would take this one's shards as
/// its own former run's, and claim under the same holder.
pub async fn refuse_a_live_namesake(
    api: &Api<Lease>,
    identity: &str,
    lease_duration: Duration,
    retry_period: Duration,
) -> Result<(), NameInUse> {
    let name = member_lease_name(identity);
    // An API server that does not answer cannot tell: the start goes on,
    // and the Lease loop reports the outage.
    let read = async || match api.get_opt(&name).await {
        Ok(lease) => lease,
        Err(error) => {
            warn!(lease = %name, %error, "cannot read this replica's member Lease to check its name is free");
            None
        }
    };
    let holds = |lease: &Lease| {
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        let renewed = spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.as_microsecond());
        let recent = renewed.is_some_and(|at| {
            let age_us = Utc::now().timestamp_micros().saturating_sub(at);
            u128::try_from(age_us).unwrap_or(0) < lease_duration.as_micros()
        });
        holder == Some(identity) && recent
    };
    let Some(first) = read().await else {
        return Ok(());
    };
    if !holds(&first) {
        return Ok(());
    }
    info!(
        lease = %name,
        "a recently renewed member Lease has this replica's name: watching it for a lease duration"
    );
    let started = tokio::time::Instant::now();
    while started.elapsed() < lease_duration {
        tokio::time::sleep(retry_period.min(lease_duration)).await;
        let Some(now) = read().await else {
            return Ok(());
        };
        if now.metadata.resource_version != first.metadata.resource_version {
            return if holds(&now) {
                Err(NameInUse(identity.to_owned(), name))
            } else {
                Ok(())
            };
        }
    }
    Ok(())
}

/// Whether a write failed because the Lease changed or went meanwhile.
fn written_by_another(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 || status.code == 404)
}

/// The Lease name of a shard.
pub fn shard_lease_name(shard: u32) -> String {
    format!("{SHARD_LEASE_PREFIX}{shard}")
}

/// The member Lease name of a replica: its identity made a valid name.
pub fn member_lease_name(identity: &str) -> String {
    let mut name: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    name.truncate(253 - MEMBER_LEASE_PREFIX.len());
    format!("{MEMBER_LEASE_PREFIX}{}", name.trim_end_matches(['-', '.']))
}

pub(super) fn shard_of_lease(lease: &Lease, shard_count: u32) -> Option<u32> {
    let name = lease.metadata.name.as_deref()?;
    let shard: u32 = name.strip_prefix(SHARD_LEASE_PREFIX)?.parse().ok()?;
    (shard < shard_count).then_some(shard)
}

/// The annotation naming the coordination protocol of the replica that
/// wrote a Lease. Protocol 2 renews shard Leases only when they change hands
/// (the member Lease vouches for them); a replica without the annotation
/// renews each shard Lease every turn and takes one it sees unrenewed for
/// the lease duration, so while such a replica lives, protocol 2 renews its
/// shard Leases every turn too.
pub const PROTOCOL_ANNOTATION: &str = "autoapproval.io/coordination-protocol";
const PROTOCOL: &str = "2";

/// Marks a Lease as written by this protocol.
pub(super) fn mark_protocol(lease: &mut Lease) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(PROTOCOL_ANNOTATION.to_owned(), PROTOCOL.to_owned());
}

/// Whether a Lease was written by a replica of this protocol or a later one.
pub(super) fn speaks_protocol(lease: &Lease) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROTOCOL_ANNOTATION))
        .is_some_and(|v| v.parse::<u32>().is_ok_and(|n| n >= 2))
}

pub(super) fn is_member(lease: &Lease) -> bool {
    lease
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(MEMBER_LEASE_PREFIX))
}

pub(super) fn lease_meta(name: &str, role: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(
            [
                (ROLE_LABEL.to_owned(), role.to_owned()),
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "autoapproval".to_owned(),
                ),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    }
}

pub(super) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

pub(super) fn micro_time(at: DateTime<Utc>) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(at.timestamp_micros())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

pub(super) fn duration_secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn member_lease_names_are_valid_names() {
        assert_eq!(
            member_lease_name("pod-7f9c"),
            "autoapproval-member-pod-7f9c"
        );
        assert_eq!(
            member_lease_name("Host_Name."),
            "autoapproval-member-host-name"
        );
        assert!(member_lease_name(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    pub(super) fn shard_leases_are_recognised_only_within_k() {
        let lease = |name: &str| Lease {
            metadata: lease_meta(name, "shard"),
            spec: None,
        };
        assert_eq!(shard_of_lease(&lease("autoapproval-shard-3"), 16), Some(3));
        assert_eq!(shard_of_lease(&lease("autoapproval-shard-16"), 16), None);
        assert_eq!(shard_of_lease(&lease("autoapproval-leader"), 16), None);
    }
}
