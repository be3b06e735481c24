//! The simulator's data, counters and fault settings: plain values behind
//! one lock, so every check-and-create is atomic.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use autoapproval::external::http::wire;
use autoapproval::external::{ContractStatus, System};

use super::SimError;

/// First numbers handed out, far apart so a test can tell them apart.
const FIRST_OWNER: i64 = 10_001;
const FIRST_STORE: i64 = 50_001;

// === impl SimSystem ===

/// One of the four simulated systems, spelled as in JSON (`"esign"`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimSystem {
    /// The e-sign service.
    Esign,
    /// The owner service.
    Owner,
    /// The store service.
    Store,
    /// The ad service.
    Ad,
}

impl From<SimSystem> for System {
    fn from(s: SimSystem) -> Self {
        match s {
            SimSystem::Esign => System::ESign,
            SimSystem::Owner => System::Owner,
            SimSystem::Store => System::Store,
            SimSystem::Ad => System::Ad,
        }
    }
}

impl From<System> for SimSystem {
    fn from(s: System) -> Self {
        match s {
            System::ESign => SimSystem::Esign,
            System::Owner => SimSystem::Owner,
            System::Store => SimSystem::Store,
            System::Ad => SimSystem::Ad,
        }
    }
}

/// One value per simulated system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerSystem<T> {
    /// The e-sign service's value.
    pub esign: T,
    /// The owner service's value.
    pub owner: T,
    /// The store service's value.
    pub store: T,
    /// The ad service's value.
    pub ad: T,
}

impl<T> PerSystem<T> {
    /// The value for `system`.
    pub fn get(&self, system: impl Into<SimSystem>) -> &T {
        match system.into() {
            SimSystem::Esign => &self.esign,
            SimSystem::Owner => &self.owner,
            SimSystem::Store => &self.store,
            SimSystem::Ad => &self.ad,
        }
    }

    fn get_mut(&mut self, system: SimSystem) -> &mut T {
        match system {
            SimSystem::Esign => &mut self.esign,
            SimSystem::Owner => &mut self.owner,
            SimSystem::Store => &mut self.store,
            SimSystem::Ad => &mut self.ad,
        }
    }
}

// === impl Idempotency ===

/// Whether the creating systems honour `Idempotency-Key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Idempotency {
    /// A key seen before answers the first result and creates nothing; a
    /// mutation without a key is refused with 400.
    #[default]
    Honoured,
    /// No support at all, like many real downstreams: the header is not
    /// needed and not read, and every create call creates.
    Ignored,
}

// === impl Faults ===

/// How an injected fault shows itself to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// Answer 500 before doing anything.
    Error,
    /// Do the work, then hang for `hang` and answer 504: the caller times out
    /// not knowing whether the mutation happened.
    Timeout,
    /// Do the work, then answer 200 with truncated JSON: the result is lost.
    Malformed,
    /// Answer 422 before doing anything: the downstream refuses the input
    /// (only through `failNext`; no rate draws it).
    Refused,
    /// Do the work, then answer 200 with its JSON followed by 2 MiB of
    /// spaces (still valid JSON): a body larger than a client should read
    /// (only through `failNext`).
    Oversized,
}

/// Fail the next `count` matching calls with `kind`, for deterministic tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailNext {
    /// How many calls are still to fail.
    pub count: u32,
    /// How they fail.
    pub kind: FaultKind,
}

