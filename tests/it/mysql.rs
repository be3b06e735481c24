//! The MySQL 8 / MariaDB backend on a real MariaDB (env `MYSQL_URL`, e.g.
//! mysql://root@127.0.0.1:3306/): migrations, claims and fencing, the wake
//! table its triggers fill and the poller that reads it, and the business
//! system never waiting on our rows. Each test works in a scratch database
//! of its own, dropped after it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration as StdDuration, Instant};

use autoapproval::db::mysql::{Flavour, flavour_of};
use autoapproval::db::{
    ClaimOutcome, Completion, Database, DatabaseArgs, DbError, Pool, RequestChange, RequestChanges,
    RetryWrite, SessionArgs, ShardFilter, StepResult,
};
use autoapproval::domain::{Candidate, DEFAULT_RETRY_LIMIT, Fence};
use chrono::{DateTime, Duration, Utc};
use futures::FutureExt;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Executor, MySqlConnection};

use crate::support::{MysqlScratch, candidate, claim_new, complete_now, migrate_twice, t0};

/// The wake poller's interval in these tests.
const POLL: StdDuration = StdDuration::from_millis(20);

/// A scratch database on the server of `MYSQL_URL` ([`MysqlScratch`]), with our store and the
/// business system's pool over it.
struct Scratch {
    /// The database's URL.
    url: String,
    /// Its name.
    name: String,
    /// Our store, sessions as the controller sets them.
    store: Database,
    /// Its pool.
    pool: MySqlPool,
    /// The business system's pool: the server's defaults (REPEATABLE READ).
    business: MySqlPool,
}

/// Runs `test` against a fresh migrated database, dropped afterwards even
/// when the test fails.
async fn with_db<F, Fut>(test: F)
where
    F: FnOnce(Scratch) -> Fut,
    Fut: Future<Output = ()>,
{
    scratch(true, test).await
}

/// Runs `test` against a fresh database, migrated or empty.
async fn scratch<F, Fut>(migrated: bool, test: F)
where
    F: FnOnce(Scratch) -> Fut,
    Fut: Future<Output = ()>,
{
    let db = if migrated {
        MysqlScratch::create().await
    } else {
        MysqlScratch::unmigrated().await
    };
    let pool = db.pool();
    let store = Database::mysql(pool.clone(), pool.clone()).with_wake_poll_interval(POLL);
    let options: MySqlConnectOptions = db.url().parse().expect("the scratch database's URL");
    // The business sessions keep the server's own defaults.
    let business = MySqlPoolOptions::new()
        .max_connections(4)
        .connect_with(options.timezone(None))
        .await
        .expect("business pool");
    let scratch = Scratch {
        url: db.url().to_owned(),
        name: db.name().to_owned(),
        store,
        pool,
        business,
    };
    let outcome = AssertUnwindSafe(test(scratch)).catch_unwind().await;
    db.finish().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

impl Scratch {
    fn url(&self) -> String {
        self.url.clone()
    }

    /// A business connection of its own, waiting at most a second for a lock.
    async fn business_connection(&self) -> MySqlConnection {
        let mut conn = MySqlConnection::connect(&self.url()).await.unwrap();
        conn.execute("SET SESSION innodb_lock_wait_timeout = 1")
            .await
            .unwrap();
        conn
    }

    async fn wake_rows(&self) -> Vec<(Option<i64>, Option<String>)> {
        sqlx::query_as("SELECT request_id, contract_ref FROM auto_approve_wake ORDER BY id")
            .fetch_all(&self.business)
            .await
            .unwrap()
    }
}

/// Inserts a ready owner contract as the business system does.
async fn insert_owner(pool: &MySqlPool, id: i64) {
    sqlx::query(
        "INSERT INTO approval_request
            (id, request_type, status, sort_time, created_at, business_name, documents_released,
             menu_registered, logo_registered, previous_step_approved, econtract_ref)
         VALUES (?, 'OWNER_CONTRACT', 'PENDING', ?, ?, ?, true, true, true, true, ?)",
    )
    .bind(id)
    .bind(t0() - Duration::minutes(1))
    .bind(t0() - Duration::minutes(1))
    .bind(format!("Shop {id}"))
    .bind(format!("EC-{id}"))
    .execute(pool)
    .await
    .expect("insert request");
}

async fn insert_waiting(pool: &MySqlPool, request_id: i64, due: DateTime<Utc>) -> i64 {
    let done = sqlx::query(
        "INSERT INTO auto_approve_state
            (request_id, request_type, status, next_retry_time, retry_count, holder, fencing_token)
         VALUES (?, 'OWNER_CONTRACT', 'RETRY_WAITING', ?, 3, 'elsewhere', 1)",
    )
    .bind(request_id)
    .bind(due)
    .execute(pool)
    .await
    .expect("insert state");
    done.last_insert_id() as i64
}

#[tokio::test]
async fn mysql_migrations_apply_twice() {
    scratch(false, |db| async move {
        migrate_twice(&db.url());
        let count = |sql: &'static str| {
            let business = db.business.clone();
            async move {
                let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&business).await.unwrap();
                n
            }
        };
        const OURS: &str = "SELECT COUNT(*) FROM information_schema.tables
              WHERE table_schema = DATABASE()
                AND table_name IN ('auto_approve_state', 'auto_approve_wake', 'shard_fence',
                                   'shard_layout', 'auto_approve_pause', 'auto_approve_sent',
                                   'autoapproval_manual_token', '_autoapproval_migrations')";
        const BUSINESS: &str = "SELECT COUNT(*) FROM information_schema.tables
              WHERE table_schema = DATABASE()
                AND table_name IN ('approval_request', 'approval_request_memo', 'econtract',
                                   'autoapproval_request', 'autoapproval_econtract',
                                   'autoapproval_request_memo', '_autoapproval_reference_migrations')";
        const TRIGGERS: &str =
            "SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE()";
        assert_eq!(count(OURS).await, 8, "the controller's own objects");
        assert_eq!(count(BUSINESS).await, 0, "no business table, no binding");
        assert_eq!(count(TRIGGERS).await, 0);

        let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(["migrate", "--reference-schema", "--database-url", &db.url()])
            .output()
            .expect("run autoapproval migrate --reference-schema");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(count(BUSINESS).await, 7, "the reference schema and its binding");
        assert_eq!(count(TRIGGERS).await, 4, "the binding's wake triggers");
    })
    .await;
}

