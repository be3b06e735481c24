//! Rollback and upgrade safety (issue 35): an older binary starts on a newer
//! schema, `run` refuses a schema older than it needs and a binding it
//! cannot use, naming what is missing, and `migrate --print-sql` prints what
//! a DBA can apply by hand in place of `migrate`.

use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{
    Db, MysqlScratch, NS, backends, database_url, eventually, free_port, fresh_dir, kubeconfig_in,
    on_both, owner_now, request_status, spawn_run_on_sim, stop_on_sigterm,
};

/// The binary with `args`, its output.
fn autoapproval(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run autoapproval")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What a later release's migration does: adds a column our binary never
/// reads, and records itself in the controller's history.
const FROM_A_NEWER_RELEASE: &str = "ALTER TABLE auto_approve_state ADD COLUMN added_later INTEGER";

fn record_newer(db: &Db) -> String {
    let checksum = match db {
        Db::Postgres(_) => "'\\x00'::bytea",
        Db::Mysql(_) => "x'00'",
    };
    format!(
        "INSERT INTO _autoapproval_migrations (version, description, success, checksum, execution_time) \
         VALUES (9001, 'from a newer release', TRUE, {checksum}, 0)"
    )
}

on_both!(a_schema_newer_than_the_binary_lets_migrate_and_run_start);
/// A rollback leaves the newer release's migration applied: this binary's
/// `migrate` (the chart's hook, the plain manifests' init container) and its
/// `run` start all the same, and approve.
async fn a_schema_newer_than_the_binary_lets_migrate_and_run_start(db: Db) {
    db.exec(FROM_A_NEWER_RELEASE).await;
    db.exec(&record_newer(&db)).await;
    let url = database_url(&db);
    let migrate = autoapproval(&["migrate", "--database-url", &url]);
    assert!(migrate.status.success(), "migrate: {}", stderr(&migrate));

    let (server, _, sim) = backends().await;
    let dir = fresh_dir("newer-schema");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let child = spawn_run_on_sim(
        &kubeconfig,
        &db,
        &["--namespace", NS, "--replica-name", "rolled-back"],
        &sim.base_url(),
    );
    owner_now(351).insert(&db).await;
    eventually("request 351 to be approved by the older binary", || async {
        (request_status(&db, 351).await == "APPROVED").then_some(())
    })
    .await;
    let output = stop_on_sigterm(child, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{}", stderr(&output));
}

/// `autoapproval run` against `db` with a kubeconfig nobody answers: the
/// schema is checked before the API server is contacted, so what it says
/// is about the schema. A `run` that passed the check would wait for the
/// API server for ever: after a minute it is killed and the test fails.
async fn run_against(db: &Db) -> Output {
    let dir = fresh_dir("schema-check");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    namespace: default\n    user: u\n\
         current-context: c\nusers:\n- name: u\n  user: {}\n",
    )
    .expect("kubeconfig");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["run", "--replica-name", "checker", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("AUTOAPPROVAL_DATABASE_URL", database_url(db))
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run autoapproval run");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("`run` stopped at its schema check (it went on instead)")
        .expect("autoapproval run's output");
    let _ = std::fs::remove_dir_all(&dir);
    out
}

on_both!(run_refuses_a_schema_older_than_it_needs_naming_the_migration);
/// A binary newer than the schema (its `migrate` skipped, or a DBA's script
/// not applied yet) stops before it touches anything, naming the migration.
async fn run_refuses_a_schema_older_than_it_needs_naming_the_migration(db: Db) {
    db.exec("DELETE FROM _autoapproval_migrations WHERE version = 1")
        .await;
    let out = run_against(&db).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "the database lacks controller migration 0001 (controller objects): run `autoapproval migrate`"
        ),
        "{}",
        stderr(&out)
    );
}

on_both!(run_refuses_a_missing_view_or_column_naming_it);
/// The binding is checked as the controller uses it: a view dropped, or a
/// column the contract names missing from it, stops `run` with its name.
async fn run_refuses_a_missing_view_or_column_naming_it(db: Db) {
    db.exec("DROP VIEW autoapproval_request_memo").await;
    let out = run_against(&db).await;
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(
        said.contains("binding to the business tables")
            && said.contains("autoapproval_request_memo"),
        "{said}"
    );

    db.exec(
        "CREATE VIEW autoapproval_request_memo AS \
         SELECT id, request_id, created_at, author FROM approval_request_memo",
    )
    .await;
    let said = stderr(&run_against(&db).await);
    assert!(
        said.contains("SELECT on autoapproval_request_memo") && said.contains("message"),
        "{said}"
    );
}

