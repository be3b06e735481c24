//! HTTP implementations of the external-system traits over reqwest, with a
//! per-call timeout, a per-system in-flight limit and error classification.
//!
//! Wire format (camelCase JSON, served by `crate::sim` too):
//!
//! | call | request | 2xx answer |
//! | --- | --- | --- |
//! | `contract_status` | `GET {esign}/esign/contracts/{ref}` | `{"contractRef": "c-1", "status": "SIGNED"}` |
//! | `create_owner` | `POST {owner}/owners` `{"requestId": 42, "businessName": "…"}` | `{"ownerNumber": 10001}` |
//! | `create_store` | `POST {store}/stores` `{"requestId": 42, "ownerNumber": 10001, "storeName": "…"}` | `{"storeNumber": 50001}` |
//! | `lookup_store` | `GET {store}/stores/{n}` | `{"storeNumber": 50001, "open": true}`, or 404 |
//! | `approve_campaign` | `POST {ad}/campaigns/approvals` `{"requestId": 42, "storeNumber": 50001}` | `{"campaignId": "cmp-1"}` |
//!
//! Every call carries `Authorization: Bearer <token>` when a token is set and
//! every POST carries `Idempotency-Key`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tracing::debug;

use super::{
    AdClient, CampaignApproval, ContractStatus, ESignClient, ErrorKind, ExternalError,
    ExternalSystems, IdempotencyKey, NewOwner, NewStore, OwnerClient, StoreClient, StoreInfo,
    System,
};

/// Header carrying the idempotency key of a mutation.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// How much of an error body goes into an error message.
const ERROR_BODY_PREVIEW: usize = 200;

// === impl ExternalConfig ===

/// Where the four external systems live and how hard we may call them.
#[derive(clap::Args, Clone, Debug)]
pub struct ExternalConfig {
    /// Base URL of the e-sign service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_ESIGN_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub esign_url: String,
    /// Bearer token for the e-sign service.
    #[arg(long, env = "AUTOAPPROVAL_ESIGN_TOKEN", hide_env_values = true)]
    pub esign_token: Option<Secret>,
    /// Base URL of the owner service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_OWNER_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub owner_url: String,
    /// Bearer token for the owner service.
    #[arg(long, env = "AUTOAPPROVAL_OWNER_TOKEN", hide_env_values = true)]
    pub owner_token: Option<Secret>,
    /// Base URL of the store service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_STORE_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub store_url: String,
    /// Bearer token for the store service.
    #[arg(long, env = "AUTOAPPROVAL_STORE_TOKEN", hide_env_values = true)]
    pub store_token: Option<Secret>,
    /// Base URL of the ad service.
    #[arg(
        long,
        env = "AUTOAPPROVAL_AD_URL",
        default_value = "http://127.0.0.1:8090"
    )]
    pub ad_url: String,
    /// Bearer token for the ad service.
    #[arg(long, env = "AUTOAPPROVAL_AD_TOKEN", hide_env_values = true)]
    pub ad_token: Option<Secret>,
    /// Timeout of one external call, connect to last body byte (e.g. 500ms, 5s, 2m).
    #[arg(
        long,
        env = "AUTOAPPROVAL_EXTERNAL_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub external_timeout: Duration,
    /// Maximum calls in flight to each external system at once.
    #[arg(long, env = "AUTOAPPROVAL_EXTERNAL_CONCURRENCY", default_value_t = 32)]
    pub external_concurrency: usize,
}

impl ExternalConfig {
    /// All four systems at one base URL (the simulator), no tokens, default limits.
    pub fn all_at(base_url: impl Into<String>) -> Self {
        let url = base_url.into();
        Self {
            esign_url: url.clone(),
            esign_token: None,
            owner_url: url.clone(),
            owner_token: None,
            store_url: url.clone(),
            store_token: None,
            ad_url: url,
            ad_token: None,
            external_timeout: Duration::from_secs(5),
            external_concurrency: 32,
        }
    }

    /// The same token for all four systems.
    pub fn with_token(mut self, token: &str) -> Self {
        let secret = Some(Secret::new(token));
        self.esign_token = secret.clone();
        self.owner_token = secret.clone();
        self.store_token = secret.clone();
        self.ad_token = secret;
        self
    }

