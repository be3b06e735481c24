//! HTTP implementations of the external-system traits over reqwest, with a
//! per-call timeout, a per-system in-flight limit and error classification.
//!
//! Wire format (camelCase JSON, served by the `autoapproval-sim` crate too):
//!
//! | call | request | 2xx answer |
//! | --- | --- | --- |
//! | `contract_status` | `GET {esign}/esign/contracts/{ref}` | `{"contractRef": "c-1", "status": "SIGNED"}` |
//! | `create_owner` | `POST {owner}/owners` `{"requestId": 42, "businessName": "…"}` | `{"ownerNumber": 10001}` |
//! | `create_store` | `POST {store}/stores` `{"requestId": 42, "ownerNumber": 10001, "storeName": "…"}` | `{"storeNumber": 50001}` |
//! | `lookup_store` | `GET {store}/stores/{n}` | `{"storeNumber": 50001, "open": true}`, or 404 |
//! | `approve_campaign` | `POST {ad}/campaigns/approvals` `{"requestId": 42, "storeNumber": 50001}` | `{"campaignId": "cmp-1"}` (`"storeNumber"` may follow) |
//! | `find_owner` | `GET {owner}/owners?requestId=42` | the latest create's answer for request 42, or 404 |
//! | `find_store` | `GET {store}/stores?requestId=42` | the latest create's answer for request 42, or 404 |
//! | `find_campaign` | `GET {ad}/campaigns/approvals?requestId=42` | `{"campaignId": "cmp-1", "storeNumber": 50001}`, or 404 |
//!
//! Every call carries `Authorization: Bearer <token>` when a token is set and
//! every POST carries `Idempotency-Key`. The `find_*` lookups are made only
//! for a system set to `--<system>-dedup lookup`, before each creation.

mod config;
mod tls;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info};

use super::{
    AdClient, CampaignApproval, ContractStatus, Dedup, ESignClient, ErrorKind, ExternalError,
    ExternalSystems, FoundCampaign, IdempotencyKey, NewOwner, NewStore, OwnerClient, StoreClient,
    StoreInfo, System,
};

use crate::flags::format_duration;
use config::parse_base_url;
pub use config::{ConfigError, ExternalArgs, Secret};
use tls::Clients;
pub use tls::{ExternalTlsArgs, TlsFileError};

/// Header carrying the idempotency key of a mutation.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The largest answer body read from an external system: 1 MiB, far above
/// any answer of the wire format below (tens of bytes).
pub const MAX_ANSWER_BODY: usize = 1024 * 1024;

/// How much of an error body goes into an error message.
const ERROR_BODY_PREVIEW: usize = 200;

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

/// Whether a non-2xx status says the downstream refused the input itself
/// and created nothing: 400 and 422, the statuses of a validation failure.
/// Not 409 (a key in use or a conflict: something may exist), nor 408 or
/// 429 (retried), nor 401, 403 or 404 (credentials or routing: the same
/// body is right once the set-up is).
pub fn is_refusal(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 422)
}

// === impl HttpExternalSystems ===

/// Builds the HTTP-backed [`ExternalSystems`].
pub struct HttpExternalSystems;

impl HttpExternalSystems {
    /// Validates `config` and builds one client per system; its TLS files
    /// are read now (a missing, unreadable or invalid one is refused by
    /// name) and again when they change, reported only in the log.
    pub fn build(config: &ExternalArgs) -> Result<ExternalSystems, ConfigError> {
        Self::build_reporting(config, None)
    }

