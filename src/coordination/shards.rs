//! The shards this replica holds, shared between the coordinator (which
//! acquires, renews and loses them) and the controller (which claims only
//! under a guard proving the shard is held right now).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::Fence;

#[derive(Clone, Debug)]
struct Held {
    /// The shard's generation when we acquired it: the fencing token.
    token: i64,
    /// When the last successful acquire or renew was sent.
    renewed: Instant,
    /// Being handed back: no new claims.
    draining: bool,
    /// Reconciles running under a guard.
    in_flight: usize,
    /// Which hold of the shard this is (see [`Inner::holds`]): a guard
    /// taken in an earlier hold leaves this one's count alone.
    hold: u64,
}

impl Held {
    /// Renewed within `deadline` (the shard's Lease taken, or the member
    /// Lease renewed, since): until then no other replica can take it.
    fn fresh(&self, deadline: Duration) -> bool {
        self.renewed.elapsed() < deadline
    }
}

#[derive(Debug, Default)]
struct Inner {
    held: BTreeMap<u32, Held>,
    stopping: bool,
    /// Holds begun so far, over every shard: each acquisition's number.
    holds: u64,
}

/// The shards held by this replica.
#[derive(Debug)]
pub struct Shards {
    identity: String,
    shard_count: u32,
    renew_deadline: Duration,
    inner: Mutex<Inner>,
}

/// Proof that a shard was held when the guard was taken; the reconcile
/// holds it for its whole run, so a shard being handed back waits for it.
#[derive(Debug)]
pub struct ShardGuard {
    shards: Arc<Shards>,
    shard: u32,
    fence: Fence,
    /// The hold the guard was taken in.
    hold: u64,
}

impl ShardGuard {
    /// The fence every claim and write under this guard carries.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Whether the shard is still held in this guard's hold, at its token, and renewed
    /// within the renew deadline: once false, another replica may take the
    /// shard when its Lease expires, so work under the guard must stop.
    /// Draining and shutdown do not end it: both wait for running chains.
    pub fn holds(&self) -> bool {
        self.shards.lock().held.get(&self.shard).is_some_and(|h| {
            h.hold == self.hold
                && h.token == self.fence.token
                && h.fresh(self.shards.renew_deadline)
        })
    }
}

impl Drop for ShardGuard {
    fn drop(&mut self) {
        // The shard may have been lost and acquired again meanwhile: the
        // new hold's reconciles are not this guard's to uncount.
        if let Some(held) = self.shards.lock().held.get_mut(&self.shard)
            && held.hold == self.hold
        {
            held.in_flight = held.in_flight.saturating_sub(1);
        }
    }
}

