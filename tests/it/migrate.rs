//! `autoapproval migrate` is idempotent, creates only the controller's objects unless asked
//! for the reference schema, and says when it cannot connect.

use std::process::Command;

use sqlx::PgPool;

use crate::support::migrate_twice;

// PostgreSQL only: on_both! gives a migrated database; MySQL's twice-over
// run on an empty one is mysql::mysql_migrations_apply_twice.
#[sqlx::test(migrations = false)]
async fn migrate_twice_against_an_empty_database_succeeds_both_times(pool: PgPool) {
    let (name,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set by scripts/test.sh");
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    let url = format!("{server}/{name}");
    migrate_twice(&url);
    let tables = |names: &'static str| {
        let pool = pool.clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM information_schema.tables
                  WHERE table_schema = current_schema() AND table_name IN ({names})"
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        }
    };
    const OURS: &str = "'auto_approve_state', 'auto_approve_wake', '_autoapproval_migrations'";
    const BUSINESS: &str = "'approval_request', 'approval_request_memo', 'econtract', \
                            'autoapproval_request', '_autoapproval_reference_migrations'";
    assert_eq!(tables(OURS).await, 3, "the controller's own objects");
    assert_eq!(tables(BUSINESS).await, 0, "no business table, no binding");

    let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["migrate", "--reference-schema", "--database-url", &url])
        .output()
        .expect("run autoapproval migrate --reference-schema");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tables(BUSINESS).await,
        5,
        "the reference schema and its binding"
    );
}

/// Refused on either backend, before anything else, naming what failed.
#[test]
fn migrate_against_an_unreachable_database_fails_with_a_message() {
    for url in [
        "postgres://nobody@127.0.0.1:1/none",
        "mysql://nobody@127.0.0.1:1/none",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(["migrate", "--database-url", url])
            .output()
            .expect("run autoapproval migrate");
        assert!(!out.status.success(), "{url}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("connect to the primary"), "{url}: {stderr}");
    }
}
