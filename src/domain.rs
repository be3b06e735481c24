//! The domain: requests, their auto-approval state, claims and fences.
//! Plain types with no I/O; the store maps rows into them.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

/// The request types of the business table. Two are auto-approvable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestType {
    /// A new owner and store: owner → store processors.
    OwnerContract,
    /// An ad campaign for an existing store: the ad campaign processor.
    AdContract,
    /// Change of store information.
    StoreInfoChange,
    /// Change of the menu.
    MenuChange,
    /// Transfer to another owner.
    OwnerChange,
    /// Change of the payout bank account.
    BankAccountChange,
    /// Change of business hours.
    BusinessHoursChange,
    /// Change of the delivery area.
    DeliveryAreaChange,
    /// Temporary closure.
    TemporaryClosure,
    /// Reopening after a closure.
    Reopening,
    /// Termination of the contract.
    Termination,
    /// A promotion sign-up.
    PromotionSignup,
}

impl RequestType {
    /// All twelve types, in declaration order.
    pub const ALL: [RequestType; 12] = [
        RequestType::OwnerContract,
        RequestType::AdContract,
        RequestType::StoreInfoChange,
        RequestType::MenuChange,
        RequestType::OwnerChange,
        RequestType::BankAccountChange,
        RequestType::BusinessHoursChange,
        RequestType::DeliveryAreaChange,
        RequestType::TemporaryClosure,
        RequestType::Reopening,
        RequestType::Termination,
        RequestType::PromotionSignup,
    ];

    /// The types the controller approves.
    pub const AUTO_APPROVABLE: [RequestType; 2] =
        [RequestType::OwnerContract, RequestType::AdContract];

    /// The spelling in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestType::OwnerContract => "OWNER_CONTRACT",
            RequestType::AdContract => "AD_CONTRACT",
            RequestType::StoreInfoChange => "STORE_INFO_CHANGE",
            RequestType::MenuChange => "MENU_CHANGE",
            RequestType::OwnerChange => "OWNER_CHANGE",
            RequestType::BankAccountChange => "BANK_ACCOUNT_CHANGE",
            RequestType::BusinessHoursChange => "BUSINESS_HOURS_CHANGE",
            RequestType::DeliveryAreaChange => "DELIVERY_AREA_CHANGE",
            RequestType::TemporaryClosure => "TEMPORARY_CLOSURE",
            RequestType::Reopening => "REOPENING",
            RequestType::Termination => "TERMINATION",
            RequestType::PromotionSignup => "PROMOTION_SIGNUP",
        }
    }

    /// Whether the controller approves this type at all.
    pub fn is_auto_approvable(self) -> bool {
        Self::AUTO_APPROVABLE.contains(&self)
    }
}

impl FromStr for RequestType {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownValue::new("request_type", s))
    }
}

impl fmt::Display for RequestType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The business status of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestStatus {
    /// Waiting for a decision.
    Pending,
    /// Resubmitted after a rejection (not our retry).
    Retry,
    /// In progress on the business side.
    Ing,
    /// Approved (by us or a person).
    Approved,
    /// Rejected by a person.
    Rejected,
    /// Withdrawn.
    Canceled,
}

impl RequestStatus {
    /// Open statuses in pickup order, as the candidate index sorts them.
    pub const OPEN: [RequestStatus; 3] = [
        RequestStatus::Ing,
        RequestStatus::Pending,
        RequestStatus::Retry,
    ];

    /// The spelling in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Pending => "PENDING",
            RequestStatus::Retry => "RETRY",
            RequestStatus::Ing => "ING",
            RequestStatus::Approved => "APPROVED",
            RequestStatus::Rejected => "REJECTED",
            RequestStatus::Canceled => "CANCELED",
        }
    }

    /// Whether a decision is still to be made.
    pub fn is_open(self) -> bool {
        Self::OPEN.contains(&self)
    }
}

impl FromStr for RequestStatus {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            RequestStatus::Pending,
            RequestStatus::Retry,
            RequestStatus::Ing,
            RequestStatus::Approved,
            RequestStatus::Rejected,
            RequestStatus::Canceled,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
        .ok_or_else(|| UnknownValue::new("status", s))
    }
}