/// Fault injection for the four systems' endpoints (never `/stats`, `/admin`).
///
/// JSON: `{"latency": "20ms", "jitter": "5ms", "errorRate": 0.1,
/// "timeoutRate": 0, "hang": "30s", "malformedRate": 0, "system": "owner", "creationsOnly": true,
/// "failNext": {"count": 2, "kind": "error"}}`; every field optional,
/// snake_case accepted too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Faults {
    /// Added to every call.
    #[serde(with = "duration_text")]
    pub latency: Duration,
    /// Up to this much more, uniformly drawn per call.
    #[serde(with = "duration_text")]
    pub jitter: Duration,
    /// Fraction of calls answered 500.
    #[serde(alias = "error_rate")]
    pub error_rate: f64,
    /// Fraction of calls that hang for `hang`.
    #[serde(alias = "timeout_rate")]
    pub timeout_rate: f64,
    /// How long a timed-out call hangs before answering 504.
    #[serde(with = "duration_text")]
    pub hang: Duration,
    /// Fraction of calls answered 200 with malformed JSON.
    #[serde(alias = "malformed_rate")]
    pub malformed_rate: f64,
    /// Only this system gets the faults; `None`: all four.
    pub system: Option<SimSystem>,
    /// Only creations (POST) get the faults; lookups and reads are served.
    #[serde(alias = "creations_only")]
    pub creations_only: bool,
    /// Deterministic failures, taken before the rates.
    #[serde(alias = "fail_next")]
    pub fail_next: Option<FailNext>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            error_rate: 0.0,
            timeout_rate: 0.0,
            hang: Duration::from_secs(30),
            malformed_rate: 0.0,
            system: None,
            creations_only: false,
            fail_next: None,
        }
    }
}

impl Faults {
    /// Like [`Faults::fail_next`], for creations (POST) only.
    pub fn fail_next_creation(system: System, count: u32, kind: FaultKind) -> Self {
        Self {
            creations_only: true,
            ..Self::fail_next(system, count, kind)
        }
    }

    /// No faults but `fail_next` of `kind` for the next `count` calls to `system`.
    pub fn fail_next(system: System, count: u32, kind: FaultKind) -> Self {
        Self {
            system: Some(system.into()),
            fail_next: Some(FailNext { count, kind }),
            ..Self::default()
        }
    }

    /// Rates in [0, 1] and summing to at most 1; `names` are what the caller
    /// calls the three rates (flags or JSON fields), for the error.
    pub(crate) fn check_rates(&self, names: [&'static str; 3]) -> Result<(), SimError> {
        let rates = [self.error_rate, self.timeout_rate, self.malformed_rate];
        for (name, rate) in names.into_iter().zip(rates) {
            if !(0.0..=1.0).contains(&rate) {
                return Err(SimError::Invalid {
                    name,
                    message: format!("{rate} is not a fraction in [0, 1]"),
                });
            }
        }
        if rates.iter().sum::<f64>() > 1.0 {
            return Err(SimError::Invalid {
                name: names[0],
                message: format!("{} + {} + {} exceed 1", names[0], names[1], names[2]),
            });
        }
        Ok(())
    }

    /// Validates a `Faults` given as JSON or through the handle.
    pub fn validate(&self) -> Result<(), SimError> {
        self.check_rates(["errorRate", "timeoutRate", "malformedRate"])
    }

    fn applies_to(&self, system: SimSystem, creation: bool) -> bool {
        self.system.is_none_or(|s| s == system) && (creation || !self.creations_only)
    }
}

/// Durations as text (`"250ms"`) in JSON, read with the CLI's parser.
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use autoapproval::flags::{format_duration, parse_duration};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

// === impl Stats ===

/// Creations by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creations {
    /// Owners created.
    pub owners: u64,
    /// Stores created.
    pub stores: u64,
    /// Campaigns approved.
    pub campaigns: u64,
}

/// Creations made for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCreations {
    /// Owners created for it.
    pub owner: u64,
    /// Stores created for it.
    pub store: u64,
    /// Campaigns approved for it.
    pub campaign: u64,
}

/// Injected faults by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Answered 500.
    pub error: u64,
    /// Hung, then 504.
    pub timeout: u64,
    /// Answered malformed JSON.
    pub malformed: u64,
    /// Answered 422 (`failNext` with `refused`).
    #[serde(default)]
    pub refused: u64,
    /// Answered with a 2-MiB body (`failNext` with `oversized`).
    #[serde(default)]
    pub oversized: u64,
}

