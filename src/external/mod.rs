//! The external systems a processor talks to: e-sign, owner, store and ad
//! services. Processors see only these traits; `http` implements them.

pub mod http;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

/// One of the four downstream systems.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    /// Electronic-signature service: contract status.
    ESign,
    /// Owner service: creates owners.
    Owner,
    /// Store service: creates and looks up stores.
    Store,
    /// Ad service: approves ad campaigns.
    Ad,
}

impl System {
    /// Stable lower-case name, used in metrics labels and idempotency keys.
    pub fn as_str(self) -> &'static str {
        match self {
            System::ESign => "esign",
            System::Owner => "owner",
            System::Store => "store",
            System::Ad => "ad",
        }
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether retrying the same call later can succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Timeouts, connection errors, 5xx, 429, malformed bodies: retry soon.
    Transient,
    /// 4xx other than 408/429: the downstream refused this input.
    Permanent,
}

/// A failed call to an external system, classified for the retry policy.
#[derive(Debug, thiserror::Error)]
#[error("{system} {operation}: {message}")]
pub struct ExternalError {
    /// Which system failed.
    pub system: System,
    /// The operation, e.g. `create_owner`.
    pub operation: &'static str,
    /// Transient or permanent.
    pub kind: ErrorKind,
    /// What happened, for the request's memo and logs.
    pub message: String,
    /// The downstream answered 400 or 422 to this input: it refused it and
    /// created nothing ([`http::is_refusal`]). A creation refused so ends
    /// its idempotency key: the next attempt sends a new body under a new key.
    pub refused: bool,
}

/// The key sent as `Idempotency-Key` on every mutation: request id + step, so
/// a retry after a crash gets the result of the first call instead of a
/// second creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key for `step` (e.g. `owner`) of request `request_id`. `step`
    /// names the creation with the inputs that define it (the campaign's
    /// store: `campaign:store-7`); the owner and the store are one per
    /// request, whatever their names.
    pub fn new(request_id: i64, step: &str) -> Self {
        Self(format!("{request_id}:{step}"))
    }

    /// The key of this creation's `generation`-th body: this key for the
    /// first, `<key>#<n>` after n − 1 bodies were refused (400 or 422), each
    /// refusal ending its key.
    pub fn generation(&self, generation: u32) -> Self {
        match generation {
            0 | 1 => self.clone(),
            n => Self(format!("{}#{n}", self.0)),
        }
    }

    /// Which generation of `base` this key is (see [`Self::generation`]);
    /// `None` when it is not one of `base`'s.
    pub fn generation_of(&self, base: &IdempotencyKey) -> Option<u32> {
        let rest = self.0.strip_prefix(base.as_str())?;
        if rest.is_empty() {
            return Some(1);
        }
        rest.strip_prefix('#')?
            .parse()
            .ok()
            .filter(|n: &u32| *n >= 2)
    }

    /// A key as recorded (`auto_approve_sent.idempotency_key`).
    pub fn recorded(key: String) -> Self {
        Self(key)
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a downstream keeps a retried creation from making a second one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Dedup {
    /// It honours `Idempotency-Key`: a replayed key answers the first result.
    #[default]
    Key,
    /// It ignores the key: before every create the controller looks the
    /// request up (`GET …?requestId=N`) and takes what it finds.
    Lookup,
}

impl Dedup {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Dedup::Key => "key",
            Dedup::Lookup => "lookup",
        }
    }
}

/// A campaign approval the ad service reports for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundCampaign {
    /// Its id.
    pub campaign_id: String,
    /// The store it was approved for.
    pub store_number: i64,
}

pub use crate::domain::ContractStatus;

/// What the owner service needs to create an owner.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewOwner {
    /// The request this owner is created for.
    pub request_id: i64,
    /// The business (applicant) name on the request.
    pub business_name: String,
}

/// What the store service needs to create a store.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewStore {
    /// The request this store is created for.
    pub request_id: i64,
    /// The owner the store belongs to.
    pub owner_number: i64,
    /// The store's display name.
    pub store_name: String,
}

/// A store as the store service reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreInfo {
    /// The store's number.
    pub store_number: i64,
    /// Whether the store is open for business (ads need an open store).
    pub open: bool,
}

/// What the ad service needs to approve a campaign.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CampaignApproval {
    /// The request this campaign approval is for.
    pub request_id: i64,
    /// The store the campaign advertises.
    pub store_number: i64,
}

/// The e-sign system: source of e-contract status, synced into our ledger.
#[async_trait]
pub trait ESignClient: Send + Sync {
    /// Current status of the e-contract `contract_ref`.
    async fn contract_status(&self, contract_ref: &str) -> Result<ContractStatus, ExternalError>;
}

/// The owner service.
#[async_trait]
pub trait OwnerClient: Send + Sync {
    /// Creates the owner (or returns the one created under `key`) → owner number.
    async fn create_owner(
        &self,
        key: &IdempotencyKey,
        owner: &NewOwner,
    ) -> Result<i64, ExternalError>;
    /// The latest owner created for `request_id`, if any.
    async fn find_owner(&self, request_id: i64) -> Result<Option<i64>, ExternalError>;
    /// How this service keeps a retried creation single.
    fn dedup(&self) -> Dedup;
}

/// The store service.
#[async_trait]
pub trait StoreClient: Send + Sync {
    /// Creates the store (or returns the one created under `key`) → store number.
    async fn create_store(
        &self,
        key: &IdempotencyKey,
        store: &NewStore,
    ) -> Result<i64, ExternalError>;
    /// Looks a store up; `None` when it does not exist.
    async fn lookup_store(&self, store_number: i64) -> Result<Option<StoreInfo>, ExternalError>;
    /// The latest store created for `request_id`, if any → its number.
    async fn find_store(&self, request_id: i64) -> Result<Option<i64>, ExternalError>;
    /// How this service keeps a retried creation single.
    fn dedup(&self) -> Dedup;
}

/// The ad service.
#[async_trait]
pub trait AdClient: Send + Sync {
    /// Approves the campaign (or returns the approval made under `key`) → campaign id.
    async fn approve_campaign(
        &self,
        key: &IdempotencyKey,
        approval: &CampaignApproval,
    ) -> Result<String, ExternalError>;
    /// The latest campaign approval made for `request_id`, if any.
    async fn find_campaign(&self, request_id: i64) -> Result<Option<FoundCampaign>, ExternalError>;
    /// How this service keeps a retried creation single.
    fn dedup(&self) -> Dedup;
}

/// Every external system, as the processors get them.
#[derive(Clone)]
pub struct ExternalSystems {
    /// E-sign status.
    pub esign: Arc<dyn ESignClient>,
    /// Owner creation.
    pub owner: Arc<dyn OwnerClient>,
    /// Store creation and lookup.
    pub store: Arc<dyn StoreClient>,
    /// Ad campaign approval.
    pub ad: Arc<dyn AdClient>,
}
