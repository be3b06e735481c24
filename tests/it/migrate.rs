//! `autoapproval migrate` is idempotent.

use std::process::Command;

use sqlx::PgPool;

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
    for run in 1..=2 {
        let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(["migrate", "--database-url", &url])
            .output()
            .expect("run autoapproval migrate");
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (tables,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.tables
          WHERE table_name IN ('approval_request', 'approval_request_memo', 'econtract', 'auto_approve_state')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 4);
}

#[sqlx::test(migrations = false)]
async fn migrate_against_an_unreachable_database_fails_with_a_message(_pool: PgPool) {
    let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args([
            "migrate",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ])
        .output()
        .expect("run autoapproval migrate");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connect to the primary"));
}