/// Everything the simulator counted since start or the last reset
/// (`GET /stats`, camelCase JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Calls per endpoint, e.g. `"POST /owners": 3`, faulted and refused ones included.
    pub calls: BTreeMap<String, u64>,
    /// Creations by kind (replays not included).
    pub created: Creations,
    /// Mutations answered from an earlier call with the same idempotency key.
    pub idempotent_replays: u64,
    /// Creations that arrived while another for the same request and system
    /// was still being worked on: two chains on one request at once.
    pub overlapping_creations: u64,
    /// Creations of something this request already had: a second owner or
    /// store for one request, a second campaign for one request and store.
    pub duplicate_creations: u64,
    /// Replays whose body differs from the first call's: a strict downstream
    /// (Stripe's, say) refuses them; this one answers the first result.
    pub key_conflicts: u64,
    /// Creations per request id, e.g. `{"42": {"owner": 1, "store": 1, "campaign": 1}}`.
    pub per_request: BTreeMap<i64, RequestCreations>,
    /// Calls being served right now, per system.
    pub in_flight: PerSystem<u64>,
    /// Most calls ever served at once, per system: the caller's concurrency as seen here.
    pub in_flight_max: PerSystem<u64>,
    /// Injected faults by kind.
    pub faults_injected: FaultCounts,
    /// Calls refused with 401.
    pub unauthorized: u64,
    /// Owners and stores refused with 422 because their name is one of the
    /// refused names (`PUT /admin/refused-names`): nothing was created.
    #[serde(default)]
    pub names_refused: u64,
    /// The latest calls that carried a W3C `traceparent` header, oldest
    /// first, at most [`TRACED_CALLS_KEPT`].
    pub traced_calls: Vec<TracedCall>,
}

/// How many traced calls `/stats` keeps.
pub const TRACED_CALLS_KEPT: usize = 1000;

/// A call that carried trace context: what the caller's span was.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracedCall {
    /// e.g. `"POST /owners"`.
    pub endpoint: String,
    /// The header as received, `00-<trace id>-<parent span id>-<flags>`.
    pub traceparent: String,
}

impl Stats {
    /// Calls to `endpoint` (e.g. `"POST /owners"`), 0 if none.
    pub fn calls_to(&self, endpoint: &str) -> u64 {
        self.calls.get(endpoint).copied().unwrap_or(0)
    }

    /// Creations for `request_id`, zeros if none.
    pub fn for_request(&self, request_id: i64) -> RequestCreations {
        self.per_request
            .get(&request_id)
            .copied()
            .unwrap_or_default()
    }
}

// === impl State ===

/// What a call has to suffer before (or instead of) being served.
pub(crate) struct FaultPlan {
    pub latency: Duration,
    pub fault: Option<FaultKind>,
    pub hang: Duration,
}

/// Why a creation is refused with 422.
pub(crate) enum Refused {
    /// The ad service does not know the store.
    UnknownStore(i64),
    /// The owner or store name is one the admin API marked as refused.
    Name(String),
    /// Strict keys: the key was first used with another body (`first`).
    KeyConflict {
        /// The key.
        key: String,
        /// The body it was first used with.
        first: String,
    },
}

/// The simulated systems' data and counters.
/// The start of every campaign id the ad service makes up.
const DEFAULT_CAMPAIGN_PREFIX: &str = "cmp-";

pub(crate) struct State {
    initial_faults: Faults,
    pub faults: Faults,
    esign_default: ContractStatus,
    contracts: HashMap<String, ContractStatus>,
    stores: BTreeMap<i64, bool>,
    // Each key's result and the body it was made from.
    owners_by_key: HashMap<String, (i64, String)>,
    stores_by_key: HashMap<String, (i64, String)>,
    campaigns_by_key: HashMap<String, (String, String)>,
    // Names an owner or store service refuses (422, nothing created), and,
    // with strict keys, each key refused so with its body: as a strict
    // downstream remembers a key's answer, a refused key stays refused.
    refused_names: std::collections::HashSet<String>,
    refused_by_key: HashMap<String, String>,
    // The latest creation per request, for the lookups (`GET /owners?requestId=N`).
    latest_owner: HashMap<i64, i64>,
    latest_store: HashMap<i64, i64>,
    latest_campaign: HashMap<i64, (String, i64)>,
    // Every (request, store) a campaign was approved for.
    campaigns_made: std::collections::HashSet<(i64, i64)>,
    /// Whether the creating systems honour idempotency keys.
    pub idempotency: Idempotency,
    initial_idempotency: Idempotency,
    /// Whether a key replayed with another body is refused (422), as a
    /// strict downstream (a payment API) does, instead of answered.
    pub strict_keys: bool,
    // Never reset, so numbers stay unique across resets.
    next_owner: i64,
    next_store: i64,
    next_campaign: u64,
    /// What new campaign ids start with (`cmp-` unless an admin call set it).
    campaign_prefix: String,
    pub stats: Stats,
    rng: StdRng,
    /// Creations being worked on now, per system and request.
    working: HashMap<(SimSystem, i64), u32>,
}