    /// Checks every value; the error names the offending flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (flag, url) in [
            ("--esign-url", &self.esign_url),
            ("--owner-url", &self.owner_url),
            ("--store-url", &self.store_url),
            ("--ad-url", &self.ad_url),
        ] {
            parse_base_url(flag, url)?;
        }
        if self.external_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.external_concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency);
        }
        Ok(())
    }
}

/// A bad external-system configuration, naming the flag to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A base URL that is not an absolute http(s) URL.
    #[error("{flag}: {value:?} is not an http(s) URL: {reason}")]
    InvalidUrl {
        /// The flag that carried it.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A token that cannot be sent in an HTTP header.
    #[error("{flag}: the token contains characters not allowed in an HTTP header")]
    InvalidToken {
        /// The flag that carried it.
        flag: &'static str,
    },
    /// `--external-timeout 0`.
    #[error("--external-timeout must be greater than zero")]
    ZeroTimeout,
    /// `--external-concurrency 0`.
    #[error("--external-concurrency must be at least 1")]
    ZeroConcurrency,
    /// reqwest could not build its client (TLS set-up).
    #[error("building the HTTP client for {system}: {source}")]
    Client {
        /// The system the client was for.
        system: System,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
}

fn parse_base_url(flag: &'static str, value: &str) -> Result<Url, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        flag,
        value: value.to_owned(),
        reason,
    };
    let url = Url::parse(value).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?} is not http or https",
            url.scheme()
        )));
    }
    if url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(invalid("no host".to_owned()));
    }
    Ok(url)
}

// === impl Secret ===

/// A credential: usable, but printed as `***` by `Debug` and `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The credential itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

// === durations ===

/// A duration that `parse_duration` refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. 500ms, 5s, 2m, 1m30s)")]
pub struct DurationError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses `500ms`, `5s`, `2m`, `1h`, `1m30s`, `250us`, `0`; whole numbers only.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        let part = match unit {
            "ns" => Some(Duration::from_nanos(value)),
            "us" | "µs" => Some(Duration::from_micros(value)),
            "ms" => Some(Duration::from_millis(value)),
            "s" | "sec" => Some(Duration::from_secs(value)),
            "m" | "min" => value.checked_mul(60).map(Duration::from_secs),
            "h" => value.checked_mul(3600).map(Duration::from_secs),
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| err("too large"))?;
    }
    Ok(total)
}

/// Formats a duration so that `parse_duration` reads it back: `30s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    if nanos == 0 {
        format!("{}s", d.as_secs())
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", d.as_micros())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

// === classification ===

/// How a non-2xx status is classified: 408, 429 and 5xx are worth retrying,
/// other 4xx mean the downstream refused this input. Anything else (an
/// unfollowed redirect, 1xx) is a set-up problem that retrying may outlive.
pub fn classify_status(status: StatusCode) -> ErrorKind {
    match status.as_u16() {
        408 | 429 => ErrorKind::Transient,
        400..=499 => ErrorKind::Permanent,
        _ => ErrorKind::Transient,
    }
}

// === wire shapes ===

/// JSON shapes on the wire, shared with the simulator so the two cannot drift.
pub mod wire {
    use serde::{Deserialize, Serialize};

    use crate::external::ContractStatus;

    /// `GET /esign/contracts/{ref}` answer.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ContractStatusReply {
        /// The contract asked about.
        pub contract_ref: String,
        /// Its status.
        pub status: ContractStatus,
    }

    /// `POST /owners` body.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CreateOwner {
        /// The request the owner is for.
        pub request_id: i64,
        /// The business name.
        pub business_name: String,
    }

    /// `POST /owners` answer.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct OwnerCreated {
        /// The new (or replayed) owner number.
        pub owner_number: i64,
    }

    /// `POST /stores` body.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CreateStore {
        /// The request the store is for.
        pub request_id: i64,
        /// The owner of the store.
        pub owner_number: i64,
        /// The store's name.
        pub store_name: String,
    }

    /// `POST /stores` answer.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StoreCreated {
        /// The new (or replayed) store number.
        pub store_number: i64,
    }

    /// `GET /stores/{n}` answer.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Store {
        /// The store's number.
        pub store_number: i64,
        /// Whether it is open.
        pub open: bool,
    }

    /// `POST /campaigns/approvals` body.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ApproveCampaign {
        /// The request the approval is for.
        pub request_id: i64,
        /// The advertised store.
        pub store_number: i64,
    }

    /// `POST /campaigns/approvals` answer.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CampaignApproved {
        /// The new (or replayed) campaign id.
        pub campaign_id: String,
    }
}