on_both!(run_refuses_an_e_contract_ledger_without_a_unique_key_naming_it);
/// The e-contract sync is an upsert on contract_ref: over a ledger table
/// with no unique key on the column behind it, MySQL's ON DUPLICATE KEY
/// UPDATE would add a ledger row at every sync (PostgreSQL's ON CONFLICT
/// refuses the statement). `run` stops, naming the view, the column and,
/// on MySQL, the table and the key to add.
async fn run_refuses_an_e_contract_ledger_without_a_unique_key_naming_it(db: Db) {
    db.exec(match db {
        Db::Postgres(_) => {
            "CREATE TABLE econtract_unkeyed (id BIGSERIAL PRIMARY KEY, ref TEXT NOT NULL,
                 status TEXT NOT NULL, synced_at TIMESTAMPTZ NOT NULL)"
        }
        Db::Mysql(_) => {
            "CREATE TABLE econtract_unkeyed (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                 ref VARCHAR(255) NOT NULL, status VARCHAR(32) NOT NULL,
                 synced_at DATETIME(6) NOT NULL)"
        }
    })
    .await;
    db.exec("DROP VIEW autoapproval_econtract").await;
    db.exec(
        "CREATE VIEW autoapproval_econtract AS \
         SELECT ref AS contract_ref, status, synced_at FROM econtract_unkeyed",
    )
    .await;
    let out = run_against(&db).await;
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(
        said.contains("binding to the business tables")
            && said.contains("autoapproval_econtract")
            && said.contains("contract_ref")
            && said.to_lowercase().contains("unique"),
        "{said}"
    );
    if let Db::Mysql(_) = db {
        assert!(
            said.contains("`econtract_unkeyed` ADD UNIQUE KEY (`ref`)"),
            "{said}"
        );
        assert_eq!(
            db.fetch_i64("SELECT COUNT(*) FROM econtract_unkeyed").await,
            0,
            "the probe's rows are rolled back"
        );
    }
}

/// Runs `sql` as a script with the backend's own command-line client, as a
/// DBA would apply what `--print-sql` printed.
fn apply_script(db: &Db, url: &str, sql: &str) {
    use std::io::Write;
    let mut command = match db {
        Db::Postgres(_) => {
            let mut c = Command::new("psql");
            c.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", url]);
            c
        }
        Db::Mysql(_) => {
            let u = url::Url::parse(url).expect("MySQL URL");
            let mut c = Command::new("mariadb");
            c.args([
                "-h",
                u.host_str().expect("host"),
                "-P",
                &u.port().unwrap_or(3306).to_string(),
                "-u",
                u.username(),
                u.path().trim_start_matches('/'),
            ]);
            c
        }
    };
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the database's command-line client (scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(sql.as_bytes())
        .expect("script written");
    let out = child.wait_with_output().expect("client ran");
    assert!(out.status.success(), "the script failed: {}", stderr(&out));
}