    /// Like [`Self::build`], a reload of the TLS files also counted in
    /// `metrics` (`autoapproval_external_tls_reloads_total`,
    /// `autoapproval_external_tls_files_rejected`).
    pub fn build_reporting(
        config: &ExternalArgs,
        metrics: Option<&crate::telemetry::Metrics>,
    ) -> Result<ExternalSystems, ConfigError> {
        config.validate()?;
        let endpoint = |system, flag, url: &str, token_flag, token: &Option<Secret>| {
            Endpoint::new(
                system,
                flag,
                url,
                token_flag,
                token.as_ref(),
                config,
                metrics,
            )
        };
        Ok(ExternalSystems {
            esign: Arc::new(HttpESign(endpoint(
                System::ESign,
                "--esign-url",
                &config.esign_url,
                "--esign-token",
                &config.esign_token,
            )?)),
            owner: Arc::new(HttpOwner(
                endpoint(
                    System::Owner,
                    "--owner-url",
                    &config.owner_url,
                    "--owner-token",
                    &config.owner_token,
                )?,
                config.owner_dedup,
            )),
            store: Arc::new(HttpStore(
                endpoint(
                    System::Store,
                    "--store-url",
                    &config.store_url,
                    "--store-token",
                    &config.store_token,
                )?,
                config.store_dedup,
            )),
            ad: Arc::new(HttpAd(
                endpoint(
                    System::Ad,
                    "--ad-url",
                    &config.ad_url,
                    "--ad-token",
                    &config.ad_token,
                )?,
                config.ad_dedup,
            )),
        })
    }
}

