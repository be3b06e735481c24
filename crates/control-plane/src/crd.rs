//! Installing a CRD and waiting until it is served: established, and (when asked)
//! its schema published in the OpenAPI that `kubectl explain` and validation read,
//! which lags the Established condition by a moment.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

use crate::Error;

/// How long a created CRD may take to be established and published.
pub(crate) const SERVED_WITHIN: Duration = Duration::from_secs(60);

/// Where the OpenAPI publishes a CRD's schema, and a word the schema holds.
pub struct OpenApiProbe<'a> {
    /// The document's path, `/openapi/v3/apis/<group>/<version>`.
    pub path: &'a str,
    /// A word of the CRD's schema (a field name) that shows it is there.
    pub needle: &'a str,
}

/// Creates `crd` with `client` (either server: the real kube-apiserver or the
/// test API server) and waits until it is established and, with `openapi`, its
/// schema published.
pub async fn install_crd(
    client: &kube::Client,
    crd: &CustomResourceDefinition,
    openapi: Option<OpenApiProbe<'_>>,
) -> Result<(), Error> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), crd)
        .await
        .map_err(|source| Error::Kube {
            what: format!("creating the CRD {name}"),
            source,
        })?;
    let deadline = tokio::time::Instant::now() + SERVED_WITHIN;
    let not_served = |waiting_for: &str| Error::CrdNotServed {
        name: name.clone(),
        waiting_for: waiting_for.to_owned(),
    };
    while !established(&crds, &name).await {
        if tokio::time::Instant::now() > deadline {
            return Err(not_served("its Established condition"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(probe) = openapi else {
        return Ok(());
    };
    while !published(client, &probe).await {
        if tokio::time::Instant::now() > deadline {
            return Err(not_served(&format!("its schema at {}", probe.path)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn established(crds: &Api<CustomResourceDefinition>, name: &str) -> bool {
    let Ok(crd) = crds.get(name).await else {
        return false;
    };
    crd.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True")
}

async fn published(client: &kube::Client, probe: &OpenApiProbe<'_>) -> bool {
    let Ok(request) = http::Request::get(probe.path).body(Vec::new()) else {
        return false;
    };
    client
        .request_text(request)
        .await
        .is_ok_and(|text| text.contains(probe.needle))
}
