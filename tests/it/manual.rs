//! The manual-approval path: people claiming and deciding through the
//! database API (PostgreSQL's SQL functions of migration 0013, MySQL's
//! stored procedures of 0004) while a replica of the controller runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use autoapproval::controller::crd::Phase;
use autoapproval_sim::{Faults, RequestCreations, Stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::{
    Cluster, Db, eventually, memos, on_both, owner_now, set, test_settings, waiting_owner_now,
    with_pool,
};

/// The statement calling the manual-approval routine `name` with `args`
/// parameters, answering one row: a function in FROM on PostgreSQL, a
/// stored procedure's CALL (its one result set) on MySQL.
fn call(db: &Db, name: &str, args: usize) -> sqlx::AssertSqlSafe<String> {
    let sql = match db {
        Db::Postgres(_) => {
            let params: Vec<String> = (1..=args).map(|n| format!("${n}")).collect();
            format!("SELECT * FROM {name}({})", params.join(", "))
        }
        Db::Mysql(_) => format!("CALL {name}({})", vec!["?"; args].join(", ")),
    };
    sqlx::AssertSqlSafe(sql)
}

/// The other service's connections: on MySQL a pool of its own at the
/// server's default isolation (REPEATABLE READ), not the READ COMMITTED
/// of the controller's sessions, since the procedures must hold whatever
/// the caller's session uses.
fn service(db: &Db) -> Db {
    match db {
        Db::Postgres(_) => db.clone(),
        Db::Mysql(pool) => Db::Mysql(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(8)
                .connect_lazy_with((*pool.connect_options()).clone()),
        ),
    }
}

/// A person's claim: the token, or why it was refused. On MySQL a claim
/// chosen as a deadlock's victim five times running (the procedure tries
/// again four times itself, docs/DATABASE.md) fails, as the service of
/// people would show it: the person tries again later.
async fn claim(db: &Db, id: i64, who: &str) -> Result<i64, String> {
    let answer: Result<(Option<i64>, Option<String>), sqlx::Error> = with_pool!(db, pool => {
        sqlx::query_as(call(db, "autoapproval_manual_claim", 2))
            .bind(id)
            .bind(who)
            .fetch_one(pool)
            .await
    });
    let (token, refusal) = match answer {
        Ok(answer) => answer,
        Err(sqlx::Error::Database(e))
            if matches!(db, Db::Mysql(_)) && e.code().as_deref() == Some("40001") =>
        {
            return Err(format!("deadlock: {}", e.message()));
        }
        Err(e) => panic!("manual claim: {e}"),
    };
    token.ok_or_else(|| refusal.unwrap_or_default())
}

async fn decide(db: &Db, id: i64, who: &str, token: i64, decision: &str) -> Result<(), String> {
    let (decided, refusal): (bool, Option<String>) = with_pool!(db, pool => {
        sqlx::query_as(call(db, "autoapproval_manual_decide", 5))
            .bind(id)
            .bind(who)
            .bind(token)
            .bind(decision)
            .bind("by hand")
            .fetch_one(pool)
            .await
            .expect("manual decide")
    });
    if decided {
        Ok(())
    } else {
        Err(refusal.unwrap_or_default())
    }
}

/// Calls `routine` (release or heartbeat) on the claim `token`: whether
/// the claim was still this one.
async fn on_claim(db: &Db, routine: &str, id: i64, who: &str, token: i64) -> bool {
    with_pool!(db, pool => {
        sqlx::query_scalar(call(db, routine, 3))
            .bind(id)
            .bind(who)
            .bind(token)
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{routine}: {e}"))
    })
}

async fn release(db: &Db, id: i64, who: &str, token: i64) -> bool {
    on_claim(db, "autoapproval_manual_release", id, who, token).await
}

async fn heartbeat(db: &Db, id: i64, who: &str, token: i64) -> bool {
    on_claim(db, "autoapproval_manual_heartbeat", id, who, token).await
}

/// Logs every move of a request to a decided status, so a second decision
/// cannot hide behind the first.
async fn log_decisions(db: &Db) {
    // The same trigger in each dialect: PL/pgSQL needs a function,
    // MySQL's trigger has its body inline and compares with <=>.
    let statements: &[&str] = match db {
        Db::Postgres(_) => &[
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
        ],
        Db::Mysql(_) => &[
            "CREATE TABLE test_decision (request_id BIGINT, status VARCHAR(32), decided_by VARCHAR(255))",
            "CREATE TRIGGER test_log_decision AFTER UPDATE ON approval_request FOR EACH ROW
             BEGIN
                 IF NEW.status IN ('APPROVED', 'REJECTED', 'CANCELED') AND NOT (NEW.status <=> OLD.status) THEN
                     INSERT INTO test_decision VALUES (NEW.id, NEW.status, NEW.decided_by);
                 END IF;
             END",
        ],
    };
    for statement in statements {
        db.exec(statement).await;
    }
}

on_both!(people_and_the_controller_decide_each_request_exactly_once);
/// The controller and 8 people on 200 requests for 20 s: the requests wait
/// for their documents, released a few at a time, while the people claim
/// at random and decide or release what they get. Every request ends
/// decided exactly once, by whoever held the claim; nothing is created for
/// a request while or after a person holds it, nothing twice; no two chains
/// overlap. (An attempt of ours may have created an owner before a person
/// claims: a completion refused because a fact changed during the attempt,
/// or an attempt cut by its processing timeout, ends in a retry, and a
/// person may take a waiting request whatever its retry time.)
async fn people_and_the_controller_decide_each_request_exactly_once(db: Db) {
    log_decisions(&db).await;
    let mut settings = test_settings();
    settings.discovery.poll_period = Duration::from_secs(1);
    let faults = Faults {
        latency: Duration::from_millis(15),
        ..Faults::default()
    };
    let mut cluster = Cluster::with_faults(db.clone(), settings, faults).await;
    let service = service(&db);
    const N: i64 = 200;
    for id in 1..=N {
        waiting_owner_now(id).insert(&db).await;
    }

    // Who decided what, as the people saw it.
    let decided: Arc<Mutex<BTreeMap<i64, String>>> = Arc::default();
    // What the external systems held for a request when a person, holding
    // its claim, decided it: nothing may be created after.
    let at_decision: Arc<Mutex<BTreeMap<i64, RequestCreations>>> = Arc::default();
    let stats_url = format!("{}/stats", cluster.sim.base_url());
    let refusals: Arc<Mutex<BTreeMap<&str, u64>>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(20);
    let mut people = Vec::new();
    for p in 0..8 {
        let (db, decided, refusals) = (service.clone(), decided.clone(), refusals.clone());
        let (at_decision, stats_url) = (at_decision.clone(), stats_url.clone());
        people.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let who = format!("person-{p}");
            let mut rng = StdRng::seed_from_u64(p);
            while Instant::now() < until {
                let id = rng.random_range(1..=N);
                match claim(&db, id, &who).await {
                    Err(why) => {
                        let kind = if why.starts_with("auto-approval is running") {
                            "auto-approval running"
                        } else if why.contains("is already") {
                            "already decided"
                        } else if why.contains("is claimed by") {
                            "another person"
                        } else if why.starts_with("deadlock") {
                            "deadlock, five times"
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
                            let held: Stats = http
                                .get(&stats_url)
                                .send()
                                .await
                                .expect("the simulator's /stats")
                                .json()
                                .await
                                .expect("its JSON");
                            at_decision.lock().unwrap().insert(id, held.for_request(id));
                            decide(&db, id, &who, token, decision)
                                .await
                                .unwrap_or_else(|why| panic!("{who} held {id} but: {why}"));
                            let before =
                                decided.lock().unwrap().insert(id, format!("manual:{who}"));
                            assert_eq!(before, None, "request {id} decided twice by people");
                        } else {
                            assert!(release(&db, id, &who, token).await, "{who} held {id}");
                        }
                    }
                }
            }
        }));
    }
    // Documents released a few at a time while the people work.
    for wave in 0..10 {
        let from = wave * 20 + 1;
        let sql = db.sql(
            "UPDATE approval_request SET documents_released = true WHERE id BETWEEN $1 AND $2",
        );
        with_pool!(&db, pool => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(from)
            .bind(from + 19)
            .execute(pool)
            .await
            .map(|_| ())
            .expect("release documents"));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    for person in people {
        person.await.expect("a person's loop");
    }
    let open = format!(
        "SELECT count(*) FROM approval_request WHERE id <= {N} AND status IN ('PENDING', 'RETRY', 'ING')"
    );
    eventually("every request to be decided", || async {
        (db.fetch_i64(&open).await == 0).then_some(())
    })
    .await;

    let log: Vec<(i64, String, String)> = with_pool!(&db, pool => sqlx::query_as(
        "SELECT request_id, status, decided_by FROM test_decision ORDER BY request_id",
    )
    .fetch_all(pool)
    .await
    .expect("decision log"));
    let ids: BTreeSet<i64> = log.iter().map(|d| d.0).collect();
    assert_eq!(
        (log.len(), ids.len()),
        (N as usize, N as usize),
        "one decision each: {log:?}"
    );
    let decided = decided.lock().unwrap().clone();
    let stats = cluster.sim.stats();
    let mut by_people = 0;
    let mut created_before_a_person = 0;
    for (id, status, by) in &log {
        match decided.get(id) {
            Some(person) => {
                by_people += 1;
                assert_eq!(by, person, "request {id}");
                let made = stats.for_request(*id);
                let before = at_decision.lock().unwrap()[id];
                assert_eq!(
                    made, before,
                    "request {id} decided by {by} ({status}): created while or after a person held it"
                );
                assert!(made.owner <= 1 && made.store <= 1, "request {id}: {made:?}");
                if made != RequestCreations::default() {
                    created_before_a_person += 1;
                }
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
        "{by_people} of {N} decided by people ({created_before_a_person} after an attempt of \
         ours had created for it), {} by the controller; refused claims: {refusals:?}",
        N - by_people
    );
    assert!(by_people > 0 && by_people < N, "both sides decided some");
    assert!(
        refusals.contains_key("auto-approval running"),
        "a person met a running chain: {refusals:?}"
    );
    cluster.stop().await;
}

on_both!(a_manual_claim_left_by_a_crashed_service_is_returned_after_the_stuck_threshold);
/// A claim of a crashed service, never heartbeaten nor released, is
/// returned by the cleanser after the stuck threshold with a memo naming
/// its holder, and the controller then approves the request.
async fn a_manual_claim_left_by_a_crashed_service_is_returned_after_the_stuck_threshold(db: Db) {
    let mut settings = test_settings();
    settings.cleanse_interval = Duration::from_millis(200);
    settings.stuck_threshold = Duration::from_secs(3);
    settings.approver.heartbeat_interval = Duration::from_secs(1);
    settings.approver.processing_timeout = Duration::from_millis(1500);
    settings.discovery.poll_period = Duration::from_secs(1);
    waiting_owner_now(301).insert(&db).await;
    let service = service(&db);
    let token = claim(&service, 301, "crashed").await.expect("claimed");
    assert!(
        heartbeat(&service, 301, "crashed", token).await,
        "a live claim"
    );
    // Only the holder, under its token, decides.
    for (who, wrong) in [("intruder", token), ("crashed", token - 1)] {
        let refused = decide(&service, 301, who, wrong, "APPROVED").await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|why| why.contains(&format!("is not claimed by manual:{who}"))),
            "{refused:?}"
        );
    }
    let mut cluster = Cluster::with(db.clone(), settings).await;
    set(&db, 301, "documents_released = true").await;
    // A person's claim keeps the controller out while it is alive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.sim.stats().for_request(301).owner, 0);

    cluster.wait_phase(301, Phase::Approved).await;
    let history = memos(&db, 301).await;
    assert!(
        history
            .iter()
            .any(|m| m.contains("interrupted on manual:crashed")),
        "{history:?}"
    );
    // The service comes back and decides late: refused, nothing written.
    assert!(
        !heartbeat(&service, 301, "crashed", token).await,
        "the returned claim is no longer alive"
    );
    let late = decide(&service, 301, "crashed", token, "REJECTED").await;
    assert!(
        late.as_ref()
            .is_err_and(|why| why.contains("is not claimed by manual:crashed")),
        "{late:?}"
    );
    cluster.stop().await;
}

