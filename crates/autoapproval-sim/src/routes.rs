//! The simulator's HTTP surface: the four systems' endpoints behind a
//! counting, authorising, fault-injecting middleware, and the admin API.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::debug;

use autoapproval::external::ContractStatus;
use autoapproval::external::http::{IDEMPOTENCY_KEY_HEADER, Secret, wire};

use super::state::{FaultKind, Faults, Idempotency, Refused, SimSystem, State as SimState, Stats};

/// Largest handler body the malformed-answer fault will read back.
const MAX_BODY: usize = 1 << 20;
/// What an oversized answer adds to the real one: twice the client's limit.
const OVERSIZED_PADDING: usize = 2 << 20;

/// What every handler shares.
pub(crate) struct Shared {
    state: Mutex<SimState>,
    tokens: Vec<Secret>,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    pub fn new(state: SimState, tokens: Vec<Secret>, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            state: Mutex::new(state),
            tokens,
            shutdown,
        }
    }

    /// The state; a panic elsewhere leaves it usable, which is all a simulator needs.
    pub fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        if self.tokens.is_empty() {
            return true;
        }
        let presented = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        presented.is_some_and(|p| self.tokens.iter().any(|t| t.expose() == p))
    }

    /// Sleeps `d`, cut short by shutdown so a hanging call never holds it up.
    async fn pause(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    }
}

/// The router over all four systems and the admin API.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let system = |s: SimSystem, routes: Router<Arc<Shared>>| {
        routes.route_layer(middleware::from_fn_with_state(
            Ctx {
                shared: shared.clone(),
                system: s,
            },
            serve_system_call,
        ))
    };
    let esign = Router::new().route("/esign/contracts/{ref}", get(contract_status));
    let owner = Router::new().route("/owners", post(create_owner).get(find_owner));
    let store = Router::new()
        .route("/stores", post(create_store).get(find_store))
        .route("/stores/{n}", get(lookup_store));
    let ad = Router::new().route(
        "/campaigns/approvals",
        post(approve_campaign).get(find_campaign),
    );
    Router::new()
        .merge(system(SimSystem::Esign, esign))
        .merge(system(SimSystem::Owner, owner))
        .merge(system(SimSystem::Store, store))
        .merge(system(SimSystem::Ad, ad))
        .route("/healthz", get(|| async { "ok" }))
        .route("/stats", get(stats))
        .route("/admin/faults", get(get_faults).put(put_faults))
        .route("/admin/idempotency", put(put_idempotency))
        .route("/admin/esign/{ref}", put(put_contract_status))
        .route("/admin/stores/{n}", put(put_store))
        .route("/admin/campaign-prefix", put(put_campaign_prefix))
        .route("/admin/refused-names", put(put_refused_names))
        .route("/admin/reset", post(reset))
        .with_state(shared)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    let body = Body {
        error: message.into(),
    };
    (status, Json(body)).into_response()
}

// === middleware ===

#[derive(Clone)]
struct Ctx {
    shared: Arc<Shared>,
    system: SimSystem,
}

/// Counts a call as in flight until dropped, even if the caller goes away.
struct InFlight {
    shared: Arc<Shared>,
    system: SimSystem,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.lock().leave(self.system);
    }
}

/// A creation for one request being worked on (latency and work, not the
/// hang of a timeout fault), until dropped.
struct Working {
    shared: Arc<Shared>,
    system: SimSystem,
    request_id: i64,
}

impl Drop for Working {
    fn drop(&mut self) {
        self.shared.lock().end_work(self.system, self.request_id);
    }
}

/// The request id of a creation's JSON body, if it has one.
fn request_id_of(body: &[u8]) -> Option<i64> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("requestId")?
        .as_i64()
}

