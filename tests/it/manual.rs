//! The manual-approval path (migration 0013): people claiming and deciding
//! through the SQL functions while a replica of the controller runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autoapproval::controller::crd::Phase;
use autoapproval_sim::Faults;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

use crate::support::{
    Cluster, eventually, memos, owner_now, set, test_settings, waiting_owner_now,
};

/// A person's claim: the token, or why it was refused.
async fn claim(pool: &PgPool, id: i64, who: &str) -> Result<i64, String> {
    let (token, refusal): (Option<i64>, Option<String>) =
        sqlx::query_as("SELECT token, refusal FROM autoapproval_manual_claim($1, $2)")
            .bind(id)
            .bind(who)
            .fetch_one(pool)
            .await
            .expect("manual claim");
    token.ok_or_else(|| refusal.unwrap_or_default())
}

async fn decide(
    pool: &PgPool,
    id: i64,
    who: &str,
    token: i64,
    decision: &str,
) -> Result<(), String> {
    let (decided, refusal): (bool, Option<String>) = sqlx::query_as(
        "SELECT decided, refusal FROM autoapproval_manual_decide($1, $2, $3, $4, 'by hand')",
    )
    .bind(id)
    .bind(who)
    .bind(token)
    .bind(decision)
    .fetch_one(pool)
    .await
    .expect("manual decide");
    if decided {
        Ok(())
    } else {
        Err(refusal.unwrap_or_default())
    }
}

async fn release(pool: &PgPool, id: i64, who: &str, token: i64) -> bool {
    sqlx::query_scalar("SELECT autoapproval_manual_release($1, $2, $3)")
        .bind(id)
        .bind(who)
        .bind(token)
        .fetch_one(pool)
        .await
        .expect("manual release")
}

/// Logs every move of a request to a decided status, so a second decision
/// cannot hide behind the first.
async fn log_decisions(pool: &PgPool) {
    for statement in [
        "CREATE TABLE test_decision (request_id BIGINT, status TEXT, decided_by TEXT)",
        "CREATE FUNCTION test_log_decision() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.status IN ('APPROVED', 'REJECTED', 'CANCELED') AND NEW.status IS DISTINCT FROM OLD.status THEN
                 INSERT INTO test_decision VALUES (NEW.id, NEW.status, NEW.decided_by);
             END IF;
             RETURN NULL;
         END $$",
        "CREATE TRIGGER test_log_decision AFTER UPDATE ON approval_request
             FOR EACH ROW EXECUTE FUNCTION test_log_decision()",
    ] {
        sqlx::query(statement).execute(pool).await.expect("decision log");
    }
}

/// The controller and 8 people on 200 requests for 20 s: the requests wait
/// for their documents, released a few at a time, while the people claim
/// at random and decide or release what they get. Every request ends
/// decided exactly once, by whoever held the claim; nothing is created for
/// a request a person decided; no two chains overlap.
#[sqlx::test(migrations = "migrations/postgres")]
async fn people_and_the_controller_decide_each_request_exactly_once(pool: PgPool) {
    log_decisions(&pool).await;
    let mut settings = test_settings();
    settings.discovery.poll_period = Duration::from_secs(1);
    let faults = Faults {
        latency: Duration::from_millis(15),
        ..Faults::default()
    };
    let mut cluster = Cluster::with_faults(pool.clone(), settings, faults).await;
    const N: i64 = 200;
    for id in 1..=N {
        waiting_owner_now(id).insert(&pool).await;
    }

    // Who decided what, as the people saw it.
    let decided: Arc<Mutex<BTreeMap<i64, String>>> = Arc::default();
    let refusals: Arc<Mutex<BTreeMap<&str, u64>>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(20);
    let mut people = Vec::new();
    for p in 0..8 {
        let (pool, decided, refusals) = (pool.clone(), decided.clone(), refusals.clone());
        people.push(tokio::spawn(async move {
            let who = format!("person-{p}");
            let mut rng = StdRng::seed_from_u64(p);
            while Instant::now() < until {
                let id = rng.random_range(1..=N);
                match claim(&pool, id, &who).await {
                    Err(why) => {
                        let kind = if why.starts_with("auto-approval is running") {
                            "auto-approval running"
                        } else if why.contains("is already") {
                            "already decided"
                        } else if why.contains("is claimed by") {
                            "another person"
                        } else {
                            "other"
                        };
                        *refusals.lock().unwrap().entry(kind).or_default() += 1;
                        // A person takes a moment before the next one.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok(token) => {
                        let pause = Duration::from_millis(rng.random_range(0..20));
                        let decides = rng.random_bool(0.1);
                        let decision = if rng.random_bool(0.5) {
                            "APPROVED"
                        } else {
                            "REJECTED"
                        };
                        tokio::time::sleep(pause).await;
                        if decides {
                            decide(&pool, id, &who, token, decision)
                                .await
                                .unwrap_or_else(|why| panic!("{who} held {id} but: {why}"));
                            let before =
                                decided.lock().unwrap().insert(id, format!("manual:{who}"));
                            assert_eq!(before, None, "request {id} decided twice by people");
                        } else {
                            assert!(release(&pool, id, &who, token).await, "{who} held {id}");
                        }
                    }
                }
            }
        }));
    }
    // Documents released a few at a time while the people work.
    for wave in 0..10 {
        let from = wave * 20 + 1;
        sqlx::query(
            "UPDATE approval_request SET documents_released = true WHERE id BETWEEN $1 AND $2",
        )
        .bind(from)
        .bind(from + 19)
        .execute(&pool)
        .await
        .expect("release documents");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for person in people {
        person.await.expect("a person's loop");
    }
    eventually("every request to be decided", || async {
        let (open,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM approval_request WHERE id <= $1 AND status IN ('PENDING', 'RETRY', 'ING')",
        )
        .bind(N)
        .fetch_one(&pool)
        .await
        .ok()?;
        (open == 0).then_some(())
    })
    .await;

    let log: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT request_id, status, decided_by FROM test_decision ORDER BY request_id",
    )
    .fetch_all(&pool)
    .await
    .expect("decision log");
    let ids: BTreeSet<i64> = log.iter().map(|d| d.0).collect();
    assert_eq!(
        (log.len(), ids.len()),
        (N as usize, N as usize),
        "one decision each: {log:?}"
    );
    let decided = decided.lock().unwrap().clone();
    let stats = cluster.sim.stats();
    let mut by_people = 0;
    for (id, status, by) in &log {
        match decided.get(id) {
            Some(person) => {
                by_people += 1;
                assert_eq!(by, person, "request {id}");
                let made = stats.for_request(*id);
                assert_eq!(
                    (made.owner, made.store),
                    (0, 0),
                    "request {id} decided by {by} ({status}) had creations"
                );
            }
            None => {
                assert_eq!(
                    (by.as_str(), status.as_str()),
                    ("autoapproval", "APPROVED"),
                    "request {id}"
                );
                assert_eq!(stats.for_request(*id).owner, 1, "request {id}");
            }
        }
    }
    assert_eq!(stats.overlapping_creations, 0);
    assert_eq!(stats.duplicate_creations, 0);
    let refusals = refusals.lock().unwrap().clone();
    eprintln!(
        "{by_people} of {N} decided by people, {} by the controller; refused claims: {refusals:?}",
        N - by_people
    );
    assert!(by_people > 0 && by_people < N, "both sides decided some");
    assert!(
        refusals.contains_key("auto-approval running"),
        "a person met a running chain: {refusals:?}"
    );
    cluster.stop().await;
}

