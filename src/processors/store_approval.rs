//! The store processor: creates the owner's store and stores its number.

use std::sync::Arc;

use async_trait::async_trait;

use super::filters::Filter;
use super::{ChainContext, ChainError, Processor, RetryReason, Step, Transition, run_filters};
use crate::db::StepResult;
use crate::domain::Request;
use crate::external::{IdempotencyKey, NewStore, System};

/// Creates the store of an owner contract; the last step of that chain.
pub struct StoreProcessor {
    filters: Vec<Arc<dyn Filter>>,
}

impl StoreProcessor {
    /// With the store step's filters, in order.
    pub fn new(filters: Vec<Arc<dyn Filter>>) -> Self {
        Self { filters }
    }
}

#[async_trait]
impl Processor for StoreProcessor {
    fn step(&self) -> Step {
        Step::Store
    }

    async fn process(
        &self,
        cx: &ChainContext<'_>,
        request: &Request,
    ) -> Result<Transition, ChainError> {
        // The gates first, on every attempt (see the owner step); a number
        // present then means the store exists: done.
        if let Some(wait) = run_filters(&self.filters, Step::Store, cx, request).await? {
            return Ok(Transition::Retry(wait));
        }
        if request.store_number.is_some() {
            return Ok(Transition::Success);
        }
        // In shadow the owner step took its creation as made: the store
        // would be made for it.
        if cx.shadow {
            cx.would_create(System::Store);
            return Ok(Transition::Success);
        }
        let Some(owner_number) = request.owner_number else {
            return Ok(Transition::Retry(RetryReason::condition(
                "owner not created",
            )));
        };
        let key = cx
            .key_for(IdempotencyKey::new(request.id, Step::Store.as_str()))
            .await?;
        let store = cx
            .body_for(
                &key,
                NewStore {
                    request_id: request.id,
                    owner_number,
                    store_name: request.business_name.clone(),
                },
            )
            .await?;
        let client = &cx.external.store;
        let store_number = match cx
            .create_once(
                System::Store,
                client.dedup(),
                &key,
                client.find_store(request.id),
                client.create_store(&key, &store),
            )
            .await?
        {
            Ok(n) => n,
            Err(e) => return Ok(Transition::Retry(RetryReason::external(&e))),
        };
        if !cx
            .store
            .save_result(cx.claim, StepResult::StoreNumber(store_number))
            .await?
        {
            return Err(ChainError::FenceLost(request.id));
        }
        Ok(Transition::Success)
    }
}