/// Counts the call, checks the token, then applies latency and faults.
async fn serve_system_call(
    State(ctx): State<Ctx>,
    matched: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = format!("{} {}", request.method(), matched.as_str());
    let authorized = ctx.shared.authorized(request.headers());
    let (plan, _in_flight) = {
        let mut state = ctx.shared.lock();
        let traceparent = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        state.count_call(endpoint.clone(), traceparent);
        if !authorized {
            state.stats.unauthorized += 1;
            drop(state);
            debug!(%endpoint, "simulator: unauthorized");
            let mut response = error(StatusCode::UNAUTHORIZED, "missing or unknown bearer token");
            response.headers_mut().insert(
                WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            return response;
        }
        state.enter(ctx.system);
        let guard = InFlight {
            shared: ctx.shared.clone(),
            system: ctx.system,
        };
        let creation = request.method() == axum::http::Method::POST;
        (state.plan(ctx.system, creation), guard)
    };
    // A creation is read first, so that two calls working on one request
    // at once (two chains) are seen: `overlapping_creations` in /stats.
    let (request, _working) = if request.method() == axum::http::Method::POST {
        let (parts, body) = request.into_parts();
        let bytes = to_bytes(body, MAX_BODY).await.unwrap_or_default();
        let working = request_id_of(&bytes).map(|request_id| {
            ctx.shared.lock().begin_work(ctx.system, request_id);
            Working {
                shared: ctx.shared.clone(),
                system: ctx.system,
                request_id,
            }
        });
        (Request::from_parts(parts, Body::from(bytes)), working)
    } else {
        (request, None)
    };
    debug!(%endpoint, latency_ms = plan.latency.as_millis() as u64, fault = ?plan.fault, "simulator call");
    ctx.shared.pause(plan.latency).await;
    match plan.fault {
        None => next.run(request).await,
        Some(FaultKind::Error) => error(StatusCode::INTERNAL_SERVER_ERROR, "injected error"),
        Some(FaultKind::Refused) => error(StatusCode::UNPROCESSABLE_ENTITY, "injected refusal"),
        Some(FaultKind::Timeout) => {
            // The work happens; only the answer is lost.
            drop(next.run(request).await);
            drop(_working);
            ctx.shared.pause(plan.hang).await;
            error(StatusCode::GATEWAY_TIMEOUT, "injected timeout")
        }
        Some(FaultKind::Oversized) => {
            let served = next.run(request).await;
            let mut body = to_bytes(served.into_body(), MAX_BODY)
                .await
                .unwrap_or_default()
                .to_vec();
            body.resize(body.len() + OVERSIZED_PADDING, b' ');
            (
                StatusCode::OK,
                [(CONTENT_TYPE, "application/json")],
                Body::from(body),
            )
                .into_response()
        }
        Some(FaultKind::Malformed) => {
            let served = next.run(request).await;
            let body = to_bytes(served.into_body(), MAX_BODY)
                .await
                .unwrap_or_default();
            // Any strict prefix of a JSON object is invalid JSON.
            let mut garbled = body[..body.len() / 2].to_vec();
            if garbled.is_empty() {
                garbled.push(b'{');
            }
            (
                StatusCode::OK,
                [(CONTENT_TYPE, "application/json")],
                Body::from(garbled),
            )
                .into_response()
        }
    }
}

fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
}

/// A mutation without a key while keys are honoured: 400.
struct MissingKey;

impl IntoResponse for MissingKey {
    fn into_response(self) -> Response {
        error(
            StatusCode::BAD_REQUEST,
            format!("{IDEMPOTENCY_KEY_HEADER} header is required on mutations"),
        )
    }
}

/// The key a mutation is replayed by: `None` when the simulator ignores keys.
fn key_for(shared: &Shared, headers: &HeaderMap) -> Result<Option<String>, MissingKey> {
    if shared.lock().idempotency == Idempotency::Ignored {
        return Ok(None);
    }
    idempotency_key(headers).map(Some).ok_or(MissingKey)
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let message = match self {
            Refused::UnknownStore(n) => format!("store {n} does not exist"),
            Refused::Name(name) => format!("the name {name:?} is not accepted"),
            Refused::KeyConflict { key, first } => {
                format!("{IDEMPOTENCY_KEY_HEADER} {key} was used with another body: {first}")
            }
        };
        error(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
}

fn not_created(what: &str, request_id: i64) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no {what} was created for request {request_id}"),
    )
}

// === the four systems ===

async fn contract_status(
    State(shared): State<Arc<Shared>>,
    Path(contract_ref): Path<String>,
) -> Json<wire::ContractStatusReply> {
    let status = shared.lock().contract_status(&contract_ref);
    Json(wire::ContractStatusReply {
        contract_ref,
        status,
    })
}