impl State {
    pub fn new(
        faults: Faults,
        idempotency: Idempotency,
        esign_default: ContractStatus,
        seed: Option<u64>,
    ) -> Self {
        Self {
            latest_owner: HashMap::new(),
            latest_store: HashMap::new(),
            latest_campaign: HashMap::new(),
            campaigns_made: Default::default(),
            idempotency,
            initial_idempotency: idempotency,
            strict_keys: false,
            initial_faults: faults.clone(),
            faults,
            esign_default,
            contracts: HashMap::new(),
            stores: BTreeMap::new(),
            owners_by_key: HashMap::new(),
            stores_by_key: HashMap::new(),
            campaigns_by_key: HashMap::new(),
            refused_names: Default::default(),
            refused_by_key: HashMap::new(),
            next_owner: FIRST_OWNER,
            next_store: FIRST_STORE,
            next_campaign: 1,
            campaign_prefix: DEFAULT_CAMPAIGN_PREFIX.to_owned(),
            stats: Stats::default(),
            rng: seed.map_or_else(StdRng::from_os_rng, StdRng::seed_from_u64),
            working: HashMap::new(),
        }
    }

    /// Back to the start-up state: no data, zero counters, start-up faults.
    pub fn reset(&mut self) {
        self.faults = self.initial_faults.clone();
        self.contracts.clear();
        self.stores.clear();
        self.owners_by_key.clear();
        self.stores_by_key.clear();
        self.campaigns_by_key.clear();
        self.refused_names.clear();
        self.refused_by_key.clear();
        self.latest_owner.clear();
        self.latest_store.clear();
        self.latest_campaign.clear();
        self.campaigns_made.clear();
        self.idempotency = self.initial_idempotency;
        self.campaign_prefix = DEFAULT_CAMPAIGN_PREFIX.to_owned();
        // Calls still in flight will leave; keep counting them.
        let in_flight = self.stats.in_flight;
        self.stats = Stats {
            in_flight,
            in_flight_max: in_flight,
            ..Stats::default()
        };
    }

    pub fn count_call(&mut self, endpoint: String, traceparent: Option<String>) {
        if let Some(traceparent) = traceparent {
            let traced = &mut self.stats.traced_calls;
            if traced.len() == TRACED_CALLS_KEPT {
                traced.remove(0);
            }
            traced.push(TracedCall {
                endpoint: endpoint.clone(),
                traceparent,
            });
        }
        *self.stats.calls.entry(endpoint).or_default() += 1;
    }

    pub fn enter(&mut self, system: SimSystem) {
        let now = self.stats.in_flight.get_mut(system);
        *now += 1;
        let now = *now;
        let max = self.stats.in_flight_max.get_mut(system);
        *max = (*max).max(now);
    }

    /// A creation for `request_id` starts: counted as overlapping when
    /// another for the same request and system is still being worked on.
    pub fn begin_work(&mut self, system: SimSystem, request_id: i64) {
        let working = self.working.entry((system, request_id)).or_default();
        if *working > 0 {
            self.stats.overlapping_creations += 1;
        }
        *working += 1;
    }

    /// The creation for `request_id` is done (or abandoned).
    pub fn end_work(&mut self, system: SimSystem, request_id: i64) {
        if let Some(working) = self.working.get_mut(&(system, request_id)) {
            *working = working.saturating_sub(1);
            if *working == 0 {
                self.working.remove(&(system, request_id));
            }
        }
    }

