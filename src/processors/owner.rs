//! The owner processor: creates the owner and stores its number.

use std::sync::Arc;

use async_trait::async_trait;

use super::filters::Filter;
use super::{ChainContext, ChainError, Processor, RetryReason, Step, Transition, run_filters};
use crate::db::StepResult;
use crate::domain::Request;
use crate::external::{IdempotencyKey, NewOwner, System};

/// Creates the owner of an owner contract.
pub struct OwnerProcessor {
    filters: Vec<Arc<dyn Filter>>,
}

impl OwnerProcessor {
    /// With the owner step's filters, in order.
    pub fn new(filters: Vec<Arc<dyn Filter>>) -> Self {
        Self { filters }
    }
}

#[async_trait]
impl Processor for OwnerProcessor {
    fn step(&self) -> Step {
        Step::Owner
    }

    async fn process(
        &self,
        cx: &ChainContext<'_>,
        request: &Request,
    ) -> Result<Transition, ChainError> {
        // Every gate on every attempt: a hold placed, or a request
        // resubmitted, after its owner was made is checked again. Only the
        // creation is skipped when its result is stored.
        if let Some(wait) = run_filters(&self.filters, Step::Owner, cx, request).await? {
            return Ok(Transition::Retry(wait));
        }
        if request.owner_number.is_some() {
            return Ok(Transition::Next(Step::Store));
        }
        if cx.shadow {
            cx.would_create(System::Owner);
            return Ok(Transition::Next(Step::Store));
        }
        let key = cx
            .key_for(IdempotencyKey::new(request.id, Step::Owner.as_str()))
            .await?;
        // The name sent first, also after a rename (ChainContext::body_for).
        let owner = cx
            .body_for(
                &key,
                NewOwner {
                    request_id: request.id,
                    business_name: request.business_name.clone(),
                },
            )
            .await?;
        let client = &cx.external.owner;
        let owner_number = match cx
            .create_once(
                System::Owner,
                client.dedup(),
                &key,
                client.find_owner(request.id),
                client.create_owner(&key, &owner),
            )
            .await?
        {
            Ok(n) => n,
            Err(e) => return Ok(Transition::Retry(RetryReason::external(&e))),
        };
        if !cx
            .store
            .save_result(cx.claim, StepResult::OwnerNumber(owner_number))
            .await?
        {
            return Err(ChainError::FenceLost(request.id));
        }
        Ok(Transition::Next(Step::Store))
    }
}