impl fmt::Display for RequestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A column value the controller does not know; the row is skipped and reported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {column} {value:?}")]
pub struct UnknownValue {
    /// The column, e.g. `request_type`.
    pub column: &'static str,
    /// The value found.
    pub value: String,
}

impl UnknownValue {
    fn new(column: &'static str, value: &str) -> Self {
        Self {
            column,
            value: value.to_owned(),
        }
    }
}

/// A request as the processors see it, freshly read from the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `approval_request.id`; also the shard key (id mod K) and the CR name (`request-<id>`).
    pub id: i64,
    /// Its type.
    pub request_type: RequestType,
    /// Its business status.
    pub status: RequestStatus,
    /// Pickup order key.
    pub sort_time: DateTime<Utc>,
    /// When the business system created it: the start of pickup latency.
    pub created_at: DateTime<Utc>,
    /// The applicant's business name.
    pub business_name: String,
    /// Documents passed review.
    pub documents_released: bool,
    /// Operations put the request on hold.
    pub operational_hold: bool,
    /// The store's menu is registered.
    pub menu_registered: bool,
    /// The store's logo is registered.
    pub logo_registered: bool,
    /// The step before this one (e.g. the owner contract of an ad) is approved.
    pub previous_step_approved: bool,
    /// The e-contract to check in the e-sign ledger.
    pub econtract_ref: Option<String>,
    /// The store an ad contract advertises.
    pub target_store_number: Option<i64>,
    /// Owner number, once the owner processor created it.
    pub owner_number: Option<i64>,
    /// Store number, once the store processor created it.
    pub store_number: Option<i64>,
    /// Campaign id, once the ad campaign processor approved it.
    pub campaign_id: Option<String>,
    /// Who decided a closed request (`autoapproval` when it was us).
    pub decided_by: Option<String>,
}

/// The facts an attempt's gates passed on: the request's gate columns as
/// every step read them, and the e-contract's status in the ledger as the
/// chain last saw or wrote it. The completion approves only while the
/// request row it locks, and the ledger, still say so; a wake trigger only
/// makes a change seen sooner. Our own result columns (owner and store
/// numbers, campaign id) are not facts: our steps write them after the read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The business status read (a change to another open status counts too).
    pub status: RequestStatus,
    /// The request type read.
    pub request_type: RequestType,
    /// Documents passed review.
    pub documents_released: bool,
    /// Operations put the request on hold.
    pub operational_hold: bool,
    /// The store's menu is registered.
    pub menu_registered: bool,
    /// The store's logo is registered.
    pub logo_registered: bool,
    /// The step before this one is approved.
    pub previous_step_approved: bool,
    /// The e-contract the request names.
    pub econtract_ref: Option<String>,
    /// The store an ad contract advertises.
    pub target_store_number: Option<i64>,
    /// The ledger's status of `econtract_ref` as a gate last saw or wrote
    /// it; `None` when no gate read the ledger (then it is not compared).
    pub econtract_status: Option<String>,
}

impl Facts {
    /// The gate columns of `request`, the ledger not read yet.
    pub fn of(request: &Request) -> Facts {
        Facts {
            status: request.status,
            request_type: request.request_type,
            documents_released: request.documents_released,
            operational_hold: request.operational_hold,
            menu_registered: request.menu_registered,
            logo_registered: request.logo_registered,
            previous_step_approved: request.previous_step_approved,
            econtract_ref: request.econtract_ref.clone(),
            target_store_number: request.target_store_number,
            econtract_status: None,
        }
    }
}

/// The `decided_by` the controller writes when it approves.
pub const DECIDED_BY_US: &str = "autoapproval";

/// Status of an `auto_approve_state` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateStatus {
    /// A worker holds the claim and is running the chain.
    InProgress,
    /// Waiting for `next_retry_time`.
    RetryWaiting,
}

impl StateStatus {
    /// The spelling in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            StateStatus::InProgress => "IN_PROGRESS",
            StateStatus::RetryWaiting => "RETRY_WAITING",
        }
    }
}

impl FromStr for StateStatus {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "IN_PROGRESS" => Ok(StateStatus::InProgress),
            "RETRY_WAITING" => Ok(StateStatus::RetryWaiting),
            other => Err(UnknownValue::new("auto_approve_state.status", other)),
        }
    }
}