    pub fn leave(&mut self, system: SimSystem) {
        let now = self.stats.in_flight.get_mut(system);
        *now = now.saturating_sub(1);
    }

    /// Draws this call's latency and fault; `fail_next` wins over the rates.
    pub fn plan(&mut self, system: SimSystem, creation: bool) -> FaultPlan {
        let faults = &mut self.faults;
        if !faults.applies_to(system, creation) {
            return FaultPlan {
                latency: Duration::ZERO,
                fault: None,
                hang: faults.hang,
            };
        }
        let jitter = u64::try_from(faults.jitter.as_nanos()).unwrap_or(u64::MAX);
        let latency = faults.latency + Duration::from_nanos(self.rng.random_range(0..=jitter));
        let fault = match &mut faults.fail_next {
            Some(next) if next.count > 0 => {
                next.count -= 1;
                let kind = next.kind;
                if next.count == 0 {
                    faults.fail_next = None;
                }
                Some(kind)
            }
            _ => {
                let draw: f64 = self.rng.random();
                if draw < faults.error_rate {
                    Some(FaultKind::Error)
                } else if draw < faults.error_rate + faults.timeout_rate {
                    Some(FaultKind::Timeout)
                } else if draw < faults.error_rate + faults.timeout_rate + faults.malformed_rate {
                    Some(FaultKind::Malformed)
                } else {
                    None
                }
            }
        };
        let counts = &mut self.stats.faults_injected;
        match fault {
            Some(FaultKind::Error) => counts.error += 1,
            Some(FaultKind::Timeout) => counts.timeout += 1,
            Some(FaultKind::Malformed) => counts.malformed += 1,
            Some(FaultKind::Refused) => counts.refused += 1,
            Some(FaultKind::Oversized) => counts.oversized += 1,
            None => {}
        }
        FaultPlan {
            latency,
            fault,
            hang: faults.hang,
        }
    }

    pub fn contract_status(&self, contract_ref: &str) -> ContractStatus {
        self.contracts
            .get(contract_ref)
            .copied()
            .unwrap_or(self.esign_default)
    }

    pub fn set_contract_status(&mut self, contract_ref: &str, status: ContractStatus) {
        self.contracts.insert(contract_ref.to_owned(), status);
    }

    pub fn set_store(&mut self, store_number: i64, open: bool) {
        self.stores.insert(store_number, open);
    }

    pub fn store(&self, store_number: i64) -> Option<wire::Store> {
        self.stores
            .get(&store_number)
            .map(|&open| wire::Store { store_number, open })
    }

    /// Counts a replay of `key`, and a conflict when `body` is not the one
    /// the key was first used with, which strict keys refuse.
    fn replayed(&mut self, key: &str, first_body: &str, body: &str) -> Result<(), Refused> {
        if first_body == body {
            self.stats.idempotent_replays += 1;
            return Ok(());
        }
        self.stats.key_conflicts += 1;
        if self.strict_keys {
            return Err(Refused::KeyConflict {
                key: key.to_owned(),
                first: first_body.to_owned(),
            });
        }
        self.stats.idempotent_replays += 1;
        Ok(())
    }

    /// Owners and stores named one of `names` are refused from now on
    /// (422, nothing created), as a downstream refuses a name it does not
    /// accept; replaces the earlier list.
    pub fn set_refused_names(&mut self, names: &[String]) {
        self.refused_names = names.iter().cloned().collect();
    }

    /// Refuses a creation named `name` when it is a refused name, or when
    /// its (honoured) key was refused before: with the same body, the same
    /// refusal; with another, a key conflict (strict keys only remember).
    fn refuse_name(&mut self, key: Option<&str>, name: &str, body: &str) -> Result<(), Refused> {
        if let Some(k) = key
            && let Some(first) = self.refused_by_key.get(k).cloned()
            && first != body
        {
            self.stats.key_conflicts += 1;
            return Err(Refused::KeyConflict {
                key: k.to_owned(),
                first,
            });
        }
        if !self.refused_names.contains(name) {
            return Ok(());
        }
        self.stats.names_refused += 1;
        if let Some(k) = key
            && self.strict_keys
        {
            self.refused_by_key.insert(k.to_owned(), body.to_owned());
        }
        Err(Refused::Name(name.to_owned()))
    }