/// `--print-sql` on an empty database, applied with the database's own
/// client, is the same as `migrate`: the next `migrate` finds nothing
/// pending (the history rows and checksums match) and `run`'s check passes.
async fn the_printed_sql_applied_by_hand_is_what_migrate_does(db: Db) {
    let url = database_url(&db);
    let printed = autoapproval(&[
        "migrate",
        "--reference-schema",
        "--print-sql",
        "--database-url",
        &url,
    ]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let script = String::from_utf8(printed.stdout).expect("UTF-8");
    assert!(
        script.contains("0001 (controller objects)") && script.contains("CREATE TABLE"),
        "{script}"
    );
    apply_script(&db, &url, &script);

    let again = autoapproval(&[
        "migrate",
        "--reference-schema",
        "--print-sql",
        "--database-url",
        &url,
    ]);
    let again = String::from_utf8_lossy(&again.stdout).into_owned();
    assert_eq!(
        again,
        "-- autoapproval controller migrations (none pending)\n\
         -- autoapproval reference schema migrations (none pending)\n"
    );
    let migrate = autoapproval(&["migrate", "--reference-schema", "--database-url", &url]);
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    // What `run` checks before it starts (a passing check goes on to the
    // API server, which this test has none of).
    let warnings = db
        .database()
        .check_schema()
        .await
        .expect("the schema passes");
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[sqlx::test(migrations = false)]
async fn the_printed_sql_applied_by_hand_is_what_migrate_does_on_postgres(pool: sqlx::PgPool) {
    the_printed_sql_applied_by_hand_is_what_migrate_does(Db::Postgres(pool)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_applied_by_hand_is_what_migrate_does_on_mysql() {
    let scratch = MysqlScratch::unmigrated().await;
    the_printed_sql_applied_by_hand_is_what_migrate_does(scratch.db()).await;
    scratch.finish().await;
}

on_both!(start_up_warns_of_a_whole_table_candidate_read_and_of_no_wake_trigger);
/// What only slows the controller is a warning, naming what to create: the
/// candidate queries with no index to read (every index of the request table
/// but its primary key dropped), and no wake trigger attached.
async fn start_up_warns_of_a_whole_table_candidate_read_and_of_no_wake_trigger(db: Db) {
    let store = db.database();
    assert_eq!(store.check_schema().await.unwrap(), Vec::<String>::new());
    let secondary: Vec<String> = match &db {
        Db::Postgres(pool) => sqlx::query_scalar(
            "SELECT format('DROP INDEX %I', indexname) FROM pg_indexes
              WHERE tablename = 'approval_request' AND indexname <> 'approval_request_pkey'",
        )
        .fetch_all(pool)
        .await
        .unwrap(),
        Db::Mysql(pool) => sqlx::query_scalar(
            "SELECT DISTINCT CONCAT('DROP INDEX ', INDEX_NAME, ' ON approval_request')
               FROM information_schema.STATISTICS
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'approval_request'
                AND INDEX_NAME <> 'PRIMARY'",
        )
        .fetch_all(pool)
        .await
        .unwrap(),
    };
    assert!(
        !secondary.is_empty(),
        "the reference schema indexes its requests"
    );
    for drop in &secondary {
        db.exec(drop).await;
    }
    let warnings = store.check_schema().await.expect("only warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("OWNER_CONTRACT candidate query reads")),
        "{warnings:?}"
    );

    let triggers: Vec<String> = match &db {
        Db::Postgres(pool) => sqlx::query_scalar(
            "SELECT format('DROP TRIGGER %I ON %s', tgname, tgrelid::regclass) FROM pg_trigger
              WHERE tgname LIKE 'autoapproval_request_%'",
        )
        .fetch_all(pool)
        .await
        .unwrap(),
        Db::Mysql(pool) => sqlx::query_scalar(
            "SELECT CONCAT('DROP TRIGGER ', TRIGGER_NAME) FROM information_schema.TRIGGERS
              WHERE TRIGGER_SCHEMA = DATABASE()
                AND ACTION_STATEMENT LIKE '%autoapproval_request_changed%'",
        )
        .fetch_all(pool)
        .await
        .unwrap(),
    };
    assert!(!triggers.is_empty(), "the reference schema is watched");
    for drop in &triggers {
        db.exec(drop).await;
    }
    let warnings = store.check_schema().await.expect("only warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("no wake trigger calls autoapproval_request_changed")),
        "{warnings:?}"
    );
}

on_both!(start_up_warns_of_a_candidate_read_through_an_index_on_sort_time_alone);
/// Issue 44: a request table whose only index is on `sort_time` gives the candidate query an
/// index to use (PostgreSQL walks it, ordered or as a bitmap; MySQL lists it among the usable
/// keys), so it is no whole-table read, yet every request of the window is read whatever its
/// type and status. Start-up warns, naming the table and the type and status columns.
async fn start_up_warns_of_a_candidate_read_through_an_index_on_sort_time_alone(db: Db) {
    let store = db.database();
    let secondary: Vec<String> = match &db {
        Db::Postgres(_) => {
            db.fetch_strings(
                "SELECT format('DROP INDEX %I', indexname) FROM pg_indexes
                  WHERE tablename = 'approval_request' AND indexname <> 'approval_request_pkey'",
            )
            .await
        }
        Db::Mysql(_) => {
            db.fetch_strings(
                "SELECT DISTINCT CONCAT('DROP INDEX ', INDEX_NAME, ' ON approval_request')
                   FROM information_schema.STATISTICS
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'approval_request'
                    AND INDEX_NAME <> 'PRIMARY'",
            )
            .await
        }
    };
    for drop in &secondary {
        db.exec(drop).await;
    }
    db.exec("CREATE INDEX approval_request_sort_time ON approval_request (sort_time)")
        .await;
    // Requests of every type and status in the window, for the planner to weigh.
    for id in 1..=200 {
        owner_now(id).insert(&db).await;
    }
    db.exec("UPDATE approval_request SET status = 'APPROVED' WHERE id % 4 = 0")
        .await;
    db.exec("UPDATE approval_request SET request_type = 'OWNER_CHANGE' WHERE id % 3 = 0")
        .await;
    if let Db::Postgres(_) = db {
        db.exec("ANALYZE approval_request").await;
    }
    let warnings = store.check_schema().await.expect("only warnings");
    eprintln!("{}: {warnings:?}", db.name());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("OWNER_CONTRACT candidate query")
                && w.contains("approval_request")
                && (w.contains("does not hold its type and status")
                    || w.contains("does not begin with its type and status"))),
        "{}: {warnings:?}",
        db.name()
    );
    assert!(
        !warnings
            .iter()
            .any(|w| w.contains("reads table approval_request whole")),
        "an index walk, not a whole-table read: {warnings:?}"
    );
}

/// 0.2.0's wake triggers on approval_request and econtract, as its
/// migrations 0004–0021 left them (the functions named, the bodies abridged
/// to their effect).
const PG_WAKE_0_2_0: &str = "
CREATE TABLE auto_approve_wake (request_id BIGINT NOT NULL, woken_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE FUNCTION autoapproval_notify_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO auto_approve_wake (request_id) VALUES (NEW.id);
    END IF;
    PERFORM pg_notify('autoapproval_request_changed', NEW.id::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER approval_request_notify AFTER INSERT OR UPDATE ON approval_request
    FOR EACH ROW EXECUTE FUNCTION autoapproval_notify_request();
CREATE FUNCTION autoapproval_notify_econtract() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO auto_approve_wake (request_id)
    SELECT r.id FROM approval_request r WHERE r.econtract_ref = NEW.contract_ref;
    RETURN NULL;
END;
$$;
CREATE TRIGGER econtract_notify AFTER INSERT OR UPDATE ON econtract
    FOR EACH ROW EXECUTE FUNCTION autoapproval_notify_econtract();
";

/// The triggers on `table` of the test's database, by name.
async fn pg_triggers(pool: &sqlx::PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tgname::text FROM pg_trigger
          WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY 1",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The request ids of the wake rows, which it deletes.
async fn pg_take_wakes(pool: &sqlx::PgPool) -> Vec<i64> {
    sqlx::query_scalar("DELETE FROM auto_approve_wake RETURNING request_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A database 0.2.0 migrated (its business tables, made by 0.2.0's own
/// migrations, its wake triggers) keeps its requests through the upgrade.
/// The controller set (the chart's pre-upgrade hook, while 0.2.0's
/// replicas still run) leaves 0.2.0's triggers recording their wakes,
/// which those replicas' completions rely on; the reference set's binding
/// replaces them with the new ones: one wake row per change, not two.
#[sqlx::test(migrations = false)]
async fn a_0_2_0_postgres_database_keeps_its_wake_triggers_until_the_binding_replaces_them(
    pool: sqlx::PgPool,
) {
    sqlx::raw_sql(include_str!(
        "../../migrations/postgres/reference/0001_business_tables.sql"
    ))
    .execute(&pool)
    .await
    .expect("0.2.0's business tables");
    sqlx::raw_sql(PG_WAKE_0_2_0)
        .execute(&pool)
        .await
        .expect("0.2.0's wake triggers");
    let db = Db::Postgres(pool.clone());
    owner_now(361).insert(&db).await;
    let url = database_url(&db);

    let controller = autoapproval(&["migrate", "--database-url", &url]);
    assert!(controller.status.success(), "{}", stderr(&controller));
    assert_eq!(
        pg_triggers(&pool, "approval_request").await,
        ["approval_request_notify"]
    );
    assert_eq!(pg_triggers(&pool, "econtract").await, ["econtract_notify"]);
    db.exec("UPDATE approval_request SET documents_released = false WHERE id = 361")
        .await;
    db.exec("INSERT INTO econtract (contract_ref, status) VALUES ('EC-361', 'SIGNED')")
        .await;
    assert_eq!(
        pg_take_wakes(&pool).await,
        [361, 361],
        "0.2.0's triggers still record the wakes of a change and of its contract"
    );

    let reference = autoapproval(&["migrate", "--reference-schema", "--database-url", &url]);
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert_eq!(
        pg_triggers(&pool, "approval_request").await,
        [
            "autoapproval_request_inserted",
            "autoapproval_request_updated"
        ]
    );
    assert_eq!(
        pg_triggers(&pool, "econtract").await,
        [
            "autoapproval_econtract_inserted",
            "autoapproval_econtract_updated"
        ]
    );
    db.exec("UPDATE approval_request SET documents_released = true WHERE id = 361")
        .await;
    db.exec("UPDATE econtract SET status = 'REJECTED' WHERE contract_ref = 'EC-361'")
        .await;
    assert_eq!(
        pg_take_wakes(&pool).await,
        [361, 361],
        "one wake row per change: the new triggers' only"
    );
    assert_eq!(request_status(&db, 361).await, "PENDING");
    let warnings = db
        .database()
        .check_schema()
        .await
        .expect("the schema passes");
    assert!(warnings.is_empty(), "{warnings:?}");
}
