//! The ad campaign processor: approves the campaign of an ad contract.

use std::sync::Arc;

use async_trait::async_trait;

use super::filters::Filter;
use super::{ChainContext, ChainError, Processor, RetryReason, Step, Transition, run_filters};
use crate::db::StepResult;
use crate::domain::Request;
use crate::external::{CampaignApproval, IdempotencyKey, System};

/// Approves an ad contract's campaign; owner and store already exist.
pub struct AdCampaignProcessor {
    filters: Vec<Arc<dyn Filter>>,
}

impl AdCampaignProcessor {
    /// With the ad step's filters, in order.
    pub fn new(filters: Vec<Arc<dyn Filter>>) -> Self {
        Self { filters }
    }
}

#[async_trait]
impl Processor for AdCampaignProcessor {
    fn step(&self) -> Step {
        Step::AdCampaign
    }

    async fn process(
        &self,
        cx: &ChainContext<'_>,
        request: &Request,
    ) -> Result<Transition, ChainError> {
        // The gates first, on every attempt (see the owner step).
        if let Some(wait) = run_filters(&self.filters, Step::AdCampaign, cx, request).await? {
            return Ok(Transition::Retry(wait));
        }
        let Some(store_number) = request.target_store_number else {
            return Ok(Transition::Retry(RetryReason::condition("no target store")));
        };
        // The store defines the campaign: after a lost answer and a change
        // of target store, the retry is a new campaign, not a replay of the
        // one made for the old store.
        let key = cx
            .key_for(IdempotencyKey::new(
                request.id,
                &format!("campaign:store-{store_number}"),
            ))
            .await?;
        if let Some(saved) = &request.campaign_id {
            // A saved campaign ends the step only when it was made for the
            // current target store: the store may have changed after it was
            // saved (while the completion failed on a held row, say).
            let made_for = cx.store.sent_result(request.id, key.as_str()).await?;
            if made_for.as_deref() == Some(saved.as_str()) {
                return Ok(Transition::Success);
            }
            cx.metrics.result_redone(System::Ad.as_str());
            tracing::warn!(
                request_id = request.id,
                campaign_id = %saved,
                store_number,
                "the saved campaign was not approved for the current target store; approving the store's own"
            );
        }
        if cx.shadow {
            cx.would_create(System::Ad);
            return Ok(Transition::Success);
        }
        let approval = cx
            .body_for(
                &key,
                CampaignApproval {
                    request_id: request.id,
                    store_number,
                },
            )
            .await?;
        let ad = &cx.external.ad;
        // Only a campaign for the current store is this creation; one found
        // for an old target store is left, and a new one is approved.
        let found = async {
            Ok(ad
                .find_campaign(request.id)
                .await?
                .filter(|c| c.store_number == store_number)
                .map(|c| c.campaign_id))
        };
        let campaign_id = match cx
            .create_once(
                System::Ad,
                ad.dedup(),
                &key,
                found,
                ad.approve_campaign(&key, &approval),
            )
            .await?
        {
            Ok(id) => id,
            Err(e) => return Ok(Transition::Retry(RetryReason::external(&e))),
        };
        if !cx
            .store
            .save_result(
                cx.claim,
                StepResult::CampaignId {
                    key: key.as_str(),
                    campaign_id: &campaign_id,
                },
            )
            .await?
        {
            return Err(ChainError::FenceLost(request.id));
        }
        Ok(Transition::Success)
    }
}
