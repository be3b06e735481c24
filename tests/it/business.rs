//! Living beside the business system: its own writes, made as a role with
//! only the grants the README documents, never fail or wait because of us.

use autoapproval::approval::{AttemptOutcome, attempt_all};
use autoapproval::clock::Clock;
use autoapproval::domain::{DEFAULT_RETRY_LIMIT, RequestType};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;

use crate::support::{
    Db, Env, NewRequest, candidate, defaults, fence, on_both, request_view, with_pool,
};

/// A login role with exactly the documented grants of the business system:
/// its own tables, nothing of ours (our triggers run with their definer's
/// rights), and a pool of its sessions with the server's defaults (on
/// MySQL, InnoDB's REPEATABLE READ). Roles are server-wide: the name is
/// unique. The statements differ by dialect: roles, grants and sequences.
async fn business_role(db: &Db) -> (String, Db) {
    let role = format!("business_{}", std::process::id() ^ rand::random::<u32>());
    match db {
        Db::Postgres(pool) => {
            let database: (String,) = sqlx::query_as("SELECT current_database()")
                .fetch_one(pool)
                .await
                .unwrap();
            for sql in [
                format!("CREATE ROLE {role} LOGIN"),
                format!("GRANT CONNECT ON DATABASE \"{}\" TO {role}", database.0),
                format!("GRANT USAGE ON SCHEMA public TO {role}"),
                format!(
                    "GRANT SELECT, INSERT, UPDATE ON approval_request, approval_request_memo, econtract TO {role}"
                ),
                format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"),
            ] {
                db.exec(&sql).await;
            }
            let options = (*pool.connect_options()).clone().username(&role);
            let business = PgPoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .expect("the business role connects");
            (role, Db::Postgres(business))
        }
        Db::Mysql(pool) => {
            let database = pool
                .connect_options()
                .get_database()
                .expect("a database name")
                .to_owned();
            db.exec(&format!("CREATE USER '{role}'@'%'")).await;
            for table in ["approval_request", "approval_request_memo", "econtract"] {
                db.exec(&format!(
                    "GRANT SELECT, INSERT, UPDATE ON {database}.{table} TO '{role}'@'%'"
                ))
                .await;
            }
            // The server's session defaults, not the controller's.
            let options = (*pool.connect_options())
                .clone()
                .username(&role)
                .timezone(None);
            let business = MySqlPoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .expect("the business role connects");
            (role, Db::Mysql(business))
        }
    }
}

/// Closes the business role's pool and drops the role.
async fn drop_business_role(db: &Db, role: &str, business: Db) {
    with_pool!(&business, pool => pool.close().await);
    match db {
        Db::Postgres(_) => {
            db.exec(&format!("DROP OWNED BY {role}")).await;
            db.exec(&format!("DROP ROLE {role}")).await;
        }
        Db::Mysql(_) => {
            db.exec(&format!("DROP USER '{role}'@'%'")).await;
        }
    }
}

