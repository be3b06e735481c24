//! Retry classes and when a waiting request is due again. Polling finds new
//! work; this decides how often failed work is retried. They stay separate.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

/// Why a request has to wait, which decides how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// A condition is not met yet (documents, signature, hold…): it may take
    /// days, so wait the long interval and leave the slots to new requests.
    ConditionNotMet,
    /// A downstream system failed transiently: back off exponentially.
    Transient,
}

impl RetryClass {
    /// Stable name for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryClass::ConditionNotMet => "condition_not_met",
            RetryClass::Transient => "transient",
        }
    }
}

/// When a request waiting for a retry is due again: unmet conditions wait
/// a fixed interval, transient failures back off exponentially with jitter,
/// and the limit ends automatic retries.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Wait after an unmet condition (the seed's 10 minutes).
    pub condition_interval: Duration,
    /// First backoff after a transient failure.
    pub transient_base: Duration,
    /// Longest backoff after transient failures.
    pub transient_max: Duration,
    /// Retries after which a request is no longer selected.
    pub limit: i32,
}

impl RetryPolicy {
    /// The delay before the next attempt. `streak` counts consecutive
    /// transient failures including this one (≥ 1 for `Transient`).
    pub fn delay(&self, class: RetryClass, streak: i32, rng: &mut impl Rng) -> Duration {
        match class {
            RetryClass::ConditionNotMet => self.condition_interval,
            RetryClass::Transient => {
                let exp = streak.clamp(1, 30) as u32 - 1;
                let ceiling = self
                    .transient_base
                    .saturating_mul(1u32 << exp.min(20))
                    .min(self.transient_max);
                // Equal jitter: half fixed, half random, so a burst of failures
                // does not come back as a burst.
                let half = ceiling / 2;
                half + half.mul_f64(rng.random::<f64>())
            }
        }
    }

    /// When the next attempt is due.
    pub fn next_retry_time(
        &self,
        now: DateTime<Utc>,
        class: RetryClass,
        streak: i32,
        rng: &mut impl Rng,
    ) -> DateTime<Utc> {
        let delay = self.delay(class, streak, rng);
        crate::clock::after(now, delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn defaults() -> RetryPolicy {
        crate::controller::config::ControllerConfig::defaults("ns", "r1")
            .unwrap()
            .approver
            .retry
    }

    #[test]
    fn unmet_conditions_wait_the_long_interval() {
        let p = defaults();
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(
            p.delay(RetryClass::ConditionNotMet, 0, &mut rng),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn transient_failures_back_off_exponentially_with_jitter_up_to_the_cap() {
        let p = defaults();
        let mut rng = StdRng::seed_from_u64(7);
        for (streak, ceiling) in [(1, 2), (2, 4), (3, 8), (10, 600), (40, 600)] {
            for _ in 0..100 {
                let d = p.delay(RetryClass::Transient, streak, &mut rng);
                let ceiling = Duration::from_secs(ceiling);
                assert!(d >= ceiling / 2 && d <= ceiling, "streak {streak}: {d:?}");
            }
        }
    }
}
