//! Living beside the business system: its own writes, made as a role with
//! only the grants the README documents, never fail or wait because of us.

use autoapproval::approval::{AttemptOutcome, attempt_all};
use autoapproval::clock::Clock;
use autoapproval::domain::RequestType;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::support::{Env, NewRequest, defaults, fence, request_view};

/// A login role with exactly the documented grants of the business system:
/// its own tables, nothing of ours. Roles are cluster-wide: the name is unique.
async fn business_role(pool: &PgPool) -> (String, PgPool) {
    let role = format!("business_{}", std::process::id() ^ rand::random::<u32>());
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
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
    let options = (*pool.connect_options()).clone().username(&role);
    let business = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("the business role connects");
    (role, business)
}

/// The business system updates the facts of requests the controller is
/// claiming, working and completing at that moment, in short transactions
/// that hold the request row: before migration 0010 its trigger updated our
/// state rows, which deadlocked with a completion and was refused to a role
/// without grants on them. Now the business side only appends a wake row:
/// none of its writes fails, and every request is approved.
#[sqlx::test(migrations = "migrations/postgres")]
async fn business_writes_racing_the_chains_never_fail_and_every_request_is_approved(pool: PgPool) {
    const REQUESTS: i64 = 40;
    let (role, business) = business_role(&pool).await;
    let env = Env::start(pool.clone()).await;
    for id in 1..=REQUESTS {
        NewRequest::ready_owner(id).insert(&pool).await;
    }

    // The business side: rounds of short transactions over every request,
    // each changing a fact its trigger reacts to, holding the row a moment.
    let writer = tokio::spawn({
        let business = business.clone();
        async move {
            let mut errors = Vec::new();
            for round in 0..6 {
                for id in 1..=REQUESTS {
                    let result: Result<(), sqlx::Error> = async {
                        let mut tx = business.begin().await?;
                        sqlx::query(
                            "UPDATE approval_request
                                SET target_store_number = COALESCE(target_store_number, 0) + 1
                              WHERE id = $1",
                        )
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                        sqlx::query("SELECT pg_sleep(0.005)")
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await
                    }
                    .await;
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
        assert_eq!(request_view(&pool, id).await.status, "APPROVED", "{id}");
    }
    business.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP OWNED BY {role}")))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&pool)
        .await
        .unwrap();
}