// === impl HttpExternalSystems ===

/// Builds the HTTP-backed [`ExternalSystems`].
pub struct HttpExternalSystems;

impl HttpExternalSystems {
    /// Validates `config` and builds one client per system.
    pub fn build(config: &ExternalConfig) -> Result<ExternalSystems, ConfigError> {
        config.validate()?;
        let endpoint = |system, flag, url: &str, token_flag, token: &Option<Secret>| {
            Endpoint::new(system, flag, url, token_flag, token.as_ref(), config)
        };
        Ok(ExternalSystems {
            esign: Arc::new(HttpESign(endpoint(
                System::ESign,
                "--esign-url",
                &config.esign_url,
                "--esign-token",
                &config.esign_token,
            )?)),
            owner: Arc::new(HttpOwner(endpoint(
                System::Owner,
                "--owner-url",
                &config.owner_url,
                "--owner-token",
                &config.owner_token,
            )?)),
            store: Arc::new(HttpStore(endpoint(
                System::Store,
                "--store-url",
                &config.store_url,
                "--store-token",
                &config.store_token,
            )?)),
            ad: Arc::new(HttpAd(endpoint(
                System::Ad,
                "--ad-url",
                &config.ad_url,
                "--ad-token",
                &config.ad_token,
            )?)),
        })
    }
}

/// One system's connection: base URL, credentials, timeout and in-flight limit.
struct Endpoint {
    system: System,
    base: Url,
    client: reqwest::Client,
    auth: Option<HeaderValue>,
    timeout: Duration,
    in_flight: Semaphore,
}

/// A call that got an HTTP answer, whatever its status.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

impl Endpoint {
    fn new(
        system: System,
        url_flag: &'static str,
        url: &str,
        token_flag: &'static str,
        token: Option<&Secret>,
        config: &ExternalConfig,
    ) -> Result<Self, ConfigError> {
        let base = parse_base_url(url_flag, url)?;
        let auth = token
            .filter(|t| !t.expose().is_empty())
            .map(|t| {
                HeaderValue::from_str(&format!("Bearer {}", t.expose()))
                    .map(|mut v| {
                        v.set_sensitive(true);
                        v
                    })
                    .map_err(|_| ConfigError::InvalidToken { flag: token_flag })
            })
            .transpose()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.external_timeout)
            // A redirect would be a misconfiguration; surface it instead of following.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("autoapproval/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| ConfigError::Client { system, source })?;
        Ok(Self {
            system,
            base,
            client,
            auth,
            timeout: config.external_timeout,
            in_flight: Semaphore::new(config.external_concurrency),
        })
    }

    fn error(&self, operation: &'static str, kind: ErrorKind, message: String) -> ExternalError {
        ExternalError {
            system: self.system,
            operation,
            kind,
            message,
        }
    }

    /// `base` + path segments, each percent-encoded.
    fn url(&self, operation: &'static str, segments: &[&str]) -> Result<Url, ExternalError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| {
                self.error(
                    operation,
                    ErrorKind::Permanent,
                    "base URL cannot take a path".into(),
                )
            })?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// Sends one request under the in-flight limit and the per-call timeout.
    async fn send<B: Serialize + ?Sized>(
        &self,
        operation: &'static str,
        request_id: Option<i64>,
        method: Method,
        url: Url,
        key: Option<&IdempotencyKey>,
        body: Option<&B>,
    ) -> Result<Answer, ExternalError> {
        let mut request = self
            .client
            .request(method.clone(), url.clone())
            .timeout(self.timeout);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        if let Some(key) = key {
            let value = HeaderValue::from_str(key.as_str()).map_err(|_| {
                self.error(
                    operation,
                    ErrorKind::Permanent,
                    format!(
                        "idempotency key {:?} is not a valid header value",
                        key.as_str()
                    ),
                )
            })?;
            request = request.header(IDEMPOTENCY_KEY_HEADER, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }

        // The semaphore is never closed, so acquire cannot fail in practice.
        let _permit = self.in_flight.acquire().await.map_err(|_| {
            self.error(
                operation,
                ErrorKind::Transient,
                "client is shutting down".into(),
            )
        })?;
        let started = Instant::now();
        debug!(system = %self.system, operation, request_id, %method, %url, "external call");
        let response = request
            .send()
            .await
            .map_err(|e| self.transport_error(operation, &e))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(operation, &e))?
            .to_vec();
        debug!(
            system = %self.system,
            operation,
            request_id,
            status = status.as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "external call answered"
        );
        Ok(Answer { status, body })
    }

    fn transport_error(&self, operation: &'static str, e: &reqwest::Error) -> ExternalError {
        let what = if e.is_timeout() {
            format!("timed out after {}", format_duration(self.timeout))
        } else if e.is_connect() {
            format!("connect failed: {}", error_chain(e))
        } else {
            format!("request failed: {}", error_chain(e))
        };
        debug!(system = %self.system, operation, error = %what, "external call failed");
        self.error(operation, ErrorKind::Transient, what)
    }

    /// A 2xx body as `T`, or the classified error.
    fn decode<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        answer: Answer,
    ) -> Result<T, ExternalError> {
        if !answer.status.is_success() {
            let kind = classify_status(answer.status);
            let message = format!("HTTP {}: {}", answer.status, preview(&answer.body));
            debug!(system = %self.system, operation, ?kind, %message, "external call refused");
            return Err(self.error(operation, kind, message));
        }
        serde_json::from_slice(&answer.body).map_err(|e| {
            // A garbled answer to a good request: the next try may read a good one.
            self.error(
                operation,
                ErrorKind::Transient,
                format!("malformed {} answer: {e}", answer.status),
            )
        })
    }
}