/// One system's connection: base URL, credentials, timeout and in-flight limit.
struct Endpoint {
    system: System,
    base: Url,
    clients: Clients,
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
        config: &ExternalArgs,
        metrics: Option<&crate::telemetry::Metrics>,
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
        let clients = Clients::new(
            system,
            config.tls.files(system)?,
            config.external_timeout,
            config.tls.external_tls_reload_interval,
            metrics.cloned(),
        )?;
        match base.scheme() {
            "https" => {
                info!(%system, url = %base, tls = %clients.describe(), "external system over TLS")
            }
            _ => info!(%system, url = %base, "external system over plain HTTP: not encrypted"),
        }
        Ok(Self {
            system,
            base,
            clients,
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
            refused: false,
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

    /// Sends one request under the in-flight limit and the per-call timeout,
    /// in a client span whose trace context the request carries.
    async fn send<B: Serialize + ?Sized>(
        &self,
        operation: &'static str,
        request_id: Option<i64>,
        method: Method,
        url: Url,
        key: Option<&IdempotencyKey>,
        body: Option<&B>,
    ) -> Result<Answer, ExternalError> {
        let span = tracing::info_span!(
            "external call",
            system = %self.system,
            operation,
            otel.kind = "client",
            http.request.method = %method,
            http.response.status_code = tracing::field::Empty,
        );
        self.send_in_span(operation, request_id, method, url, key, body)
            .instrument(span)
            .await
    }

    async fn send_in_span<B: Serialize + ?Sized>(
        &self,
        operation: &'static str,
        request_id: Option<i64>,
        method: Method,
        url: Url,
        key: Option<&IdempotencyKey>,
        body: Option<&B>,
    ) -> Result<Answer, ExternalError> {
        let mut request = self
            .clients
            .client()
            .await
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
        for (name, value) in crate::traces::propagation_headers() {
            request = request.header(name, value);
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
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        let body = self.read_body(operation, status, response).await?;
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

    /// The answer's body, at most [`MAX_ANSWER_BODY`] bytes: a larger one
    /// (announced or read) is a bad answer, retried like a malformed one,
    /// instead of memory spent on whatever the downstream sends.
    async fn read_body(
        &self,
        operation: &'static str,
        status: StatusCode,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, ExternalError> {
        let too_large = |size: String| {
            let message = format!(
                "answer too large: HTTP {status} with a body of {size}, over the {} KiB limit",
                MAX_ANSWER_BODY / 1024
            );
            debug!(system = %self.system, operation, %message, "external call refused");
            self.error(operation, ErrorKind::Transient, message)
        };
        if let Some(announced) = response.content_length()
            && announced > MAX_ANSWER_BODY as u64
        {
            return Err(too_large(format!("{announced} bytes")));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(operation, &e))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BODY {
                return Err(too_large(format!("more than {} bytes", MAX_ANSWER_BODY)));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn transport_error(&self, operation: &'static str, e: &reqwest::Error) -> ExternalError {
        let host = self.base.host_str().unwrap_or_default();
        let what = if let Some(tls) = tls::tls_failure(e, &self.clients, host) {
            // Retried like any connection failure: a rotated certificate or a
            // fixed CA file makes the next attempt succeed.
            format!("{tls} ({})", error_chain(e))
        } else if e.is_timeout() {
            format!("timed out after {}", format_duration(self.timeout))
        } else if e.is_connect() {
            format!("connect failed: {}", error_chain(e))
        } else {
            format!("request failed: {}", error_chain(e))
        };
        debug!(system = %self.system, operation, error = %what, "external call failed");
        self.error(operation, ErrorKind::Transient, what)
    }

    /// `GET {path}?requestId=N`: the latest creation for the request as
    /// `T`, or `None` on 404.
    async fn find<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        segments: &[&str],
        request_id: i64,
    ) -> Result<Option<T>, ExternalError> {
        let mut url = self.url(operation, segments)?;
        url.query_pairs_mut()
            .append_pair("requestId", &request_id.to_string());
        let answer = self
            .send::<()>(operation, Some(request_id), Method::GET, url, None, None)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        self.decode(operation, answer).map(Some)
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
            return Err(ExternalError {
                refused: is_refusal(answer.status),
                ..self.error(operation, kind, message)
            });
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

/// The settings of every system's client but TLS.
fn base_client(connect_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        // A redirect would be a misconfiguration; surface it instead of following.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("autoapproval/", env!("CARGO_PKG_VERSION")))
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
struct HttpOwner(Endpoint, Dedup);
struct HttpStore(Endpoint, Dedup);
struct HttpAd(Endpoint, Dedup);

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

    async fn find_owner(&self, request_id: i64) -> Result<Option<i64>, ExternalError> {
        let found: Option<wire::OwnerCreated> =
            self.0.find("find_owner", &["owners"], request_id).await?;
        Ok(found.map(|f| f.owner_number))
    }

    fn dedup(&self) -> Dedup {
        self.1
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

    async fn find_store(&self, request_id: i64) -> Result<Option<i64>, ExternalError> {
        let found: Option<wire::StoreCreated> =
            self.0.find("find_store", &["stores"], request_id).await?;
        Ok(found.map(|f| f.store_number))
    }

    fn dedup(&self) -> Dedup {
        self.1
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

    async fn find_campaign(&self, request_id: i64) -> Result<Option<FoundCampaign>, ExternalError> {
        const OP: &str = "find_campaign";
        let found: Option<wire::CampaignApproved> = self
            .0
            .find(OP, &["campaigns", "approvals"], request_id)
            .await?;
        let Some(found) = found else {
            return Ok(None);
        };
        // Without the store, a campaign made for an old target store could
        // be taken for the current one: refuse the answer by name.
        let store_number = found.store_number.ok_or_else(|| {
            self.0.error(
                OP,
                ErrorKind::Permanent,
                format!(
                    "the lookup answer for campaign {:?} has no storeNumber",
                    found.campaign_id
                ),
            )
        })?;
        Ok(Some(FoundCampaign {
            campaign_id: found.campaign_id,
            store_number,
        }))
    }

    fn dedup(&self) -> Dedup {
        self.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn only_400_and_422_are_refusals_of_the_input() {
        for code in [
            300, 302, 401, 403, 404, 408, 409, 425, 429, 500, 502, 503, 504,
        ] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(!is_refusal(status), "HTTP {code}");
        }
        for code in [400, 422] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(is_refusal(status), "HTTP {code}");
            assert_eq!(classify_status(status), ErrorKind::Permanent, "HTTP {code}");
        }
    }

    #[test]
    fn base_url_path_is_kept_and_segments_are_encoded() {
        let config = ExternalArgs::all_at("http://h:1/prefix/").unwrap();
        let endpoint = Endpoint::new(
            System::ESign,
            "--esign-url",
            "http://h:1/prefix/",
            "--t",
            None,
            &config,
            None,
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