/// 0.2.0's wake table and the four triggers its 0003 put on
/// approval_request and econtract (the update trigger abridged to two of
/// the columns it watched).
const WAKE_0_2_0: &str = "
CREATE TABLE auto_approve_wake (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    request_id   BIGINT,
    contract_ref VARCHAR(255),
    skip_request BIGINT,
    new_request  BOOLEAN      NOT NULL DEFAULT false,
    woken_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY auto_approve_wake_request (request_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
CREATE TRIGGER approval_request_wake_insert
    AFTER INSERT ON approval_request FOR EACH ROW
    INSERT INTO auto_approve_wake (request_id, new_request) VALUES (NEW.id, true);
CREATE TRIGGER approval_request_wake_update
    AFTER UPDATE ON approval_request FOR EACH ROW
BEGIN
    IF NOT (NEW.status <=> OLD.status) OR NOT (NEW.documents_released <=> OLD.documents_released) THEN
        INSERT INTO auto_approve_wake (request_id) VALUES (NEW.id);
    END IF;
END;
CREATE TRIGGER econtract_wake_insert
    AFTER INSERT ON econtract FOR EACH ROW
    INSERT INTO auto_approve_wake (contract_ref, skip_request)
    VALUES (NEW.contract_ref, @autoapproval_syncing_request);
CREATE TRIGGER econtract_wake_update
    AFTER UPDATE ON econtract FOR EACH ROW
BEGIN
    IF NOT (NEW.status <=> OLD.status) THEN
        INSERT INTO auto_approve_wake (contract_ref, skip_request)
        VALUES (NEW.contract_ref, @autoapproval_syncing_request);
    END IF;
END;
";

/// A database 0.2.0's migrations made (its business tables, its wake
/// triggers) keeps its requests through the upgrade. The controller set
/// (run while 0.2.0's replicas still run) leaves 0.2.0's triggers
/// appending their wake rows, which those replicas' completions rely on;
/// the reference set's binding replaces them: one wake row per change.
#[tokio::test]
async fn mysql_a_0_2_0_database_keeps_its_wake_triggers_until_the_binding_replaces_them() {
    scratch(false, |db| async move {
        // 0.2.0 made the business tables itself (the reference set's are
        // the same) and its wake triggers on them.
        sqlx::raw_sql(include_str!(
            "../../migrations/mysql/reference/0001_business_tables.sql"
        ))
        .execute(&db.business)
        .await
        .unwrap();
        sqlx::raw_sql(WAKE_0_2_0)
            .execute(&db.business)
            .await
            .unwrap();
        insert_owner(&db.business, 1).await;
        assert_eq!(db.wake_rows().await, [(Some(1), None)]);
        let triggers = async || -> Vec<String> {
            sqlx::query_scalar(
                "SELECT trigger_name FROM information_schema.triggers
                  WHERE trigger_schema = DATABASE() ORDER BY trigger_name",
            )
            .fetch_all(&db.business)
            .await
            .unwrap()
        };
        let changes = async || {
            sqlx::query("UPDATE approval_request SET documents_released = NOT documents_released WHERE id = 1")
                .execute(&db.business)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO econtract (contract_ref, status) VALUES ('EC-1', 'SIGNED')
                 ON DUPLICATE KEY UPDATE status = IF(status = 'SIGNED', 'REJECTED', 'SIGNED')",
            )
            .execute(&db.business)
            .await
            .unwrap();
        };

        db.store
            .migrate(false)
            .await
            .expect("0.2.0's database takes the controller set");
        assert_eq!(
            triggers().await,
            [
                "approval_request_wake_insert",
                "approval_request_wake_update",
                "econtract_wake_insert",
                "econtract_wake_update"
            ]
        );
        changes().await;
        assert_eq!(
            db.wake_rows().await,
            [
                (Some(1), None),
                (Some(1), None),
                (None, Some("EC-1".to_owned()))
            ],
            "0.2.0's triggers still append the wakes of a change and of its contract"
        );
        sqlx::query("DELETE FROM auto_approve_wake")
            .execute(&db.business)
            .await
            .unwrap();

        db.store
            .migrate(true)
            .await
            .expect("the reference set binds the tables");
        assert_eq!(
            triggers().await,
            [
                "approval_request_autoapproval_inserted",
                "approval_request_autoapproval_updated",
                "econtract_autoapproval_inserted",
                "econtract_autoapproval_updated"
            ]
        );
        assert!(
            db.store.request(1).await.unwrap().is_some(),
            "the request stays"
        );
        // One wake row per change, not one per trigger generation.
        changes().await;
        insert_owner(&db.business, 2).await;
        assert_eq!(
            db.wake_rows().await,
            [
                (Some(1), None),
                (None, Some("EC-1".to_owned())),
                (Some(2), None)
            ]
        );
    })
    .await;
}

/// 0.2.0's four manual procedures, verbatim from its 0004 (the attempts
/// they call are the new migration's to make).
const MANUAL_0_2_0: &str = "
CREATE PROCEDURE autoapproval_manual_claim(IN p_request_id BIGINT, IN p_who VARCHAR(200))
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_claim_attempt(p_request_id, p_who);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE autoapproval_manual_heartbeat(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_heartbeat_attempt(p_request_id, p_who, p_token);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE autoapproval_manual_release(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_release_attempt(p_request_id, p_who, p_token);
            LEAVE retry;
        END;
    END LOOP;
END;

CREATE PROCEDURE autoapproval_manual_decide(IN p_request_id BIGINT, IN p_who VARCHAR(200), IN p_token BIGINT, IN p_decision VARCHAR(32), IN p_note TEXT)
SQL SECURITY DEFINER
BEGIN
    DECLARE attempt INT DEFAULT 1;
    retry: LOOP
        BEGIN
            DECLARE EXIT HANDLER FOR 1213 BEGIN
                IF attempt >= 5 THEN RESIGNAL; END IF;
                SET attempt = attempt + 1;
            END;
            CALL autoapproval_manual_decide_attempt(p_request_id, p_who, p_token, p_decision, p_note);
            LEAVE retry;
        END;
    END LOOP;
END;
";

/// The procedures the people's service calls, and those the business
/// tables' triggers call: each under a grant of its own.
const MANUAL_PROCEDURES: [&str; 4] = [
    "autoapproval_manual_claim",
    "autoapproval_manual_heartbeat",
    "autoapproval_manual_release",
    "autoapproval_manual_decide",
];
const WAKE_PROCEDURES: [&str; 2] = [
    "autoapproval_request_changed",
    "autoapproval_econtract_changed",
];

impl Scratch {
    /// A user of the server (`<database>_<role>`, dropped by
    /// [`Scratch::drop_user`]) granted EXECUTE on `procedures` of this
    /// database, and a pool of its sessions (the server's defaults).
    async fn user_calling(&self, role: &str, procedures: &[&str]) -> (String, MySqlPool) {
        let user = format!("{}_{role}", self.name);
        self.pool
            .execute(sqlx::AssertSqlSafe(format!("CREATE USER '{user}'@'%'")))
            .await
            .unwrap();
        for procedure in procedures {
            self.pool
                .execute(sqlx::AssertSqlSafe(format!(
                    "GRANT EXECUTE ON PROCEDURE {procedure} TO '{user}'@'%'"
                )))
                .await
                .unwrap();
        }
        let options: MySqlConnectOptions = self.url().parse().unwrap();
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(options.username(&user).timezone(None));
        (user, pool)
    }

    async fn drop_user(&self, user: &str, pool: MySqlPool) {
        pool.close().await;
        self.pool
            .execute(sqlx::AssertSqlSafe(format!("DROP USER '{user}'@'%'")))
            .await
            .unwrap();
    }

    /// Every grant on a routine of this database: routine, user, rights.
    async fn routine_grants(&self) -> Vec<(String, String, String)> {
        sqlx::query_as(
            "SELECT CAST(Routine_name AS CHAR), CAST(User AS CHAR), CAST(Proc_priv AS CHAR)
               FROM mysql.procs_priv WHERE Db = DATABASE() ORDER BY 1, 2",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }
}

/// A person's claim, heartbeat and decision through the procedures, on
/// `pool`: each must be allowed.
async fn claim_beat_and_decide(pool: &MySqlPool, request_id: i64) {
    let (token, refusal): (Option<i64>, Option<String>) =
        sqlx::query_as("CALL autoapproval_manual_claim(?, 'kim')")
            .bind(request_id)
            .fetch_one(pool)
            .await
            .expect("the people's service calls autoapproval_manual_claim");
    let token = token.unwrap_or_else(|| panic!("claim refused: {refusal:?}"));
    let (alive,): (bool,) = sqlx::query_as("CALL autoapproval_manual_heartbeat(?, 'kim', ?)")
        .bind(request_id)
        .bind(token)
        .fetch_one(pool)
        .await
        .expect("the people's service calls autoapproval_manual_heartbeat");
    assert!(alive);
    let (decided, refusal): (bool, Option<String>) =
        sqlx::query_as("CALL autoapproval_manual_decide(?, 'kim', ?, 'REJECTED', 'by hand')")
            .bind(request_id)
            .bind(token)
            .fetch_one(pool)
            .await
            .expect("the people's service calls autoapproval_manual_decide");
    assert!(decided, "{refusal:?}");
}

#[tokio::test]
async fn mysql_upgrading_a_0_2_0_database_keeps_the_grants_on_the_manual_procedures() {
    scratch(false, |db| async move {
        sqlx::raw_sql(include_str!(
            "../../migrations/mysql/reference/0001_business_tables.sql"
        ))
        .execute(&db.business)
        .await
        .unwrap();
        sqlx::raw_sql(WAKE_0_2_0)
            .execute(&db.business)
            .await
            .unwrap();
        sqlx::raw_sql(MANUAL_0_2_0)
            .execute(&db.business)
            .await
            .unwrap();
        let (user, people) = db.user_calling("people", &MANUAL_PROCEDURES).await;
        let granted = db.routine_grants().await;
        assert_eq!(granted.len(), 4);

        db.store
            .migrate(true)
            .await
            .expect("0.2.0's database migrates");

        insert_owner(&db.business, 1).await;
        claim_beat_and_decide(&people, 1).await;
        assert_eq!(db.routine_grants().await, granted, "the grants stay");
        db.drop_user(&user, people).await;
    })
    .await;
}

#[tokio::test]
async fn mysql_applying_the_controller_migration_again_keeps_every_grant_on_our_procedures() {
    with_db(|db| async move {
        let (person, people) = db.user_calling("people", &MANUAL_PROCEDURES).await;
        let (owner, business) = db.user_calling("business", &WAKE_PROCEDURES).await;
        // The business tables' owner attaches the wake triggers as itself:
        // its writes call our procedures with its own rights.
        for table in ["approval_request", "econtract"] {
            db.pool
                .execute(sqlx::AssertSqlSafe(format!(
                    "GRANT SELECT, INSERT, UPDATE, TRIGGER ON {table} TO '{owner}'@'%'"
                )))
                .await
                .unwrap();
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TRIGGER approval_request_autoapproval_inserted;
             CREATE DEFINER = '{owner}'@'%' TRIGGER approval_request_autoapproval_inserted
                 AFTER INSERT ON approval_request FOR EACH ROW
                 CALL autoapproval_request_changed(NEW.id, TRUE);
             DROP TRIGGER econtract_autoapproval_inserted;
             CREATE DEFINER = '{owner}'@'%' TRIGGER econtract_autoapproval_inserted
                 AFTER INSERT ON econtract FOR EACH ROW
                 CALL autoapproval_econtract_changed(NEW.contract_ref);"
        )))
        .execute(&db.pool)
        .await
        .unwrap();
        let granted = db.routine_grants().await;
        assert_eq!(granted.len(), 6);

        // What a later migration re-running these definitions does.
        db.pool
            .execute("DELETE FROM _autoapproval_migrations WHERE version = 1")
            .await
            .unwrap();
        db.store
            .migrate(false)
            .await
            .expect("the controller set applies again");

        insert_owner(&business, 1).await;
        sqlx::query("INSERT INTO econtract (contract_ref, status) VALUES ('EC-1', 'SIGNED')")
            .execute(&business)
            .await
            .expect("a business write fires the e-contract wake trigger");
        assert_eq!(
            db.wake_rows().await,
            [(Some(1), None), (None, Some("EC-1".to_owned()))]
        );
        claim_beat_and_decide(&people, 1).await;
        assert_eq!(db.routine_grants().await, granted, "the grants stay");
        db.drop_user(&person, people).await;
        db.drop_user(&owner, business).await;
    })
    .await;
}

#[tokio::test]
async fn mysql_the_start_up_check_of_the_e_contract_upsert_leaves_no_row() {
    with_db(|db| async move {
        db.store
            .check_schema()
            .await
            .expect("the reference binding passes");
        let (ledger,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM econtract")
            .fetch_one(&db.business)
            .await
            .unwrap();
        assert_eq!(ledger, 0, "no ledger row");
        assert_eq!(db.wake_rows().await, [], "no wake row");
    })
    .await;
}

#[tokio::test]
async fn mysql_two_concurrent_claimers_of_a_new_request_one_wins() {
    with_db(|db| async move {
        insert_owner(&db.business, 1).await;
        let (fa, fb) = (Fence::new("a", 1), Fence::new("b", 1));
        let c = candidate(1, None);
        let (a, b) = tokio::join!(
            db.store.claim(&c, &fa, t0(), DEFAULT_RETRY_LIMIT),
            db.store.claim(&c, &fb, t0(), DEFAULT_RETRY_LIMIT)
        );
        let outcomes = [a.unwrap(), b.unwrap()];
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                ClaimOutcome::Won(claim) => Some(claim),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        let state = db.store.state(1).await.unwrap().unwrap();
        assert_eq!(state.status.as_str(), "IN_PROGRESS");
        assert_eq!(state.holder, winners[0].fence.holder);
        assert_eq!(state.id, winners[0].state_id);
    })
    .await;
}

#[tokio::test]
async fn mysql_many_concurrent_claimers_of_a_due_retry_one_wins() {
    with_db(|db| async move {
        insert_owner(&db.business, 1).await;
        let state_id = insert_waiting(&db.business, 1, t0() - Duration::seconds(1)).await;
        let c = Candidate {
            state_id: Some(state_id),
            ..candidate(1, None)
        };
        let fences: Vec<_> = (0..8).map(|i| Fence::new(format!("w{i}"), 1)).collect();
        let results = futures::future::join_all(
            fences
                .iter()
                .map(|f| db.store.claim(&c, f, t0(), DEFAULT_RETRY_LIMIT)),
        )
        .await;
        let won: Vec<_> = results
            .into_iter()
            .map(Result::unwrap)
            .filter_map(|o| match o {
                ClaimOutcome::Won(claim) => Some(claim),
                _ => None,
            })
            .collect();
        assert_eq!(won.len(), 1);
        assert_eq!(won[0].retry_count, 3);
        // Not due yet: nobody claims it.
        let later = Candidate {
            state_id: Some(state_id),
            ..candidate(1, None)
        };
        db.store
            .release(&won[0], t0() + Duration::hours(1))
            .await
            .unwrap();
        let again = db
            .store
            .claim(&later, &Fence::new("x", 1), t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap();
        assert_eq!(again, ClaimOutcome::Lost);
    })
    .await;
}

#[tokio::test]
async fn mysql_a_stale_holder_is_refused_after_the_fence_moves() {
    with_db(|db| async move {
        insert_owner(&db.business, 5).await;
        let store = &db.store;
        // Shard 1 of 4 (5 % 4), fenced by replica a at token 1.
        assert_eq!(
            store.fence_shard(4, 1, 1, "a", t0()).await.unwrap(),
            Some(vec![])
        );
        let old = Fence::sharded("a", 1, 4);
        let ClaimOutcome::Won(claim) = store
            .claim(&candidate(5, None), &old, t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap()
        else {
            panic!("a claims under the current token");
        };
        // b takes the shard: a's claim is recovered in the same transaction.
        let recovered = store.fence_shard(4, 1, 2, "b", t0()).await.unwrap();
        assert_eq!(recovered, Some(vec![5]));
        assert_eq!(store.fence_shard(4, 1, 2, "c", t0()).await.unwrap(), None);
        assert_eq!(store.shard_token(4, 1).await.unwrap(), Some(2));
        // Every write of a is refused.
        assert!(!store.heartbeat(&claim, "start").await.unwrap());
        assert!(
            !store
                .save_result(&claim, StepResult::OwnerNumber(77))
                .await
                .unwrap()
        );
        assert_eq!(complete_now(store, &claim).await, Completion::Stale);
        assert!(!store.release(&claim, t0()).await.unwrap());
        assert!(!store.drop_claim(&claim).await.unwrap());
        let retry = RetryWrite {
            next_retry_time: t0(),
            transient: true,
            counted: true,
            reason: "late",
            step: "start",
        };
        assert_eq!(
            store.schedule_retry(&claim, &retry, t0()).await.unwrap(),
            None
        );
        let (status, owner): (String, Option<i64>) =
            sqlx::query_as("SELECT status, owner_number FROM approval_request WHERE id = 5")
                .fetch_one(&db.business)
                .await
                .unwrap();
        assert_eq!((status.as_str(), owner), ("PENDING", None));
        // a cannot claim again under its old token; b can.
        let state = store.state(5).await.unwrap().unwrap();
        let due = Candidate {
            state_id: Some(state.id),
            ..candidate(5, None)
        };
        assert_eq!(
            store
                .claim(&due, &old, t0(), DEFAULT_RETRY_LIMIT)
                .await
                .unwrap(),
            ClaimOutcome::Lost
        );
        let ClaimOutcome::Won(fresh) = store
            .claim(&due, &Fence::sharded("b", 2, 4), t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap()
        else {
            panic!("b claims under the new token");
        };
        assert!(
            store
                .save_result(&fresh, StepResult::OwnerNumber(77))
                .await
                .unwrap()
        );
        assert_eq!(complete_now(store, &fresh).await, Completion::Approved);
        let memos = store.memos(5).await.unwrap();
        assert!(
            memos.iter().any(|m| m.contains("interrupted on a")),
            "{memos:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn mysql_the_triggers_append_a_wake_row_per_relevant_change_only() {
    with_db(|db| async move {
        insert_owner(&db.business, 1).await;
        assert_eq!(db.wake_rows().await, [(Some(1), None)], "insert");
        sqlx::query("UPDATE approval_request SET business_name = 'renamed', updated_at = UTC_TIMESTAMP(6) WHERE id = 1")
            .execute(&db.business)
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await.len(), 1, "a field no filter reads wakes nobody");
        sqlx::query("UPDATE approval_request SET operational_hold = true WHERE id = 1")
            .execute(&db.business)
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await.len(), 2, "a filter fact wakes");
        // An e-contract change names its contract; our own sync of it wakes
        // the other requests on it, not the one that synced.
        sqlx::query("INSERT INTO econtract (contract_ref, status) VALUES ('EC-1', 'SIGNED')")
            .execute(&db.business)
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await[2], (None, Some("EC-1".to_owned())));
        db.store
            .sync_econtract(1, "EC-1", "PENDING", t0())
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await.len(), 3, "SIGNED never goes back to PENDING");
        assert_eq!(db.store.econtract_status("EC-1").await.unwrap().as_deref(), Some("SIGNED"));
        db.store
            .sync_econtract(1, "EC-1", "REJECTED", t0())
            .await
            .unwrap();
        let skip: Option<i64> =
            sqlx::query_scalar("SELECT skip_request FROM auto_approve_wake ORDER BY id DESC LIMIT 1")
                .fetch_one(&db.business)
                .await
                .unwrap();
        assert_eq!(skip, Some(1));
        // Our own approval wakes nobody. The contract's row is a pending
        // wake of request 1 until a poller expands it (the completion
        // counts it): one poll, as a replica makes every interval.
        let mut changes = db.store.request_changes().await.unwrap();
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(1));
        let before = db.wake_rows().await.len();
        let claim = claim_new(&db.store, 1, "a").await;
        let after_claim = db.wake_rows().await.len();
        assert!(after_claim < before, "the claim consumed the request's rows");
        assert_eq!(complete_now(&db.store, &claim).await, Completion::Approved);
        assert_eq!(db.wake_rows().await.len(), after_claim);
    })
    .await;
}

#[tokio::test]
async fn mysql_our_own_approval_and_results_append_no_wake_row_a_business_change_does() {
    with_db(|db| async move {
        // One connection for all our writes: what they leave in its session,
        // the statement after them sees.
        let options: MySqlConnectOptions = db.url().parse().expect("the scratch database's URL");
        let one = autoapproval::db::mysql::pool(options, 1, None);
        let store = Database::mysql(one.clone(), one.clone()).with_wake_poll_interval(POLL);
        insert_owner(&db.business, 1).await;
        let claim = claim_new(&store, 1, "a").await;
        assert!(
            db.wake_rows().await.is_empty(),
            "the claim consumed the insert's row"
        );
        assert!(
            store
                .save_result(&claim, StepResult::OwnerNumber(77))
                .await
                .unwrap()
        );
        // A result the business's lock refuses: the error path clears too.
        let mut business = db.business_connection().await;
        business.execute("BEGIN").await.unwrap();
        sqlx::query("SELECT id FROM approval_request WHERE id = 1 FOR UPDATE")
            .fetch_all(&mut business)
            .await
            .unwrap();
        let refused = store.save_result(&claim, StepResult::StoreNumber(88)).await;
        assert!(
            matches!(refused, Err(DbError::RowLocked { .. })),
            "{refused:?}"
        );
        business.execute("ROLLBACK").await.unwrap();
        assert!(
            store
                .save_result(&claim, StepResult::StoreNumber(88))
                .await
                .unwrap()
        );
        assert_eq!(complete_now(&store, &claim).await, Completion::Approved);
        assert!(
            db.wake_rows().await.is_empty(),
            "our approval and results wake nobody"
        );
        // A business change of a watched column wakes, even on the
        // connection our writes used: nothing of theirs is left in it.
        sqlx::query("UPDATE approval_request SET operational_hold = true WHERE id = 1")
            .execute(&one)
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await, [(Some(1), None)]);
    })
    .await;
}

/// The next change the poller yields, within a second.
async fn next_change(changes: &mut RequestChanges) -> RequestChange {
    tokio::time::timeout(StdDuration::from_secs(1), changes.next())
        .await
        .expect("a change within a second")
        .unwrap()
}

#[tokio::test]
async fn mysql_the_poller_yields_changes_and_survives_a_restart() {
    with_db(|db| async move {
        let mut changes = db.store.request_changes().await.unwrap();
        insert_owner(&db.business, 1).await;
        insert_owner(&db.business, 2).await;
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(1));
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(2));
        // An e-contract change reaches every request on the contract.
        sqlx::query("INSERT INTO econtract (contract_ref, status) VALUES ('EC-2', 'SIGNED')")
            .execute(&db.business)
            .await
            .unwrap();
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(2));
        drop(changes);
        // A restarted replica (a store of its own) starts at the oldest row
        // still there: nothing was consumed, so it hears of all again.
        let restarted =
            Database::mysql(db.pool.clone(), db.pool.clone()).with_wake_poll_interval(POLL);
        let mut again = restarted.request_changes().await.unwrap();
        let mut seen = vec![];
        for _ in 0..2 {
            seen.push(next_change(&mut again).await);
        }
        assert_eq!(seen, [RequestChange::Changed(1), RequestChange::Changed(2)]);
        // The owner's turn deletes what its poller saw below its first
        // hole: the e-contract row the first poller expanded left one (as a
        // transaction still open would), so the expansion's row stays.
        restarted
            .apply_wakes(None, t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap();
        assert_eq!(db.wake_rows().await, [(Some(2), None)]);
        insert_owner(&db.business, 3).await;
        let fresh = Database::mysql(db.pool.clone(), db.pool.clone()).with_wake_poll_interval(POLL);
        let mut third = fresh.request_changes().await.unwrap();
        let seen = [next_change(&mut third).await, next_change(&mut third).await];
        assert_eq!(seen, [RequestChange::Changed(2), RequestChange::Changed(3)]);
    })
    .await;
}

#[tokio::test]
async fn mysql_a_new_requests_wake_row_outlives_apply_wakes_until_the_poller_saw_it() {
    with_db(|db| async move {
        let mut changes = db.store.request_changes().await.unwrap();
        // A business transaction takes an id and commits late: a later
        // request's row (a higher id) is read first.
        let mut slow = db.business_connection().await;
        slow.execute("BEGIN").await.unwrap();
        sqlx::query(
            "INSERT INTO approval_request (id, request_type, documents_released) VALUES (1, 'OWNER_CONTRACT', true)",
        )
        .execute(&mut slow)
        .await
        .unwrap();
        insert_owner(&db.business, 2).await;
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(2));
        // Not seen yet, so the turn leaves the rows from the gap on.
        db.store.apply_wakes(None, t0(), DEFAULT_RETRY_LIMIT).await.unwrap();
        slow.execute("COMMIT").await.unwrap();
        assert_eq!(db.wake_rows().await.len(), 2);
        assert_eq!(next_change(&mut changes).await, RequestChange::Changed(1));
        db.store.apply_wakes(None, t0(), DEFAULT_RETRY_LIMIT).await.unwrap();
        assert!(db.wake_rows().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn mysql_a_change_makes_a_waiting_request_due_at_its_owners_turn_only() {
    with_db(|db| async move {
        insert_owner(&db.business, 1).await;
        insert_owner(&db.business, 2).await;
        let later = t0() + Duration::hours(1);
        insert_waiting(&db.business, 1, later).await;
        insert_waiting(&db.business, 2, later).await;
        for id in [1, 2] {
            sqlx::query("UPDATE approval_request SET menu_registered = false WHERE id = ?")
                .bind(id)
                .execute(&db.business)
                .await
                .unwrap();
        }
        // Shard 1 of 2 holds request 1 only.
        let mine = ShardFilter {
            shard_count: 2,
            shards: vec![1],
        };
        let due = db
            .store
            .apply_wakes(Some(&mine), t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap();
        assert_eq!(due, [1]);
        assert_eq!(
            db.store.state(1).await.unwrap().unwrap().next_retry_time,
            Some(t0())
        );
        assert_eq!(
            db.store.state(2).await.unwrap().unwrap().next_retry_time,
            Some(later)
        );
        let left: Vec<Option<i64>> = db.wake_rows().await.into_iter().map(|(r, _)| r).collect();
        assert_eq!(
            left,
            [Some(2), Some(2)],
            "the other shard's rows stay for its owner"
        );
    })
    .await;
}

#[tokio::test]
async fn mysql_a_business_update_never_waits_for_a_state_row_we_hold() {
    with_db(|db| async move {
        insert_owner(&db.business, 1).await;
        claim_new(&db.store, 1, "a").await;
        // Our transaction holds the state row and has deleted the newest
        // wake rows, as a retry write and a wake consumption do.
        let mut ours = db.pool.acquire().await.unwrap();
        ours.execute("BEGIN").await.unwrap();
        sqlx::query("SELECT id FROM auto_approve_state WHERE request_id = 1 FOR UPDATE")
            .fetch_all(&mut *ours)
            .await
            .unwrap();
        insert_owner(&db.business, 2).await;
        let newest: i64 = sqlx::query_scalar("SELECT MAX(id) FROM auto_approve_wake")
            .fetch_one(&db.business)
            .await
            .unwrap();
        sqlx::query("DELETE FROM auto_approve_wake WHERE id IN (?)")
            .bind(newest)
            .execute(&mut *ours)
            .await
            .unwrap();
        // The business, in its own REPEATABLE READ session, updates the
        // request and inserts another: neither waits (a wait would fail
        // after its 1 s lock timeout).
        let mut business = db.business_connection().await;
        let started = Instant::now();
        sqlx::query("UPDATE approval_request SET documents_released = false WHERE id = 1")
            .execute(&mut business)
            .await
            .expect("the business update does not wait for our state row");
        sqlx::query("INSERT INTO approval_request (id, request_type) VALUES (3, 'OWNER_CONTRACT')")
            .execute(&mut business)
            .await
            .expect("the business insert does not wait for our wake delete");
        let took = started.elapsed();
        assert!(took < StdDuration::from_millis(900), "took {took:?}");
        ours.execute("ROLLBACK").await.unwrap();
        let woken: Vec<Option<i64>> = db.wake_rows().await.into_iter().map(|(r, _)| r).collect();
        assert!(
            woken.contains(&Some(1)) && woken.contains(&Some(3)),
            "{woken:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn mysql_a_business_insert_never_waits_for_an_e_contract_wake_expansion() {
    with_db(|db| async move {
        for id in 1..=3 {
            insert_owner(&db.business, id).await;
        }
        insert_waiting(&db.pool, 2, t0() + Duration::minutes(10)).await;
        sqlx::query("INSERT INTO econtract (contract_ref, status) VALUES ('EC-2', 'SIGNED')")
            .execute(&db.business)
            .await
            .unwrap();
        // Another session (REPEATABLE READ, as the business's are) holds
        // the gap of request 2 in the wake table's (request_id, id) index,
        // where the expansion of EC-2 inserts: the expansion's insert waits
        // there, mid-statement. Request 10's row goes elsewhere.
        let mut holder = db.business.acquire().await.unwrap();
        holder.execute("BEGIN").await.unwrap();
        sqlx::query(
            "SELECT id FROM auto_approve_wake FORCE INDEX (auto_approve_wake_request)
              WHERE request_id = 2 FOR UPDATE",
        )
        .fetch_all(&mut *holder)
        .await
        .unwrap();
        let expansion = tokio::spawn({
            let store = db.store.clone();
            async move { store.apply_wakes(None, t0(), DEFAULT_RETRY_LIMIT).await }
        });
        // Waiting, as InnoDB reports it (information_schema.innodb_trx
        // was seen to leave the waiting transaction out on MariaDB 10.11).
        let waiting = format!(
            "index auto_approve_wake_request of table `{}`.`auto_approve_wake`",
            db.name
        );
        let deadline = Instant::now() + StdDuration::from_secs(30);
        loop {
            let (_, _, status): (String, String, String) =
                sqlx::query_as("SHOW ENGINE INNODB STATUS")
                    .fetch_one(&db.business)
                    .await
                    .unwrap();
            if status
                .lines()
                .any(|line| line.contains(&waiting) && line.contains("insert intention waiting"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "the expansion never waited");
            tokio::time::sleep(StdDuration::from_millis(20)).await;
        }

        // A business insert meanwhile: its trigger appends a wake row. An
        // INSERT ... SELECT in progress held the table's AUTO-INC lock
        // (innodb_autoinc_lock_mode 1) and this waited out its lock wait.
        let mut business = db.business_connection().await;
        let inserted = sqlx::query(
            "INSERT INTO approval_request (id, request_type) VALUES (10, 'OWNER_CONTRACT')",
        )
        .execute(&mut business)
        .await;
        assert!(
            inserted.is_ok(),
            "the business insert waited for our expansion: {inserted:?}"
        );

        holder.execute("ROLLBACK").await.unwrap();
        let due = expansion
            .await
            .expect("joins")
            .expect("the expansion ends once the gap is free");
        assert_eq!(due, [2], "request 2, waiting on EC-2, is woken");
    })
    .await;
}

#[tokio::test]
async fn mysql_the_coordination_pool_gives_up_on_a_held_fence_row_after_the_lock_wait() {
    with_db(|db| async move {
        let args = DatabaseArgs {
            database_url: db.url().parse().expect("the scratch database's URL"),
            read_database_url: None,
            db_max_connections: 4,
            wake_poll_interval: POLL,
            vocabulary: None,
        };
        let session = SessionArgs {
            db_lock_timeout: StdDuration::from_secs(1),
            db_statement_timeout: StdDuration::from_secs(30),
        };
        let store = Database::connect(&args, Some(&session)).await.unwrap();
        // As `run` makes the Lease loop's store.
        let coordination = store.dedicated(2);
        let Pool::Mysql(pool) = coordination.primary_pool() else {
            panic!("a MySQL pool");
        };
        let mut conn = pool.acquire().await.unwrap();
        let lock_wait: u64 = sqlx::query_scalar("SELECT @@innodb_lock_wait_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(lock_wait, 1, "the session's lock wait, not InnoDB's 50 s");
        if flavour_of(&mut conn).await.unwrap() == Flavour::MariaDb {
            let statement: f64 = sqlx::query_scalar("SELECT @@max_statement_time")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(statement, 30.0);
        }
        drop(conn);

        assert_eq!(
            coordination.fence_shard(16, 3, 1, "a", t0()).await.unwrap(),
            Some(vec![])
        );
        let mut other = db.business.acquire().await.unwrap();
        other.execute("BEGIN").await.unwrap();
        sqlx::query(
            "SELECT token FROM shard_fence WHERE shard_count = 16 AND shard = 3 FOR UPDATE",
        )
        .fetch_all(&mut *other)
        .await
        .unwrap();
        let raised = tokio::time::timeout(
            StdDuration::from_secs(20),
            coordination.fence_shard(16, 3, 2, "b", t0()),
        )
        .await
        .expect("the fence gave up on the held row before InnoDB's 50 s");
        assert!(
            matches!(raised, Err(DbError::RowLocked { .. })),
            "{raised:?}"
        );
        other.execute("ROLLBACK").await.unwrap();
        assert_eq!(
            coordination.fence_shard(16, 3, 2, "b", t0()).await.unwrap(),
            Some(vec![])
        );
    })
    .await;
}