/// The error and its causes on one line: reqwest's own message is terse.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The start of an error body, for messages.
fn preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(ERROR_BODY_PREVIEW) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

// === the four clients ===

struct HttpESign(Endpoint);
struct HttpOwner(Endpoint);
struct HttpStore(Endpoint);
struct HttpAd(Endpoint);

#[async_trait]
impl ESignClient for HttpESign {
    async fn contract_status(&self, contract_ref: &str) -> Result<ContractStatus, ExternalError> {
        const OP: &str = "contract_status";
        let url = self.0.url(OP, &["esign", "contracts", contract_ref])?;
        let answer = self
            .0
            .send::<()>(OP, None, Method::GET, url, None, None)
            .await?;
        let reply: wire::ContractStatusReply = self.0.decode(OP, answer)?;
        Ok(reply.status)
    }
}

#[async_trait]
impl OwnerClient for HttpOwner {
    async fn create_owner(
        &self,
        key: &IdempotencyKey,
        owner: &NewOwner,
    ) -> Result<i64, ExternalError> {
        const OP: &str = "create_owner";
        let url = self.0.url(OP, &["owners"])?;
        let body = wire::CreateOwner {
            request_id: owner.request_id,
            business_name: owner.business_name.clone(),
        };
        let answer = self
            .0
            .send(
                OP,
                Some(owner.request_id),
                Method::POST,
                url,
                Some(key),
                Some(&body),
            )
            .await?;
        let reply: wire::OwnerCreated = self.0.decode(OP, answer)?;
        Ok(reply.owner_number)
    }
}

#[async_trait]
impl StoreClient for HttpStore {
    async fn create_store(
        &self,
        key: &IdempotencyKey,
        store: &NewStore,
    ) -> Result<i64, ExternalError> {
        const OP: &str = "create_store";
        let url = self.0.url(OP, &["stores"])?;
        let body = wire::CreateStore {
            request_id: store.request_id,
            owner_number: store.owner_number,
            store_name: store.store_name.clone(),
        };
        let answer = self
            .0
            .send(
                OP,
                Some(store.request_id),
                Method::POST,
                url,
                Some(key),
                Some(&body),
            )
            .await?;
        let reply: wire::StoreCreated = self.0.decode(OP, answer)?;
        Ok(reply.store_number)
    }

    async fn lookup_store(&self, store_number: i64) -> Result<Option<StoreInfo>, ExternalError> {
        const OP: &str = "lookup_store";
        let n = store_number.to_string();
        let url = self.0.url(OP, &["stores", &n])?;
        let answer = self
            .0
            .send::<()>(OP, None, Method::GET, url, None, None)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let reply: wire::Store = self.0.decode(OP, answer)?;
        Ok(Some(StoreInfo {
            store_number: reply.store_number,
            open: reply.open,
        }))
    }
}