async fn create_owner(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<wire::CreateOwner>,
) -> Response {
    let key = match key_for(&shared, &headers) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let created = shared.lock().create_owner(key.as_deref(), &body);
    match created {
        Ok(owner_number) => Json(wire::OwnerCreated { owner_number }).into_response(),
        Err(refused) => refused.into_response(),
    }
}

async fn find_owner(
    State(shared): State<Arc<Shared>>,
    Query(by): Query<wire::ByRequest>,
) -> Response {
    match shared.lock().owner_for(by.request_id) {
        Some(owner_number) => Json(wire::OwnerCreated { owner_number }).into_response(),
        None => not_created("owner", by.request_id),
    }
}

async fn create_store(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<wire::CreateStore>,
) -> Response {
    let key = match key_for(&shared, &headers) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let created = shared.lock().create_store(key.as_deref(), &body);
    match created {
        Ok(store_number) => Json(wire::StoreCreated { store_number }).into_response(),
        Err(refused) => refused.into_response(),
    }
}

async fn find_store(
    State(shared): State<Arc<Shared>>,
    Query(by): Query<wire::ByRequest>,
) -> Response {
    match shared.lock().store_for(by.request_id) {
        Some(store_number) => Json(wire::StoreCreated { store_number }).into_response(),
        None => not_created("store", by.request_id),
    }
}

async fn lookup_store(State(shared): State<Arc<Shared>>, Path(n): Path<i64>) -> Response {
    match shared.lock().store(n) {
        Some(store) => Json(store).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no store {n}")),
    }
}

async fn approve_campaign(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<wire::ApproveCampaign>,
) -> Response {
    let key = match key_for(&shared, &headers) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let store_number = body.store_number;
    let approved = shared.lock().approve_campaign(key.as_deref(), &body);
    match approved {
        Ok(campaign_id) => Json(wire::CampaignApproved {
            campaign_id,
            store_number: Some(store_number),
        })
        .into_response(),
        Err(refused) => refused.into_response(),
    }
}

async fn find_campaign(
    State(shared): State<Arc<Shared>>,
    Query(by): Query<wire::ByRequest>,
) -> Response {
    match shared.lock().campaign_for(by.request_id) {
        Some((campaign_id, store_number)) => Json(wire::CampaignApproved {
            campaign_id,
            store_number: Some(store_number),
        })
        .into_response(),
        None => not_created("campaign approval", by.request_id),
    }
}

// === admin ===

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    Json(shared.lock().stats.clone())
}

async fn get_faults(State(shared): State<Arc<Shared>>) -> Json<Faults> {
    Json(shared.lock().faults.clone())
}

async fn put_faults(State(shared): State<Arc<Shared>>, Json(faults): Json<Faults>) -> Response {
    if let Err(e) = faults.validate() {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    shared.lock().faults = faults.clone();
    Json(faults).into_response()
}

#[derive(Deserialize)]
struct IdempotencyBody {
    mode: Idempotency,
}

async fn put_idempotency(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<IdempotencyBody>,
) -> StatusCode {
    shared.lock().idempotency = body.mode;
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct ContractStatusBody {
    status: ContractStatus,
}

async fn put_contract_status(
    State(shared): State<Arc<Shared>>,
    Path(contract_ref): Path<String>,
    Json(body): Json<ContractStatusBody>,
) -> StatusCode {
    shared
        .lock()
        .set_contract_status(&contract_ref, body.status);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct StoreBody {
    open: bool,
}

async fn put_store(
    State(shared): State<Arc<Shared>>,
    Path(n): Path<i64>,
    Json(body): Json<StoreBody>,
) -> StatusCode {
    shared.lock().set_store(n, body.open);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct PrefixBody {
    prefix: String,
}

async fn put_campaign_prefix(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<PrefixBody>,
) -> StatusCode {
    shared.lock().set_campaign_prefix(&body.prefix);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct RefusedNamesBody {
    names: Vec<String>,
}

async fn put_refused_names(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<RefusedNamesBody>,
) -> StatusCode {
    shared.lock().set_refused_names(&body.names);
    StatusCode::NO_CONTENT
}

async fn reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.lock().reset();
    StatusCode::NO_CONTENT
}
