//! `autoapproval migrate` is idempotent, and says when it cannot connect.

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
    let (tables,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.tables
          WHERE table_name IN ('approval_request', 'approval_request_memo', 'econtract', 'auto_approve_state')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 4);
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
