//! The engine under test: an approver over the test's database, the
//! simulator over loopback HTTP, a manual clock, and the values tests place
//! their fixtures around.

use std::sync::Arc;

use autoapproval::approval::{Approver, ApproverConfig, AttemptOutcome};
use autoapproval::clock::{ManualClock, SharedClock};
use autoapproval::controller::config::ControllerConfig;
use autoapproval::db::{ClaimOutcome, Database, DatabaseArgs, SessionArgs};
use autoapproval::domain::{Candidate, Claim, DEFAULT_RETRY_LIMIT, Fence, RequestType};
use autoapproval::external::System;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{FaultKind, Faults, SimHandle, SimSystem};
use chrono::{DateTime, TimeZone, Utc};

use super::db::AsDb;

/// A fixed "now" for tests, so fixtures can be placed relative to it.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0)
        .single()
        .expect("valid time")
}

/// The controller's documented defaults, for replica "replica-1" in the
/// tests' namespace.
pub fn defaults() -> ControllerConfig {
    ControllerConfig::defaults(super::NS, "replica-1").expect("the defaults are valid")
}

/// Everything a test of the engine needs.
pub struct Env {
    pub store: Database,
    pub sim: SimHandle,
    pub clock: ManualClock,
    pub metrics: Metrics,
    pub approver: Arc<Approver>,
}

impl Env {
    /// Starts a simulator and builds an approver over `pool`, with the
    /// clock standing at `t0()`.
    pub async fn start(pool: impl AsDb) -> Env {
        Self::with_external(pool, |c| c).await
    }

    /// Like `start`, with the external client settings adjusted.
    pub async fn with_external(
        pool: impl AsDb,
        adjust: impl FnOnce(ExternalArgs) -> ExternalArgs,
    ) -> Env {
        Self::with(pool, adjust, defaults().approver).await
    }

    /// Like `start`, with the attempt settings given (a lower retry limit, say).
    pub async fn with_approver(pool: impl AsDb, config: ApproverConfig) -> Env {
        Self::with(pool, |c| c, config).await
    }

    /// Like `start`, the store connected as `run` connects it: by the
    /// database's URL, its sessions limited by `session`.
    pub async fn with_session(db: impl AsDb, session: &SessionArgs) -> Env {
        Self::connected(&db.db().url(), None, Some(session)).await
    }

    /// Like `start`, the store connected as `run` connects it to a primary
    /// (`database_url`) and a read replica (`read_database_url`).
    pub async fn with_read_replica(database_url: &str, read_database_url: &str) -> Env {
        Self::connected(database_url, Some(read_database_url), None).await
    }

    async fn connected(url: &str, read_url: Option<&str>, session: Option<&SessionArgs>) -> Env {
        let args = DatabaseArgs {
            database_url: url.parse().expect("the test database's URL"),
            read_database_url: read_url.map(|u| u.parse().expect("the read replica's URL")),
            db_max_connections: 4,
            wake_poll_interval: std::time::Duration::from_millis(250),
            vocabulary: None,
        };
        let store = Database::connect(&args, session)
            .await
            .expect("the store connects");
        Self::over(store, |c| c, defaults().approver).await
    }

    async fn with(
        pool: impl AsDb,
        adjust: impl FnOnce(ExternalArgs) -> ExternalArgs,
        approver_config: ApproverConfig,
    ) -> Env {
        Self::over(pool.db().database(), adjust, approver_config).await
    }

    async fn over(
        store: Database,
        adjust: impl FnOnce(ExternalArgs) -> ExternalArgs,
        approver_config: ApproverConfig,
    ) -> Env {
        let sim = super::simulator().await;
        let config = adjust(ExternalArgs::all_at(sim.base_url()).expect("defaults"));
        let external = HttpExternalSystems::build(&config).expect("external clients");
        let clock = ManualClock::new(t0());
        let shared: SharedClock = Arc::new(clock.clone());
        let metrics = Metrics::new();
        let approver = Arc::new(Approver::new(
            store.clone(),
            external,
            shared,
            metrics.clone(),
            approver_config,
        ));
        Env {
            store,
            sim,
            clock,
            metrics,
            approver,
        }
    }

    /// Attempts `candidate` as the tests' usual worker: "a" with token 1.
    pub async fn attempt(&self, candidate: &Candidate) -> AttemptOutcome {
        self.approver
            .attempt(candidate, &fence("a", 1))
            .await
            .unwrap()
    }

    /// Makes the next call of `system` fail as `kind`.
    pub fn fail_next(&self, system: System, kind: FaultKind) {
        self.sim
            .set_faults(Faults::fail_next(system, 1, kind))
            .unwrap();
    }
}

/// An owner contract as the candidate query returns it.
pub fn candidate(id: i64, state_id: Option<i64>) -> Candidate {
    Candidate {
        request_id: id,
        request_type: RequestType::OwnerContract,
        state_id,
    }
}

/// The fence of a test worker.
pub fn fence(holder: &str, token: i64) -> Fence {
    Fence::new(holder, token)
}

/// Claims new owner contract `id` for `holder` with token 1, which must win it.
pub async fn claim_new(store: &Database, id: i64, holder: &str) -> Claim {
    match store
        .claim(
            &candidate(id, None),
            &fence(holder, 1),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Won(claim) => claim,
        lost => panic!("{holder} claims request {id}: {lost:?}"),
    }
}

/// Runs the due retry of request `id` (the clock set to its retry time)
/// as worker "a" with token 1.
pub async fn attempt_due_retry(env: &Env, id: i64, request_type: RequestType) -> AttemptOutcome {
    let state = env.store.state(id).await.unwrap().unwrap();
    env.clock.set(state.next_retry_time.unwrap());
    let retry = Candidate {
        request_id: id,
        request_type,
        state_id: Some(state.id),
    };
    env.attempt(&retry).await
}

/// Calls of `system` that take `latency`, every other call at once.
pub fn slow(system: System, latency: std::time::Duration) -> Faults {
    Faults {
        latency,
        system: Some(system.into()),
        ..Faults::default()
    }
}

/// Waits until the simulator is serving a call of `system`.
pub async fn wait_in_call(env: &Env, system: SimSystem) {
    super::eventually("a call in flight", || async {
        (*env.sim.stats().in_flight.get(system) > 0).then_some(())
    })
    .await;
}