#[async_trait]
impl AdClient for HttpAd {
    async fn approve_campaign(
        &self,
        key: &IdempotencyKey,
        approval: &CampaignApproval,
    ) -> Result<String, ExternalError> {
        const OP: &str = "approve_campaign";
        let url = self.0.url(OP, &["campaigns", "approvals"])?;
        let body = wire::ApproveCampaign {
            request_id: approval.request_id,
            store_number: approval.store_number,
        };
        let answer = self
            .0
            .send(
                OP,
                Some(approval.request_id),
                Method::POST,
                url,
                Some(key),
                Some(&body),
            )
            .await?;
        let reply: wire::CampaignApproved = self.0.decode(OP, answer)?;
        Ok(reply.campaign_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration(" 0 ").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0ms").unwrap(), Duration::ZERO);
    }

    #[test]
    fn durations_without_unit_or_number_are_refused() {
        for bad in [
            "",
            "5",
            "ms",
            "5x",
            "1.5s",
            "-1s",
            "s5",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        let err = parse_duration("5").unwrap_err().to_string();
        assert!(err.contains("missing unit"), "{err}");
    }

    #[test]
    fn formatted_durations_parse_back() {
        for d in [
            Duration::ZERO,
            Duration::from_secs(30),
            Duration::from_millis(1500),
            Duration::from_micros(7),
            Duration::from_nanos(3),
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn statuses_are_classified_for_the_retry_policy() {
        use ErrorKind::*;
        for (code, kind) in [
            (500, Transient),
            (502, Transient),
            (503, Transient),
            (504, Transient),
            (429, Transient),
            (408, Transient),
            (400, Permanent),
            (401, Permanent),
            (403, Permanent),
            (404, Permanent),
            (409, Permanent),
            (422, Permanent),
            (302, Transient),
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(status), kind, "HTTP {code}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let config = ExternalConfig::all_at("http://x").with_token("hunter2");
        let printed = format!("{config:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("***"), "{printed}");
    }

    #[test]
    fn validation_names_the_flag() {
        let mut config = ExternalConfig::all_at("http://127.0.0.1:1");
        config.store_url = "ftp://example.com".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.starts_with("--store-url"), "{err}");

        config.store_url = "not a url".into();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("--store-url")
        );

        let mut config = ExternalConfig::all_at("https://example.com/base/");
        config.validate().unwrap();
        config.external_timeout = Duration::ZERO;
        assert!(matches!(config.validate(), Err(ConfigError::ZeroTimeout)));
        config.external_timeout = Duration::from_secs(1);
        config.external_concurrency = 0;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::ZeroConcurrency)
        ));
    }

    #[test]
    fn flags_and_defaults_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            external: ExternalConfig,
        }
        let cli =
            Cli::try_parse_from(["x", "--external-timeout", "500ms", "--ad-token", "t"]).unwrap();
        assert_eq!(cli.external.external_timeout, Duration::from_millis(500));
        assert_eq!(cli.external.external_concurrency, 32);
        assert_eq!(cli.external.esign_url, "http://127.0.0.1:8090");
        assert_eq!(
            cli.external.ad_token.as_ref().map(Secret::expose),
            Some("t")
        );
        let err = Cli::try_parse_from(["x", "--external-timeout", "5"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("--external-timeout"), "{err}");
    }

    #[test]
    fn base_url_path_is_kept_and_segments_are_encoded() {
        let config = ExternalConfig::all_at("http://h:1/prefix/");
        let endpoint = Endpoint::new(
            System::ESign,
            "--esign-url",
            "http://h:1/prefix/",
            "--t",
            None,
            &config,
        )
        .unwrap();
        let url = endpoint
            .url("op", &["esign", "contracts", "a/b c"])
            .unwrap();
        assert_eq!(url.as_str(), "http://h:1/prefix/esign/contracts/a%2Fb%20c");
    }

    #[test]
    fn error_previews_are_bounded() {
        let long = "x".repeat(1000);
        assert!(preview(long.as_bytes()).chars().count() <= ERROR_BODY_PREVIEW + 1);
        assert_eq!(preview(b" short "), "short");
    }
}
