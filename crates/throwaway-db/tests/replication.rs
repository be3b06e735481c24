//! The throwaway servers for real: a primary and its replica, a row
//! replicated, held back while applying is stopped, and applied after.

use std::time::Duration;

use sqlx::{Connection, MySqlConnection};
use throwaway_db::{MariaDb, Replicated};

async fn count(url: &str) -> i64 {
    let mut conn = MySqlConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT COUNT(*) FROM t")
        .fetch_one(&mut conn)
        .await
        .expect("count")
}

#[tokio::test]
async fn a_replica_goes_stale_while_not_applying_and_catches_up_after() {
    let pair = Replicated::start()
        .await
        .expect("primary and replica start");
    pair.create_database("app").await.expect("create database");
    let primary = pair.primary().database_url("app");
    let replica = pair.replica().database_url("app");
    let mut writer = MySqlConnection::connect(&primary).await.expect("connect");
    sqlx::raw_sql("CREATE TABLE t (id BIGINT PRIMARY KEY); INSERT INTO t VALUES (1)")
        .execute(&mut writer)
        .await
        .expect("create and insert");
    pair.wait_caught_up(Duration::from_secs(30))
        .await
        .expect("caught up");
    assert_eq!(count(&replica).await, 1);

    pair.stop_applying().await.expect("stop applying");
    sqlx::raw_sql("INSERT INTO t VALUES (2)")
        .execute(&mut writer)
        .await
        .expect("insert");
    let stale = pair.wait_caught_up(Duration::from_millis(500)).await;
    assert!(stale.is_err(), "caught up while not applying: {stale:?}");
    assert_eq!(
        count(&replica).await,
        1,
        "the replica applied while stopped"
    );

    pair.start_applying().await.expect("start applying");
    pair.wait_caught_up(Duration::from_secs(30))
        .await
        .expect("caught up");
    assert_eq!(count(&replica).await, 2);
}

#[tokio::test]
async fn a_dropped_server_is_gone_with_its_directory() {
    let db = MariaDb::start().await.expect("starts");
    db.create_database("x").await.expect("create database");
    let url = db.url();
    let dir = db.log_path().parent().expect("a directory").to_owned();
    drop(db);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(
        MySqlConnection::connect(&url).await.is_err(),
        "{url} still answers"
    );
    assert!(matches!(
        MariaDb::start()
            .await
            .expect("starts")
            .create_database("no-such name")
            .await,
        Err(throwaway_db::Error::BadName(_))
    ));
}