    /// The key to replay by, when keys are honoured and one was sent.
    fn honoured<'k>(&self, key: Option<&'k str>) -> Option<&'k str> {
        key.filter(|_| self.idempotency == Idempotency::Honoured)
    }

    pub fn create_owner(
        &mut self,
        key: Option<&str>,
        owner: &wire::CreateOwner,
    ) -> Result<i64, Refused> {
        let body = body_of(owner);
        let key = self.honoured(key);
        if let Some((k, (n, first))) =
            key.and_then(|k| self.owners_by_key.get(k).cloned().map(|f| (k, f)))
        {
            self.replayed(k, &first, &body)?;
            return Ok(n);
        }
        self.refuse_name(key, &owner.business_name, &body)?;
        let n = self.next_owner;
        self.next_owner += 1;
        if let Some(key) = key {
            self.owners_by_key.insert(key.to_owned(), (n, body));
        }
        if self.latest_owner.insert(owner.request_id, n).is_some() {
            self.stats.duplicate_creations += 1;
        }
        self.stats.created.owners += 1;
        self.stats
            .per_request
            .entry(owner.request_id)
            .or_default()
            .owner += 1;
        Ok(n)
    }

    pub fn create_store(
        &mut self,
        key: Option<&str>,
        store: &wire::CreateStore,
    ) -> Result<i64, Refused> {
        let body = body_of(store);
        let key = self.honoured(key);
        if let Some((k, (n, first))) =
            key.and_then(|k| self.stores_by_key.get(k).cloned().map(|f| (k, f)))
        {
            self.replayed(k, &first, &body)?;
            return Ok(n);
        }
        self.refuse_name(key, &store.store_name, &body)?;
        // Skip numbers a test registered by hand.
        let mut n = self.next_store;
        while self.stores.contains_key(&n) {
            n += 1;
        }
        self.next_store = n + 1;
        if let Some(key) = key {
            self.stores_by_key.insert(key.to_owned(), (n, body));
        }
        if self.latest_store.insert(store.request_id, n).is_some() {
            self.stats.duplicate_creations += 1;
        }
        self.stores.insert(n, true);
        self.stats.created.stores += 1;
        self.stats
            .per_request
            .entry(store.request_id)
            .or_default()
            .store += 1;
        Ok(n)
    }

    /// What new campaign ids start with, to make the ad service answer
    /// ids that a database may refuse (a NUL byte, say).
    pub fn set_campaign_prefix(&mut self, prefix: &str) {
        prefix.clone_into(&mut self.campaign_prefix);
    }

    pub fn approve_campaign(
        &mut self,
        key: Option<&str>,
        approval: &wire::ApproveCampaign,
    ) -> Result<String, Refused> {
        let body = body_of(approval);
        let key = self.honoured(key);
        if let Some((k, (id, first))) =
            key.and_then(|k| self.campaigns_by_key.get(k).cloned().map(|f| (k, f)))
        {
            self.replayed(k, &first, &body)?;
            return Ok(id);
        }
        if !self.stores.contains_key(&approval.store_number) {
            return Err(Refused::UnknownStore(approval.store_number));
        }
        let id = format!("{}{:06}", self.campaign_prefix, self.next_campaign);
        self.next_campaign += 1;
        if let Some(key) = key {
            self.campaigns_by_key
                .insert(key.to_owned(), (id.clone(), body));
        }
        let (request_id, store_number) = (approval.request_id, approval.store_number);
        if !self.campaigns_made.insert((request_id, store_number)) {
            self.stats.duplicate_creations += 1;
        }
        self.latest_campaign
            .insert(request_id, (id.clone(), store_number));
        self.stats.created.campaigns += 1;
        self.stats
            .per_request
            .entry(approval.request_id)
            .or_default()
            .campaign += 1;
        Ok(id)
    }
}

impl State {
    /// The latest owner created for `request_id`.
    pub fn owner_for(&self, request_id: i64) -> Option<i64> {
        self.latest_owner.get(&request_id).copied()
    }