/// The manual-approval procedures of MySQL's migration 0004: a GRANT
/// EXECUTE ON PROCEDURE names one routine at a time.
const MANUAL_PROCEDURES: [&str; 4] = [
    "autoapproval_manual_claim",
    "autoapproval_manual_heartbeat",
    "autoapproval_manual_release",
    "autoapproval_manual_decide",
];

/// The grants of the manual functions in docs/DATABASE.md ("Working alongside people"), as
/// statements: PostgreSQL's, then MySQL's (after the comment naming MySQL).
fn documented_manual_grants() -> (Vec<String>, Vec<String>) {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/DATABASE.md"))
        .expect("docs/DATABASE.md");
    let section = doc
        .split("\n## Working alongside people\n")
        .nth(1)
        .expect("the section");
    let block = section
        .split("```sql\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("its SQL block");
    let (mut postgres, mut mysql) = (vec![], vec![]);
    let mut in_mysql = false;
    let mut statement = String::new();
    for line in block.lines() {
        if line.starts_with("--") {
            in_mysql |= line.contains("MySQL");
            continue;
        }
        statement.push_str(line);
        statement.push('\n');
        if line.trim_end().ends_with(';') {
            let done = std::mem::take(&mut statement).trim().to_owned();
            if in_mysql { &mut mysql } else { &mut postgres }.push(done);
        }
    }
    assert!(
        postgres
            .iter()
            .any(|g| g.starts_with("GRANT USAGE ON SCHEMA"))
            && mysql.len() == MANUAL_PROCEDURES.len(),
        "{postgres:?} {mysql:?}"
    );
    (postgres, mysql)
}

on_both!(a_role_granted_only_the_functions_can_claim_and_decide_and_nothing_more);
/// The functions are the only door a separate role needs: granted EXECUTE
/// on them (the README's statement), it claims and decides; it cannot
/// write our tables itself, and a role without the grant cannot call them.
async fn a_role_granted_only_the_functions_can_claim_and_decide_and_nothing_more(db: Db) {
    let role = format!("aa_manual_{}", rand::rng().random::<u32>());
    let outsider = format!("{role}_outsider");
    // PostgreSQL's roles and MySQL's users are both server-wide, so both
    // are dropped at the end. The grants are docs/DATABASE.md's block as it
    // is, its names replaced by the test's.
    let (postgres_grants, mysql_grants) = documented_manual_grants();
    let (setup, teardown) = match &db {
        Db::Postgres(_) => {
            // The block's USAGE must be what lets the role in: PUBLIC's is taken away (the
            // outsider, which is refused EXECUTE below, gets USAGE of its own).
            let mut setup = vec![
                "REVOKE ALL ON SCHEMA public FROM PUBLIC".to_owned(),
                format!("CREATE ROLE {role} LOGIN"),
                format!("CREATE ROLE {outsider} LOGIN"),
                format!("GRANT USAGE ON SCHEMA public TO {outsider}"),
            ];
            setup.extend(
                postgres_grants
                    .iter()
                    .map(|g| g.replace("manual_approver", &role)),
            );
            (
                setup,
                vec![
                    format!("DROP OWNED BY {role}, {outsider}"),
                    format!("DROP ROLE {role}, {outsider}"),
                ],
            )
        }
        Db::Mysql(pool) => {
            let database = pool
                .connect_options()
                .get_database()
                .expect("a scratch database")
                .to_owned();
            let mut setup = vec![
                format!("CREATE USER '{role}'@'%'"),
                format!("CREATE USER '{outsider}'@'%'"),
            ];
            setup.extend(mysql_grants.iter().map(|g| {
                g.replace("'manual_approver'", &format!("'{role}'"))
                    .replace(" autoapproval.", &format!(" `{database}`."))
            }));
            (
                setup,
                vec![format!("DROP USER '{role}'@'%', '{outsider}'@'%'")],
            )
        }
    };
    for statement in &setup {
        db.exec(statement).await;
    }
    let as_role = |name: &str| match &db {
        Db::Postgres(pool) => Db::Postgres(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with((*pool.connect_options()).clone().username(name)),
        ),
        Db::Mysql(pool) => Db::Mysql(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with((*pool.connect_options()).clone().username(name)),
        ),
    };
    // What each server answers a statement the user has no right to.
    let denied = match &db {
        Db::Postgres(_) => "permission denied",
        Db::Mysql(_) => "command denied to user",
    };
    let person = as_role(&role);
    owner_now(401).insert(&db).await;

    let token = claim(&person, 401, "ann")
        .await
        .expect("claimed through the function");
    let direct = with_pool!(&person, pool => sqlx::query(
        "UPDATE auto_approve_state SET holder = 'someone else'"
    )
    .execute(pool)
    .await
    .map(|_| ()));
    assert!(
        direct
            .as_ref()
            .is_err_and(|e| e.to_string().contains(denied)),
        "{direct:?}"
    );
    decide(&person, 401, "ann", token, "REJECTED")
        .await
        .expect("decided");
    let (status, by): (String, String) = with_pool!(&db, pool => sqlx::query_as(
        "SELECT status, decided_by FROM approval_request WHERE id = 401"
    )
    .fetch_one(pool)
    .await
    .expect("request"));
    assert_eq!((status.as_str(), by.as_str()), ("REJECTED", "manual:ann"));

    // MySQL refuses a user with no privilege in the database at connect
    // time already; the outsider connects to no database and calls the
    // procedure by its qualified name, to meet the EXECUTE check itself.
    let (stranger, claim_call) = match &db {
        Db::Postgres(_) => (
            as_role(&outsider),
            call(&db, "autoapproval_manual_claim", 2),
        ),
        Db::Mysql(pool) => {
            let options = pool.connect_options();
            let database = options.get_database().expect("a scratch database");
            let mut server = url::Url::parse(&db.url()).expect("a database URL");
            server.set_path("");
            let options = server
                .as_str()
                .parse::<sqlx::mysql::MySqlConnectOptions>()
                .expect("the server's options")
                .username(&outsider);
            (
                Db::Mysql(
                    sqlx::mysql::MySqlPoolOptions::new()
                        .max_connections(1)
                        .connect_lazy_with(options),
                ),
                sqlx::AssertSqlSafe(format!("CALL {database}.autoapproval_manual_claim(?, ?)")),
            )
        }
    };
    let refused = with_pool!(&stranger, pool => sqlx::query(claim_call)
        .bind(401_i64)
        .bind("bob")
        .execute(pool)
        .await
        .map(|_| ()));
    // PostgreSQL names the function; MySQL says "execute command denied
    // ... for routine".
    let no_execute = match &db {
        Db::Postgres(_) => "permission denied for function",
        Db::Mysql(_) => "execute command denied",
    };
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains(no_execute)),
        "{refused:?}"
    );
    for pool in [person, stranger] {
        with_pool!(pool, pool => pool.close().await);
    }
    for statement in &teardown {
        db.exec(statement).await;
    }
}