impl Shards {
    /// No shard held yet.
    pub fn new(
        identity: impl Into<String>,
        shard_count: u32,
        renew_deadline: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            identity: identity.into(),
            shard_count,
            renew_deadline,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This replica's identity (Lease holder and claim holder).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// K, fixed for the replica's life.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The shard of a request.
    pub fn shard_of(&self, request_id: i64) -> u32 {
        request_id.rem_euclid(i64::from(self.shard_count.max(1))) as u32
    }

    /// A guard for `shard` if this replica can prove it holds it now: held,
    /// renewed within the renew deadline, not being handed back, and the
    /// replica not shutting down.
    pub fn guard(self: &Arc<Self>, shard: u32) -> Option<ShardGuard> {
        let mut inner = self.lock();
        if inner.stopping {
            return None;
        }
        let held = inner.held.get_mut(&shard)?;
        if held.draining || !held.fresh(self.renew_deadline) {
            return None;
        }
        held.in_flight += 1;
        let (token, hold) = (held.token, held.hold);
        drop(inner);
        Some(ShardGuard {
            shards: self.clone(),
            shard,
            fence: Fence::sharded(self.identity.clone(), token, self.shard_count),
            hold,
        })
    }

    /// The shards this replica can work now (for discovery).
    pub fn workable(&self) -> Vec<u32> {
        let inner = self.lock();
        if inner.stopping {
            return Vec::new();
        }
        inner
            .held
            .iter()
            .filter(|(_, h)| !h.draining && h.fresh(self.renew_deadline))
            .map(|(s, _)| *s)
            .collect()
    }

    /// Every shard held, workable or not.
    pub fn held(&self) -> Vec<u32> {
        self.lock().held.keys().copied().collect()
    }

    /// The tokens of every shard held (for releasing claims at shutdown).
    pub fn tokens(&self) -> Vec<i64> {
        self.lock().held.values().map(|h| h.token).collect()
    }

    /// Whether `shard` is held and past its renew deadline.
    pub fn is_overdue(&self, shard: u32) -> bool {
        self.lock()
            .held
            .get(&shard)
            .is_some_and(|h| !h.fresh(self.renew_deadline))
    }

    /// Reconciles running now under a guard, over every shard held.
    pub fn in_flight(&self) -> usize {
        self.lock().held.values().map(|h| h.in_flight).sum()
    }

    /// Whether shutdown began.
    pub fn is_stopping(&self) -> bool {
        self.lock().stopping
    }

    /// Stops every new claim (shutdown); held shards are still renewed.
    pub fn stop_claiming(&self) {
        self.lock().stopping = true;
    }

    /// Records a shard acquired at generation `token`, renewed at `at`.
    pub(super) fn insert(&self, shard: u32, token: i64, at: Instant) {
        let mut inner = self.lock();
        inner.holds += 1;
        let hold = inner.holds;
        inner.held.insert(
            shard,
            Held {
                token,
                renewed: at,
                draining: false,
                in_flight: 0,
                hold,
            },
        );
    }

    /// Records a successful renew of the member Lease sent at `at`: it
    /// vouches for every shard held. Returns the shards that were past
    /// their renew deadline (claiming in them resumes).
    pub(super) fn renewed_all(&self, at: Instant) -> Vec<u32> {
        let mut inner = self.lock();
        let mut resumed = Vec::new();
        for (shard, held) in &mut inner.held {
            if !held.fresh(self.renew_deadline) {
                resumed.push(*shard);
            }
            held.renewed = held.renewed.max(at);
        }
        resumed
    }

    /// Forgets every shard (the member Lease was taken: another replica
    /// judged this one gone and may be taking its shards).
    pub(super) fn remove_all(&self) -> Vec<u32> {
        let mut inner = self.lock();
        let lost = inner.held.keys().copied().collect();
        inner.held.clear();
        lost
    }

    /// Forgets a shard (lost or released).
    pub(super) fn remove(&self, shard: u32) {
        self.lock().held.remove(&shard);
    }

    /// Marks a shard as being handed back; returns reconciles still running in it.
    pub(super) fn drain(&self, shard: u32) -> usize {
        self.lock().held.get_mut(&shard).map_or(0, |h| {
            h.draining = true;
            h.in_flight
        })
    }

    /// Shards being handed back, with the reconciles still running in each.
    pub(super) fn draining(&self) -> Vec<(u32, usize)> {
        self.lock()
            .held
            .iter()
            .filter(|(_, h)| h.draining)
            .map(|(s, h)| (*s, h.in_flight))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_guard_needs_a_renew_within_the_deadline() {
        let shards = Shards::new("r1", 16, Duration::from_millis(50));
        assert!(shards.guard(3).is_none(), "not held");
        shards.insert(3, 7, Instant::now());
        let guard = shards.guard(3).expect("held");
        assert_eq!(guard.fence(), &Fence::sharded("r1", 7, 16));
        assert_eq!(shards.workable(), vec![3]);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(shards.guard(3).is_none(), "renew deadline passed");
        assert!(shards.workable().is_empty());
        assert!(shards.is_overdue(3));
        assert_eq!(shards.renewed_all(Instant::now()), vec![3]);
        assert!(shards.guard(3).is_some());
        assert_eq!(shards.remove_all(), vec![3]);
        assert!(shards.guard(3).is_none(), "forgotten");
    }

    #[tokio::test]
    async fn draining_refuses_new_guards_and_counts_running_ones() {
        let shards = Shards::new("r1", 16, Duration::from_secs(10));
        shards.insert(1, 1, Instant::now());
        let running = shards.guard(1).expect("held");
        assert_eq!(shards.drain(1), 1);
        assert!(shards.guard(1).is_none());
        drop(running);
        assert_eq!(shards.draining(), vec![(1, 0)]);
        shards.stop_claiming();
        shards.insert(2, 1, Instant::now());
        assert!(shards.guard(2).is_none(), "no claims while stopping");
        assert_eq!(shards.tokens(), vec![1, 1]);
    }

    #[tokio::test]
    async fn a_guard_of_an_earlier_hold_leaves_the_new_holds_count_alone() {
        let shards = Shards::new("r1", 16, Duration::from_secs(10));
        shards.insert(4, 1, Instant::now());
        let earlier = shards.guard(4).expect("held");
        // Lost, then acquired again (even at the same token) while the
        // earlier chain still runs.
        shards.remove(4);
        shards.insert(4, 1, Instant::now());
        let current = shards.guard(4).expect("held again");
        assert!(!earlier.holds(), "its hold ended");
        assert!(current.holds());
        drop(earlier);
        assert_eq!(shards.in_flight(), 1, "the new hold's chain still runs");
        assert_eq!(shards.drain(4), 1, "its hand-back waits for that chain");
        drop(current);
        assert_eq!(shards.draining(), vec![(4, 0)]);
    }
}
