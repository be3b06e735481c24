//! A lagging read replica (issue 19, point 5): a real MariaDB primary and a
//! real replica replicating from it by binary log (crates/throwaway-db). The
//! candidates come from the replica, every check and write goes to the
//! primary; with the replica's SQL thread stopped, requests approved on the
//! primary stay candidates on the replica, and those stale candidates must
//! cost only refused claims: nothing claimed, run or created again.

use std::collections::BTreeMap;
use std::time::Duration as StdDuration;

use autoapproval::approval::{AttemptOutcome, TurnReport, run_turn};
use autoapproval::domain::RequestStatus;
use chrono::Duration;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use throwaway_db::Replicated;

use crate::support::{Db, Env, NewRequest, defaults, fence};

/// Approvable requests inserted on the primary.
const REQUESTS: i64 = 6;
/// Discovery turns run on the stale replica after every request is approved.
const STALE_TURNS: usize = 4;
/// How long replication may take to catch up.
const CATCH_UP: StdDuration = StdDuration::from_secs(30);

async fn pool(url: &str) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// What the primary holds of every request's processing: the request rows
/// with what the chain wrote into them, the e-contract ledger the chain
/// syncs (synced_at is the engine's clock, which moves each turn), the memos,
/// the state rows, and the state table's next id (a claim inserted and
/// deleted again moves it).
async fn writer_snapshot(writer: &MySqlPool) -> BTreeMap<&'static str, Vec<String>> {
    let queries = [
        (
            "requests",
            "SELECT CONCAT_WS('|', id, status, owner_number, store_number, updated_at)
               FROM approval_request ORDER BY id",
        ),
        (
            "ledger",
            "SELECT CONCAT_WS('|', contract_ref, status, synced_at) FROM econtract ORDER BY contract_ref",
        ),
        (
            "memos",
            "SELECT CONCAT_WS('|', request_id, message) FROM approval_request_memo ORDER BY id",
        ),
        (
            "state rows",
            "SELECT CONCAT_WS('|', request_id, status) FROM auto_approve_state ORDER BY id",
        ),
        (
            "next state id",
            "SELECT CAST(AUTO_INCREMENT AS CHAR) FROM information_schema.TABLES
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'auto_approve_state'",
        ),
    ];
    let mut snapshot = BTreeMap::new();
    for (name, sql) in queries {
        let rows: Vec<(String,)> = sqlx::query_as(sql)
            .fetch_all(writer)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        snapshot.insert(name, rows.into_iter().map(|(r,)| r).collect());
    }
    snapshot
}

/// One discovery turn of the engine at the clock's time, a minute later
/// each call.
async fn turn(env: &Env) -> TurnReport {
    env.clock.advance(Duration::minutes(1));
    run_turn(
        &env.approver,
        &defaults().discovery.turn,
        &fence("replica-1", 1),
        None,
    )
    .await
    .expect("a discovery turn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_candidates_of_a_frozen_replica_cost_only_refused_claims() {
    let pair = Replicated::start()
        .await
        .expect("a MariaDB primary and replica start (Debian's mariadb-server)");
    pair.create_database("autoapproval")
        .await
        .expect("create the database");
    let primary_url = pair.primary().database_url("autoapproval");
    let replica_url = pair.replica().database_url("autoapproval");
    let writer = pool(&primary_url).await;
    let reader = pool(&replica_url).await;
    let primary = Db::Mysql(writer.clone());
    primary
        .database()
        .migrate(true)
        .await
        .expect("migrations apply on the primary");
    for id in 1..=REQUESTS {
        NewRequest::ready_owner(id).insert(&primary).await;
    }
    pair.wait_caught_up(CATCH_UP)
        .await
        .expect("the replica has the requests");
    // From here on the replica receives the primary's changes but applies
    // none: its candidates go stale.
    pair.stop_applying().await.expect("stop the SQL thread");
    let pending_on = |pool: MySqlPool| async move {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM approval_request WHERE status = 'PENDING'")
                .fetch_one(&pool)
                .await
                .expect("count pending requests");
        n
    };

    let env = Env::with_read_replica(&primary_url, &replica_url).await;
    let mut turns = 0;
    while pending_on(writer.clone()).await > 0 {
        turns += 1;
        assert!(turns <= 5, "not every request approved after 5 turns");
        let report = turn(&env).await;
        assert_eq!(report.errors, 0, "{report:?}");
    }
    assert_eq!(env.metrics.claims("won"), REQUESTS as u64);
    let approved = env.sim.stats();
    let before = writer_snapshot(&writer).await;
    let refused_before = env.metrics.claims("already_done");
    eprintln!("approved in {turns} turn(s); the primary: {before:?}");

    // The replica still lists every request; the engine keeps discovering.
    let mut stale_seen = 0;
    for _ in 0..STALE_TURNS {
        assert_eq!(
            pending_on(reader.clone()).await,
            REQUESTS,
            "the replica applied"
        );
        let report = turn(&env).await;
        assert_eq!(report.errors, 0, "{report:?}");
        assert_eq!(
            report.candidates, REQUESTS as usize,
            "the stale replica's candidates: {report:?}"
        );
        for (id, outcome) in &report.outcomes {
            assert_eq!(
                *outcome,
                AttemptOutcome::Superseded(RequestStatus::Approved),
                "request {id}: refused at the claim as already approved"
            );
        }
        stale_seen += report.candidates as u64;
    }

    // No approved request claimed again, no chain run again, nothing
    // created again: the primary is as the approvals left it.
    assert_eq!(
        env.metrics.claims("won"),
        REQUESTS as u64,
        "an approved request was claimed again"
    );
    assert_eq!(
        writer_snapshot(&writer).await,
        before,
        "the primary changed: a stale candidate was claimed or its chain ran"
    );
    let stats = env.sim.stats();
    assert_eq!(
        stats.calls, approved.calls,
        "external calls made for stale candidates"
    );
    for id in 1..=REQUESTS {
        let created = stats.for_request(id);
        assert_eq!(
            (created.owner, created.store, created.campaign),
            (1, 1, 0),
            "request {id}: one owner and one store created"
        );
    }
    assert_eq!(stats.duplicate_creations, 0);
    assert_eq!(stats.overlapping_creations, 0, "two chains at once");
    // The stale candidates cost refused claims, each counted.
    let refused = env.metrics.claims("already_done") - refused_before;
    assert!(
        refused >= stale_seen,
        "{refused} claims refused as already done for {stale_seen} stale candidates"
    );
    eprintln!("{stale_seen} stale candidates over {STALE_TURNS} turns, {refused} claims refused");

    // Applying again, the replica converges: nothing left to discover.
    pair.start_applying().await.expect("start the SQL thread");
    pair.wait_caught_up(CATCH_UP)
        .await
        .expect("the replica catches up");
    assert_eq!(pending_on(reader.clone()).await, 0);
    let report = turn(&env).await;
    assert_eq!((report.candidates, report.errors), (0, 0), "{report:?}");
    assert_eq!(writer_snapshot(&writer).await, before);
    writer.close().await;
    reader.close().await;
}