/// A claim of a crashed service, never heartbeaten nor released, is
/// returned by the cleanser after the stuck threshold with a memo naming
/// its holder, and the controller then approves the request.
#[sqlx::test(migrations = "migrations/postgres")]
async fn a_manual_claim_left_by_a_crashed_service_is_returned_after_the_stuck_threshold(
    pool: PgPool,
) {
    let mut settings = test_settings();
    settings.cleanse_interval = Duration::from_millis(200);
    settings.stuck_threshold = Duration::from_secs(3);
    settings.approver.heartbeat_interval = Duration::from_secs(1);
    settings.approver.processing_timeout = Duration::from_millis(1500);
    settings.discovery.poll_period = Duration::from_secs(1);
    waiting_owner_now(301).insert(&pool).await;
    let token = claim(&pool, 301, "crashed").await.expect("claimed");
    let mut cluster = Cluster::with(pool.clone(), settings).await;
    set(&pool, 301, "documents_released = true").await;
    // A person's claim keeps the controller out while it is alive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.sim.stats().for_request(301).owner, 0);

    cluster.wait_phase(301, Phase::Approved).await;
    let history = memos(&pool, 301).await;
    assert!(
        history
            .iter()
            .any(|m| m.contains("interrupted on manual:crashed")),
        "{history:?}"
    );
    // The service comes back and decides late: refused, nothing written.
    let late = decide(&pool, 301, "crashed", token, "REJECTED").await;
    assert!(
        late.as_ref()
            .is_err_and(|why| why.contains("is not claimed by manual:crashed")),
        "{late:?}"
    );
    cluster.stop().await;
}

/// The functions are the only door a separate role needs: granted EXECUTE
/// on them (the README's statement), it claims and decides; it cannot
/// write our tables itself, and a role without the grant cannot call them.
#[sqlx::test(migrations = "migrations/postgres")]
async fn a_role_granted_only_the_functions_can_claim_and_decide_and_nothing_more(pool: PgPool) {
    let role = format!("aa_manual_{}", rand::rng().random::<u32>());
    let outsider = format!("{role}_outsider");
    for statement in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("CREATE ROLE {outsider} LOGIN"),
        format!(
            "GRANT EXECUTE ON FUNCTION {} TO {role}",
            autoapproval::store::MANUAL_FUNCTIONS
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&pool)
            .await
            .expect(&statement);
    }
    let as_role = |name: &str| {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with((*pool.connect_options()).clone().username(name))
    };
    let person = as_role(&role);
    owner_now(401).insert(&pool).await;

    let token = claim(&person, 401, "ann")
        .await
        .expect("claimed through the function");
    let direct = sqlx::query("UPDATE auto_approve_state SET holder = 'someone else'")
        .execute(&person)
        .await;
    assert!(
        direct
            .as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied")),
        "{direct:?}"
    );
    decide(&person, 401, "ann", token, "REJECTED")
        .await
        .expect("decided");
    let (status, by): (String, String) =
        sqlx::query_as("SELECT status, decided_by FROM approval_request WHERE id = 401")
            .fetch_one(&pool)
            .await
            .expect("request");
    assert_eq!((status.as_str(), by.as_str()), ("REJECTED", "manual:ann"));

    let stranger = as_role(&outsider);
    let refused = sqlx::query("SELECT * FROM autoapproval_manual_claim(401, 'bob')")
        .execute(&stranger)
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied for function")),
        "{refused:?}"
    );
    person.close().await;
    stranger.close().await;
    for statement in [
        format!("DROP OWNED BY {role}, {outsider}"),
        format!("DROP ROLE {role}, {outsider}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&pool)
            .await
            .expect(&statement);
    }
}
