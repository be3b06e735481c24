//! When to speak about a dependency that does not answer (the API server,
//! for the Lease loop and the CR watch): once when the outage begins, then
//! at most every `every` while it lasts, and once when it ends, so a long
//! outage is visible without a line every turn.

use std::time::Duration;

use tokio::time::Instant;

/// What a turn should log about the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// The first failure after a success: warn, naming the address.
    Began,
    /// Still failing, for this long: warn again (it has been `every`).
    Still(Duration),
    /// Answering again after an outage this long: say so once.
    Ended(Duration),
    /// Nothing new to say.
    Quiet,
}

/// The state of the API server as the Lease loop sees it.
#[derive(Debug)]
pub struct Outage {
    since: Option<Instant>,
    reported: Option<Instant>,
    every: Duration,
}

impl Outage {
    /// No outage yet; repeat reports `every` while one lasts.
    pub fn new(every: Duration) -> Self {
        Self {
            since: None,
            reported: None,
            every,
        }
    }

    /// A call failed at `now`.
    pub fn failed(&mut self, now: Instant) -> Report {
        let Some(since) = self.since else {
            self.since = Some(now);
            self.reported = Some(now);
            return Report::Began;
        };
        if self
            .reported
            .is_none_or(|at| now.duration_since(at) >= self.every)
        {
            self.reported = Some(now);
            return Report::Still(now.duration_since(since));
        }
        Report::Quiet
    }

    /// A call succeeded at `now`.
    pub fn succeeded(&mut self, now: Instant) -> Report {
        self.reported = None;
        match self.since.take() {
            Some(since) => Report::Ended(now.duration_since(since)),
            None => Report::Quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_reported_when_it_begins_every_period_and_when_it_ends() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let mut outage = Outage::new(s(30));
        assert_eq!(outage.succeeded(t), Report::Quiet);
        assert_eq!(outage.failed(t), Report::Began);
        // A turn every 2 s: quiet until 30 s have passed since the last report.
        for k in 1..15 {
            assert_eq!(outage.failed(t + s(2 * k)), Report::Quiet, "{k}");
        }
        assert_eq!(outage.failed(t + s(30)), Report::Still(s(30)));
        assert_eq!(outage.failed(t + s(32)), Report::Quiet);
        assert_eq!(outage.failed(t + s(60)), Report::Still(s(60)));
        assert_eq!(outage.succeeded(t + s(62)), Report::Ended(s(62)));
        assert_eq!(outage.succeeded(t + s(64)), Report::Quiet);
        assert_eq!(outage.failed(t + s(66)), Report::Began);
    }
}
