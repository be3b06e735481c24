//! Where this process's wake poller stands in auto_approve_wake: pure
//! bookkeeping, no I/O, so it is tested alone.
//!
//! AUTO_INCREMENT ids are given out when a row is inserted, not when its
//! transaction commits: a poller that has read id 11 may see id 10 commit
//! later. The poller remembers the ids it skipped (holes) for HOLE_WAIT and
//! reads from the oldest of them (a fresh poller counts the START_HOLES ids
//! below the oldest row as holes too). `apply_wakes` makes every woken
//! waiting request due at once, but deletes only rows below the oldest
//! hole, so a new request's row is never deleted before this replica's
//! poller saw it. A hole is also a row another replica consumed first, or
//! a rolled-back insert: the rows above it then stay up to HOLE_WAIT longer,
//! which delays their deletion, not a wake.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How long an id skipped by the poller is looked for again.
const HOLE_WAIT: Duration = Duration::from_secs(10);
/// Ids below the oldest row a fresh poller treats as holes: rows of
/// business transactions still open when it started.
const START_HOLES: i64 = 1000;
/// At most this many holes are remembered (auto_increment_increment > 1
/// makes every other id one); the oldest are forgotten first.
const MAX_HOLES: usize = 10_000;

/// How far this process's poller has read the wake table.
#[derive(Debug)]
pub(super) struct WakeCursor {
    /// Every row at or below this id was seen by the poller; `i64::MAX`
    /// while no poller runs in this process (notifications off), so the
    /// discovery turn consumes every row as PostgreSQL's does.
    pub(super) seen_upto: AtomicI64,
    poll: Mutex<PollState>,
}

#[derive(Debug, Default)]
pub(super) struct PollState {
    /// The highest id read; `None` before the first poll.
    pub(super) cursor: Option<i64>,
    /// Ids below the cursor not read yet, with when they were skipped.
    holes: BTreeMap<i64, Instant>,
}

impl Default for WakeCursor {
    fn default() -> Self {
        Self {
            seen_upto: AtomicI64::new(i64::MAX),
            poll: Mutex::new(PollState::default()),
        }
    }
}

impl WakeCursor {
    pub(super) fn seen_upto(&self) -> i64 {
        self.seen_upto.load(Ordering::Acquire)
    }

    /// The poller's position. Nothing panics while it is held; were it
    /// poisoned, the position it holds is still one the poller wrote.
    pub(super) fn state(&self) -> MutexGuard<'_, PollState> {
        self.poll.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PollState {
    /// The rows of `rows` (id order) this poller had not seen, after which
    /// the cursor, holes and `seen_upto` are advanced.
    pub(super) fn take<T>(
        &mut self,
        rows: Vec<(i64, T)>,
        seen_upto: &AtomicI64,
        now: Instant,
    ) -> Vec<T> {
        let mut cursor = self.cursor.unwrap_or(0);
        let mut fresh = Vec::new();
        for (id, row) in rows {
            if id <= cursor {
                if self.holes.remove(&id).is_some() {
                    fresh.push(row);
                }
                continue;
            }
            for skipped in (cursor + 1)..id {
                if self.holes.len() >= MAX_HOLES {
                    break;
                }
                self.holes.insert(skipped, now);
            }
            cursor = id;
            fresh.push(row);
        }
        self.cursor = Some(cursor);
        self.holes
            .retain(|_, since| now.duration_since(*since) < HOLE_WAIT);
        let upto = self.holes.keys().next().map_or(cursor, |oldest| oldest - 1);
        seen_upto.store(upto, Ordering::Release);
        fresh
    }

    /// A fresh poller's position: before the oldest row, the START_HOLES
    /// ids below it taken as holes.
    pub(super) fn start(&mut self, oldest: Option<i64>, now: Instant) {
        if self.cursor.is_some() {
            return;
        }
        let cursor = oldest.map_or(0, |id| id - 1);
        for id in (cursor - START_HOLES + 1).max(1)..=cursor {
            self.holes.insert(id, now);
        }
        self.cursor = Some(cursor);
    }

    /// Where the next read starts: past the oldest hole, else the cursor.
    pub(super) fn read_from(&self) -> i64 {
        self.holes
            .keys()
            .next()
            .map_or(self.cursor.unwrap_or(0), |oldest| oldest - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_id_is_read_later_and_holds_back_consumption() {
        let seen = AtomicI64::new(i64::MAX);
        let mut state = PollState {
            cursor: Some(9),
            ..PollState::default()
        };
        let t0 = Instant::now();
        // 10 is not committed yet: 11 is read, 10 becomes a hole.
        assert_eq!(state.take(vec![(11, 'b')], &seen, t0), ['b']);
        assert_eq!(seen.load(Ordering::Acquire), 9);
        assert_eq!(state.read_from(), 9);
        // 10 commits: read once, 11 not again.
        assert_eq!(state.take(vec![(10, 'a'), (11, 'b')], &seen, t0), ['a']);
        assert_eq!(seen.load(Ordering::Acquire), 11);
        // A hole that never fills is given up after HOLE_WAIT.
        state.take(vec![(13, 'd')], &seen, t0);
        assert_eq!(seen.load(Ordering::Acquire), 11);
        state.take(Vec::<(i64, char)>::new(), &seen, t0 + HOLE_WAIT);
        assert_eq!(seen.load(Ordering::Acquire), 13);
    }

    #[test]
    fn a_fresh_poller_waits_for_ids_below_the_oldest_row() {
        let seen = AtomicI64::new(i64::MAX);
        let mut state = PollState::default();
        let t0 = Instant::now();
        state.start(Some(5), t0);
        assert_eq!(state.read_from(), 0);
        assert_eq!(state.take(vec![(5, 'e')], &seen, t0), ['e']);
        assert_eq!(seen.load(Ordering::Acquire), 0);
        // 3 commits after the poller started: read, not lost.
        assert_eq!(state.take(vec![(3, 'c'), (5, 'e')], &seen, t0), ['c']);
        state.take(Vec::<(i64, char)>::new(), &seen, t0 + HOLE_WAIT);
        assert_eq!(seen.load(Ordering::Acquire), 5);
    }
}