    /// The latest store created for `request_id`.
    pub fn store_for(&self, request_id: i64) -> Option<i64> {
        self.latest_store.get(&request_id).copied()
    }

    /// The latest campaign approved for `request_id`, with its store.
    pub fn campaign_for(&self, request_id: i64) -> Option<(String, i64)> {
        self.latest_campaign.get(&request_id).cloned()
    }
}

/// A body as compared between the calls of one key.
fn body_of(body: &impl Serialize) -> String {
    serde_json::to_string(body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(faults: Faults) -> State {
        State::new(
            faults,
            Idempotency::Honoured,
            ContractStatus::Signed,
            Some(7),
        )
    }

    #[test]
    fn a_creation_for_a_request_already_being_worked_on_is_an_overlap() {
        let mut s = state(Faults::default());
        s.begin_work(SimSystem::Owner, 1);
        s.begin_work(SimSystem::Owner, 2);
        s.begin_work(SimSystem::Store, 1);
        assert_eq!(
            s.stats.overlapping_creations, 0,
            "other requests, other systems"
        );
        s.begin_work(SimSystem::Owner, 1);
        assert_eq!(
            s.stats.overlapping_creations, 1,
            "two at once for request 1"
        );
        s.end_work(SimSystem::Owner, 1);
        s.end_work(SimSystem::Owner, 1);
        s.begin_work(SimSystem::Owner, 1);
        assert_eq!(
            s.stats.overlapping_creations, 1,
            "one after the other is no overlap"
        );
    }

    #[test]
    fn fail_next_fails_exactly_n_matching_calls() {
        let mut s = state(Faults::fail_next(System::Owner, 2, FaultKind::Timeout));
        assert_eq!(s.plan(SimSystem::Store, true).fault, None);
        assert_eq!(
            s.plan(SimSystem::Owner, true).fault,
            Some(FaultKind::Timeout)
        );
        assert_eq!(
            s.plan(SimSystem::Owner, true).fault,
            Some(FaultKind::Timeout)
        );
        assert_eq!(s.plan(SimSystem::Owner, true).fault, None);
        assert_eq!(s.faults.fail_next, None);
        assert_eq!(s.stats.faults_injected.timeout, 2);
    }

    #[test]
    fn rates_split_one_draw() {
        let mut s = state(Faults {
            error_rate: 0.5,
            malformed_rate: 0.5,
            ..Faults::default()
        });
        for _ in 0..200 {
            assert_ne!(s.plan(SimSystem::Ad, true).fault, None);
        }
        let c = s.stats.faults_injected;
        assert_eq!(c.timeout, 0);
        assert!(c.error > 50 && c.malformed > 50, "{c:?}");
    }

    #[test]
    fn latency_stays_within_jitter() {
        let mut s = state(Faults {
            latency: Duration::from_millis(10),
            jitter: Duration::from_millis(5),
            ..Faults::default()
        });
        for _ in 0..100 {
            let l = s.plan(SimSystem::Esign, true).latency;
            assert!(l >= Duration::from_millis(10) && l <= Duration::from_millis(15));
        }
    }

    #[test]
    fn rates_outside_unit_interval_are_refused_by_name() {
        let f = Faults {
            timeout_rate: 1.5,
            ..Faults::default()
        };
        let err = f.validate().unwrap_err().to_string();
        assert!(err.starts_with("timeoutRate"), "{err}");
        let f = Faults {
            error_rate: 0.6,
            malformed_rate: 0.6,
            ..Faults::default()
        };
        assert!(f.validate().is_err());
    }

    #[test]
    fn faults_read_from_camel_or_snake_json() {
        let f: Faults = serde_json::from_str(
            r#"{"latency": "20ms", "error_rate": 0.25, "failNext": {"count": 1, "kind": "malformed"}}"#,
        )
        .unwrap();
        assert_eq!(f.latency, Duration::from_millis(20));
        assert_eq!(f.error_rate, 0.25);
        assert_eq!(f.hang, Duration::from_secs(30));
        assert_eq!(f.fail_next.map(|n| n.kind), Some(FaultKind::Malformed));
        let back: Faults = serde_json::from_value(serde_json::to_value(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn created_stores_skip_numbers_taken_by_hand() {
        let mut s = state(Faults::default());
        s.set_store(FIRST_STORE, false);
        let body = wire::CreateStore {
            request_id: 1,
            owner_number: 1,
            store_name: "s".into(),
        };
        let n = s.create_store(Some("1:store"), &body).ok().unwrap();
        assert_eq!(n, FIRST_STORE + 1);
        assert_eq!(s.store(n).map(|st| st.open), Some(true));
        assert_eq!(s.create_store(Some("1:store"), &body).ok(), Some(n));
        assert_eq!(s.stats.idempotent_replays, 1);
        assert_eq!(s.stats.duplicate_creations, 0);
    }

    #[test]
    fn strict_keys_refuse_a_key_replayed_with_another_body_and_answer_the_same_body() {
        let mut s = state(Faults::default());
        let named = |name: &str| wire::CreateOwner {
            request_id: 1,
            business_name: name.into(),
        };
        let first = s.create_owner(Some("1:owner"), &named("Kim")).ok();
        s.strict_keys = false;
        assert_eq!(
            s.create_owner(Some("1:owner"), &named("Lee")).ok(),
            first,
            "lenient: the first answer"
        );
        s.strict_keys = true;
        assert!(matches!(
            s.create_owner(Some("1:owner"), &named("Lee")),
            Err(Refused::KeyConflict { .. })
        ));
        assert_eq!(s.create_owner(Some("1:owner"), &named("Kim")).ok(), first);
        assert_eq!(s.stats.key_conflicts, 2);
        assert_eq!(s.stats.idempotent_replays, 2);
        assert_eq!(s.stats.created.owners, 1);
    }

    #[test]
    fn a_refused_name_creates_nothing_and_with_strict_keys_its_key_stays_refused() {
        let mut s = state(Faults::default());
        s.strict_keys = true;
        s.set_refused_names(&["Bad".to_owned()]);
        let owner = |name: &str| wire::CreateOwner {
            request_id: 1,
            business_name: name.to_owned(),
        };
        assert!(matches!(
            s.create_owner(Some("1:owner"), &owner("Bad")),
            Err(Refused::Name(_))
        ));
        assert!(matches!(
            s.create_owner(Some("1:owner"), &owner("Good")),
            Err(Refused::KeyConflict { .. })
        ));
        assert!(s.create_owner(Some("1:owner#2"), &owner("Good")).is_ok());
        assert_eq!(
            (
                s.stats.created.owners,
                s.stats.names_refused,
                s.stats.key_conflicts
            ),
            (1, 1, 1)
        );
    }

    #[test]
    fn without_idempotency_every_create_creates_and_a_second_one_is_a_duplicate() {
        let mut s = state(Faults::default());
        s.idempotency = Idempotency::Ignored;
        let owner = wire::CreateOwner {
            request_id: 1,
            business_name: "b".into(),
        };
        let first = s.create_owner(Some("1:owner"), &owner).ok();
        let second = s.create_owner(Some("1:owner"), &owner).ok();
        assert_ne!(first, second, "the key is not read");
        assert_eq!(s.stats.idempotent_replays, 0);
        assert_eq!(s.stats.duplicate_creations, 1);
        assert_eq!(s.owner_for(1), second, "the latest one is looked up");
        assert_eq!(s.owner_for(2), None);

        s.set_store(7, true);
        s.set_store(8, true);
        let campaign = |store_number| wire::ApproveCampaign {
            request_id: 1,
            store_number,
        };
        s.approve_campaign(None, &campaign(7)).ok();
        s.approve_campaign(None, &campaign(8)).ok();
        assert_eq!(
            s.stats.duplicate_creations, 1,
            "a campaign for another store is a new creation"
        );
        assert_eq!(s.campaign_for(1).map(|c| c.1), Some(8));
        s.approve_campaign(None, &campaign(8)).ok();
        assert_eq!(s.stats.duplicate_creations, 2);
    }
}
