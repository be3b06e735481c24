//! Fault injection: failing or delaying matching requests, closing watches, and outages (hang or refuse).

use crate::error::ApiError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Which requests a fault applies to; every set field must match (unset = any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Match {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<String>,
    /// Substring of the request path (e.g. `/namespaces/default/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_contains: Option<String>,
    /// Resource plural (e.g. `autoapprovals`, `leases`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

impl Match {
    /// Matches every request.
    pub fn any() -> Self {
        Match::default()
    }
    /// Restricts to one verb.
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.into());
        self
    }
    /// Restricts to one resource plural.
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.into());
        self
    }
    /// Restricts to paths containing a substring.
    pub fn path_contains(mut self, s: &str) -> Self {
        self.path_contains = Some(s.into());
        self
    }
    fn matches(&self, r: &RequestInfo) -> bool {
        self.verb.as_deref().is_none_or(|v| v == r.verb)
            && self.resource.as_deref().is_none_or(|v| v == r.resource)
            && self
                .path_contains
                .as_deref()
                .is_none_or(|v| r.path.contains(v))
    }
}

/// A fault rule as accepted by `POST /_testserver/faults`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultRule {
    /// Which requests.
    #[serde(flatten)]
    pub matcher: Match,
    /// Answer with this HTTP status (500 or 429 typically); None = do not fail (latency only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Delay before answering, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
    /// How many matching requests are affected; None = until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Fraction (0..=1) of matching requests that fail; None = all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
}

/// What the server knows about a request when checking faults.
#[derive(Debug, Clone)]
pub struct RequestInfo {
    /// Kubernetes verb.
    pub verb: String,
    /// Resource plural ("" for discovery and other paths).
    pub resource: String,
    /// Request path.
    pub path: String,
}

/// An outage mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Answering normally.
    None,
    /// Requests wait, unanswered, until the outage ends.
    Hang,
    /// New connections are dropped and open connections are reset until the outage ends.
    Refuse,
}

#[derive(Debug)]
struct Inner {
    rules: Vec<FaultRule>,
    outage: Outage,
    until: Option<Instant>,
}

/// A cloneable handle to control faults of a running server.
#[derive(Debug, Clone)]
pub struct Faults {
    inner: Arc<Mutex<Inner>>,
    outage_tx: Arc<watch::Sender<u64>>,
    close_tx: Arc<watch::Sender<u64>>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            inner: Arc::new(Mutex::new(Inner {
                rules: vec![],
                outage: Outage::None,
                until: None,
            })),
            outage_tx: Arc::new(watch::channel(0).0),
            close_tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl Faults {
    /// Fails the next `n` matching requests with `status` (e.g. 500 or 429).
    pub fn fail_next(&self, n: u32, status: u16, matcher: Match) {
        self.add(FaultRule {
            matcher,
            status: Some(status),
            count: Some(n),
            ..FaultRule::default()
        });
    }
    /// Fails every matching request with `status` until [`Faults::clear`].
    pub fn fail_always(&self, status: u16, matcher: Match) {
        self.add(FaultRule {
            matcher,
            status: Some(status),
            ..FaultRule::default()
        });
    }
    /// Fails a random `fraction` (0..=1) of matching requests with `status` until [`Faults::clear`].
    pub fn fail_fraction(&self, fraction: f64, status: u16, matcher: Match) {
        self.add(FaultRule {
            matcher,
            status: Some(status),
            probability: Some(fraction.clamp(0.0, 1.0)),
            ..FaultRule::default()
        });
    }
    /// Delays every matching request by `latency` until [`Faults::clear`].
    pub fn add_latency(&self, latency: Duration, matcher: Match) {
        self.add(FaultRule {
            matcher,
            latency_ms: latency.as_millis() as u64,
            ..FaultRule::default()
        });
    }
    /// Adds a rule.
    pub fn add(&self, rule: FaultRule) {
        self.inner.lock().rules.push(rule);
    }
    /// The active rules.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.inner.lock().rules.clone()
    }
    /// Removes every rule and ends any outage.
    pub fn clear(&self) {
        self.inner.lock().rules.clear();
        self.resume();
    }
    /// Closes every open watch stream now (clients see the stream end).
    pub fn close_watches(&self) {
        self.close_tx.send_modify(|n| *n += 1);
    }
    /// Stops answering: requests hang until `resume` or until `for_` elapses (None = until resume).
    pub fn hang(&self, for_: Option<Duration>) {
        self.set_outage(Outage::Hang, for_);
    }
    /// Refuses service: new connections are dropped, open ones reset, until `resume` or `for_` elapses.
    pub fn refuse(&self, for_: Option<Duration>) {
        self.set_outage(Outage::Refuse, for_);
        self.close_watches();
    }
    /// Ends an outage.
    pub fn resume(&self) {
        self.set_outage(Outage::None, None);
    }
    fn set_outage(&self, o: Outage, for_: Option<Duration>) {
        {
            let mut g = self.inner.lock();
            g.outage = o;
            g.until = for_.map(|d| Instant::now() + d);
        }
        self.outage_tx.send_modify(|n| *n += 1);
    }
    /// The current outage mode (expired outages end by themselves).
    pub fn outage(&self) -> Outage {
        let mut g = self.inner.lock();
        if let Some(u) = g.until
            && Instant::now() >= u
        {
            g.outage = Outage::None;
            g.until = None;
        }
        g.outage
    }
    pub(crate) fn close_signal(&self) -> watch::Receiver<u64> {
        self.close_tx.subscribe()
    }
    /// Waits while a hang outage lasts.
    pub(crate) async fn wait_hang(&self) {
        let mut rx = self.outage_tx.subscribe();
        loop {
            let until = {
                let _ = self.outage();
                let g = self.inner.lock();
                if g.outage != Outage::Hang {
                    return;
                }
                g.until
            };
            match until {
                Some(u) => {
                    let _ = tokio::time::timeout_at(u.into(), rx.changed()).await;
                }
                None => {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    /// Applies latency and failure rules to a request; returns the error to answer with, if any.
    pub(crate) async fn check(&self, info: &RequestInfo) -> Option<ApiError> {
        self.wait_hang().await;
        let (latency, fail) = {
            let mut g = self.inner.lock();
            let mut latency = 0;
            let mut fail = None;
            for r in g.rules.iter_mut() {
                if !r.matcher.matches(info) || r.count == Some(0) {
                    continue;
                }
                latency = latency.max(r.latency_ms);
                if let Some(st) = r.status
                    && fail.is_none()
                    && r.probability.is_none_or(|p| rand::random::<f64>() < p)
                {
                    fail = Some(st);
                    if let Some(c) = r.count.as_mut() {
                        *c -= 1;
                    }
                } else if r.status.is_none()
                    && let Some(c) = r.count.as_mut()
                {
                    *c -= 1;
                }
            }
            g.rules.retain(|r| r.count != Some(0));
            (latency, fail)
        };
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        fail.map(|code| {
            let mut e = match code {
                429 => ApiError::new(429, "TooManyRequests", "the server has received too many requests and has asked us to try again later (injected fault)"),
                503 => ApiError::new(503, "ServiceUnavailable", "the server is currently unable to handle the request (injected fault)"),
                504 => ApiError::new(504, "Timeout", "the server was unable to return a response in the time allotted (injected fault)"),
                c => ApiError::new(c, "InternalError", "Internal error occurred: injected fault"),
            };
            if code == 429 {
                e.retry_after = Some(1);
            }
            e
        })
    }
}