on_both!(business_writes_racing_the_chains_never_fail_and_every_request_is_approved);
/// The business system updates the facts of requests the controller is
/// claiming, working and completing at that moment, in short transactions
/// that hold the request row: before migration 0010 its trigger updated our
/// state rows, which deadlocked with a completion and was refused to a role
/// without grants on them. Now the business side only appends a wake row:
/// none of its writes fails, and every request is approved.
async fn business_writes_racing_the_chains_never_fail_and_every_request_is_approved(db: Db) {
    const REQUESTS: i64 = 40;
    let (role, business) = business_role(&db).await;
    let env = Env::start(db.clone()).await;
    for id in 1..=REQUESTS {
        NewRequest::ready_owner(id).insert(&db).await;
    }
    // By key, as the business system edits a request.
    let update = business.sql(
        "UPDATE approval_request
            SET target_store_number = COALESCE(target_store_number, 0) + 1
          WHERE id = $1",
    );
    // The row held a moment: each dialect has its own sleep.
    let sleep = match business {
        Db::Postgres(_) => "SELECT pg_sleep(0.005)",
        Db::Mysql(_) => "SELECT SLEEP(0.005)",
    };

    // The business side: rounds of short transactions over every request,
    // each changing a fact its trigger reacts to, holding the row a moment.
    let writer = tokio::spawn({
        let business = business.clone();
        async move {
            let mut errors = Vec::new();
            for round in 0..6 {
                for id in 1..=REQUESTS {
                    let result: Result<(), sqlx::Error> = with_pool!(&business, pool => async {
                        let mut tx = pool.begin().await?;
                        sqlx::query(sqlx::AssertSqlSafe(update.clone()))
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                        sqlx::query(sleep).execute(&mut *tx).await?;
                        tx.commit().await
                    }
                    .await);
                    if let Err(error) = result {
                        errors.push(format!("round {round}, request {id}: {error}"));
                    }
                }
            }
            errors
        }
    });

    // The controller side: turns until every request is approved.
    let turn = defaults().discovery.turn;
    for _ in 0..50 {
        let query = turn.query(RequestType::OwnerContract, env.clock.now(), 300, None);
        let candidates = env.store.candidates(&query).await.unwrap();
        if candidates.is_empty() {
            break;
        }
        let report = attempt_all(&env.approver, &candidates, &fence("a", 1), 8).await;
        assert_eq!(report.errors, 0, "{report:?}");
        for (_, outcome) in &report.outcomes {
            assert!(
                matches!(
                    outcome,
                    AttemptOutcome::Approved | AttemptOutcome::RetryScheduled { .. }
                ),
                "{outcome:?}"
            );
        }
        env.clock.advance(chrono::Duration::minutes(11));
    }

    let errors = writer.await.unwrap();
    assert_eq!(
        errors,
        Vec::<String>::new(),
        "the business side never fails"
    );
    for id in 1..=REQUESTS {
        assert_eq!(request_view(&db, id).await.status, "APPROVED", "{id}");
    }
    drop_business_role(&db, &role, business).await;
}

on_both!(a_fact_changed_before_the_first_claim_committed_is_acted_on_at_once);
/// The business releases the documents in a transaction that commits only
/// after the first attempt has claimed the request and read it: that
/// attempt saw the old fact and waits the long interval. The change's wake
/// is recorded however the claim stood, so the next discovery turn makes
/// the request due and the retry approves it, the clock not moved. Before
/// (issue 33), PostgreSQL's trigger wrote no wake (its test for a state row
/// ran before the claim committed) and MySQL's turn dropped the wake row
/// as older than the claim: the request waited its 10 minutes.
async fn a_fact_changed_before_the_first_claim_committed_is_acted_on_at_once(db: Db) {
    let (role, business) = business_role(&db).await;
    let env = Env::start(db.clone()).await;
    NewRequest {
        documents_released: false,
        ..NewRequest::ready_owner(1)
    }
    .insert(&db)
    .await;
    let held = business
        .business_transaction("UPDATE approval_request SET documents_released = true WHERE id = 1")
        .await;

    let outcome = env
        .approver
        .attempt(&candidate(1, None), &fence("a", 1))
        .await
        .expect("an outcome");
    let AttemptOutcome::RetryScheduled {
        next_retry_time, ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert!(
        next_retry_time > env.clock.now() + chrono::Duration::minutes(5),
        "the attempt read the old fact and waits the long interval: {next_retry_time}"
    );
    held.commit().await;

    // A discovery turn (a notification only brings it forward).
    let due = env
        .store
        .apply_wakes(None, env.clock.now(), DEFAULT_RETRY_LIMIT)
        .await
        .expect("apply wakes");
    assert_eq!(due, [1], "the change made the waiting request due");
    let state = env
        .store
        .state(1)
        .await
        .unwrap()
        .expect("a waiting state row");
    let outcome = env
        .approver
        .attempt(&candidate(1, Some(state.id)), &fence("a", 1))
        .await
        .expect("an outcome");
    assert_eq!(outcome, AttemptOutcome::Approved);

    drop_business_role(&db, &role, business).await;
}
