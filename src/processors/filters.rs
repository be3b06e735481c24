//! Filters: the conditions of auto-approval. Each declares the steps and
//! request types it applies to and its order; a processor runs the ones for
//! its step and the request's type. A new policy is one more filter here.

use std::sync::Arc;

use async_trait::async_trait;

use super::{ChainContext, ChainError, RetryReason, Step};
use crate::domain::{Request, RequestType};
use crate::external::{ContractStatus, System};

/// A filter's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The condition holds.
    Pass,
    /// It does not (yet): wait and retry.
    Wait(RetryReason),
}

/// One auto-approval condition.
#[async_trait]
pub trait Filter: Send + Sync {
    /// Stable name, for logs.
    fn name(&self) -> &'static str;
    /// The steps and request types it applies to.
    fn targets(&self) -> &'static [(Step, RequestType)];
    /// Lower runs first.
    fn order(&self) -> u16;
    /// Checks the condition on a freshly read request.
    async fn check(&self, cx: &ChainContext<'_>, request: &Request) -> Result<Verdict, ChainError>;

    /// Whether it applies to this step of this request type.
    fn applies(&self, step: Step, request_type: RequestType) -> bool {
        self.targets().contains(&(step, request_type))
    }
}

const OWNER: (Step, RequestType) = (Step::Owner, RequestType::OwnerContract);
const STORE: (Step, RequestType) = (Step::Store, RequestType::OwnerContract);
const AD: (Step, RequestType) = (Step::AdCampaign, RequestType::AdContract);

/// Every filter, in no particular order.
pub fn all() -> Vec<Arc<dyn Filter>> {
    vec![
        Arc::new(PreviousStepApproved),
        Arc::new(EContractSigned),
        Arc::new(DocumentsReleased),
        Arc::new(NoOperationalHold),
        Arc::new(MenuAndLogoRegistered),
        Arc::new(TargetStoreOpen),
    ]
}

/// The filters of one step, in their declared order.
pub fn for_step(filters: &[Arc<dyn Filter>], step: Step) -> Vec<Arc<dyn Filter>> {
    let mut chosen: Vec<_> = filters
        .iter()
        .filter(|f| f.targets().iter().any(|(s, _)| *s == step))
        .cloned()
        .collect();
    chosen.sort_by_key(|f| f.order());
    chosen
}

fn verdict(holds: bool, reason: &str) -> Verdict {
    if holds {
        Verdict::Pass
    } else {
        Verdict::Wait(RetryReason::condition(reason))
    }
}

/// Ads wait for the owner contract they belong to.
pub struct PreviousStepApproved;

#[async_trait]
impl Filter for PreviousStepApproved {
    fn name(&self) -> &'static str {
        "previous-step-approved"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[AD]
    }
    fn order(&self) -> u16 {
        5
    }
    async fn check(&self, _: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        Ok(verdict(
            r.previous_step_approved,
            "previous step not approved",
        ))
    }
}

/// The e-contract is signed. Our ledger is read first; when it does not say
/// SIGNED, the e-sign system is asked and the ledger updated (the sync).
pub struct EContractSigned;

#[async_trait]
impl Filter for EContractSigned {
    fn name(&self) -> &'static str {
        "econtract-signed"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[OWNER, AD]
    }
    fn order(&self) -> u16 {
        10
    }
    async fn check(&self, cx: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        let Some(contract) = r.econtract_ref.as_deref() else {
            return Ok(Verdict::Wait(RetryReason::condition("no e-contract")));
        };
        let signed = ContractStatus::Signed.as_str();
        if cx.store.econtract_status(contract).await?.as_deref() == Some(signed) {
            cx.seen.econtract_status(signed);
            return Ok(Verdict::Pass);
        }
        let status = match cx
            .call(System::ESign, cx.external.esign.contract_status(contract))
            .await?
        {
            Ok(status) => status,
            Err(e) => return Ok(Verdict::Wait(RetryReason::external(&e))),
        };
        // The ledger is the business's: shadow reads the e-sign system's
        // answer and writes nothing.
        if !cx.shadow {
            cx.store
                .sync_econtract(r.id, contract, status.as_str(), cx.clock.now())
                .await?;
        }
        Ok(match status {
            // What the sync just wrote to the ledger.
            ContractStatus::Signed => {
                cx.seen.econtract_status(signed);
                Verdict::Pass
            }
            other => Verdict::Wait(RetryReason::condition(format!(
                "e-contract {}",
                other.as_str().to_lowercase()
            ))),
        })
    }
}

/// The documents passed review.
pub struct DocumentsReleased;

#[async_trait]
impl Filter for DocumentsReleased {
    fn name(&self) -> &'static str {
        "documents-released"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[OWNER]
    }
    fn order(&self) -> u16 {
        20
    }
    async fn check(&self, _: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        Ok(verdict(r.documents_released, "documents not released"))
    }
}

/// Operations has not put the request on hold.
pub struct NoOperationalHold;

#[async_trait]
impl Filter for NoOperationalHold {
    fn name(&self) -> &'static str {
        "no-operational-hold"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[OWNER, STORE, AD]
    }
    fn order(&self) -> u16 {
        30
    }
    async fn check(&self, _: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        Ok(verdict(!r.operational_hold, "operational hold"))
    }
}

/// The store has its menu and logo.
pub struct MenuAndLogoRegistered;

#[async_trait]
impl Filter for MenuAndLogoRegistered {
    fn name(&self) -> &'static str {
        "menu-and-logo-registered"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[STORE]
    }
    fn order(&self) -> u16 {
        40
    }
    async fn check(&self, _: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        Ok(match (r.menu_registered, r.logo_registered) {
            (true, true) => Verdict::Pass,
            (false, _) => Verdict::Wait(RetryReason::condition("menu not registered")),
            (true, false) => Verdict::Wait(RetryReason::condition("logo not registered")),
        })
    }
}

/// The store an ad contract advertises exists and is open.
pub struct TargetStoreOpen;

#[async_trait]
impl Filter for TargetStoreOpen {
    fn name(&self) -> &'static str {
        "target-store-open"
    }
    fn targets(&self) -> &'static [(Step, RequestType)] {
        &[AD]
    }
    fn order(&self) -> u16 {
        50
    }
    async fn check(&self, cx: &ChainContext<'_>, r: &Request) -> Result<Verdict, ChainError> {
        let Some(number) = r.target_store_number else {
            return Ok(Verdict::Wait(RetryReason::condition("no target store")));
        };
        Ok(
            match cx
                .call(System::Store, cx.external.store.lookup_store(number))
                .await?
            {
                Ok(Some(store)) => verdict(store.open, &format!("store {number} is closed")),
                Ok(None) => Verdict::Wait(RetryReason::condition(format!(
                    "store {number} does not exist"
                ))),
                Err(e) => Verdict::Wait(RetryReason::external(&e)),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_gets_its_filters_in_declared_order() {
        let filters = all();
        let names = |step| {
            for_step(&filters, step)
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(Step::Owner),
            [
                "econtract-signed",
                "documents-released",
                "no-operational-hold"
            ]
        );
        assert_eq!(
            names(Step::Store),
            ["no-operational-hold", "menu-and-logo-registered"]
        );
        assert_eq!(
            names(Step::AdCampaign),
            [
                "previous-step-approved",
                "econtract-signed",
                "no-operational-hold",
                "target-store-open"
            ]
        );
    }
}