on_both!(a_role_with_the_documented_grants_cannot_shadow_our_tables_or_wake_requests);
/// The functions run as their owner with a search_path pinned to their
/// schema, `pg_temp` last (migration 0021): a role granted them cannot put
/// a temporary table of its own in their way, as it could when pg_temp was
/// searched first; and a login granted nothing cannot call the wake, which
/// PUBLIC could (any login could revive exhausted requests in a loop). On
/// MySQL a temporary table would shadow ours inside the procedures as well,
/// so the documented grants carry no CREATE TEMPORARY TABLES: the attempt
/// is refused, and the procedures work for the role as before.
async fn a_role_with_the_documented_grants_cannot_shadow_our_tables_or_wake_requests(db: Db) {
    let role = format!("aa_manual_{}", rand::rng().random::<u32>());
    let outsider = format!("{role}_outsider");
    owner_now(402).insert(&db).await;
    match &db {
        Db::Postgres(pool) => {
            for statement in [
                format!("CREATE ROLE {role} LOGIN"),
                format!("CREATE ROLE {outsider} LOGIN"),
                format!(
                    "GRANT EXECUTE ON FUNCTION {} TO {role}",
                    autoapproval::db::postgres::MANUAL_FUNCTIONS
                ),
            ] {
                db.exec(&statement).await;
            }
            let connect = |name: &str| {
                let options = (*pool.connect_options()).clone().username(name);
                async move {
                    sqlx::PgConnection::connect_with(&options)
                        .await
                        .expect("the role connects")
                }
            };
            use sqlx::Connection;
            let mut person = connect(&role).await;
            // Every login may create temporary tables (PostgreSQL's
            // default TEMPORARY right of PUBLIC on a database).
            sqlx::query(
                "CREATE TEMPORARY TABLE auto_approve_state (
                     request_id BIGINT UNIQUE, request_type TEXT, status TEXT, holder TEXT,
                     fencing_token BIGINT, step TEXT, created_at TIMESTAMPTZ,
                     modified_at TIMESTAMPTZ, woken_at TIMESTAMPTZ,
                     next_retry_time TIMESTAMPTZ, last_reason TEXT)",
            )
            .execute(&mut person)
            .await
            .expect("a temporary table of the role's own");
            let (token, refusal): (Option<i64>, Option<String>) =
                sqlx::query_as("SELECT * FROM autoapproval_manual_claim($1, $2)")
                    .bind(402_i64)
                    .bind("eve")
                    .fetch_one(&mut person)
                    .await
                    .expect("manual claim");
            assert!(token.is_some(), "{refusal:?}");
            let shadowed: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_temp.auto_approve_state")
                    .fetch_one(&mut person)
                    .await
                    .expect("the role's own table");
            assert_eq!(
                shadowed, 0,
                "the claim went into the role's temporary table"
            );

            // Neither the role nor a login granted nothing may wake.
            for name in [&role, &outsider] {
                let mut conn = connect(name).await;
                let woke = sqlx::query("SELECT autoapproval_wake(ARRAY[402]::bigint[])")
                    .execute(&mut conn)
                    .await;
                assert!(
                    woke.as_ref().is_err_and(|e| e
                        .to_string()
                        .contains("permission denied for function autoapproval_wake")),
                    "{name}: {woke:?}"
                );
                conn.close().await.expect("close");
            }
            person.close().await.expect("close");
            db.exec(&format!("DROP OWNED BY {role}, {outsider}")).await;
            db.exec(&format!("DROP ROLE {role}, {outsider}")).await;
        }
        Db::Mysql(pool) => {
            let database = pool
                .connect_options()
                .get_database()
                .expect("a scratch database")
                .to_owned();
            db.exec(&format!("CREATE USER '{role}'@'%'")).await;
            for procedure in MANUAL_PROCEDURES {
                db.exec(&format!(
                    "GRANT EXECUTE ON PROCEDURE {procedure} TO '{role}'@'%'"
                ))
                .await;
            }
            let person = Db::Mysql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect_lazy_with((*pool.connect_options()).clone().username(&role)),
            );
            let shadow =
                format!("CREATE TEMPORARY TABLE {database}.auto_approve_state (request_id BIGINT)");
            let refused = with_pool!(&person, pool => sqlx::query(sqlx::AssertSqlSafe(shadow))
                .execute(pool)
                .await
                .map(|_| ()));
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.to_string().contains("denied")),
                "{refused:?}"
            );
            let token = claim(&person, 402, "eve").await.expect("claimed");
            assert!(token < 0);
            with_pool!(person, pool => pool.close().await);
            db.exec(&format!("DROP USER '{role}'@'%'")).await;
        }
    }
    let ours = db
        .fetch_ids("SELECT request_id FROM auto_approve_state WHERE holder = 'manual:eve'")
        .await;
    assert_eq!(ours, [402], "the claim is in our table");
}
