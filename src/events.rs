//! Events (`events.k8s.io/v1`) published without a per-object cache.
//!
//! kube-runtime's `Recorder` keeps every Event it published for six minutes,
//! keyed by object and reason, to turn a repeat into a series patch, and
//! scans that whole cache on every publish. With one RetryScheduled Event
//! per waiting request that is one full Event (about 1 KB) per CR held in
//! every replica, and a scan of all of them per Event. Our repeats are rare
//! (a retry is ten minutes apart by default, beyond those six minutes), so
//! each Event is simply created: the same one write the Recorder makes for
//! a first occurrence, and nothing kept.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// Creates Events as one reporting controller and instance.
#[derive(Clone)]
pub struct Publisher {
    client: kube::Client,
    reporter: Reporter,
}

impl Publisher {
    /// Events name `reporter` as their reporting controller and instance.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Creates one Event about `regarding`, in its namespace ("default"
    /// for a cluster-scoped object).
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &self.event(event, regarding))
            .await?;
        Ok(())
    }

    /// The Event object, shaped as kube-runtime's Recorder shapes a first
    /// occurrence: named after the object and the time in nanoseconds.
    fn event(&self, event: &Event, regarding: &ObjectReference) -> K8sEvent {
        let now = Timestamp::now();
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: event.secondary.clone(),
            ..K8sEvent::default()
        }
    }
}