/// The auto-approval state of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Primary key (`stateId` in the seed).
    pub id: i64,
    /// The request.
    pub request_id: i64,
    /// In progress or waiting.
    pub status: StateStatus,
    /// When a waiting request is due.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// Retries so far.
    pub retry_count: i32,
    /// Who claimed it last.
    pub holder: String,
    /// The fencing token of that claim.
    pub fencing_token: i64,
    /// The step it last reached.
    pub step: Option<String>,
    /// Why it last had to wait.
    pub last_reason: Option<String>,
    /// Last write; the cleanser's clock for stuck claims.
    pub modified_at: DateTime<Utc>,
}

/// One row of a candidate query: only what is needed to try a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The request.
    pub request_id: i64,
    /// Its type.
    pub request_type: RequestType,
    /// The state row of a due retry; `None` for a new request.
    pub state_id: Option<i64>,
}

/// Who is writing, and with which token: every write after a claim carries it,
/// so a worker that lost its right cannot overwrite the new holder's writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The replica (pod) name.
    pub holder: String,
    /// A token that grows whenever the right to the request moves on.
    pub token: i64,
    /// Under lease coordination, K: `token` is then the generation of shard
    /// `request_id mod K`, and a claim is taken only while it is current.
    pub shard_count: Option<u32>,
}

impl Fence {
    /// A fence outside shard coordination (one worker, tests, tools).
    pub fn new(holder: impl Into<String>, token: i64) -> Self {
        Self {
            holder: holder.into(),
            token,
            shard_count: None,
        }
    }

    /// The fence of a shard held at generation `token` among `shard_count`.
    pub fn sharded(holder: impl Into<String>, token: i64, shard_count: u32) -> Self {
        Self {
            holder: holder.into(),
            token,
            shard_count: Some(shard_count),
        }
    }
}

/// A won claim: the caller owns the request until it completes, schedules a
/// retry or releases it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The state row.
    pub state_id: i64,
    /// The request.
    pub request_id: i64,
    /// Retries before this attempt.
    pub retry_count: i32,
    /// Consecutive transient failures before this attempt (the backoff exponent).
    pub transient_streak: i32,
    /// The fence every later write carries.
    pub fence: Fence,
    /// Drawn afresh by every claim and re-claim and carried by every later
    /// write with the fence: a claim given back and taken again under the
    /// same holder and token is another claim (migration 0017).
    pub nonce: i64,
    /// When the request was created, read by a new request's claim (what
    /// its pickup is measured from); `None` for a due retry's.
    pub requested_at: Option<DateTime<Utc>>,
}

/// The retry limit after which a request is no longer selected (the seed's 300).
pub const DEFAULT_RETRY_LIMIT: i32 = 300;

/// Status of an e-contract in the e-sign system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ContractStatus {
    /// Sent, not yet signed by every party.
    Pending,
    /// Signed by every party.
    Signed,
    /// Declined or voided.
    Rejected,
}

impl ContractStatus {
    /// The ledger's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractStatus::Pending => "PENDING",
            ContractStatus::Signed => "SIGNED",
            ContractStatus::Rejected => "REJECTED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_type_round_trips_through_its_spelling() {
        for t in RequestType::ALL {
            assert_eq!(t.as_str().parse::<RequestType>(), Ok(t));
        }
        assert_eq!(
            RequestType::ALL
                .iter()
                .filter(|t| t.is_auto_approvable())
                .count(),
            2
        );
    }

    #[test]
    fn unknown_values_name_their_column() {
        let err = "MYSTERY".parse::<RequestType>().unwrap_err();
        assert_eq!(err.to_string(), r#"unknown request_type "MYSTERY""#);
        assert!("DONE".parse::<RequestStatus>().is_err());
    }

    #[test]
    fn open_statuses_are_pending_retry_and_ing() {
        let open: Vec<_> = [
            "PENDING", "RETRY", "ING", "APPROVED", "REJECTED", "CANCELED",
        ]
        .iter()
        .map(|s| s.parse::<RequestStatus>().unwrap().is_open())
        .collect();
        assert_eq!(open, [true, true, true, false, false, false]);
    }
}
