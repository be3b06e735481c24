//! JSON shapes on the wire (camelCase), shared with the simulator so the
//! client and the simulator cannot drift apart.

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
    /// The store it was approved for: required in a lookup's answer
    /// (`GET /campaigns/approvals?requestId=N`), optional in a create's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_number: Option<i64>,
}

/// The query of the lookups `GET /owners`, `/stores`, `/campaigns/approvals`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByRequest {
    /// The request whose latest creation is asked for.
    pub request_id: i64,
}
